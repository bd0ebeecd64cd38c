// Package extenttest is an in-process extent store for the tests of the
// layers above it (issue 13 item 7): raft engines over a LocalNetwork, each
// node's pebble on a crashable in-memory file system, the Extent service
// over in-memory gRPC, and a directory that holds the extent map and the
// node table in memory with the real directory client's contract (epochs,
// the sentinel errors of internal/directory). Nodes can be crashed (kill
// -9: what they had not synced is lost) and started again.
//
//	c := extenttest.NewCluster(t, extenttest.Options{Nodes: 3, Seed: seed})
//	ext := c.CreateExtent(g, 1, 2, 3)
//	cl := c.Client(nil) // an *extent.Client; a faults.Injector faults its calls
//	c.Crash(c.Leader(ext)); c.Start(id)
//
// The extent package's own tests cannot import it (an import cycle): they
// keep an internal harness of the same shape, which reaches the nodes'
// unexported hooks.
package extenttest

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
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Directory is the directory's extent map and node table in memory. It
// implements extent.Directory and extent.ManagerDirectory.
type Directory struct {
	mu         sync.Mutex
	extents    map[uint64]*dpb.Extent
	nodes      map[uint64]*dpb.Node
	nextExtent uint64
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{extents: map[uint64]*dpb.Extent{}, nodes: map[uint64]*dpb.Node{}, nextExtent: extent.FirstExtentID}
}

func cloneExtent(e *dpb.Extent) *dpb.Extent {
	return &dpb.Extent{ExtentId: e.ExtentId, Geometry: e.Geometry, Replicas: slices.Clone(e.Replicas), Epoch: e.Epoch}
}

func cloneNode(n *dpb.Node) *dpb.Node {
	return &dpb.Node{Id: n.Id, Address: n.Address, FailureDomain: n.FailureDomain, Roles: n.Roles, State: n.State}
}

// GetExtent implements extent.Directory.
func (d *Directory) GetExtent(_ context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.extents[req.ExtentId]
	if e == nil {
		return nil, fmt.Errorf("%w: extent %d does not exist", directory.ErrNotFound, req.ExtentId)
	}
	return cloneExtent(e), nil
}

