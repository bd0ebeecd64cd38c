package meta

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/directory/directorytest"
	"github.com/arbor-storage/arbor/internal/fs"
)

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// TestClusterCapacity checks the sum against a hand count: which nodes
// count, where their figures come from, and the division by k.
func TestClusterCapacity(t *testing.T) {
	node := func(id uint64, state dpb.NodeState, roles []string, disks ...*dpb.Disk) *dpb.Node {
		return &dpb.Node{Id: id, State: state, Roles: roles, Disks: disks}
	}
	alive, suspect, dead, gone := dpb.NodeState_NODE_STATE_ALIVE, dpb.NodeState_NODE_STATE_SUSPECT,
		dpb.NodeState_NODE_STATE_DEAD, dpb.NodeState_NODE_STATE_DECOMMISSIONED
	storage, metaOnly := []string{"directory", storageRole}, []string{RoleMeta}
	nodes := []*dpb.Node{
		node(1, alive, storage, &dpb.Disk{CapacityBytes: 100 * gib}),   // stats below win
		node(2, suspect, storage, &dpb.Disk{CapacityBytes: 100 * gib}), // still counts
		node(3, dead, storage, &dpb.Disk{CapacityBytes: 100 * gib}),    // counts for nothing
		node(4, gone, storage, &dpb.Disk{CapacityBytes: 100 * gib}),
		node(5, alive, metaOnly, &dpb.Disk{CapacityBytes: 100 * gib}), // serves no disks
		// No statistics yet: its registered disks.
		node(6, alive, storage, &dpb.Disk{CapacityBytes: 40 * gib, UsedBytes: 10 * gib}, &dpb.Disk{CapacityBytes: 20 * gib}),
	}
	stats := []*dpb.MemberStats{
		{NodeId: 1, CapacityBytes: 90 * gib, FreeBytes: 30 * gib},
		{NodeId: 2, CapacityBytes: 60 * gib, FreeBytes: 60 * gib},
		{NodeId: 3, CapacityBytes: 500 * gib, FreeBytes: 500 * gib},
	}
	// Raw: 90 + 60 + 60 total, 30 + 60 + 50 free.
	for _, tc := range []struct {
		k           uint32
		total, free uint64
	}{{3, 70 * gib, 140 * gib / 3}, {1, 210 * gib, 140 * gib}, {0, 210 * gib, 140 * gib}} {
		got := clusterCapacity(nodes, stats, tc.k)
		if want := (fs.Capacity{TotalBytes: tc.total, FreeBytes: tc.free}); got != want {
			t.Errorf("k=%d: capacity %+v, want %+v", tc.k, got, want)
		}
	}
	sf := fs.StatFS{Frsize: 4096, Bsize: 4096}.WithCapacity(fs.Capacity{TotalBytes: 10*4096 + 100, FreeBytes: 4*4096 + 1})
	if sf.Blocks != 10 || sf.Bfree != 4 || sf.Bavail != 4 {
		t.Errorf("WithCapacity: blocks %d free %d avail %d, want 10 4 4", sf.Blocks, sf.Bfree, sf.Bavail)
	}
}

// storageNode is a node registered with the real directory through a
// real node agent whose heartbeats report the figures the test sets.
type storageNode struct {
	capacity, free atomic.Uint64
	cancel         context.CancelFunc
	done           chan struct{}
}

func startStorageNode(t *testing.T, dir *directorytest.Cluster, log *slog.Logger, id, capacity, free uint64) *storageNode {
	t.Helper()
	n := &storageNode{done: make(chan struct{})}
	n.capacity.Store(capacity)
	n.free.Store(free)
	a, err := directory.NewNodeAgent(directory.AgentConfig{Directory: dir.Client(),
		Node: &dpb.RegisterRequest{NodeId: id, Address: fmt.Sprintf("127.0.0.1:%d", 1+id), Roles: []string{storageRole},
			Disks: []*dpb.Disk{{Path: "/disk", CapacityBytes: capacity}}},
		Stats: func() *dpb.MemberStats {
			return &dpb.MemberStats{CapacityBytes: n.capacity.Load(), FreeBytes: n.free.Load()}
		},
		Interval: directorytest.Detector.HeartbeatInterval, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { defer close(n.done); _ = a.Run(ctx) }()
	t.Cleanup(n.stop)
	for deadline := time.Now().Add(20 * time.Second); a.Epoch() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node %d never registered", id)
		}
	}
	return n
}

func (n *storageNode) stop() {
	n.cancel()
	<-n.done
}

// TestStatFSReportsClusterCapacity runs statfs through a mount, the
// metadata client and server against a real directory whose storage
// nodes heartbeat their disks' figures: the total is their capacity over
// the TLT's replication, a dead node drops out, and used space grows when
// the nodes' disks fill.
func TestStatFSReportsClusterCapacity(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("capacity")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const k = 3
	var nodes []*storageNode
	for id := uint64(101); id <= 104; id++ {
		nodes = append(nodes, startStorageNode(t, c.dir, c.log, id, 30*gib, 20*gib))
	}
	var slots []*dpb.TractServer
	for id := uint64(101); id < 101+k; id++ {
		slots = append(slots, &dpb.TractServer{NodeId: id})
	}
	if _, err := c.dir.Client().InstallTLT(ctx, &dpb.InstallTLTRequest{Replication: k, Rows: []*dpb.TLTRow{{Slots: slots}}}); err != nil {
		t.Fatal(err)
	}

	// waitFor polls statfs until it shows total and free bytes of file
	// data (the cache and the directory's stats flush lag a few seconds).
	waitFor := func(what string, total, free uint64) {
		t.Helper()
		var sf fs.StatFS
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var err error
			if sf, err = x.FS().StatFS(ctx); err != nil {
				t.Fatal(err)
			}
			if sf.Blocks == total/uint64(sf.Frsize) && sf.Bfree == free/uint64(sf.Frsize) && sf.Bavail == sf.Bfree {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: statfs shows %d blocks, %d free, %d available of %d bytes; want %d bytes, %d free",
					what, sf.Blocks, sf.Bfree, sf.Bavail, sf.Frsize, total, free)
			}
		}
	}
	waitFor("four live nodes", 4*30*gib/k, 4*20*gib/k)

	// A file of 300 MiB at k = 3 takes 300 MiB on each of three disks.
	for _, n := range nodes[:k] {
		n.free.Store(20*gib - 300*mib)
	}
	waitFor("after writing", 4*30*gib/k, (4*20*gib-k*300*mib)/k)

	nodes[3].stop()
	c.waitNodeState(ctx, 104, dpb.NodeState_NODE_STATE_DEAD)
	waitFor("node 104 dead", 3*30*gib/k, (3*20*gib-k*300*mib)/k)
}
