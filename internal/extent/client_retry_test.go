package extent

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/faults"
)

// TestClientRidesThroughLeaderCrash: the leader of an extent crashes and
// the next commits and reads, on a client that still believes in the dead
// leader, succeed within their deadline: the client routes around the
// dead node and retries while the survivors elect a new leader (issue 13
// items 4 and 6), instead of failing "unavailable" or "ambiguous".
func TestClientRidesThroughLeaderCrash(t *testing.T) {
	c := newTestCluster(t, 3, 11)
	ext := c.createExtent(smallGeometry(), 1, 2, 3)
	cl := c.client(nil)
	blk := allocate(t, cl, ext, 1)
	p := blk.WithPage(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := cl.Commit(ctx, []Element{Write(p, 0, []byte("before"))})
	if err != nil {
		t.Fatal(err)
	}
	slot := rs[0].Slot
	dead := c.leader(ext)
	c.crash(dead)
	t.Logf("crashed leader %d", dead)
	start := time.Now()
	rs, err = cl.Commit(ctx, []Element{Write(p, slot, []byte("after"))})
	if err != nil {
		t.Fatalf("commit after the leader's crash: %v", err)
	}
	pg, err := cl.ReadPage(ctx, p)
	if err != nil || string(pg.Data) != "after" || pg.Slot != rs[0].Slot {
		t.Fatalf("read after the crash: %q at %d, %v; want %q at %d", pg.Data, pg.Slot, err, "after", rs[0].Slot)
	}
	if cl.Retries() == 0 {
		t.Fatal("the client reached a new leader without a retry: the crash was not exercised")
	}
	t.Logf("rode through the crash in %v with %d retries", time.Since(start).Round(time.Millisecond), cl.Retries())

	// With no quorum left, a call fails at its deadline, not later, and
	// says the extent is unavailable.
	c.crash(c.leader(ext))
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	start = time.Now()
	_, err = cl.ReadPage(short, p)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read without a quorum: %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("read without a quorum took %v past a 500ms deadline", el)
	}
}

// TestLostRepliesAreResentAndRunOnce: with a third of the client's
// Commit calls failing (the request or the reply lost), every
// conditional write of a chain still succeeds exactly once: a write whose
// reply was lost is resent under its request id, and the extent answers
// the repeat with the first reply instead of running it again (which
// would conflict: its slot moved).
func TestLostRepliesAreResentAndRunOnce(t *testing.T) {
	c := newTestCluster(t, 3, 12)
	ext := c.createExtent(smallGeometry(), 1, 2, 3)
	blk := allocate(t, c.client(nil), ext, 1)
	inj, err := faults.New(faults.Options{Config: faults.Config{Seed: 12, FailRate: 0.3, Methods: "/.*/Commit"}})
	if err != nil {
		t.Fatal(err)
	}
	cl := c.client(inj)
	p := blk.WithPage(2)
	var slot uint64
	for i := range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rs, err := cl.Commit(ctx, []Element{Write(p, slot, []byte(fmt.Sprint(i)))})
		cancel()
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		slot = rs[0].Slot
	}
	pg, err := c.client(nil).ReadPage(context.Background(), p)
	if err != nil || string(pg.Data) != "39" || pg.Slot != slot {
		t.Fatalf("page reads %q at %d (%v), want %q at %d", pg.Data, pg.Slot, err, "39", slot)
	}
	repeats := uint64(0)
	for _, sm := range c.stateMachines(ext) {
		repeats = max(repeats, sm.Stats().Repeats)
	}
	if inj.Counts().RepliesLost == 0 || repeats == 0 {
		t.Fatalf("%d replies lost, %d repeats answered from memory: the test did not lose a reply", inj.Counts().RepliesLost, repeats)
	}
	t.Logf("%d requests and %d replies lost, %d retries, %d repeats answered from the extent's memory", inj.Counts().RequestsLost, inj.Counts().RepliesLost, cl.Retries(), repeats)
}

// TestUnknownOutcomeSurvivesLaterRefusals: a write whose first attempt
// timed out (it may have committed) and whose retries then find no
// leader until the deadline is ambiguous, not unavailable: the retries
// say nothing about the first attempt. (The model check saw a 3-extent
// transaction reported as not committed, and committed, this way.)
func TestUnknownOutcomeSurvivesLaterRefusals(t *testing.T) {
	c := newTestCluster(t, 3, 13)
	ext := c.createExtent(smallGeometry(), 1, 2, 3)
	cl := c.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	attempts := 0
	_, err := invoke(ctx, cl, "commit", ext, true, true, func(context.Context, pb.ExtentClient) (*pb.CommitResponse, error) {
		attempts++
		if attempts == 1 {
			return nil, status.Error(codes.DeadlineExceeded, "reply lost")
		}
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_NOT_LEADER, ExtentId: ext, Message: "no leader"})
	})
	if !errors.Is(err, ErrAmbiguous) || attempts < 2 {
		t.Fatalf("after %d attempts: %v; want ErrAmbiguous", attempts, err)
	}
	// Without the unknown first attempt, the refusal is what it says.
	attempts = 0
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = invoke(ctx2, cl, "commit", ext, true, true, func(context.Context, pb.ExtentClient) (*pb.CommitResponse, error) {
		attempts++
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_NOT_LEADER, ExtentId: ext, Message: "no leader"})
	})
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAmbiguous) {
		t.Fatalf("after %d attempts: %v; want ErrUnavailable", attempts, err)
	}
}
