package extent

import (
	"bytes"
	"strings"
	"testing"
	"time"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

func TestGeometryValidate(t *testing.T) {
	if err := DefaultGeometry().Validate(); err != nil {
		t.Fatalf("default geometry: %v", err)
	}
	g := DefaultGeometry()
	if g.PagesPerBlock() != 32 || g.Blocks() != 4096 || g.Pages() != 131072 {
		t.Fatalf("default geometry: %d pages per block, %d blocks, %d pages", g.PagesPerBlock(), g.Blocks(), g.Pages())
	}
	for name, bad := range map[string]Geometry{
		"page not a power of two": {PageSizeBytes: 1000, BlockSizeBytes: 4000, ExtentSizeBytes: 8000, Replication: 3},
		"page too small":          {PageSizeBytes: 256, BlockSizeBytes: 512, ExtentSizeBytes: 1024, Replication: 3},
		"page too large":          {PageSizeBytes: 1 << 20, BlockSizeBytes: 1 << 20, ExtentSizeBytes: 1 << 30, Replication: 3},
		"block not a multiple":    {PageSizeBytes: 512, BlockSizeBytes: 700, ExtentSizeBytes: 1400, Replication: 3},
		"extent not a multiple":   {PageSizeBytes: 512, BlockSizeBytes: 1024, ExtentSizeBytes: 1500, Replication: 3},
		"extent too large":        {PageSizeBytes: 512, BlockSizeBytes: 1024, ExtentSizeBytes: 1 << 41, Replication: 3},
		"no replicas":             {PageSizeBytes: 512, BlockSizeBytes: 1024, ExtentSizeBytes: 2048},
		"too many replicas":       {PageSizeBytes: 512, BlockSizeBytes: 1024, ExtentSizeBytes: 2048, Replication: 8},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, bad)
		}
	}
	if _, err := GroupDescriptor(1, DefaultGeometry()); err == nil {
		t.Error("extent id 1 (the directory's group) accepted")
	}
}

