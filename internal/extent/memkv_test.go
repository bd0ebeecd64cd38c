package extent

import (
	"bytes"
	"fmt"
	"sort"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// memKV is a raftengine.Writer over a sorted map: the state machine's key
// space without an engine, so its core can be driven step by step.
type memKV struct{ m map[string][]byte }

func newMemKV() *memKV { return &memKV{m: map[string][]byte{}} }

func (kv *memKV) Get(key []byte) ([]byte, error) {
	v, ok := kv.m[string(key)]
	if !ok {
		return nil, raftengine.ErrNotFound
	}
	return bytes.Clone(v), nil
}

func (kv *memKV) keys(start, end []byte) []string {
	var ks []string
	for k := range kv.m {
		if k >= string(start) && (end == nil || k < string(end)) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

func (kv *memKV) Scan(start, end []byte, fn func(key, value []byte) error) error {
	for _, k := range kv.keys(start, end) {
		if err := fn([]byte(k), kv.m[k]); err != nil {
			return err
		}
	}
	return nil
}

func (kv *memKV) Set(key, value []byte) error {
	kv.m[string(key)] = bytes.Clone(value)
	return nil
}

func (kv *memKV) Delete(key []byte) error {
	delete(kv.m, string(key))
	return nil
}

func (kv *memKV) DeleteRange(start, end []byte) error {
	for _, k := range kv.keys(start, end) {
		delete(kv.m, k)
	}
	return nil
}

// dump is the whole key space, for comparing states.
func (kv *memKV) dump() string {
	var b bytes.Buffer
	for _, k := range kv.keys(nil, nil) {
		fmt.Fprintf(&b, "%x=%x\n", k, kv.m[k])
	}
	return b.String()
}

// smHarness drives one replica's state machine directly.
type smHarness struct {
	t     *testing.T
	sm    *StateMachine
	kv    *memKV
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
	h := &smHarness{t: t, sm: raw.(*StateMachine), kv: newMemKV(), index: 10, now: 1_000_000}
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
