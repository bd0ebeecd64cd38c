package extent

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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// fakeDirectory is the directory's extent map and node table in memory,
// with the same contract as the real directory client for what the extent
// store uses (epochs on replica changes, the client's sentinel errors:
// directory.ErrNotFound, directory.ErrStaleEpoch).
type fakeDirectory struct {
	mu         sync.Mutex
	extents    map[uint64]*dpb.Extent
	nodes      map[uint64]*dpb.Node
	nextExtent uint64
}

func newFakeDirectory() *fakeDirectory {
	return &fakeDirectory{extents: map[uint64]*dpb.Extent{}, nodes: map[uint64]*dpb.Node{}, nextExtent: FirstExtentID}
}

func cloneExtent(e *dpb.Extent) *dpb.Extent {
	return &dpb.Extent{ExtentId: e.ExtentId, Geometry: e.Geometry, Replicas: slices.Clone(e.Replicas), Epoch: e.Epoch}
}

func (d *fakeDirectory) GetExtent(_ context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.extents[req.ExtentId]
	if e == nil {
		return nil, fmt.Errorf("%w: extent %d does not exist", directory.ErrNotFound, req.ExtentId)
	}
	return cloneExtent(e), nil
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
		resp.Extents = append(resp.Extents, cloneExtent(d.extents[id]))
	}
	return resp, nil
}

func (d *fakeDirectory) GetNode(_ context.Context, req *dpb.GetNodeRequest) (*dpb.Node, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[req.NodeId]
	if n == nil {
		return nil, fmt.Errorf("%w: node %d", directory.ErrNotFound, req.NodeId)
	}
	return &dpb.Node{Id: n.Id, Address: n.Address, FailureDomain: n.FailureDomain, Roles: n.Roles, State: n.State}, nil
}

func (d *fakeDirectory) ListNodes(context.Context, *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp := &dpb.ListNodesResponse{}
	for _, n := range d.nodes {
		resp.Nodes = append(resp.Nodes, &dpb.Node{Id: n.Id, Address: n.Address, FailureDomain: n.FailureDomain, Roles: n.Roles, State: n.State})
	}
	return resp, nil
}

func (d *fakeDirectory) CreateExtent(_ context.Context, req *dpb.CreateExtentRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(req.Replicas) != int(req.Geometry.GetReplication()) {
		return nil, fmt.Errorf("%w: %d replicas for replication %d", directory.ErrInvalidArgument, len(req.Replicas), req.Geometry.GetReplication())
	}
	e := &dpb.Extent{ExtentId: d.nextExtent, Geometry: req.Geometry, Replicas: slices.Clone(req.Replicas), Epoch: 1}
	d.nextExtent++
	d.extents[e.ExtentId] = e
	return cloneExtent(e), nil
}

func (d *fakeDirectory) ChangeExtentReplicas(_ context.Context, req *dpb.ChangeExtentReplicasRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.extents[req.ExtentId]
	if e == nil {
		return nil, fmt.Errorf("%w: extent %d", directory.ErrNotFound, req.ExtentId)
	}
	if e.Epoch != req.ExpectedEpoch {
		return nil, fmt.Errorf("%w: extent %d is at epoch %d, not %d", directory.ErrStaleEpoch, req.ExtentId, e.Epoch, req.ExpectedEpoch)
	}
	for _, r := range req.Replicas {
		if n := d.nodes[r]; n == nil || n.State == dpb.NodeState_NODE_STATE_DEAD {
			return nil, fmt.Errorf("%w: node %d is not usable", directory.ErrInvalidArgument, r)
		}
	}
	e.Replicas, e.Epoch = slices.Clone(req.Replicas), e.Epoch+1
	return cloneExtent(e), nil
}

func (d *fakeDirectory) setNodeState(id uint64, s dpb.NodeState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes[id].State = s
}

func (d *fakeDirectory) extentMap(id uint64) *dpb.Extent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return cloneExtent(d.extents[id])
}

// testNode is one in-process node: engine, extent store, gRPC server.
type testNode struct {
	store  *raftengine.Store
	engine *raftengine.Engine
	node   *Node
	srv    *grpc.Server
}

// testCluster is nodes in one process: raft over a LocalNetwork, every
// node's in-memory disk crashable, the Extent service over in-memory gRPC
// connections, and a fake directory.
type testCluster struct {
	t      testing.TB
	net    *raftengine.LocalNetwork
	dir    *fakeDirectory
	logger *slog.Logger
	// nodeFaults, if set, faults every call a node makes to another.
	nodeFaults *faults.Injector
	manager    func(id uint64) *ManagerConfig

	mu    sync.Mutex
	fs    map[uint64]*vfs.MemFS
	nodes map[uint64]*testNode
	lis   map[string]*bufconn.Listener
}

func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func newTestCluster(t testing.TB, n int, seed uint64) *testCluster {
	c := &testCluster{
		t: t, net: raftengine.NewLocalNetwork(seed), dir: newFakeDirectory(), logger: testLogger(),
		fs: map[uint64]*vfs.MemFS{}, nodes: map[uint64]*testNode{}, lis: map[string]*bufconn.Listener{},
	}
	t.Cleanup(c.close)
	for id := uint64(1); id <= uint64(n); id++ {
		c.addNode(id)
	}
	return c
}

func nodeAddr(id uint64) string { return fmt.Sprintf("n%d", id) }

