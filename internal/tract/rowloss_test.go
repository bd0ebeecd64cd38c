package tract

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// rowStateOf returns node id's view of row r (its only disk).
func rowStateOf(c *testCluster, id uint64, r int) (rowState, bool) {
	return c.nodes[id].svc.disks[0].member(uint32(r))
}

// TestKillsDuringCatchUpLoseNothing is the nemesis's acknowledged-data
// loss (issue 13): row {A,B,C}; A and B are killed and declared dead, so
// the row becomes {C,D,E} with C promoted and D, E catching up from it;
// C is killed before they finish. A kill is not a lost disk: the row must
// wait for C (the only complete copy) rather than promote an incomplete
// member that then "declares loss" and has the others drop their tracts.
// Once the killed nodes return, every acknowledged tract reads back.
// rowWaitingForC builds the situation of TestKillsDuringCatchUpLoseNothing
// up to the waiting row: row ri = {A,B,C}; A and B killed and declared
// dead, the row becomes {C,D,E} with D and E unable to catch up from C,
// then C is killed and declared dead too. It returns the blob written
// before and the killed nodes.
func rowWaitingForC(t *testing.T, c *testCluster, cl *Client, ri int) (g GUID, want [][]byte, a, b, cNode uint64) {
	t.Helper()
	tab := c.table()
	want = randomTracts(3*len(tab.Rows), 131)
	g = putBlob(t, cl, want, 0)
	row := tab.Rows[ri]
	a, b, cNode = row.Slots[1].Node, row.Slots[2].Node, row.Slots[0].Node
	t.Logf("row %d: %v; killing %d and %d, then %d", ri, row.Slots, a, b, cNode)
	// C serves no catch-up: its new partners stay incomplete.
	refuse := func(node uint64, method string) error {
		if node == cNode && (strings.HasSuffix(method, "/ListRow") || strings.HasSuffix(method, "/FetchTract")) {
			return status.Error(codes.Unavailable, "injected: no catch-up from C")
		}
		return nil
	}
	c.refuse.Store(&refuse)
	for _, id := range []uint64{a, b} {
		c.crash(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_DEAD)
	}
	c.step()
	mid := c.table().Rows[ri]
	if mid.Slots[0].Node != cNode {
		t.Fatalf("row %d after the first repair: %v; want %d promoted", ri, mid.Slots, cNode)
	}
	c.waitFor("C to lead the row", func() bool {
		st, ok := rowStateOf(c, cNode, ri)
		return ok && st.version == mid.Version && st.inSync
	})
	for _, s := range mid.Slots[1:] {
		if st, ok := rowStateOf(c, s.Node, ri); ok && st.inSync {
			t.Fatalf("new member %s caught up although C refused", s)
		}
	}
	// C is killed before its partners caught up.
	c.crash(cNode)
	c.dir.setState(cNode, dpb.NodeState_NODE_STATE_DEAD)
	for range 5 {
		c.step()
	}
	after := c.table().Rows[ri]
	if after.Version != mid.Version || fmt.Sprint(after.Slots) != fmt.Sprint(mid.Slots) {
		t.Fatalf("row %d changed from %+v to %+v while its only complete member was down", ri, mid, after)
	}
	if w := c.manager.Waiting(); len(w) == 0 || w[0].Row != ri || w[0].For[0].Node != cNode {
		t.Fatalf("the manager reports waiting rows %v; want row %d waiting for node %d", w, ri, cNode)
	}
	c.refuse.Store(nil)
	return g, want, a, b, cNode
}