func TestPointerEncoding(t *testing.T) {
	p := Pointer{Extent: 1234, Page: 99, Generation: 7, Tenant: 1 << 60, ReadOnly: true}
	b := p.AppendBinary(nil)
	if len(b) != PointerBytes {
		t.Fatalf("encoded %d bytes, want %d", len(b), PointerBytes)
	}
	got, err := DecodePointer(b)
	if err != nil || got != p {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	if _, err := DecodePointer(b[:10]); err == nil {
		t.Error("short encoding accepted")
	}
	b[32] = 9
	if _, err := DecodePointer(b); err == nil {
		t.Error("unknown flags accepted")
	}
}

// TestOwnershipCheckedOnEveryAccess is FSS §3's block ownership: every page
// access compares the pointer's generation, tenant and read-only bit with
// the block's, so a stale or foreign pointer fails.
func TestOwnershipCheckedOnEveryAccess(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	if blk.Generation != 1 || blk.Tenant != 7 || blk.Page != 0 {
		t.Fatalf("first allocation: %v", blk)
	}
	page := blk.WithPage(2)
	if p, code := h.read(page); code != pb.Code_CODE_OK || len(p.Data) != 0 || p.Slot != 0 {
		t.Fatalf("fresh page: %+v %v, want empty at slot 0", p, code)
	}
	slot := h.mustCommit(Write(page, 0, []byte("tenant seven")))[0].Slot
	if p, _ := h.read(page); string(p.Data) != "tenant seven" || p.Slot != slot || slot != h.index {
		t.Fatalf("read %q at %d, want the write at slot %d (index %d)", p.Data, p.Slot, slot, h.index)
	}

	for name, bad := range map[string]Pointer{
		"stale generation": {Extent: testExtent, Page: 2, Generation: 0, Tenant: 7},
		"newer generation": {Extent: testExtent, Page: 2, Generation: 2, Tenant: 7},
		"wrong tenant":     {Extent: testExtent, Page: 2, Generation: 1, Tenant: 8},
		"read-only bit":    {Extent: testExtent, Page: 2, Generation: 1, Tenant: 7, ReadOnly: true},
		"other block":      {Extent: testExtent, Page: 5, Generation: 1, Tenant: 7},
	} {
		if _, code := h.read(bad); code != pb.Code_CODE_STALE {
			t.Errorf("%s: read %v gave %v, want STALE", name, bad, code)
		}
		if res := h.commit(Write(bad.WithPage(bad.Page), slot, []byte("x"))); !bad.ReadOnly && res.Code != pb.Code_CODE_STALE {
			t.Errorf("%s: write gave %v, want STALE", name, res.Code)
		}
	}

	// Free moves the generation on: the old pointer fails, and whoever gets
	// the block next finds its pages empty.
	h.mustCommit(Free(blk))
	if _, code := h.read(page); code != pb.Code_CODE_STALE {
		t.Fatalf("read through a freed block's pointer: %v, want STALE", code)
	}
	again := h.mustCommit(Allocate(testExtent, 8))[0].Block
	if again.Page != blk.Page || again.Generation != 3 || again.Tenant != 8 {
		t.Fatalf("reallocation: %v, want block 0 at generation 3 for tenant 8", again)
	}
	if _, code := h.read(page); code != pb.Code_CODE_STALE {
		t.Fatalf("tenant 7's old pointer reads tenant 8's block: %v", code)
	}
	if p, code := h.read(again.WithPage(2)); code != pb.Code_CODE_OK || len(p.Data) != 0 || p.Slot != 0 {
		t.Fatalf("reallocated page: %q at %d (%v), want empty at slot 0", p.Data, p.Slot, code)
	}
}

// TestMPSCIsAllOrNothing: an MPSC whose slot, ownership or allocation check
// fails changes nothing at all.
func TestMPSCIsAllOrNothing(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 1))[0].Block
	a, b := blk.WithPage(0), blk.WithPage(1)
	rs := h.mustCommit(Write(a, 0, []byte("a1")), Write(b, 0, []byte("b1")))
	if rs[0].Slot != rs[1].Slot || rs[0].Slot != h.index {
		t.Fatalf("slots %d %d, want both %d: one raft entry", rs[0].Slot, rs[1].Slot, h.index)
	}
	sa := rs[0].Slot
	before := h.kv.Dump()
	for name, elems := range map[string][]Element{
		"stale slot":      {Write(a, sa, []byte("a2")), Write(b, sa-1, []byte("b2"))},
		"failed check":    {Write(a, sa, []byte("a2")), Check(b, 3)},
		"taken block":     {Write(a, sa, []byte("a2")), AllocateBlock(FreeBlock{Extent: testExtent, Page: 0, Generation: 0}, 1)},
		"stale free":      {Write(a, sa, []byte("a2")), Free(Pointer{Extent: testExtent, Page: 0, Generation: 9, Tenant: 1})},
		"stale ownership": {Write(a, sa, []byte("a2")), Write(Pointer{Extent: testExtent, Page: 1, Generation: 1, Tenant: 2}, sa, nil)},
	} {
		res := h.commit(elems...)
		if res.Code == pb.Code_CODE_OK {
			t.Fatalf("%s: committed", name)
		}
		if after := h.kv.Dump(); after != before {
			t.Fatalf("%s (%v): state changed", name, res.Code)
		}
	}
	if res := h.commit(Write(a, sa, []byte("a2")), Check(b, sa)); res.Code != pb.Code_CODE_OK {
		t.Fatalf("write with a valid check: %v %s", res.Code, res.Message)
	}
	if p, _ := h.read(a); string(p.Data) != "a2" {
		t.Fatalf("page a reads %q", p.Data)
	}
}

