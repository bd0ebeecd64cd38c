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
func TestKillsDuringCatchUpLoseNothing(t *testing.T) {
	c := newTestCluster(t, 6, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	tab := c.table()
	want := randomTracts(3*len(tab.Rows), 131)
	g := putBlob(t, cl, want, 0)
	// A row and its members.
	ri := 0
	row := tab.Rows[ri]
	a, b, cNode := row.Slots[1].Node, row.Slots[2].Node, row.Slots[0].Node
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
	// Everyone comes back.
	c.refuse.Store(nil)
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