func (c *testCluster) addNode(id uint64) {
	c.dir.mu.Lock()
	c.dir.nodes[id] = &dpb.Node{Id: id, Address: "passthrough:///" + nodeAddr(id), FailureDomain: fmt.Sprintf("rack-%d", id),
		Roles: []string{StorageRole}, State: dpb.NodeState_NODE_STATE_ALIVE}
	c.dir.mu.Unlock()
	c.mu.Lock()
	c.fs[id] = vfs.NewCrashableMem()
	c.mu.Unlock()
	c.start(id)
}

// dialOptions reach the cluster's nodes in memory; inj, if set, faults
// every call.
func (c *testCluster) dialOptions(inj *faults.Injector) []grpc.DialOption {
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

func (c *testCluster) start(id uint64) {
	c.t.Helper()
	c.mu.Lock()
	fs := c.fs[id]
	c.mu.Unlock()
	st, err := raftengine.OpenStore("/db", fs, c.logger)
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	e, err := raftengine.Open(raftengine.Config{
		NodeID: id, Store: st, Transport: c.net.Transport(id), Factory: NewStateMachine,
		Logger: c.logger, TickInterval: 10 * time.Millisecond,
	})
	if err != nil {
		c.t.Fatalf("open engine %d: %v", id, err)
	}
	var mc *ManagerConfig
	if c.manager != nil {
		mc = c.manager(id)
	}
	n, err := NewNode(NodeConfig{Engine: e, Directory: c.dir, DialOptions: c.dialOptions(c.nodeFaults), Logger: c.logger,
		RecoveryInterval: 100 * time.Millisecond, Manager: mc})
	if err != nil {
		c.t.Fatal(err)
	}
	// Stop waits for running handlers, so the store outlives them.
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	n.Register(srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	c.net.Heal()
	if err := e.Start(); err != nil {
		c.t.Fatal(err)
	}
	n.Start()
	c.mu.Lock()
	c.nodes[id] = &testNode{store: st, engine: e, node: n, srv: srv}
	c.lis[nodeAddr(id)] = lis
	c.mu.Unlock()
}

// crash stops node id as a power loss would: what it had not synced is lost.
func (c *testCluster) crash(id uint64) {
	c.mu.Lock()
	tn := c.nodes[id]
	delete(c.nodes, id)
	delete(c.lis, nodeAddr(id))
	c.mu.Unlock()
	if tn == nil {
		return
	}
	tn.srv.Stop()
	_ = tn.node.Stop()
	// The crash point: from here the node neither hears nor says anything
	// (Detach alone would let it keep sending acks for entries it syncs
	// after the clone, which a real crash would have lost), and its disk
	// keeps only what it had synced.
	c.net.Isolate(id, c.peers(id)...)
	c.net.Detach(id)
	c.mu.Lock()
	crashed := c.fs[id].CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	c.fs[id] = crashed
	c.mu.Unlock()
	tn.engine.Stop()
	_ = tn.store.Close()
}

// peers lists every node id the cluster ever had but id.
func (c *testCluster) peers(id uint64) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint64
	for p := range c.fs {
		if p != id {
			out = append(out, p)
		}
	}
	return out
}

func (c *testCluster) close() {
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

func (c *testCluster) node(id uint64) *testNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// createExtent records an extent in the directory and bootstraps its group
// on replicas.
func (c *testCluster) createExtent(g Geometry, replicas ...uint64) uint64 {
	c.t.Helper()
	g.Replication = uint32(len(replicas))
	e, err := c.dir.CreateExtent(context.Background(), &dpb.CreateExtentRequest{Geometry: dirGeometry(g), Replicas: replicas})
	if err != nil {
		c.t.Fatal(err)
	}
	desc, err := GroupDescriptor(e.ExtentId, g)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range replicas {
		if err := c.node(r).engine.CreateGroup(context.Background(), desc, replicas); err != nil {
			c.t.Fatal(err)
		}
	}
	c.leader(e.ExtentId)
	return e.ExtentId
}

// leader waits for extent id to have a leader and returns it.
func (c *testCluster) leader(id uint64) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for nid, tn := range c.nodes {
			if st, err := tn.engine.Status(id); err == nil && st.IsLeader() {
				c.mu.Unlock()
				return nid
			}
		}
		c.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("extent %d has no leader", id)
	return 0
}

// client returns a client of the cluster; inj, if set, faults its calls.
func (c *testCluster) client(inj *faults.Injector) *Client {
	c.t.Helper()
	cl, err := NewClient(ClientConfig{Directory: c.dir, DialOptions: c.dialOptions(inj), Logger: c.logger, CallTimeout: 2 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// stateMachines returns the local state machines of extent id on every
// running node that holds one.
func (c *testCluster) stateMachines(id uint64) map[uint64]*StateMachine {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]*StateMachine{}
	for nid, tn := range c.nodes {
		if raw, err := tn.engine.StateMachine(id); err == nil {
			out[nid] = raw.(*StateMachine)
		}
	}
	return out
}

// retry runs fn until it succeeds or the deadline passes: a test's
// patience, never the library's.
func retry[T any](t testing.TB, what string, within time.Duration, fn func(ctx context.Context) (T, error)) T {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := fn(ctx)
		cancel()
		if err == nil {
			return v
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, last)
	var zero T
	return zero
}
