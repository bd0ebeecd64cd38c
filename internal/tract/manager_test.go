package tract

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// clock is a settable clock for the manager.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

type notLeader struct{ *fakeDirectory }

func (notLeader) IsLeader() bool { return false }

func noDial(string) (grpc.ClientConnInterface, error) { return nil, fmt.Errorf("no tractservers here") }

func newTestManager(t *testing.T, dir ManagerDirectory, clk *clock, k int) *Manager {
	t.Helper()
	m, err := NewManager(ManagerConfig{Directory: dir, Dial: noDial, ClusterID: "c", TractSizeBytes: 1 << 20, Replication: k,
		Settle: 3 * time.Second, BuildWait: 30 * time.Second, Logger: testLogger(t), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func registerNodes(dir *fakeDirectory, n int, domain func(int) string) {
	for i := 1; i <= n; i++ {
		dir.setNode(&dpb.Node{Id: uint64(i), Address: fmt.Sprintf("127.0.0.1:%d", 1000+i), FailureDomain: domain(i),
			Roles: []string{"storage"}, Disks: []*dpb.Disk{{Path: "d", CapacityBytes: 100}}, State: dpb.NodeState_NODE_STATE_ALIVE, Epoch: 1})
	}
}

func TestManagerBuildsOnceStable(t *testing.T) {
	dir := newFakeDirectory()
	clk := &clock{now: time.Unix(1000, 0)}
	m := newTestManager(t, dir, clk, 3)
	ctx := context.Background()
	if err := newTestManager(t, notLeader{dir}, clk, 3).Step(ctx); err != nil || dir.Cluster() != nil {
		t.Fatalf("a manager that does not lead acted: %v", err)
	}
	if err := m.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if c := dir.Cluster(); c == nil || c.TractSizeBytes != 1<<20 || c.ClusterId != "c" {
		t.Fatalf("cluster not initialised with the tract size: %v", c)
	}
	registerNodes(dir, 4, func(i int) string { return fmt.Sprintf("d%d", i) })
	m.Step(ctx)
	if dir.TLT() != nil {
		t.Fatal("built before the set of tractservers was stable")
	}
	registerNodes(dir, 5, func(i int) string { return fmt.Sprintf("d%d", i) }) // a fifth arrives
	clk.now = clk.now.Add(2 * time.Second)
	m.Step(ctx)
	clk.now = clk.now.Add(2 * time.Second)
	m.Step(ctx)
	if dir.TLT() != nil {
		t.Fatal("built less than the settle time after the last change")
	}
	clk.now = clk.now.Add(2 * time.Second)
	if err := m.Step(ctx); err != nil {
		t.Fatal(err)
	}
	tab, err := TableFromProto(dir.TLT())
	if err != nil {
		t.Fatal(err)
	}
	if tab.Replication != 3 || len(tab.Servers()) != 5 || len(tab.Rows) < DefaultMinRows {
		t.Fatalf("table: k=%d, %d servers, %d rows", tab.Replication, len(tab.Servers()), len(tab.Rows))
	}
	// Deterministic: another manager of the same cluster builds the same.
	dir2 := newFakeDirectory()
	m2 := newTestManager(t, dir2, clk, 3)
	m2.Step(ctx)
	registerNodes(dir2, 5, func(i int) string { return fmt.Sprintf("d%d", i) })
	m2.Step(ctx)
	clk.now = clk.now.Add(4 * time.Second)
	m2.Step(ctx)
	if got, want := fmt.Sprint(dir2.TLT().Rows), fmt.Sprint(dir.TLT().Rows); got != want {
		t.Fatal("two managers built different tables from the same state")
	}
}

func TestManagerWaitsForFailureDomains(t *testing.T) {
	dir := newFakeDirectory()
	clk := &clock{now: time.Unix(1000, 0)}
	m := newTestManager(t, dir, clk, 3)
	ctx := context.Background()
	m.Step(ctx)
	// Four nodes in two racks: not enough domains for 3 replicas.
	registerNodes(dir, 4, func(i int) string { return fmt.Sprintf("rack%d", i%2) })
	m.Step(ctx)
	clk.now = clk.now.Add(10 * time.Second)
	m.Step(ctx)
	if dir.TLT() != nil {
		t.Fatal("built a 3-way table over 2 failure domains before the build wait")
	}
	clk.now = clk.now.Add(30 * time.Second)
	if err := m.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if dir.TLT() == nil {
		t.Fatal("never built: a cluster with too few domains must still work (development)")
	}
}

func TestManagerRepairsDeadNode(t *testing.T) {
	dir := newFakeDirectory()
	clk := &clock{now: time.Unix(1000, 0)}
	m := newTestManager(t, dir, clk, 3)
	ctx := context.Background()
	m.Step(ctx)
	registerNodes(dir, 5, func(i int) string { return fmt.Sprintf("d%d", i) })
	m.Step(ctx)
	clk.now = clk.now.Add(4 * time.Second)
	m.Step(ctx)
	before, _ := TableFromProto(dir.TLT())
	// Suspect: nothing moves (FDS waits for a verdict of death).
	dir.setState(2, dpb.NodeState_NODE_STATE_SUSPECT)
	m.Step(ctx)
	if dir.TLT().Version != before.Version {
		t.Fatal("the table changed for a suspect node")
	}
	dir.mu.Lock()
	dir.nodes[2].State = dpb.NodeState_NODE_STATE_DEAD
	dir.mu.Unlock()
	if err := m.Step(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := TableFromProto(dir.TLT())
	for ri, r := range after.Rows {
		if r.Has(ServerID{Node: 2}) {
			t.Fatalf("row %d still has the dead node", ri)
		}
		if changed := r.Version != before.Rows[ri].Version; changed != before.Rows[ri].Has(ServerID{Node: 2}) {
			t.Fatalf("row %d: version changed %v, had the dead node %v", ri, changed, before.Rows[ri].Has(ServerID{Node: 2}))
		}
	}
}
