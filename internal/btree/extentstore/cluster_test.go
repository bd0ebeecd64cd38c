package extentstore

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// This file is a small in-process extent store: raft engines over a
// LocalNetwork with pebble on in-memory (crashable) file systems, the
// Extent service over in-memory gRPC, and an in-memory directory holding
// the extent map and node table. It follows internal/extent's own test
// harness, which is not importable.

// fakeDirectory is the part of the directory the extent client reads.
type fakeDirectory struct {
	mu      sync.Mutex
	extents map[uint64]*dpb.Extent
	nodes   map[uint64]*dpb.Node
	next    uint64
}

func (d *fakeDirectory) GetExtent(_ context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.extents[req.ExtentId]
	if e == nil {
		return nil, status.Errorf(codes.NotFound, "extent %d does not exist", req.ExtentId)
	}
	return &dpb.Extent{ExtentId: e.ExtentId, Geometry: e.Geometry, Replicas: slices.Clone(e.Replicas), Epoch: e.Epoch}, nil
}

func (d *fakeDirectory) ListExtents(_ context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []uint64
	for id := range d.extents {
		if id > req.StartAfter {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	resp := &dpb.ListExtentsResponse{}
	for _, id := range ids {
		e := d.extents[id]
		resp.Extents = append(resp.Extents, &dpb.Extent{ExtentId: e.ExtentId, Geometry: e.Geometry, Replicas: slices.Clone(e.Replicas), Epoch: e.Epoch})
	}
	return resp, nil
}

func (d *fakeDirectory) GetNode(_ context.Context, req *dpb.GetNodeRequest) (*dpb.Node, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[req.NodeId]
	if n == nil {
		return nil, status.Errorf(codes.NotFound, "node %d", req.NodeId)
	}
	return &dpb.Node{Id: n.Id, Address: n.Address, Roles: n.Roles, State: n.State}, nil
}

type testNode struct {
	store  *raftengine.Store
	engine *raftengine.Engine
	node   *extent.Node
	srv    *grpc.Server
}

type cluster struct {
	t      testing.TB
	net    *raftengine.LocalNetwork
	dir    *fakeDirectory
	logger *slog.Logger

	mu    sync.Mutex
	fs    map[uint64]*vfs.MemFS
	nodes map[uint64]*testNode
	lis   map[string]*bufconn.Listener
}

func testLogger() *slog.Logger {
	level := slog.LevelError + 4 // quiet: node kills log errors by design
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func newCluster(t testing.TB, n int, seed uint64) *cluster {
	c := &cluster{
		t: t, net: raftengine.NewLocalNetwork(seed), logger: testLogger(),
		dir: &fakeDirectory{extents: map[uint64]*dpb.Extent{}, nodes: map[uint64]*dpb.Node{}, next: extent.FirstExtentID},
		fs:  map[uint64]*vfs.MemFS{}, nodes: map[uint64]*testNode{}, lis: map[string]*bufconn.Listener{},
	}
	t.Cleanup(c.close)
	for id := uint64(1); id <= uint64(n); id++ {
		c.dir.mu.Lock()
		c.dir.nodes[id] = &dpb.Node{Id: id, Address: "passthrough:///" + nodeAddr(id), Roles: []string{extent.StorageRole}, State: dpb.NodeState_NODE_STATE_ALIVE}
		c.dir.mu.Unlock()
		c.mu.Lock()
		c.fs[id] = vfs.NewCrashableMem()
		c.mu.Unlock()
		c.start(id)
	}
	return c
}

func nodeAddr(id uint64) string { return fmt.Sprintf("n%d", id) }

func (c *cluster) dialOptions(inj *faults.Injector) []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c.mu.Lock()
			l := c.lis[addr]
			c.mu.Unlock()
			if l == nil {
				return nil, fmt.Errorf("no node listens at %s", addr)
			}
			return l.DialContext(ctx)
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second}),
	}
	if inj != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(inj.UnaryClientInterceptor()))
	}
	return opts
}

