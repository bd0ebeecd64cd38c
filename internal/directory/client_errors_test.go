package directory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/directory/directorytest"
)

// allSentinels are the directory's sentinel errors, for checking that an
// error matches its own and no other.
var allSentinels = []error{directory.ErrInvalidArgument, directory.ErrUnknownNode, directory.ErrStaleEpoch,
	directory.ErrNotFound, directory.ErrConflict, directory.ErrLeaseHeld, directory.ErrExpired,
	directory.ErrAlreadyExists, directory.ErrNotInitialized, directory.ErrDecommissioned,
	directory.ErrNodeDead, directory.ErrLimitExceeded}

func matchesOnly(t *testing.T, what string, err, want error) {
	t.Helper()
	for _, s := range allSentinels {
		if errors.Is(err, s) != (s == want) {
			t.Errorf("%s: %v: errors.Is(err, %v) = %v", what, err, s, errors.Is(err, s))
		}
	}
}

// TestResultErrorSentinels checks that every refusal code maps to one
// sentinel.
func TestResultErrorSentinels(t *testing.T) {
	if err := directory.ResultError(&pb.CommandResult{}); err != nil {
		t.Fatalf("OK maps to %v", err)
	}
	seen := map[error]bool{}
	for code := range pb.ErrorCode_name {
		if code == 0 {
			continue
		}
		err := directory.ResultError(&pb.CommandResult{Code: pb.ErrorCode(code), Message: "test"})
		var want error
		for _, s := range allSentinels {
			if errors.Is(err, s) {
				want = s
			}
		}
		if want == nil || seen[want] {
			t.Errorf("code %v: %v matches no sentinel of its own", pb.ErrorCode(code), err)
		}
		seen[want] = true
		matchesOnly(t, pb.ErrorCode(code).String(), err, want)
	}
}

// TestClientErrorsAreSentinels checks that the directory's refusals, over
// real gRPC, reach the Client's caller as errors errors.Is matches to the
// directory's sentinels, in words without gRPC's wrapping.
func TestClientErrorsAreSentinels(t *testing.T) {
	c := directorytest.Start(t, 1)
	cl := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, err := cl.GetFileSystem(ctx, &pb.GetFileSystemRequest{Name: "nothing"})
	matchesOnly(t, "get a missing file system", err, directory.ErrNotFound)
	if !directory.IsNotFound(err) || directory.CodeOf(err) != pb.ErrorCode_NOT_FOUND {
		t.Errorf("IsNotFound and CodeOf no longer see %v", err)
	}
	if msg := err.Error(); strings.Contains(msg, "rpc error") || !strings.HasPrefix(msg, "directory: GetFileSystem: ") {
		t.Errorf("error text %q: want the method and the directory's words, not gRPC's", msg)
	}

	if _, err := cl.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: "one"}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: "one"})
	matchesOnly(t, "create a file system twice", err, directory.ErrAlreadyExists)

	_, err = cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 77, Epoch: 1})
	matchesOnly(t, "heartbeat of an unregistered node", err, directory.ErrUnknownNode)

	_, err = cl.InstallTLT(ctx, &pb.InstallTLTRequest{Replication: 0})
	matchesOnly(t, "a TLT of replication 0", err, directory.ErrInvalidArgument)

	n1, n2 := c.Register(11, "127.0.0.1:11"), c.Register(12, "127.0.0.1:12")
	if _, err := cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "l", HolderNode: 11, HolderEpoch: n1.Epoch(), DurationMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "l", HolderNode: 12, HolderEpoch: n2.Epoch(), DurationMs: 60_000})
	matchesOnly(t, "a lease another holds", err, directory.ErrLeaseHeld)
	if !directory.IsRefusal(err) {
		t.Errorf("IsRefusal(%v) = false", err)
	}
	_, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "m", HolderNode: 12, HolderEpoch: n2.Epoch() + 5, DurationMs: 60_000})
	matchesOnly(t, "a lease for a future epoch", err, directory.ErrStaleEpoch)

	// No answer at all is not a refusal.
	dctx, dcancel := context.WithTimeout(ctx, time.Millisecond)
	defer dcancel()
	<-dctx.Done()
	if _, err := cl.ListNodes(dctx, &pb.ListNodesRequest{}); err == nil || directory.IsRefusal(err) {
		t.Errorf("a call whose context ended: %v, IsRefusal %v", err, directory.IsRefusal(err))
	}
}
