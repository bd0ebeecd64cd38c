package tract

import (
	"context"
	"errors"
	"testing"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// degradedBlobOps sums the nodes' blob operations acknowledged with row
// members missing.
func (c *testCluster) degradedBlobOps() uint64 {
	var n uint64
	for _, node := range c.nodes {
		if node.svc != nil {
			n += node.svc.Metrics().DegradedBlobOps
		}
	}
	return n
}

// TestBlobOpsWithMembersDeclaredDead: on 7 nodes with rows of 7 (no
// server can replace a dead member), blob create, extend and delete
// wait while a dead member is still held alive by the directory, go on
// once it is declared dead (acknowledged by the members left, two of
// seven missing), stop again when a majority of the row is missing, and
// the members that come back hold every record (verify compares each
// member's records with the primary's: a member lacking one fails it).
func TestBlobOpsWithMembersDeclaredDead(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	before := randomTracts(3, 31)
	gOld := putECBlob(t, cl, before)
	gGone := putBlob(t, cl, randomTracts(2, 32), 3)

	// A member killed but not yet declared dead: operations wait (the
	// member may be alive and merely cut off from this primary).
	const first, second = 3, 5
	c.crash(first)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := cl.CreateBlobLayout(sctx, NewGUID(), ec52, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create with a member down and alive in the directory: %v, want it to wait (deadline exceeded)", err)
	}

	// Declared dead: the operations go on, and stripes are written (6 of
	// 7 shards). Then a second one: the operations still go on (stripe
	// writes wait now: they need Data+1 shards).
	c.dir.setState(first, dpb.NodeState_NODE_STATE_DEAD)
	c.step()
	var made []GUID
	var want [][][]byte
	for i := range 3 {
		data := randomTracts(2, uint64(40+i))
		made = append(made, putECBlob(t, cl, data))
		want = append(want, data)
	}
	c.crash(second)
	c.dir.setState(second, dpb.NodeState_NODE_STATE_DEAD)
	c.step()
	var sized []GUID
	for i := range 3 {
		g := NewGUID()
		if _, err := cl.CreateBlobLayout(ctx, g, ec52, uint64(i+1)); err != nil {
			t.Fatalf("create with two members dead: %v", err)
		}
		sized = append(sized, g)
	}
	b, err := cl.OpenBlob(ctx, gOld)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Extend(ctx, 2); err != nil || n != uint64(len(before))+2 {
		t.Fatalf("extend with two members dead: %d, %v", n, err)
	}
	if err := cl.DeleteBlob(ctx, gGone); err != nil {
		t.Fatalf("delete with two members dead: %v", err)
	}
	if c.degradedBlobOps() == 0 {
		t.Fatal("no blob operation was acknowledged with members missing")
	}
	t.Logf("%d blob operations acknowledged with members %d and %d dead", c.degradedBlobOps(), first, second)

	// Four of seven dead: no majority of the row holds a record; wait.
	// (The manager does not run: promotions past the stripes' two lost
	// shards are not this test's.) A blob whose metadata primary is
	// alive, so that only the majority rule refuses it.
	const third, fourth = 6, 7
	for _, id := range []uint64{third, fourth} {
		c.crash(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_DEAD)
	}
	tab := c.table()
	g := NewGUID()
	for p := tab.Rows[tab.Locate(g, MetadataTract)].Slots[0].Node; p == first || p == second || p == third || p == fourth; p = tab.Rows[tab.Locate(g, MetadataTract)].Slots[0].Node {
		g = NewGUID()
	}
	sctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	_, err = cl.CreateBlobLayout(sctx, g, ec52, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create with 4 of the row's 7 members dead: %v, want it to wait (deadline exceeded)", err)
	}

	// Everyone back: every member catches up every record.
	for _, id := range []uint64{first, second, third, fourth} {
		c.restart(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_ALIVE)
	}
	c.settle()
	var rep *VerifyReport
	last := time.Now()
	c.waitFor("every member's records equal to the primary's", func() bool {
		rep, err = cl.Verify(ctx, VerifyOptions{})
		if ok := err == nil && rep.OK(); ok || time.Since(last) < 5*time.Second {
			return ok
		}
		last = time.Now()
		if err != nil {
			t.Logf("verify: %v", err)
		} else {
			t.Logf("verify: %d problems: %q", rep.ProblemsTotal, rep.Problems)
		}
		return false
	})
	for i, g := range made {
		checkBlob(t, cl, g, want[i])
	}
	checkSized := func() {
		t.Helper()
		for i, g := range sized {
			b, err := cl.OpenBlob(ctx, g)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := b.Size(ctx); err != nil || n != uint64(i+1) || b.Info().Layout != ec52 {
				t.Fatalf("blob %s created with two members dead: %d tracts, layout %v, %v", g, n, b.Info().Layout, err)
			}
		}
	}
	checkSized()
	if b, err = cl.OpenBlob(ctx, gOld); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Size(ctx); err != nil || n != uint64(len(before))+2 {
		t.Fatalf("the extended blob after the return: %d tracts, %v", n, err)
	}
	if _, err := cl.OpenBlob(ctx, gGone); err == nil {
		t.Fatal("the blob deleted with members dead is back")
	}
}