// ListExtents implements extent.Directory (one page: every extent).
func (d *Directory) ListExtents(_ context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error) {
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

// GetNode implements extent.Directory.
func (d *Directory) GetNode(_ context.Context, req *dpb.GetNodeRequest) (*dpb.Node, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.nodes[req.NodeId]
	if n == nil {
		return nil, fmt.Errorf("%w: node %d", directory.ErrNotFound, req.NodeId)
	}
	return cloneNode(n), nil
}

// ListNodes implements extent.ManagerDirectory.
func (d *Directory) ListNodes(context.Context, *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp := &dpb.ListNodesResponse{}
	for _, n := range d.nodes {
		resp.Nodes = append(resp.Nodes, cloneNode(n))
	}
	return resp, nil
}

// CreateExtent implements extent.ManagerDirectory.
func (d *Directory) CreateExtent(_ context.Context, req *dpb.CreateExtentRequest) (*dpb.Extent, error) {
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

// ChangeExtentReplicas implements extent.ManagerDirectory.
func (d *Directory) ChangeExtentReplicas(_ context.Context, req *dpb.ChangeExtentReplicasRequest) (*dpb.Extent, error) {
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

// SetNodeState sets a node's state (a failure detector's verdict).
func (d *Directory) SetNodeState(id uint64, s dpb.NodeState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes[id].State = s
}

// Extent returns extent id's map entry (nil if none).
func (d *Directory) Extent(id uint64) *dpb.Extent {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.extents[id]; e != nil {
		return cloneExtent(e)
	}
	return nil
}

// Node is one in-process node: engine, extent store, gRPC server.
type Node struct {
	Store  *raftengine.Store
	Engine *raftengine.Engine
	Extent *extent.Node
	srv    *grpc.Server
}

// Options configure a Cluster.
type Options struct {
	// Nodes is how many nodes NewCluster starts (ids 1..Nodes); more can
	// be added with AddNode.
	Nodes int
	// Seed seeds the network's decisions.
	Seed uint64
	// Logger receives the nodes' logs (default: errors only, everything
	// with ARBOR_TEST_DEBUG set).
	Logger *slog.Logger
	// NodeFaults, if set, faults every call a node makes to another.
	NodeFaults *faults.Injector
	// Manager, if set, returns the extent manager configuration of a node
	// (nil: none on that node).
	Manager func(id uint64) *extent.ManagerConfig
}

// Cluster is the in-process extent store.
type Cluster struct {
	t    testing.TB
	opts Options
	net  *raftengine.LocalNetwork
	dir  *Directory
	log  *slog.Logger

	mu    sync.Mutex
	fs    map[uint64]*vfs.MemFS
	nodes map[uint64]*Node
	lis   map[string]*bufconn.Listener
}

// NewCluster starts opts.Nodes nodes; the test's cleanup crashes them.
func NewCluster(t testing.TB, opts Options) *Cluster {
	log := opts.Logger
	if log == nil {
		level := slog.LevelError
		if os.Getenv("ARBOR_TEST_DEBUG") != "" {
			level = slog.LevelDebug
		}
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	c := &Cluster{
		t: t, opts: opts, net: raftengine.NewLocalNetwork(opts.Seed), dir: NewDirectory(), log: log,
		fs: map[uint64]*vfs.MemFS{}, nodes: map[uint64]*Node{}, lis: map[string]*bufconn.Listener{},
	}
	t.Cleanup(c.Close)
	for id := uint64(1); id <= uint64(opts.Nodes); id++ {
		c.AddNode(id)
	}
	return c
}

func nodeAddr(id uint64) string { return fmt.Sprintf("n%d", id) }

// Directory is the cluster's directory.
func (c *Cluster) Directory() *Directory { return c.dir }

// Network is the cluster's raft network (to cut links).
func (c *Cluster) Network() *raftengine.LocalNetwork { return c.net }

// AddNode registers node id (alive, storage role, its own failure domain)
// with an empty disk and starts it.
func (c *Cluster) AddNode(id uint64) {
	c.dir.mu.Lock()
	c.dir.nodes[id] = &dpb.Node{Id: id, Address: "passthrough:///" + nodeAddr(id), FailureDomain: fmt.Sprintf("rack-%d", id),
		Roles: []string{extent.StorageRole}, State: dpb.NodeState_NODE_STATE_ALIVE}
	c.dir.mu.Unlock()
	c.mu.Lock()
	c.fs[id] = vfs.NewCrashableMem()
	c.mu.Unlock()
	c.Start(id)
}

// DialOptions reach the cluster's nodes in memory; inj, if set, faults
// every call.
func (c *Cluster) DialOptions(inj *faults.Injector) []grpc.DialOption {
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

// Start starts node id (again) on its disk. It heals every cut link,
// which is right while at most one node is down at a time.
func (c *Cluster) Start(id uint64) {
	c.t.Helper()
	c.net.Heal()
	c.mu.Lock()
	fs := c.fs[id]
	c.mu.Unlock()
	st, err := raftengine.OpenStore("/db", fs, c.log)
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	e, err := raftengine.Open(raftengine.Config{
		NodeID: id, Store: st, Transport: c.net.Transport(id), Factory: extent.NewStateMachine,
		Logger: c.log, TickInterval: 10 * time.Millisecond,
	})
	if err != nil {
		c.t.Fatalf("open engine %d: %v", id, err)
	}
	var mc *extent.ManagerConfig
	if c.opts.Manager != nil {
		mc = c.opts.Manager(id)
	}
	n, err := extent.NewNode(extent.NodeConfig{Engine: e, Directory: c.dir, DialOptions: c.DialOptions(c.opts.NodeFaults), Logger: c.log,
		RecoveryInterval: 100 * time.Millisecond, Manager: mc})
	if err != nil {
		c.t.Fatal(err)
	}
	// Stop must wait for running handlers: they read the store, which a
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
	c.nodes[id] = &Node{Store: st, Engine: e, Extent: n, srv: srv}
	c.lis[nodeAddr(id)] = lis
	c.mu.Unlock()
}

// Crash stops node id as a power loss would (kill -9): what it had not
// synced is lost when it starts again.
func (c *Cluster) Crash(id uint64) {
	c.mu.Lock()
	tn := c.nodes[id]
	delete(c.nodes, id)
	delete(c.lis, nodeAddr(id))
	var peers []uint64
	for p := range c.fs {
		if p != id {
			peers = append(peers, p)
		}
	}
	c.mu.Unlock()
	if tn == nil {
		return
	}
	// Cut the node's links both ways before taking the crash image:
	// Detach only stops delivery to it, and the dying engine could still
	// append, sync and acknowledge entries after the image was taken,
	// which a real crash cannot do.
	c.net.Isolate(id, peers...)
	tn.srv.Stop()
	_ = tn.Extent.Stop()
	c.net.Detach(id)
	c.mu.Lock()
	c.fs[id] = c.fs[id].CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	c.mu.Unlock()
	tn.Engine.Stop()
	_ = tn.Store.Close()
}

// Close crashes every node and closes the network.
func (c *Cluster) Close() {
	c.mu.Lock()
	var ids []uint64
	for id := range c.nodes {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.Crash(id)
	}
	c.net.Close()
}

// Node returns running node id (nil if it is down).
func (c *Cluster) Node(id uint64) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// CreateExtent records an extent in the directory and bootstraps its
// group on replicas; it returns once the group has a leader.
func (c *Cluster) CreateExtent(g extent.Geometry, replicas ...uint64) uint64 {
	c.t.Helper()
	g.Replication = uint32(len(replicas))
	e, err := c.dir.CreateExtent(context.Background(), &dpb.CreateExtentRequest{Replicas: replicas, Geometry: &dpb.ExtentGeometry{
		PageSizeBytes: g.PageSizeBytes, BlockSizeBytes: g.BlockSizeBytes, ExtentSizeBytes: g.ExtentSizeBytes, Replication: g.Replication}})
	if err != nil {
		c.t.Fatal(err)
	}
	desc, err := extent.GroupDescriptor(e.ExtentId, g)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range replicas {
		if err := c.Node(r).Engine.CreateGroup(context.Background(), desc, replicas); err != nil {
			c.t.Fatal(err)
		}
	}
	c.Leader(e.ExtentId)
	return e.ExtentId
}

// LeaderOf returns the running node that leads extent id (0: none).
func (c *Cluster) LeaderOf(id uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for nid, tn := range c.nodes {
		if st, err := tn.Engine.Status(id); err == nil && st.IsLeader() {
			return nid
		}
	}
	return 0
}

// Leader waits (up to 15 s) for extent id to have a leader and returns it.
func (c *Cluster) Leader(id uint64) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if l := c.LeaderOf(id); l != 0 {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("extent %d has no leader", id)
	return 0
}

// Client returns an extent client of the cluster (closed by the test's
// cleanup); inj, if set, faults its calls.
func (c *Cluster) Client(inj *faults.Injector) *extent.Client {
	c.t.Helper()
	cl, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, DialOptions: c.DialOptions(inj), Logger: c.log, CallTimeout: 2 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// StateMachines returns the local state machines of extent id on every
// running node that holds one.
func (c *Cluster) StateMachines(id uint64) map[uint64]*extent.StateMachine {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]*extent.StateMachine{}
	for nid, tn := range c.nodes {
		if raw, err := tn.Engine.StateMachine(id); err == nil {
			out[nid] = raw.(*extent.StateMachine)
		}
	}
	return out
}