// TestBadInputChangesNothing: malformed MPSCs and steps get a clear
// INVALID_ARGUMENT and change nothing.
func TestBadInputChangesNothing(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 1))[0].Block
	g := smallGeometry()
	sixteen := make([]Element, 16)
	for i := range sixteen {
		sixteen[i] = Check(blk.WithPage(uint64(i%4)), 0)
	}
	before := h.kv.Dump()
	oversize := make([]byte, g.PageSizeBytes+1)
	for name, tc := range map[string]struct {
		cmd  *pb.Command
		want string
	}{
		"16 elements":       {commitCmd(sixteen...), "at most 15"},
		"no elements":       {commitCmd(), "at least one"},
		"page out of range": {commitCmd(Write(blk.WithPage(g.Pages()), 0, nil)), "does not exist"},
		"oversize page":     {commitCmd(Write(blk, 0, oversize)), "exceed the page size"},
		"page twice":        {commitCmd(Write(blk, 0, nil), Check(blk, 0)), "named twice"},
		"other extent":      {commitCmd(Write(Pointer{Extent: testExtent + 1, Generation: 1, Tenant: 1}, 0, nil)), "not 1000"},
		"tenant 0":          {commitCmd(Allocate(testExtent, 0)), "tenant 0"},
		"free mid-block":    {commitCmd(Free(blk.WithPage(1))), "not the first page"},
		"read-only write":   {commitCmd(Write(Pointer{Extent: testExtent, Generation: 1, Tenant: 1, ReadOnly: true}, 0, nil)), "read-only"},
		"empty element":     {&pb.Command{Op: &pb.Command_Commit{Commit: &pb.CommitCmd{Elements: []*pb.Element{{}}}}}, "without an operation"},
		"empty command":     {&pb.Command{}, "without an operation"},
		"prepare no next": {&pb.Command{Op: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{TxnId: 5, ExpiryUnixMs: h.now + 1000,
			Elements: []*pb.Element{Check(blk, 0).toProto()}}}}, "needs a next extent"},
		"prepare far expiry": {&pb.Command{Op: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{TxnId: 5, NextExtent: testExtent + 1,
			ExpiryUnixMs: h.now + time.Hour.Milliseconds(), Elements: []*pb.Element{Check(blk, 0).toProto()}}}}, "ahead of the extent's clock"},
		"decide without prev": {&pb.Command{Op: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{TxnId: 5, ExpiryUnixMs: h.now + 1000, Decide: true,
			Elements: []*pb.Element{Check(blk, 0).toProto()}}}}, "last extent of a list"},
		"txn id 0": {&pb.Command{Op: &pb.Command_Fence{Fence: &pb.TxnCmd{ExpiryUnixMs: h.now}}}, "no transaction id"},
	} {
		res := h.apply(tc.cmd)
		if res.Code != pb.Code_CODE_INVALID_ARGUMENT || !strings.Contains(res.Message, tc.want) {
			t.Errorf("%s: %v %q, want INVALID_ARGUMENT mentioning %q", name, res.Code, res.Message, tc.want)
		}
		if after := h.kv.Dump(); after != before {
			t.Fatalf("%s: state changed", name)
		}
	}
	if res := h.applyRaw([]byte{0xff, 0xff, 0xff}); res.Code != pb.Code_CODE_INVALID_ARGUMENT {
		t.Errorf("undecodable command: %v", res.Code)
	}
	if h.kv.Dump() != before {
		t.Fatal("undecodable command changed the state")
	}
	if _, code := h.read(blk.WithPage(g.Pages() + 3)); code != pb.Code_CODE_INVALID_ARGUMENT {
		t.Errorf("read of an unknown page: %v", code)
	}
}

func commitCmd(elems ...Element) *pb.Command {
	var pes []*pb.Element
	for _, e := range elems {
		pes = append(pes, e.toProto())
	}
	return &pb.Command{Op: &pb.Command_Commit{Commit: &pb.CommitCmd{Elements: pes}}}
}