func TestKillsDuringCatchUpLoseNothing(t *testing.T) {
	c := newTestCluster(t, 6, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	g, want, a, b, cNode := rowWaitingForC(t, c, cl, 0)
	// Everyone comes back.
	for _, id := range []uint64{cNode, a, b} {
		c.restart(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_ALIVE)
	}
	c.settle()
	checkBlob(t, cl, g, want)
	rep := verifyOK(t, cl)
	if rep.Tracts != len(want) {
		t.Fatalf("verify saw %d tracts, want %d", rep.Tracts, len(want))
	}
}

// TestForgottenMemberRowRepaired: the row of TestKillsDuringCatchUpLoseNothing
// waits for C, whose disk never returns. Once C is given up (decommissioned,
// as `arbor tlt forget-member` does), the manager stops waiting and repairs
// the row from what survives: a live member becomes its primary, C's slot
// is refilled, the members get in sync, and the row takes writes again.
func TestForgottenMemberRowRepaired(t *testing.T) {
	c := newTestCluster(t, 6, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ri := 0
	_, _, a, b, cNode := rowWaitingForC(t, c, cl, ri)
	waited := c.table().Rows[ri]
	c.dir.setState(cNode, dpb.NodeState_NODE_STATE_DECOMMISSIONED)
	c.step()
	if w := c.manager.Waiting(); len(w) != 0 {
		t.Fatalf("rows still waiting after node %d was given up: %v", cNode, w)
	}
	row := c.table().Rows[ri]
	if row.Version == waited.Version {
		t.Fatalf("row %d not repaired after node %d was given up: %+v", ri, cNode, row)
	}
	for _, s := range append(row.Slots, pendingServers(row)...) {
		if s.Node == cNode || s.Node == a || s.Node == b {
			t.Fatalf("row %d still lists dead node %d: %+v", ri, s.Node, row)
		}
	}
	if row.Slots[0] != waited.Slots[1] && row.Slots[0] != waited.Slots[2] {
		t.Fatalf("row %d primary %s, want one of the surviving members %v", ri, row.Slots[0], waited.Slots[1:])
	}
	c.settle()
	// Writes to every row, this one included, work again.
	more := randomTracts(3*len(c.table().Rows), 7)
	g2 := putBlob(t, cl, more, 0)
	checkBlob(t, cl, g2, more)
}

// TestVerifyReportsTractsNoReplicaHolds: verify reported ok for a blob
// whose tracts no replica held (issue 13). A tract inside a blob that no
// replica holds (lost from every replica, or never written: a failed write
// after the blob was sized leaves such holes, and the two cannot be told
// apart), and a blob that holds none of its tracts, are counted across the
// cluster, and are problems when the blob is named.
func TestVerifyReportsTractsNoReplicaHolds(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	lost := putBlob(t, cl, randomTracts(3, 5), 0)
	verifyOK(t, cl)

	// Tract 1 of lost vanishes from every member of its row.
	k := tractKey{lost, 1}
	for _, s := range c.table().Rows[c.table().Locate(lost, 1)].Slots {
		if err := c.nodes[s.Node].svc.disks[s.Disk].store.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	// Across the cluster it is counted (it cannot be told from a hole);
	// named, the blob fails.
	rep, err := cl.Verify(ctx, VerifyOptions{})
	if err != nil || rep.Unheld != 1 || rep.Tracts != 2 {
		t.Fatalf("verify after tract %s was lost: %+v %v, want it counted as held by no replica", k, rep, err)
	}
	rep, err = cl.Verify(ctx, VerifyOptions{Blobs: []GUID{lost}})
	if err != nil || rep.ProblemsTotal != 1 || !strings.Contains(fmt.Sprint(rep.Problems), k.String()+": no replica holds it") {
		t.Fatalf("verify of blob %s after tract %s was lost: %+v %v, want it reported", lost, k, rep, err)
	}

	// A blob of two tracts none of which was written.
	empty := NewGUID()
	if _, err := cl.CreateBlobSized(ctx, empty, 0, 2); err != nil {
		t.Fatal(err)
	}
	// A blob with a hole: tract 0 written, tract 1 not.
	holed := NewGUID()
	b, err := cl.CreateBlobSized(ctx, holed, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteTract(ctx, 0, []byte("written")); err != nil {
		t.Fatal(err)
	}
	rep, err = cl.Verify(ctx, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Unheld != 4 || rep.UnheldBlobs != 1 {
		t.Fatalf("verify: %d problems %v, %d unheld tracts, %d unheld blobs; want the lost tract, the hole and the empty blob's two counted", rep.ProblemsTotal, rep.Problems, rep.Unheld, rep.UnheldBlobs)
	}
	rep, err = cl.Verify(ctx, VerifyOptions{Blobs: []GUID{empty}})
	if err != nil || rep.ProblemsTotal != 2 {
		t.Fatalf("verify of the blob none of whose tracts was written: %+v %v, want both reported", rep, err)
	}
	rep, err = cl.Verify(ctx, VerifyOptions{Blobs: []GUID{holed}})
	if err != nil || rep.ProblemsTotal != 1 || !strings.Contains(fmt.Sprint(rep.Problems), tractKey{holed, 1}.String()+": no replica holds it") {
		t.Fatalf("verify of the blob with a hole: %+v %v, want its unwritten tract reported", rep, err)
	}
}
