package extent

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine/raftenginetest"
)

// smHarness drives one replica's state machine directly.
type smHarness struct {
	t     *testing.T
	sm    *StateMachine
	kv    *raftenginetest.MemKV
	index uint64
	now   int64
}

const testExtent = FirstExtentID

func smallGeometry() Geometry {
	return Geometry{PageSizeBytes: 512, BlockSizeBytes: 2048, ExtentSizeBytes: 16 * 2048, Replication: 3}
}

func newSMHarness(t *testing.T, id uint64, g Geometry) *smHarness {
	t.Helper()
	desc, err := GroupDescriptor(id, g)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := NewStateMachine(desc)
	if err != nil {
		t.Fatal(err)
	}
	h := &smHarness{t: t, sm: raw.(*StateMachine), kv: raftenginetest.NewMemKV(), index: 10, now: 1_000_000}
	if err := h.sm.Load(h.kv); err != nil {
		t.Fatal(err)
	}
	return h
}

// apply applies cmd at the next index and returns the result.
func (h *smHarness) apply(cmd *pb.Command) *pb.CommandResult {
	h.t.Helper()
	if cmd.NowUnixMs == 0 {
		cmd.NowUnixMs = h.now
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.applyRaw(data)
}

func (h *smHarness) applyRaw(data []byte) *pb.CommandResult {
	h.t.Helper()
	h.index++
	out, err := h.sm.Apply(h.kv, h.index, data)
	if err != nil {
		h.t.Fatalf("apply at %d: %v", h.index, err)
	}
	return out.(*pb.CommandResult)
}

func (h *smHarness) commit(elems ...Element) *pb.CommandResult {
	h.t.Helper()
	var pes []*pb.Element
	for _, e := range elems {
		pes = append(pes, e.toProto())
	}
	return h.apply(&pb.Command{Op: &pb.Command_Commit{Commit: &pb.CommitCmd{Elements: pes}}})
}

func (h *smHarness) mustCommit(elems ...Element) []Result {
	h.t.Helper()
	res := h.commit(elems...)
	if res.Code != pb.Code_CODE_OK {
		h.t.Fatalf("commit: %v: %s", res.Code, res.Message)
	}
	return resultsFromProto(res.Results)
}

func (h *smHarness) read(p Pointer) (Page, pb.Code) {
	h.t.Helper()
	page, refused, err := h.sm.ReadPage(p)
	if err != nil {
		h.t.Fatal(err)
	}
	if refused != nil {
		return Page{}, refused.Code
	}
	return page, pb.Code_CODE_OK
}

func (h *smHarness) step(kind pb.StepKind, id, prev, next uint64, expiry int64, elems ...Element) *pb.CommandResult {
	h.t.Helper()
	var pes []*pb.Element
	for _, e := range elems {
		pes = append(pes, e.toProto())
	}
	txn := &pb.TxnCmd{TxnId: id, ExpiryUnixMs: expiry}
	cmd := &pb.Command{}
	switch kind {
	case pb.StepKind_STEP_KIND_PREPARE, pb.StepKind_STEP_KIND_PREPARE_DECIDE:
		cmd.Op = &pb.Command_Prepare{Prepare: &pb.PrepareCmd{TxnId: id, PrevExtent: prev, NextExtent: next, ExpiryUnixMs: expiry,
			Elements: pes, Decide: kind == pb.StepKind_STEP_KIND_PREPARE_DECIDE}}
	case pb.StepKind_STEP_KIND_DECIDE_RELEASE:
		cmd.Op = &pb.Command_DecideRelease{DecideRelease: txn}
	case pb.StepKind_STEP_KIND_RELEASE:
		cmd.Op = &pb.Command_Release{Release: txn}
	case pb.StepKind_STEP_KIND_ABORT:
		cmd.Op = &pb.Command_Abort{Abort: txn}
	case pb.StepKind_STEP_KIND_FENCE:
		cmd.Op = &pb.Command_Fence{Fence: txn}
	}
	return h.apply(cmd)
}