func TestAllocation(t *testing.T) {
	g := smallGeometry() // 16 blocks of 4 pages
	h := newSMHarness(t, testExtent, g)
	var got []Pointer
	for range g.Blocks() {
		got = append(got, h.mustCommit(Allocate(testExtent, 3))[0].Block)
	}
	for i, p := range got {
		if p.Page != uint64(i)*g.PagesPerBlock() || p.Generation != 1 {
			t.Fatalf("allocation %d: %v", i, p)
		}
	}
	if res := h.commit(Allocate(testExtent, 3)); res.Code != pb.Code_CODE_NO_SPACE {
		t.Fatalf("allocation in a full extent: %v", res.Code)
	}
	free, err := h.sm.FreeBlocks(0, 10)
	if err != nil || len(free) != 0 {
		t.Fatalf("free blocks of a full extent: %v %v", free, err)
	}
	h.mustCommit(Free(got[5]), Free(got[9]))
	free, err = h.sm.FreeBlocks(g.FirstPage(8), 10)
	if err != nil || len(free) != 2 || free[0].Page != got[9].Page || free[1].Page != got[5].Page || free[0].Generation != 2 {
		t.Fatalf("free blocks near block 8: %+v %v, want blocks 9 then 5 at generation 2", free, err)
	}
	// Allocate a named block and write its pages in the same MPSC.
	rs := h.mustCommit(AllocateBlock(free[0], 4), Write(Pointer{Extent: testExtent, Page: got[9].Page + 1, Generation: 3, Tenant: 4}, 0, []byte("fresh")))
	if rs[0].Block.Generation != 3 || rs[1].Slot != h.index {
		t.Fatalf("allocate-and-write: %+v", rs)
	}
	if res := h.commit(AllocateBlock(free[0], 4)); res.Code != pb.Code_CODE_CONFLICT {
		t.Fatalf("second allocation of the same block: %v", res.Code)
	}
	// The lowest free block goes first.
	if p := h.mustCommit(Allocate(testExtent, 5))[0].Block; p.Page != got[5].Page {
		t.Fatalf("allocation after frees took %v, want block 5", p)
	}
	meta, pending, err := h.sm.Info()
	if err != nil || meta.BlocksAllocated != g.Blocks() || meta.PagesUsed != 1 || len(pending) != 0 {
		t.Fatalf("info: %+v pending %d err %v", meta, len(pending), err)
	}
}

