package tract

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// fakeDirectory is the directory as the tract store sees it, in memory: a
// node table whose states the test sets, and the TLT with the directory's
// conditional updates (row versions are the table's version when they
// changed).
type fakeDirectory struct {
	mu      sync.Mutex
	cluster *dpb.ClusterInfo
	nodes   map[uint64]*dpb.Node
	tlt     *dpb.TLT
	// down makes GetTLT fail (the directory unreachable).
	down bool
}

func newFakeDirectory() *fakeDirectory {
	return &fakeDirectory{nodes: map[uint64]*dpb.Node{}}
}

func (f *fakeDirectory) GetTLT(context.Context, *dpb.GetTLTRequest) (*dpb.TLT, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, fmt.Errorf("directory unreachable")
	}
	if f.tlt == nil {
		return nil, fmt.Errorf("no TLT is installed")
	}
	return proto.Clone(f.tlt).(*dpb.TLT), nil
}

func (f *fakeDirectory) ListNodes(context.Context, *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error) {
	return &dpb.ListNodesResponse{Nodes: f.Nodes()}, nil
}

func (f *fakeDirectory) IsLeader() bool { return true }

func (f *fakeDirectory) Cluster() *dpb.ClusterInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cluster == nil {
		return nil
	}
	return proto.Clone(f.cluster).(*dpb.ClusterInfo)
}

func (f *fakeDirectory) Nodes() []*dpb.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*dpb.Node
	for id := uint64(1); id <= 64; id++ {
		if n, ok := f.nodes[id]; ok {
			out = append(out, proto.Clone(n).(*dpb.Node))
		}
	}
	return out
}

func (f *fakeDirectory) TLT() *dpb.TLT {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tlt == nil {
		return nil
	}
	return proto.Clone(f.tlt).(*dpb.TLT)
}

func (f *fakeDirectory) InitCluster(_ context.Context, req *dpb.InitClusterRequest) (*dpb.ClusterInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cluster == nil {
		f.cluster = &dpb.ClusterInfo{ClusterId: req.ClusterId, TractSizeBytes: req.TractSizeBytes}
	}
	return f.cluster, nil
}

func (f *fakeDirectory) InstallTLT(_ context.Context, req *dpb.InstallTLTRequest) (*dpb.TLTVersion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := uint64(0)
	if f.tlt != nil {
		cur = f.tlt.Version
	}
	if req.ExpectedVersion != cur {
		return nil, fmt.Errorf("stale: TLT at %d", cur)
	}
	v := cur + 1
	t := &dpb.TLT{Version: v, TractSizeBytes: f.cluster.TractSizeBytes, Replication: req.Replication}
	for _, r := range req.Rows {
		row := proto.Clone(r).(*dpb.TLTRow)
		row.Version = v
		t.Rows = append(t.Rows, row)
	}
	f.tlt = t
	return &dpb.TLTVersion{Version: v}, nil
}

func (f *fakeDirectory) UpdateTLTRows(_ context.Context, req *dpb.UpdateTLTRowsRequest) (*dpb.TLTVersion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range req.Updates {
		if f.tlt.Rows[u.Row].Version != u.ExpectedVersion {
			return nil, fmt.Errorf("stale: row %d at %d, not %d", u.Row, f.tlt.Rows[u.Row].Version, u.ExpectedVersion)
		}
	}
	v := f.tlt.Version + 1
	f.tlt.Version = v
	for _, u := range req.Updates {
		f.tlt.Rows[u.Row] = &dpb.TLTRow{Version: v, Slots: u.Slots, Pending: u.Pending}
	}
	return &dpb.TLTVersion{Version: v}, nil
}

func (f *fakeDirectory) setNode(n *dpb.Node) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[n.Id] = n
}

func (f *fakeDirectory) setState(id uint64, st dpb.NodeState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	n.State = st
	if st == dpb.NodeState_NODE_STATE_ALIVE {
		n.Epoch++
	}
}

func (f *fakeDirectory) epoch(id uint64) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.nodes[id]; n != nil {
		return n.Epoch
	}
	return 0
}

// testNode is one node: a pebble and a file system that survive restarts
// (a process crash keeps what it wrote), and a tract service on a real
// gRPC server on loopback.
type testNode struct {
	id     uint64
	addr   string
	fs     vfs.FS
	db     *pebble.DB
	svc    *Service
	srv    *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
	// full is the node's store out of space (Config.DiskFull).
	full atomic.Bool
}

