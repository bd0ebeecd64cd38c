package directory

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine/raftenginetest"
)

func TestRepeatedRequestAppliesOnce(t *testing.T) {
	sm := NewStateMachine()
	kv := raftenginetest.NewMemKV()
	apply := func(index uint64, id string, value string, expected uint64) *pb.CommandResult {
		t.Helper()
		cmd := &pb.Command{NowUnixMs: 1000, RequestId: []byte(id), Op: &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{
			Key: "k", Value: []byte(value), ExpectedVersion: proto.Uint64(expected),
		}}}
		data, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		out, err := sm.Apply(kv, index, data)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*pb.CommandResult)
	}
	first := apply(1, "req-a", "one", 0)
	if first.Code != pb.ErrorCode_OK {
		t.Fatalf("first put: %v", first)
	}
	// Someone else writes in between.
	if r := apply(2, "req-b", "two", 1); r.Code != pb.ErrorCode_OK {
		t.Fatalf("second writer: %v", r)
	}
	before := kv.Clone()
	// The first request arrives again (a retry after a lost reply, or a
	// duplicated RPC): it gets its first result and changes nothing, where
	// executing it again would have failed its condition.
	again := apply(3, "req-a", "one", 0)
	if !proto.Equal(again, first) {
		t.Fatalf("repeat got %v, want the first result %v", again, first)
	}
	if !kv.Equal(before) {
		t.Fatal("a repeated request changed the state")
	}
	if e, _ := sm.Config("k"); string(e.GetValue()) != "two" {
		t.Fatalf("config k = %q, want the second writer's value", e.GetValue())
	}
	// A new request with the same condition is judged on its own.
	if r := apply(4, "req-c", "one", 0); r.Code != pb.ErrorCode_CONFLICT {
		t.Fatalf("fresh request with a stale condition: %v, want CONFLICT", r)
	}
	// Ids that are too long are refused.
	if r := apply(5, string(make([]byte, maxRequestIDBytes+1)), "x", 2); r.Code != pb.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("oversize request id: %v", r)
	}
}

func TestRequestsAreForgottenAfterTheWindow(t *testing.T) {
	kv := raftenginetest.NewMemKV()
	res := &pb.CommandResult{}
	var pruned uint64
	if err := rememberRequest(kv, 10, []byte("old"), res, &pruned); err != nil {
		t.Fatal(err)
	}
	if err := rememberRequest(kv, 20, []byte("older"), res, &pruned); err != nil {
		t.Fatal(err)
	}
	if err := rememberRequest(kv, 10+requestWindowEntries+1, []byte("new"), res, &pruned); err != nil {
		t.Fatal(err)
	}
	if r, _ := repeatedRequest(kv, []byte("old")); r != nil {
		t.Fatal("a request older than the window is still remembered")
	}
	if r, _ := repeatedRequest(kv, []byte("older")); r == nil {
		t.Fatal("a request inside the window is forgotten")
	}
	// The next prune starts where this one ended and still finds what
	// fell out of the window since.
	if pruned != 11 {
		t.Fatalf("pruned below %d, want 11", pruned)
	}
	if err := rememberRequest(kv, 20+requestWindowEntries+1, []byte("newer"), res, &pruned); err != nil {
		t.Fatal(err)
	}
	if r, _ := repeatedRequest(kv, []byte("older")); r != nil {
		t.Fatal("a request that fell out of the window later is still remembered")
	}
	for _, id := range []string{"new", "newer"} {
		if r, _ := repeatedRequest(kv, []byte(id)); r == nil {
			t.Fatalf("request %s inside the window is forgotten", id)
		}
	}
}