// TestTxnStepsOnReplicas drives the FSS §6 states on two extents' state
// machines by hand: prepare locks, prepare-and-decide commits,
// decide-and-release applies, and fence/abort leave nothing behind.
func TestTxnStepsOnReplicas(t *testing.T) {
	const ea, eb = testExtent, testExtent + 1
	a, b := newSMHarness(t, ea, smallGeometry()), newSMHarness(t, eb, smallGeometry())
	pa := a.mustCommit(Allocate(ea, 1))[0].Block
	pb_ := b.mustCommit(Allocate(eb, 1))[0].Block
	exp := a.now + 5000

	// Commit: prepare A, prepare-and-decide B, decide-and-release A, release B.
	res := a.step(pb.StepKind_STEP_KIND_PREPARE, 77, 0, eb, exp, Write(pa, 0, []byte("A")), Allocate(ea, 9))
	if res.Code != pb.Code_CODE_OK || res.Record.State != pb.TxnState_TXN_STATE_PREPARED {
		t.Fatalf("prepare: %v %s", res.Code, res.Message)
	}
	reserved := pointerFromProto(res.Results[1].Block)
	if _, code := a.read(pa); code != pb.Code_CODE_PREPARED {
		t.Fatalf("read of a prepared page: %v", code)
	}
	_, refused, _ := a.sm.ReadPage(pa)
	if refused.Holder.GetTxnId() != 77 || refused.Holder.GetNextExtent() != eb {
		t.Fatalf("holder of the prepared page: %v", refused.Holder)
	}
	if r := a.commit(Write(pa, 0, []byte("other"))); r.Code != pb.Code_CODE_PREPARED {
		t.Fatalf("conflicting MPSC on a prepared page: %v", r.Code)
	}
	if r := a.commit(Allocate(ea, 2)); r.Code != pb.Code_CODE_OK || pointerFromProto(r.Results[0].Block).Page == reserved.Page {
		t.Fatalf("allocation next to a reservation: %v %v", r.Code, r.Results)
	}
	res = b.step(pb.StepKind_STEP_KIND_PREPARE_DECIDE, 77, ea, 0, exp, Write(pb_, 0, []byte("B")))
	if res.Code != pb.Code_CODE_OK || res.Record.State != pb.TxnState_TXN_STATE_DECIDED {
		t.Fatalf("prepare-and-decide: %v %s", res.Code, res.Message)
	}
	if p, _ := b.read(pb_); string(p.Data) != "B" {
		t.Fatalf("decided extent reads %q", p.Data)
	}
	res = a.step(pb.StepKind_STEP_KIND_DECIDE_RELEASE, 77, 0, 0, exp)
	if res.Code != pb.Code_CODE_OK || res.Record.State != pb.TxnState_TXN_STATE_COMMITTED || res.Results[0].Slot != a.index {
		t.Fatalf("decide-and-release: %v %+v", res.Code, res.Results)
	}
	if p, code := a.read(pa); code != pb.Code_CODE_OK || string(p.Data) != "A" || p.Slot != a.index {
		t.Fatalf("after decide-and-release: %q %v %v", p.Data, p.Slot, code)
	}
	if _, code := a.read(reserved.WithPage(reserved.Page)); code != pb.Code_CODE_OK {
		t.Fatalf("block allocated by the transaction: %v", code)
	}
	res = b.step(pb.StepKind_STEP_KIND_RELEASE, 77, 0, 0, exp)
	if res.Record.State != pb.TxnState_TXN_STATE_COMMITTED {
		t.Fatalf("release: %v", res.Record.State)
	}
	// Repeats change nothing.
	before := a.kv.Dump()
	for _, k := range []pb.StepKind{pb.StepKind_STEP_KIND_DECIDE_RELEASE, pb.StepKind_STEP_KIND_FENCE} {
		if r := a.step(k, 77, 0, 0, exp); r.Code != pb.Code_CODE_OK || r.Record.State != pb.TxnState_TXN_STATE_COMMITTED {
			t.Fatalf("repeated %v: %v %v", k, r.Code, r.Record.State)
		}
	}
	if r := a.step(pb.StepKind_STEP_KIND_PREPARE, 77, 0, eb, exp, Check(pa, 0)); r.Code != pb.Code_CODE_ABORTED {
		t.Fatalf("prepare of a finished transaction: %v", r.Code)
	}
	// The coordinator's prepare-and-decide, repeated after its reply was
	// lost and recovery released the decision, learns it committed.
	beforeB := b.kv.Dump()
	if r := b.step(pb.StepKind_STEP_KIND_PREPARE_DECIDE, 77, ea, 0, exp, Write(pb_, 0, []byte("B"))); r.Code != pb.Code_CODE_OK || r.Record.State != pb.TxnState_TXN_STATE_COMMITTED {
		t.Fatalf("repeated prepare-and-decide of a released transaction: %v %s %v", r.Code, r.Message, r.Record.GetState())
	}
	if b.kv.Dump() != beforeB {
		t.Fatal("the repeated prepare-and-decide changed the state")
	}
	if a.kv.Dump() != before {
		t.Fatal("repeated steps changed the state")
	}

	// Abort: prepare A, fence B (recovery's promise), abort A.
	slotA := a.index - 3
	if p, _ := a.read(pa); p.Slot != slotA {
		t.Fatalf("slot of page A %d, want %d", p.Slot, slotA)
	}
	before = a.kv.Dump()
	r78 := a.step(pb.StepKind_STEP_KIND_PREPARE, 78, 0, eb, exp, Write(pa, slotA, []byte("never")), Allocate(ea, 9))
	if r78.Code != pb.Code_CODE_OK {
		t.Fatalf("prepare 78: %v %s", r78.Code, r78.Message)
	}
	reserved78 := pointerFromProto(r78.Results[1].Block)
	if r := b.step(pb.StepKind_STEP_KIND_FENCE, 78, 0, 0, exp); r.Record.State != pb.TxnState_TXN_STATE_ABORTED {
		t.Fatalf("fence: %v", r.Record.State)
	}
	if r := b.step(pb.StepKind_STEP_KIND_PREPARE_DECIDE, 78, ea, 0, exp, Check(pb_, 0)); r.Code != pb.Code_CODE_ABORTED {
		t.Fatalf("prepare-and-decide after a fence: %v", r.Code)
	}
	r := a.step(pb.StepKind_STEP_KIND_ABORT, 78, 0, 0, exp)
	if r.Record.State != pb.TxnState_TXN_STATE_ABORTED {
		t.Fatalf("abort: %v", r.Record.State)
	}
	after := a.kv.Dump()
	// Only the tombstone, its gc entry and the bookkeeping differ.
	if p, code := a.read(pa); code != pb.Code_CODE_OK || string(p.Data) != "A" || p.Slot != slotA {
		t.Fatalf("aborted write visible: %q %d %v", p.Data, p.Slot, code)
	}
	if held(after) != held(before)+2 {
		t.Fatalf("abort left %d keys more, want the tombstone and its gc entry:\nbefore\n%s\nafter\n%s",
			held(after)-held(before), before, after)
	}
	if p := a.mustCommit(Allocate(ea, 3))[0].Block; p.Page != reserved78.Page || p.Generation != 1 {
		t.Fatalf("allocation after the aborted reservation took %v, want the block it released, %v", p, reserved78)
	}

	// An expired transaction is refused.
	if r := a.step(pb.StepKind_STEP_KIND_PREPARE, 79, 0, eb, a.now-1, Check(pa, slotA)); r.Code != pb.Code_CODE_ABORTED {
		t.Fatalf("expired prepare: %v %s", r.Code, r.Message)
	}
}