// testCluster is a set of tract services, the fake directory and a real
// Manager driven step by step.
type testCluster struct {
	t       testing.TB
	dir     *fakeDirectory
	nodes   map[uint64]*testNode
	manager *Manager
	cfg     Config
	conns   sync.Map // addr -> *grpc.ClientConn
	log     *slog.Logger
	// refuse, if set, is asked before every RPC a node serves: a non-nil
	// error fails the call unrun (an injected fault).
	refuse atomic.Pointer[func(node uint64, method string) error]
	// watch, if set, sees every request a node serves.
	watch atomic.Pointer[func(node uint64, method string, req any)]
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("ARBOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newTestCluster starts n nodes with one disk each, every node in its own
// failure domain, and builds the TLT with k replicas and tracts of
// tractSize bytes.
func newTestCluster(t testing.TB, n, k int, tractSize uint64) *testCluster {
	t.Helper()
	c := &testCluster{t: t, dir: newFakeDirectory(), nodes: map[uint64]*testNode{}, log: testLogger(t)}
	c.cfg = Config{
		TLTPoll: 20 * time.Millisecond, TLTValidity: 2 * time.Second, RPCTimeout: 10 * time.Second,
		DropGrace: 200 * time.Millisecond, ReturnGrace: time.Minute, ScrubInterval: time.Hour, VerifyInterval: time.Hour,
		OrphanGrace: time.Millisecond, TornStripeGrace: time.Millisecond,
	}
	var err error
	c.manager, err = NewManager(ManagerConfig{
		Directory: c.dir, Dial: c.dial, ClusterID: "test", TractSizeBytes: tractSize, Replication: k,
		Tick: 10 * time.Millisecond, Settle: time.Millisecond, BuildWait: time.Millisecond, Logger: c.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	for id := uint64(1); id <= uint64(n); id++ {
		c.addNode(id)
	}
	c.waitFor("the TLT", func() bool { c.step(); return c.dir.TLT() != nil })
	c.settle()
	return c
}

func (c *testCluster) dial(addr string) (grpc.ClientConnInterface, error) {
	if cc, ok := c.conns.Load(addr); ok {
		return cc.(*grpc.ClientConn), nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	actual, loaded := c.conns.LoadOrStore(addr, cc)
	if loaded {
		cc.Close()
	}
	return actual.(*grpc.ClientConn), nil
}

// addNode creates node id (registered ALIVE) and starts it.
func (c *testCluster) addNode(id uint64) *testNode {
	c.t.Helper()
	fs := vfs.NewMem()
	db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		c.t.Fatal(err)
	}
	n := &testNode{id: id, fs: fs, db: db}
	c.nodes[id] = n
	c.startNode(n)
	c.dir.setNode(&dpb.Node{Id: id, Address: n.addr, FailureDomain: fmt.Sprintf("d%d", id), Roles: []string{"storage"},
		Disks: []*dpb.Disk{{Path: "disk", CapacityBytes: 1 << 40}}, State: dpb.NodeState_NODE_STATE_ALIVE, Epoch: 1})
	return n
}

func (c *testCluster) startNode(n *testNode) {
	c.t.Helper()
	addr := n.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for range 50 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	n.addr = lis.Addr().String()
	cfg := c.cfg
	cfg.NodeID, cfg.Disks, cfg.DB, cfg.Directory, cfg.Dial, cfg.Logger = n.id, []DiskConfig{{Path: "disk", FS: n.fs}}, n.db, c.dir, c.dial, c.log
	cfg.Epoch = func() uint64 { return c.dir.epoch(n.id) }
	cfg.DiskFull = n.full.Load
	svc, err := NewService(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	n.svc = svc
	refuse := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if f := c.watch.Load(); f != nil {
			(*f)(n.id, info.FullMethod, req)
		}
		if f := c.refuse.Load(); f != nil {
			if err := (*f)(n.id, info.FullMethod); err != nil {
				return nil, err
			}
		}
		return handler(withTestIdentity(ctx), req)
	}
	n.srv = grpc.NewServer(grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20), grpc.WaitForHandlers(true),
		grpc.UnaryInterceptor(refuse))
	svc.Register(n.srv)
	go n.srv.Serve(lis)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	go func() {
		defer close(n.done)
		_ = svc.Run(ctx)
	}()
}

// crash stops node id at once (its data stays, as after kill -9).
func (c *testCluster) crash(id uint64) {
	n := c.nodes[id]
	if n.srv == nil {
		return
	}
	n.srv.Stop()
	n.cancel()
	<-n.done
	n.srv = nil
}

// restart starts a crashed node again on the same address and data.
func (c *testCluster) restart(id uint64) {
	c.startNode(c.nodes[id])
}

func (c *testCluster) close() {
	for id, n := range c.nodes {
		c.crash(id)
		n.db.Close()
	}
	c.conns.Range(func(_, v any) bool {
		v.(*grpc.ClientConn).Close()
		return true
	})
}

// step runs the manager once.
func (c *testCluster) step() {
	c.t.Helper()
	if err := c.manager.Step(context.Background()); err != nil {
		c.t.Logf("manager step: %v", err)
	}
}

// settle steps the manager until the table stops changing and every row
// is in sync.
// settleState is what settle waits on, logged when it changes so that a
// timeout says which part never settled.
type settleState struct {
	version                 uint64
	catchingUp, unreachable int
}

func (c *testCluster) settle() {
	c.t.Helper()
	quiet := 0
	var last Recovery
	var lastVersion uint64
	var logged settleState
	c.waitFor("every row in sync", func() bool {
		before := c.dir.TLT().GetVersion()
		c.step()
		// Kept for the failure message: which of the three conditions
		// never settled.
		last, lastVersion = c.manager.LastRecovery(), c.dir.TLT().GetVersion()
		if lastVersion == before && last.RowsCatchingUp == 0 && last.Unreachable == 0 {
			quiet++
		} else {
			quiet = 0
			if now := (settleState{lastVersion, last.RowsCatchingUp, last.Unreachable}); now != logged {
				c.t.Logf("settle: TLT version %d, %d rows catching up, %d unreachable", now.version, now.catchingUp, now.unreachable)
				logged = now
			}
		}
		return quiet >= 3
	})
}

func (c *testCluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// client returns a client of the cluster.
func (c *testCluster) client() *Client {
	c.t.Helper()
	cl, err := NewClient(ClientConfig{Directory: c.dir, Dial: c.dial, Logger: c.log, AttemptTimeout: 10 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func (c *testCluster) table() *Table {
	c.t.Helper()
	t, err := TableFromProto(c.dir.TLT())
	if err != nil {
		c.t.Fatal(err)
	}
	return t
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
