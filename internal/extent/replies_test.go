package extent

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// TestRepeatedRequestRunsOnce: a command whose request id the extent
// remembers is not applied again, answers the first result (with the first
// index), and writes nothing; the memory is in the replica's state, so a
// replica built from that state (a new leader, a restart, a snapshot)
// remembers too.
func TestRepeatedRequestRunsOnce(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	cmd := commitCmd(Write(blk.WithPage(1), 0, []byte("once")))
	cmd.RequestId = 99
	first := h.apply(proto.CloneOf(cmd))
	if first.Code != pb.Code_CODE_OK {
		t.Fatalf("first: %v %s", first.Code, first.Message)
	}
	before := h.kv.Dump()
	again := h.apply(proto.CloneOf(cmd))
	if again.Code != pb.Code_CODE_OK || again.Index != first.Index || again.Results[0].Slot != first.Results[0].Slot {
		t.Fatalf("repeat answered %v at %d slot %d, want the first reply (index %d slot %d)",
			again.Code, again.Index, again.Results[0].Slot, first.Index, first.Results[0].Slot)
	}
	if after := h.kv.Dump(); after != before {
		t.Fatalf("the repeat wrote:\nbefore %s\nafter  %s", before, after)
	}
	if h.sm.Stats().Repeats != 1 {
		t.Fatalf("repeats %d, want 1", h.sm.Stats().Repeats)
	}
	// Without the memory the repeat (slot 0 on a written page) would
	// conflict: show it with a fresh id.
	cmd.RequestId = 100
	if r := h.apply(proto.CloneOf(cmd)); r.Code != pb.Code_CODE_CONFLICT {
		t.Fatalf("same write under a new id: %v, want a conflict", r.Code)
	}
	// A replica loaded from the same state remembers (restart, snapshot).
	h2 := newSMHarness(t, testExtent, smallGeometry())
	h2.kv, h2.index, h2.now = h.kv, h.index, h.now
	if err := h2.sm.Load(h2.kv); err != nil {
		t.Fatal(err)
	}
	cmd.RequestId = 99
	if r := h2.apply(proto.CloneOf(cmd)); r.Code != pb.Code_CODE_OK || r.Index != first.Index {
		t.Fatalf("repeat on a reloaded replica: %v at %d, want the first reply at %d", r.Code, r.Index, first.Index)
	}
	// A refusal is remembered too, and writes nothing else: its repeat
	// is refused the same way even once the write would succeed.
	bad := commitCmd(Write(blk.WithPage(2), 12345, []byte("x")))
	bad.RequestId = 7
	before = h.kv.Dump()
	if r := h.apply(proto.CloneOf(bad)); r.Code != pb.Code_CODE_CONFLICT {
		t.Fatalf("bad slot: %v", r.Code)
	}
	after := h.kv.Dump()
	if strings.Count(after, "\n")-strings.Count(before, "\n") != 2 {
		t.Fatalf("a refusal wrote more than its reply, its expiry entry and meta:\nbefore %s\nafter  %s", before, after)
	}
	if _, ok, _ := (&applier{sm: h.sm, w: h.kv, clock: h.now}).rememberedReply(7); !ok {
		t.Fatal("a refused command was not remembered")
	}
}

// TestRememberedRepliesExpireAndAreBounded: replies are forgotten after
// replyMemory of extent clock, and at most maxRememberedReplies are kept.
func TestRememberedRepliesExpireAndAreBounded(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	write := func(id uint64, page uint64) *pb.CommandResult {
		t.Helper()
		p, _ := h.read(blk.WithPage(page))
		cmd := commitCmd(Write(blk.WithPage(page), p.Slot, []byte(fmt.Sprint(id))))
		cmd.RequestId = id
		r := h.apply(cmd)
		if r.Code != pb.Code_CODE_OK {
			t.Fatalf("write %d: %v %s", id, r.Code, r.Message)
		}
		return r
	}
	for id := uint64(1); id <= 5; id++ {
		write(id, 1)
	}
	if n := len(h.kv.Keys([]byte{prefixReply}, []byte{prefixReply + 1})); n != 5 {
		t.Fatalf("%d replies remembered, want 5", n)
	}
	// Past the memory, the next command collects them all.
	h.now += replyMemory + 1
	write(6, 2)
	if ks := h.kv.Keys([]byte{prefixReply}, []byte{prefixReply + 1}); len(ks) != 1 {
		t.Fatalf("after expiry %d replies left, want only the newest", len(ks))
	}
	if ks := h.kv.Keys([]byte{prefixReplyExpiry}, []byte{prefixReplyExpiry + 1}); len(ks) != 1 {
		t.Fatalf("after expiry %d expiry entries left, want 1", len(ks))
	}
	meta, _ := loadMeta(h.kv)
	if meta.RememberedReplies != 1 {
		t.Fatalf("meta counts %d replies, want 1", meta.RememberedReplies)
	}
	// An expired id runs again (it is a new request as far as anyone
	// can tell).
	cmd := commitCmd(Allocate(testExtent, 9))
	cmd.RequestId = 3
	if r := h.apply(cmd); r.Code != pb.Code_CODE_OK || r.Index != h.index {
		t.Fatalf("expired id: %v at %d, want a fresh run at %d", r.Code, r.Index, h.index)
	}
}

func TestRememberedRepliesBound(t *testing.T) {
	if testing.Short() {
		t.Skip("writes maxRememberedReplies commands")
	}
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	slot := uint64(0)
	for id := uint64(1); id <= maxRememberedReplies+10; id++ {
		cmd := commitCmd(Write(blk.WithPage(1), slot, nil))
		cmd.RequestId = id
		r := h.apply(cmd)
		if r.Code != pb.Code_CODE_OK {
			t.Fatalf("write %d: %v %s", id, r.Code, r.Message)
		}
		slot = r.Results[0].Slot
	}
	ks := h.kv.Keys([]byte{prefixReply}, []byte{prefixReply + 1})
	if len(ks) != maxRememberedReplies {
		t.Fatalf("%d replies kept, want the bound %d", len(ks), maxRememberedReplies)
	}
	// The oldest were forgotten first.
	if !bytes.Equal([]byte(ks[0]), replyKey(11)) {
		t.Fatalf("oldest kept %x, want request 11", ks[0])
	}
}