// TestAbortedReservationIsReused: an allocation reserved by a prepare and
// then aborted returns its block to the free pool.
func TestAbortedReservationIsReused(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	exp := h.now + 5000
	r := h.step(pb.StepKind_STEP_KIND_PREPARE, 5, 0, testExtent+1, exp, Allocate(testExtent, 1))
	got := pointerFromProto(r.Results[0].Block)
	if got.Page != 0 {
		t.Fatalf("reserved %v", got)
	}
	if p := h.mustCommit(Allocate(testExtent, 2))[0].Block; p.Page == 0 {
		t.Fatal("reserved block allocated twice")
	}
	h.step(pb.StepKind_STEP_KIND_ABORT, 5, 0, 0, exp)
	if p := h.mustCommit(Allocate(testExtent, 2))[0].Block; p.Page != 0 || p.Generation != 1 {
		t.Fatalf("after the abort the lowest free block is %v, want block 0 at generation 1", p)
	}
}

func TestTombstonesAreCollected(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	exp := h.now + 1000
	h.step(pb.StepKind_STEP_KIND_FENCE, 42, 0, 0, exp)
	if rec, _ := h.sm.QueryTxn(42); rec.State != pb.TxnState_TXN_STATE_ABORTED {
		t.Fatalf("fence: %v", rec.State)
	}
	h.now = exp + tombstoneRetention.Milliseconds() + 1
	h.mustCommit(Allocate(testExtent, 1))
	if rec, _ := h.sm.QueryTxn(42); rec.State != pb.TxnState_TXN_STATE_NONE {
		t.Fatalf("tombstone not collected: %v", rec.State)
	}
	for _, k := range h.kv.Keys([]byte{prefixGC}, []byte{prefixGC + 1}) {
		t.Fatalf("gc entry left: %x", k)
	}
	// A fence after expiry writes no tombstone but moves the clock, so no
	// prepare of the transaction can follow.
	before := h.kv.Len()
	if r := h.step(pb.StepKind_STEP_KIND_FENCE, 43, 0, 0, h.now-10); r.Record.State != pb.TxnState_TXN_STATE_ABORTED {
		t.Fatalf("late fence: %v", r.Record.State)
	}
	if h.kv.Len() != before {
		t.Fatal("late fence wrote a tombstone")
	}
	h.now = 1 // a leader with a slow clock
	if r := h.step(pb.StepKind_STEP_KIND_PREPARE, 43, 0, testExtent+1, exp+tombstoneRetention.Milliseconds()-10,
		Allocate(testExtent, 1)); r.Code != pb.Code_CODE_ABORTED {
		t.Fatalf("prepare after a late fence under a slow clock: %v %s", r.Code, r.Message)
	}
}

func TestReadOfWrittenDataIsACopy(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 1))[0].Block
	h.mustCommit(Write(blk, 0, []byte("abc")))
	p, _ := h.read(blk)
	p.Data[0] = 'X'
	q, _ := h.read(blk)
	if !bytes.Equal(q.Data, []byte("abc")) {
		t.Fatalf("read returned shared memory: %q", q.Data)
	}
}

// held counts the keys of a dump but released locks (lock keys whose
// holder is 0, kept so that their reads stay cheap).
func held(dump string) int {
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(dump), "\n") {
		if line == "" {
			continue
		}
		if (strings.HasPrefix(line, "6b") || strings.HasPrefix(line, "6c")) && strings.HasSuffix(line, "=0000000000000000") {
			continue
		}
		n++
	}
	return n
}
