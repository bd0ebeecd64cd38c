package extent

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"

	"google.golang.org/protobuf/proto"
)

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// allocate takes a block in extent for tenant, with the test's patience.
func allocate(t testing.TB, cl *Client, extent, tenant uint64) Pointer {
	t.Helper()
	return retry(t, "allocate", 10*time.Second, func(ctx context.Context) (Pointer, error) {
		rs, err := cl.Commit(ctx, []Element{Allocate(extent, tenant)})
		if err != nil {
			return Pointer{}, err
		}
		return rs[0].Block, nil
	})
}

// TestClientReadsAndWrites covers the client's data path end to end:
// routing (a replica forwards to the leader), slots, ownership, and that
// bad input is refused with a clear error and changes nothing.
func TestClientReadsAndWrites(t *testing.T) {
	c := newTestCluster(t, 3, 1)
	g := smallGeometry()
	ext := c.createExtent(g, 1, 2, 3)
	cl := c.client(nil)
	blk := allocate(t, cl, ext, 11)

	ctx := ctxTimeout(t, 10*time.Second)
	p, err := cl.ReadPage(ctx, blk.WithPage(1))
	if err != nil || len(p.Data) != 0 || p.Slot != 0 {
		t.Fatalf("unwritten page: %+v %v", p, err)
	}
	rs, err := cl.Commit(ctx, []Element{Write(blk.WithPage(1), 0, []byte("one")), Write(blk.WithPage(2), 0, []byte("two"))})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Slot == 0 || rs[0].Slot != rs[1].Slot {
		t.Fatalf("slots %+v: want one raft index for both pages", rs)
	}
	p, err = cl.ReadPage(ctx, blk.WithPage(2))
	if err != nil || string(p.Data) != "two" || p.Slot != rs[1].Slot {
		t.Fatalf("read back %q at %d (%v), want \"two\" at %d", p.Data, p.Slot, err, rs[1].Slot)
	}

	// A stale generation or a wrong tenant fails, through the client too.
	if _, err := cl.ReadPage(ctx, Pointer{Extent: ext, Page: 1, Generation: blk.Generation, Tenant: 12}); !errors.Is(err, ErrStale) {
		t.Fatalf("read with a wrong tenant: %v", err)
	}
	if _, err := cl.Commit(ctx, []Element{Free(blk)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReadPage(ctx, blk.WithPage(2)); !errors.Is(err, ErrStale) {
		t.Fatalf("read through a stale generation: %v", err)
	}

	// Bad input.
	blk = allocate(t, cl, ext, 11)
	rs, err = cl.Commit(ctx, []Element{Write(blk, 0, []byte("keep"))})
	if err != nil {
		t.Fatal(err)
	}
	keep := rs[0].Slot
	sixteen := make([]Element, 16)
	for i := range sixteen {
		sixteen[i] = Write(blk.WithPage(uint64(i%4)), keep, []byte("x"))
	}
	for name, tc := range map[string]struct {
		elems []Element
		want  error
	}{
		"more than 15 pages": {sixteen, ErrInvalid},
		"unknown page":       {[]Element{Write(blk.WithPage(g.Pages()+5), 0, []byte("x"))}, ErrInvalid},
		"oversize page":      {[]Element{Write(blk, keep, make([]byte, g.PageSizeBytes+1))}, ErrInvalid},
		"stale slot":         {[]Element{Write(blk, keep-1, []byte("x"))}, ErrConflict},
		"unknown extent":     {[]Element{Write(Pointer{Extent: ext + 100, Generation: 1, Tenant: 11}, 0, []byte("x"))}, ErrNotFound},
		"system group":       {[]Element{Write(Pointer{Extent: 1, Generation: 1, Tenant: 11}, 0, []byte("x"))}, ErrInvalid},
		"stale pointer":      {[]Element{Write(Pointer{Extent: ext, Generation: 1, Tenant: 11}, keep, []byte("x"))}, ErrStale},
	} {
		_, err := cl.Commit(ctx, tc.elems)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		if p, rerr := cl.ReadPage(ctx, blk); rerr != nil || string(p.Data) != "keep" || p.Slot != keep {
			t.Fatalf("%s changed page 0: %q at %d (%v)", name, p.Data, p.Slot, rerr)
		}
	}
	if _, err := cl.ReadPage(ctx, blk.WithPage(g.Pages())); !errors.Is(err, ErrInvalid) {
		t.Errorf("read of an unknown page: %v", err)
	}
	if _, err := cl.ReadPage(ctx, Pointer{Extent: ext + 100, Generation: 1, Tenant: 1}); !errors.Is(err, ErrNotFound) {
		t.Errorf("read of an unknown extent: %v", err)
	}
}

// waitStats waits until every replica of each extent has applied the same
// commands, and returns the sum over extents of one replica's stats.
func waitStats(t *testing.T, c *testCluster, extents []uint64) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var total Stats
		agree := true
		for _, e := range extents {
			var first *Stats
			for _, sm := range c.stateMachines(e) {
				s := sm.Stats()
				if first == nil {
					first = &s
				} else if s != *first {
					agree = false
				}
			}
			if first != nil {
				total.Prepares += first.Prepares
				total.PrepareDecides += first.PrepareDecides
				total.DecideReleases += first.DecideReleases
				total.Releases += first.Releases
				total.Commits += first.Commits
				total.Aborts += first.Aborts
				total.Fences += first.Fences
			}
		}
		if agree {
			return total
		}
		if time.Now().After(deadline) {
			t.Fatal("replicas did not converge")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCommitTakes2nTransitions counts FSS §6's claim: a commit over n
// extents is exactly 2n state transitions (n-1 prepares, one
// prepare-and-decide, n-1 decide-and-releases, one release), each one raft
// entry at one extent; within one extent it is a single entry.
func TestCommitTakes2nTransitions(t *testing.T) {
	c := newTestCluster(t, 3, 2)
	const maxN = 5
	var extents []uint64
	var blocks []Pointer
	cl := c.client(nil)
	for range maxN {
		e := c.createExtent(smallGeometry(), 1, 2, 3)
		extents = append(extents, e)
		blocks = append(blocks, allocate(t, cl, e, 5))
	}
	ctx := ctxTimeout(t, 30*time.Second)
	slots := make([]uint64, maxN)

	before := waitStats(t, c, extents)
	rs, err := cl.Commit(ctx, []Element{Write(blocks[0], 0, []byte("single")), Write(blocks[0].WithPage(1), 0, []byte("same extent"))})
	if err != nil {
		t.Fatal(err)
	}
	slots[0] = rs[0].Slot
	after := waitStats(t, c, extents)
	if after.Commits-before.Commits != 1 || after.TxnTransitions() != before.TxnTransitions() {
		t.Fatalf("single-extent MPSC: %d commits, %d transitions; want 1 and 0", after.Commits-before.Commits, after.TxnTransitions()-before.TxnTransitions())
	}

	for n := 2; n <= maxN; n++ {
		before := waitStats(t, c, extents)
		steps0 := cl.Steps()
		var elems []Element
		for i := range n {
			elems = append(elems, Write(blocks[i], slots[i], []byte(fmt.Sprintf("n=%d extent %d", n, i))))
		}
		rs, err := cl.Commit(ctx, elems)
		if err != nil {
			t.Fatalf("commit over %d extents: %v", n, err)
		}
		if s := cl.Steps(); s.Release == steps0.Release && s.DecideRelease-steps0.DecideRelease != uint64(n-1) {
			t.Fatalf("n=%d: commit returned before its decide-and-release steps: %+v", n, s)
		}
		// The last extent's release runs after the answer: wait until it is
		// applied (not only sent: under -race it can lag the counter).
		after := waitStats(t, c, extents)
		for deadline := time.Now().Add(10 * time.Second); after.Releases == before.Releases && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			after = waitStats(t, c, extents)
		}
		got := after.TxnTransitions() - before.TxnTransitions()
		steps := cl.Steps()
		sent := (steps.Prepare - steps0.Prepare) + (steps.PrepareDecide - steps0.PrepareDecide) +
			(steps.DecideRelease - steps0.DecideRelease) + (steps.Release - steps0.Release)
		t.Logf("n=%d: %d state transitions applied, %d steps sent (prepare %d, prepare-and-decide %d, decide-and-release %d, release %d)",
			n, got, sent, after.Prepares-before.Prepares, after.PrepareDecides-before.PrepareDecides,
			after.DecideReleases-before.DecideReleases, after.Releases-before.Releases)
		if got != uint64(2*n) || sent != uint64(2*n) {
			t.Fatalf("commit over %d extents took %d transitions (%d steps sent), want 2n = %d", n, got, sent, 2*n)
		}
		if after.Prepares-before.Prepares != uint64(n-1) || after.PrepareDecides-before.PrepareDecides != 1 ||
			after.DecideReleases-before.DecideReleases != uint64(n-1) || after.Releases-before.Releases != 1 {
			t.Fatalf("n=%d: wrong mix of transitions: %+v -> %+v", n, before, after)
		}
		for i := range n {
			if rs[i].Slot == 0 {
				t.Fatalf("n=%d: no slot for extent %d", n, i)
			}
			p, err := cl.ReadPage(ctx, blocks[i])
			if err != nil || string(p.Data) != fmt.Sprintf("n=%d extent %d", n, i) || p.Slot != rs[i].Slot {
				t.Fatalf("n=%d extent %d reads %q at %d (%v), want slot %d", n, i, p.Data, p.Slot, err, rs[i].Slot)
			}
			slots[i] = rs[i].Slot
		}
	}
}

// TestCoordinatorCrashAtEveryStep crashes the coordinator of a transaction
// over three extents before each of its 2n steps, then lets a reader that
// meets a prepared page run recovery (FSS §6's prefix/suffix rule): the
// transaction commits exactly when the crash came after prepare-and-decide,
// and afterwards nothing is left locked.
func TestCoordinatorCrashAtEveryStep(t *testing.T) {
	c := newTestCluster(t, 3, 3)
	const n = 3
	var extents []uint64
	var blocks []Pointer
	cl := c.client(nil)
	for range n {
		e := c.createExtent(smallGeometry(), 1, 2, 3)
		extents = append(extents, e)
		blocks = append(blocks, allocate(t, cl, e, 5))
	}
	ctx := ctxTimeout(t, 60*time.Second)
	slots := make([]uint64, n)
	for crashBefore := 1; crashBefore <= 2*n; crashBefore++ {
		coord := c.client(nil)
		coord.hooks.beforeStep = func(step int, _ pb.StepKind) bool { return step == crashBefore }
		var elems []Element
		for i := range n {
			elems = append(elems, Write(blocks[i], slots[i], []byte(fmt.Sprintf("crash %d", crashBefore))))
		}
		// A fresh block allocated in the middle extent, by the same
		// transaction: the lowest free one.
		elems = append(elems, Allocate(extents[1], 6))
		next := retry(t, "free blocks", 5*time.Second, func(ctx context.Context) ([]FreeBlock, error) { return cl.FreeBlocks(ctx, extents[1], 0, 1) })[0]
		if _, err := coord.Commit(ctx, elems); !errors.Is(err, errCoordinatorCrashed) {
			t.Fatalf("crash before step %d: %v", crashBefore, err)
		}
		committed := crashBefore > n // step n is prepare-and-decide
		// Readers meet prepared pages and recover through them.
		for i := range n {
			for {
				p, err := cl.ReadPage(ctx, blocks[i])
				if ref, ok := PreparedTxn(err); ok {
					outcome, rerr := cl.Recover(ctx, ref)
					if rerr != nil {
						t.Fatalf("crash before step %d: recover %v: %v", crashBefore, ref, rerr)
					}
					want := OutcomeAborted
					if committed {
						want = OutcomeCommitted
					}
					if outcome != want {
						t.Fatalf("crash before step %d: recovery found %v, want %v", crashBefore, outcome, want)
					}
					continue
				}
				if err != nil {
					t.Fatalf("crash before step %d: read extent %d: %v", crashBefore, i, err)
				}
				wrote := string(p.Data) == fmt.Sprintf("crash %d", crashBefore)
				if wrote != committed {
					t.Fatalf("crash before step %d: extent %d reads %q: committed %v", crashBefore, i, p.Data, committed)
				}
				slots[i] = p.Slot
				break
			}
		}
		// Nothing stays locked. A crash before the release leaves only the
		// last extent's DECIDED record (it locks nothing; background
		// recovery would release it after the expiry): releasing it is
		// recovery's job too.
		for _, e := range extents {
			info := retry(t, "info", 5*time.Second, func(ctx context.Context) (*pb.InfoResponse, error) { return cl.Info(ctx, e) })
			for _, rec := range info.Pending {
				if rec.State != pb.TxnState_TXN_STATE_DECIDED || crashBefore != 2*n {
					t.Fatalf("crash before step %d: extent %d still holds %v", crashBefore, e, rec)
				}
				if out, err := cl.Recover(ctx, TxnRef{ID: rec.TxnId, Extent: e}); err != nil || out != OutcomeCommitted {
					t.Fatalf("crash before the release: recovery %v %v", out, err)
				}
			}
			info = retry(t, "info", 5*time.Second, func(ctx context.Context) (*pb.InfoResponse, error) { return cl.Info(ctx, e) })
			if len(info.Pending) != 0 {
				t.Fatalf("crash before step %d: extent %d still has pending transactions %v", crashBefore, e, info.Pending)
			}
		}
		// The middle extent's allocation happened only with the commit.
		free := retry(t, "free blocks", 5*time.Second, func(ctx context.Context) ([]FreeBlock, error) { return cl.FreeBlocks(ctx, extents[1], 0, 1) })
		switch {
		case len(free) != 1:
			t.Fatalf("crash before step %d: free blocks %+v", crashBefore, free)
		case !committed && free[0] != next:
			t.Fatalf("crash before step %d: aborted, yet the lowest free block is %+v, not %+v", crashBefore, free[0], next)
		case committed && free[0].Page != next.Page+smallGeometry().PagesPerBlock():
			t.Fatalf("crash before step %d: committed, yet the lowest free block is %+v (reserved %+v)", crashBefore, free[0], next)
		}
		if committed {
			blk := Pointer{Extent: extents[1], Page: next.Page, Generation: next.Generation + 1, Tenant: 6}
			if _, err := cl.Commit(ctx, []Element{Free(blk)}); err != nil {
				t.Fatalf("free the transaction's block %v: %v", blk, err)
			}
		}
	}
}

// TestBackgroundRecoveryReleasesLocks: nobody recovers the transactions a
// crashed coordinator left prepared; the extent leaders resolve them once
// they are past their expiry (readers only wait).
func TestBackgroundRecoveryReleasesLocks(t *testing.T) {
	c := newTestCluster(t, 3, 4)
	a, b := c.createExtent(smallGeometry(), 1, 2, 3), c.createExtent(smallGeometry(), 1, 2, 3)
	cl := c.client(nil)
	pa, pb_ := allocate(t, cl, a, 1), allocate(t, cl, b, 1)
	// Steps: 1 prepare a, 2 prepare-and-decide b, 3 decide-and-release a, 4 release b.
	for _, crashBefore := range []int{2, 3} {
		coord := c.client(nil)
		coord.hooks.beforeStep = func(step int, _ pb.StepKind) bool { return step == crashBefore }
		sa := retry(t, "read", 5*time.Second, func(ctx context.Context) (Page, error) { return cl.ReadPage(ctx, pa) }).Slot
		sb := retry(t, "read", 5*time.Second, func(ctx context.Context) (Page, error) { return cl.ReadPage(ctx, pb_) }).Slot
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := coord.Commit(ctx, []Element{Write(pa, sa, []byte("bg")), Write(pb_, sb, []byte("bg"))})
		cancel()
		if !errors.Is(err, errCoordinatorCrashed) {
			t.Fatal(err)
		}
		rctx := ctxTimeout(t, 5*time.Second)
		if _, err := cl.ReadPage(rctx, pa); !errors.Is(err, ErrPrepared) {
			t.Fatalf("crash before step %d: page a is not held: %v", crashBefore, err)
		}
		// The expiry is the deadline plus expirySlack; then staleGrace and
		// a recovery interval pass.
		p := retry(t, "read after background recovery", 15*time.Second, func(ctx context.Context) (Page, error) { return cl.ReadPage(ctx, pa) })
		want := ""
		if crashBefore > 2 {
			want = "bg"
		}
		if string(p.Data) != want {
			t.Fatalf("crash before step %d: page a reads %q, want %q", crashBefore, p.Data, want)
		}
		if q := retry(t, "read b", 5*time.Second, func(ctx context.Context) (Page, error) { return cl.ReadPage(ctx, pb_) }); string(q.Data) != want {
			t.Fatalf("crash before step %d: page b reads %q, want %q", crashBefore, q.Data, want)
		}
		retry(t, "no pending transaction at b", 10*time.Second, func(ctx context.Context) (bool, error) {
			info, err := cl.Info(ctx, b)
			if err == nil && len(info.Pending) != 0 {
				err = fmt.Errorf("pending %v", info.Pending)
			}
			return true, err
		})
	}
	var recovered uint64
	for id := uint64(1); id <= 3; id++ {
		recovered += c.node(id).node.recovered.Load()
	}
	if recovered < 2 {
		t.Fatalf("background recovery resolved %d transactions, want at least 2", recovered)
	}
}

// TestRepeatedRequestGetsFirstReply: a request the network (or the fault
// injector) delivers twice runs once; the repeat gets the first reply,
// even when running it again would now give another answer.
func TestRepeatedRequestGetsFirstReply(t *testing.T) {
	c := newTestCluster(t, 3, 5)
	ext := c.createExtent(smallGeometry(), 1, 2, 3)
	cl := c.client(nil)
	blk := allocate(t, cl, ext, 1)
	ctx := ctxTimeout(t, 10*time.Second)
	srv := c.node(c.leader(ext)).node.Server()
	commit := func(id uint64, elems ...Element) (*pb.CommitResponse, error) {
		req := &pb.CommitRequest{ExtentId: ext, RequestId: id}
		for _, e := range elems {
			req.Elements = append(req.Elements, e.toProto())
		}
		return srv.Commit(ctx, req)
	}

	// An allocation repeated: one block.
	first, err := commit(101, Allocate(ext, 1))
	if err != nil {
		t.Fatal(err)
	}
	again, err := commit(101, Allocate(ext, 1))
	if err != nil || !proto.Equal(again, first) {
		t.Fatalf("repeat of an allocation: %v %v, want the first reply", again, err)
	}
	info, err := cl.Info(ctx, ext)
	if err != nil || info.Meta.BlocksAllocated != 2 {
		t.Fatalf("blocks allocated %d (%v), want 2", info.GetMeta().GetBlocksAllocated(), err)
	}

	// A write refused because a prepared transaction holds the page, then
	// repeated after the transaction is gone: still refused, still no write.
	exp := time.Now().Add(5 * time.Second).UnixMilli()
	if _, err := cl.step(ctx, pb.StepKind_STEP_KIND_PREPARE, ext, 555, 0, ext+1, exp, []*pb.Element{Check(blk, 0).toProto()}); err != nil {
		t.Fatal(err)
	}
	_, err = commit(102, Write(blk, 0, []byte("late")))
	if d, ok := detailOf(err); !ok || d.Code != pb.Code_CODE_PREPARED {
		t.Fatalf("write to a prepared page: %v", err)
	}
	if _, err := cl.step(ctx, pb.StepKind_STEP_KIND_ABORT, ext, 555, 0, 0, exp, nil); err != nil {
		t.Fatal(err)
	}
	_, err = commit(102, Write(blk, 0, []byte("late")))
	if d, ok := detailOf(err); !ok || d.Code != pb.Code_CODE_PREPARED {
		t.Fatalf("repeat of the refused write: %v, want the first refusal", err)
	}
	if p, err := cl.ReadPage(ctx, blk); err != nil || len(p.Data) != 0 {
		t.Fatalf("page after the repeat: %q %v", p.Data, err)
	}
	if _, err := commit(103, Write(blk, 0, []byte("new request"))); err != nil {
		t.Fatalf("a new request: %v", err)
	}
}

// TestCheckValidatesWithoutRaftEntry: a check-only validation answers like
// a Commit of the same checks (current slots: nil; a moved slot:
// ErrConflict; a stale pointer: ErrStale; a page a prepared transaction
// holds: ErrPrepared; anything but checks: ErrInvalid) across extents,
// and adds no raft entry to any of them.
func TestCheckValidatesWithoutRaftEntry(t *testing.T) {
	c := newTestCluster(t, 3, 5)
	a, b := c.createExtent(smallGeometry(), 1, 2, 3), c.createExtent(smallGeometry(), 1, 2, 3)
	cl := c.client(nil)
	pa, pb_ := allocate(t, cl, a, 1), allocate(t, cl, b, 1)
	ctx := ctxTimeout(t, 20*time.Second)
	rs, err := cl.Commit(ctx, []Element{Write(pa, 0, []byte("a")), Write(pb_, 0, []byte("b"))})
	if err != nil {
		t.Fatal(err)
	}
	sa, sb := rs[0].Slot, rs[1].Slot
	// The commit's last release follows its answer: let it land.
	retry(t, "no pending transaction at b", 10*time.Second, func(ctx context.Context) (bool, error) {
		info, err := cl.Info(ctx, b)
		if err == nil && len(info.Pending) != 0 {
			err = fmt.Errorf("pending %v", info.Pending)
		}
		return true, err
	})
	applied := func() uint64 {
		s := waitStats(t, c, []uint64{a, b})
		return s.Commits + s.TxnTransitions()
	}
	before := applied()
	if err := cl.Check(ctx, []Element{Check(pa, sa), Check(pb_, sb)}); err != nil {
		t.Fatalf("check of current slots: %v", err)
	}
	if err := cl.Check(ctx, []Element{Check(pa, sa), Check(pb_, sb-1)}); !errors.Is(err, ErrConflict) {
		t.Fatalf("check of a moved slot: %v, want a conflict", err)
	}
	stale := pa
	stale.Generation++
	if err := cl.Check(ctx, []Element{Check(stale, sa)}); !errors.Is(err, ErrStale) {
		t.Fatalf("check of a stale pointer: %v, want stale", err)
	}
	if err := cl.Check(ctx, []Element{Write(pa, sa, []byte("x"))}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("check holding a write: %v, want invalid", err)
	}
	if after := applied(); after != before {
		t.Fatalf("checks applied %d commands", after-before)
	}

	// A prepared transaction holding page a (its coordinator crashed
	// before the commit point) makes the check refuse with its holder.
	coord := c.client(nil)
	coord.hooks.beforeStep = func(step int, _ pb.StepKind) bool { return step == 2 }
	cctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err = coord.Commit(cctx, []Element{Write(pa, sa, []byte("held")), Write(pb_, sb, []byte("held"))})
	cancel()
	if !errors.Is(err, errCoordinatorCrashed) {
		t.Fatal(err)
	}
	retry(t, "page a held", 5*time.Second, func(ctx context.Context) (bool, error) {
		err := cl.Check(ctx, []Element{Check(pa, sa)})
		if errors.Is(err, ErrPrepared) {
			return true, nil
		}
		return false, fmt.Errorf("check of a held page: %v, want prepared", err)
	})
}
