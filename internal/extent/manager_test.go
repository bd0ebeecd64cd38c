package extent

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

func TestPlaceSpreadsOverFailureDomains(t *testing.T) {
	nodes := nodeView{}
	for id, dom := range map[uint64]string{1: "a", 2: "a", 3: "b", 4: "c", 5: "c"} {
		nodes[id] = &dpb.Node{Id: id, FailureDomain: dom, Roles: []string{StorageRole}, State: dpb.NodeState_NODE_STATE_ALIVE}
	}
	nodes[6] = &dpb.Node{Id: 6, FailureDomain: "d", Roles: []string{StorageRole}, State: dpb.NodeState_NODE_STATE_DEAD}
	nodes[7] = &dpb.Node{Id: 7, FailureDomain: "e", Roles: []string{"directory"}, State: dpb.NodeState_NODE_STATE_ALIVE}
	load := map[uint64]int{1: 5, 2: 0, 3: 9, 4: 1, 5: 0}
	chosen, domains := map[uint64]bool{}, map[string]bool{}
	var got []uint64
	for range 3 {
		id := place(nodes, chosen, domains, load)
		chosen[id], domains[nodes[id].FailureDomain] = true, true
		got = append(got, id)
	}
	// One per domain (a, b, c), the least loaded in each; never the dead
	// node or the one without the storage role.
	if want := []uint64{2, 5, 3}; !slices.Equal(got, want) {
		t.Fatalf("placed %v, want %v", got, want)
	}
	if id := place(nodes, map[uint64]bool{1: true, 2: true, 3: true, 4: true, 5: true}, domains, load); id != 0 {
		t.Fatalf("placed on node %d with every usable node excluded", id)
	}
}

// TestManagerBootstrapsAndRepairs: with no extents, the manager creates
// its first ones (one replica per failure domain); when a node holding
// replicas dies, every extent it held gets a caught-up replica on the
// spare node, the dead one leaves the raft group, and the extent map moves
// to a new epoch. The data survives.
func TestManagerBootstrapsAndRepairs(t *testing.T) {
	c := newTestCluster(t, 0, 6)
	g := smallGeometry()
	c.manager = func(id uint64) *ManagerConfig {
		if id != 1 {
			return nil
		}
		return &ManagerConfig{Directory: c.dir, IsLeader: func() bool { return true }, InitialExtents: 3, Geometry: g,
			Interval: 50 * time.Millisecond, CatchUpTimeout: 20 * time.Second}
	}
	for id := uint64(1); id <= 4; id++ {
		c.addNode(id)
	}
	cl := c.client(nil)
	var exts []ExtentInfo
	waitUntil(t, "three extents created", 20*time.Second, func() error {
		var err error
		exts, err = cl.Extents(context.Background())
		if err == nil && len(exts) != 3 {
			err = fmt.Errorf("%d extents", len(exts))
		}
		return err
	})
	pages := map[uint64]Pointer{}
	for _, e := range exts {
		if len(e.Replicas) != 3 || e.Epoch != 1 {
			t.Fatalf("bootstrap: %+v", e)
		}
		domains := map[string]bool{}
		for _, r := range e.Replicas {
			domains[fmt.Sprintf("rack-%d", r)] = true
		}
		if len(domains) != 3 {
			t.Fatalf("extent %d replicas %v share a failure domain", e.ID, e.Replicas)
		}
		blk := allocate(t, cl, e.ID, 9)
		retry(t, "write", 10*time.Second, func(ctx context.Context) ([]Result, error) {
			return cl.Commit(ctx, []Element{Write(blk, 0, []byte(fmt.Sprintf("data of %d", e.ID)))})
		})
		pages[e.ID] = blk
	}

	// Kill a node (not the manager's) that holds replicas.
	var victim uint64
	for _, e := range exts {
		for _, r := range e.Replicas {
			if r != 1 {
				victim = r
			}
		}
	}
	c.crash(victim)
	c.dir.setNodeState(victim, dpb.NodeState_NODE_STATE_DEAD)
	for _, e := range exts {
		if !slices.Contains(e.Replicas, victim) {
			continue
		}
		waitUntil(t, fmt.Sprintf("extent %d re-replicated", e.ID), 30*time.Second, func() error {
			m := c.dir.extentMap(e.ID)
			if m.Epoch < 2 || len(m.Replicas) != 3 || slices.Contains(m.Replicas, victim) {
				return fmt.Errorf("map %v epoch %d", m.Replicas, m.Epoch)
			}
			for _, r := range m.Replicas {
				st, err := cl.ReplicaStatus(context.Background(), r, e.ID, false)
				if err != nil {
					return err
				}
				if !st.Exists || !slices.Equal(slices.Sorted(slices.Values(st.Voters)), slices.Sorted(slices.Values(m.Replicas))) {
					return fmt.Errorf("replica %d: exists %v voters %v", r, st.Exists, st.Voters)
				}
			}
			return nil
		})
	}
	for id, p := range pages {
		page := retry(t, "read", 10*time.Second, func(ctx context.Context) (Page, error) { return cl.ReadPage(ctx, p) })
		if want := fmt.Sprintf("data of %d", id); string(page.Data) != want {
			t.Fatalf("extent %d reads %q, want %q", id, page.Data, want)
		}
	}
	st := &c.node(1).node.manager.stats
	if st.repairsDone.Load() == 0 || st.created.Load() != 3 {
		t.Fatalf("manager stats: created %d repairs done %d", st.created.Load(), st.repairsDone.Load())
	}
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}