// start starts node id (again). Restarting heals every cut link, which is
// right while at most one node is down at a time.
func (c *cluster) start(id uint64) {
	c.t.Helper()
	c.net.Heal()
	c.mu.Lock()
	fs := c.fs[id]
	c.mu.Unlock()
	st, err := raftengine.OpenStore("/db", fs, c.logger)
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	e, err := raftengine.Open(raftengine.Config{
		NodeID: id, Store: st, Transport: c.net.Transport(id), Factory: extent.NewStateMachine,
		Logger: c.logger, TickInterval: 10 * time.Millisecond,
	})
	if err != nil {
		c.t.Fatalf("open engine %d: %v", id, err)
	}
	n, err := extent.NewNode(extent.NodeConfig{Engine: e, Directory: c.dir, DialOptions: c.dialOptions(nil), Logger: c.logger,
		RecoveryInterval: 100 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	// Stop must wait for running handlers: they read the store, which the
	// crash closes next.
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	n.Register(srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	if err := e.Start(); err != nil {
		c.t.Fatal(err)
	}
	n.Start()
	c.mu.Lock()
	c.nodes[id] = &testNode{store: st, engine: e, node: n, srv: srv}
	c.lis[nodeAddr(id)] = lis
	c.mu.Unlock()
}

// crash stops node id as a power loss would (kill -9): what it had not
// synced is lost.
func (c *cluster) crash(id uint64) {
	c.mu.Lock()
	tn := c.nodes[id]
	delete(c.nodes, id)
	delete(c.lis, nodeAddr(id))
	c.mu.Unlock()
	if tn == nil {
		return
	}
	// Cut the node's links both ways before taking the crash image:
	// Detach only stops delivery to it, and the dying engine could still
	// append, sync and acknowledge entries after the image was taken,
	// which a real crash cannot do (acknowledged entries would be lost).
	c.net.Isolate(id, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	tn.srv.Stop()
	_ = tn.node.Stop()
	c.net.Detach(id)
	c.mu.Lock()
	c.fs[id] = c.fs[id].CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	c.mu.Unlock()
	tn.engine.Stop()
	_ = tn.store.Close()
}

func (c *cluster) close() {
	c.mu.Lock()
	var ids []uint64
	for id := range c.nodes {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.crash(id)
	}
	c.net.Close()
}

// createExtent records an extent in the directory and bootstraps its group.
func (c *cluster) createExtent(g extent.Geometry, replicas ...uint64) uint64 {
	c.t.Helper()
	g.Replication = uint32(len(replicas))
	c.dir.mu.Lock()
	id := c.dir.next
	c.dir.next++
	c.dir.extents[id] = &dpb.Extent{ExtentId: id, Replicas: replicas, Epoch: 1, Geometry: &dpb.ExtentGeometry{
		PageSizeBytes: g.PageSizeBytes, BlockSizeBytes: g.BlockSizeBytes, ExtentSizeBytes: g.ExtentSizeBytes, Replication: g.Replication}}
	c.dir.mu.Unlock()
	desc, err := extent.GroupDescriptor(id, g)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range replicas {
		c.mu.Lock()
		tn := c.nodes[r]
		c.mu.Unlock()
		if err := tn.engine.CreateGroup(context.Background(), desc, replicas); err != nil {
			c.t.Fatal(err)
		}
	}
	c.waitLeader(id)
	return id
}

func (c *cluster) waitLeader(id uint64) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, tn := range c.nodes {
			if st, err := tn.engine.Status(id); err == nil && st.IsLeader() {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("extent %d has no leader", id)
}

// leaderOf returns the node leading extent id's group, or 0 if none does.
func (c *cluster) leaderOf(id uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for nid, tn := range c.nodes {
		if st, err := tn.engine.Status(id); err == nil && st.IsLeader() {
			return nid
		}
	}
	return 0
}

// client returns an extent client of the cluster; inj, if set, faults its
// calls.
func (c *cluster) client(inj *faults.Injector) *extent.Client {
	c.t.Helper()
	cl, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, DialOptions: c.dialOptions(inj), Logger: c.logger, CallTimeout: 2 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}
