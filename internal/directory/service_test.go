package directory

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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// dirCluster is a directory group of real engines over the engine's
// in-process network, each replica served by a Service behind a real gRPC
// server on a loopback port.
type dirCluster struct {
	t      *testing.T
	net    *raftengine.LocalNetwork
	logger *slog.Logger
	ids    []uint64
	addrs  map[uint64]string
	nodes  map[uint64]*dirNode
	det    DetectorConfig
}

type dirNode struct {
	store   *raftengine.Store
	engine  *raftengine.Engine
	sm      *StateMachine
	svc     *Service
	server  *grpc.Server
	cancel  context.CancelFunc
	running sync.WaitGroup
}

func newDirCluster(t *testing.T, n int, det DetectorConfig) *dirCluster {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	c := &dirCluster{
		t:      t,
		net:    raftengine.NewLocalNetwork(uint64(time.Now().UnixNano())),
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		addrs:  map[uint64]string{},
		nodes:  map[uint64]*dirNode{},
		det:    det,
	}
	listeners := map[uint64]net.Listener{}
	for i := 1; i <= n; i++ {
		id := uint64(i)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		c.ids = append(c.ids, id)
		c.addrs[id] = lis.Addr().String()
		listeners[id] = lis
	}
	for _, id := range c.ids {
		c.start(id, listeners[id])
	}
	t.Cleanup(func() {
		for _, id := range c.ids {
			c.stop(id)
		}
		c.net.Close()
	})
	return c
}

func (c *dirCluster) start(id uint64, lis net.Listener) {
	c.t.Helper()
	store, err := raftengine.OpenStore("/db", vfs.NewMem(), c.logger)
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	sm := NewStateMachine()
	engine, err := raftengine.Open(raftengine.Config{
		NodeID:    id,
		Store:     store,
		Transport: c.net.Transport(id),
		Factory: func(desc raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
			if desc.Kind != Kind {
				return nil, fmt.Errorf("unexpected kind %q", desc.Kind)
			}
			return sm, nil
		},
		Logger:       c.logger,
		TickInterval: 10 * time.Millisecond,
		Workers:      2,
	})
	if err != nil {
		c.t.Fatalf("open engine %d: %v", id, err)
	}
	if err := engine.Start(); err != nil {
		c.t.Fatalf("start engine %d: %v", id, err)
	}
	if err := engine.CreateGroup(context.Background(), raftengine.GroupDescriptor{GroupID: GroupID, Kind: Kind}, c.ids); err != nil {
		c.t.Fatalf("create directory group on %d: %v", id, err)
	}
	svc, err := NewService(ServiceConfig{
		NodeID: id, Engine: engine, StateMachine: sm,
		AddressOf:    func(n uint64) string { return c.addrs[n] },
		Detector:     c.det,
		DetectorTick: 20 * time.Millisecond,
		Logger:       c.logger,
	})
	if err != nil {
		c.t.Fatalf("service %d: %v", id, err)
	}
	server := grpc.NewServer()
	pb.RegisterDirectoryServer(server, svc)
	ctx, cancel := context.WithCancel(context.Background())
	node := &dirNode{store: store, engine: engine, sm: sm, svc: svc, server: server, cancel: cancel}
	node.running.Add(2)
	go func() { defer node.running.Done(); _ = server.Serve(lis) }()
	go func() { defer node.running.Done(); _ = svc.Run(ctx) }()
	c.nodes[id] = node
}

// stop kills node id: its server, its detector loop and its engine.
func (c *dirCluster) stop(id uint64) {
	n := c.nodes[id]
	if n == nil {
		return
	}
	n.server.Stop()
	n.cancel()
	c.net.Detach(id)
	n.engine.Stop()
	n.running.Wait()
	_ = n.store.Close()
	delete(c.nodes, id)
}

// leader waits until a running replica leads the group.
func (c *dirCluster) leader() uint64 {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for id, n := range c.nodes {
			if st, err := n.engine.Status(GroupID); err == nil && st.IsLeader() {
				return id
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no directory leader")
	return 0
}

func (c *dirCluster) client(ids ...uint64) *Client {
	c.t.Helper()
	if len(ids) == 0 {
		ids = c.ids
	}
	var addrs []string
	for _, id := range ids {
		addrs = append(addrs, c.addrs[id])
	}
	cl, err := NewClient(ClientConfig{
		Addresses:      addrs,
		DialOptions:    []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		AttemptTimeout: time.Second,
		Logger:         c.logger,
	})
	if err != nil {
		c.t.Fatalf("client: %v", err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, grpcCode codes.Code, code pb.ErrorCode) {
	t.Helper()
	if status.Code(err) != grpcCode || CodeOf(err) != code {
		t.Fatalf("got error %v (gRPC %v, directory %v), want gRPC %v, directory %v", err, status.Code(err), CodeOf(err), grpcCode, code)
	}
}

func TestServiceRegisterHeartbeatStatus(t *testing.T) {
	c := newDirCluster(t, 3, DetectorConfig{})
	cl := c.client()
	ctx := testCtx(t, 20*time.Second)

	if _, err := cl.InitCluster(ctx, &pb.InitClusterRequest{ClusterId: "svc-test", TractSizeBytes: DefaultTractSizeBytes}); err != nil {
		t.Fatalf("init: %v", err)
	}
	reg, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: 10, Address: "10.1.0.10:7000", FailureDomain: "rack-a",
		Roles: []string{"storage"}, Disks: []*pb.Disk{{Path: "/data", CapacityBytes: 1 << 30}}})
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	if reg.Node.Epoch != 1 || reg.Node.State != pb.NodeState_NODE_STATE_ALIVE || reg.Cluster.GetClusterId() != "svc-test" ||
		reg.HeartbeatIntervalMs != HeartbeatInterval.Milliseconds() {
		t.Fatalf("register response: %v", reg)
	}
	hb, err := cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 10, Epoch: 1, Stats: &pb.MemberStats{FreeBytes: 5, CapacityBytes: 10, Load: 2}})
	if err != nil || hb.Action != pb.HeartbeatAction_HEARTBEAT_ACTION_OK || hb.Epoch != 1 {
		t.Fatalf("heartbeat: %v, %v", hb, err)
	}

	st, err := cl.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	leader := c.leader()
	if st.LeaderId != leader || st.LeaderAddress != c.addrs[leader] || !slices.Equal(sortedCopy(st.Voters), c.ids) || st.Term == 0 {
		t.Fatalf("status: leader %d at %q, voters %v, term %d; want leader %d, voters %v", st.LeaderId, st.LeaderAddress, st.Voters, st.Term, leader, c.ids)
	}
	if len(st.Nodes) != 1 || st.Nodes[0].Id != 10 || st.Nodes[0].FailureDomain != "rack-a" || StateName(st.Nodes[0].State) != "alive" {
		t.Fatalf("status nodes: %v", st.Nodes)
	}
	if cl.Leader() != c.addrs[leader] {
		t.Fatalf("client caches leader %q, want %q", cl.Leader(), c.addrs[leader])
	}

	// Stale epoch and unknown nodes.
	hb, err = cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 10, Epoch: 7})
	if err != nil || hb.Action != pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER || hb.Epoch != 1 {
		t.Fatalf("stale heartbeat: %v, %v", hb, err)
	}
	_, err = cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 99, Epoch: 1})
	wantCode(t, err, codes.NotFound, pb.ErrorCode_UNKNOWN_NODE)
	_, err = cl.GetNode(ctx, &pb.GetNodeRequest{NodeId: 99})
	wantCode(t, err, codes.NotFound, pb.ErrorCode_UNKNOWN_NODE)
	_, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "x", HolderNode: 99, HolderEpoch: 1, DurationMs: 1000})
	wantCode(t, err, codes.NotFound, pb.ErrorCode_UNKNOWN_NODE)

	// Malformed requests are refused and change nothing.
	before, err := cl.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Register(ctx, &pb.RegisterRequest{NodeId: 11, Address: "no-port"})
	wantCode(t, err, codes.InvalidArgument, pb.ErrorCode_INVALID_ARGUMENT)
	_, err = cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "big", Value: make([]byte, maxConfigValueBytes+1)})
	wantCode(t, err, codes.InvalidArgument, pb.ErrorCode_INVALID_ARGUMENT)
	_, err = cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 10})
	wantCode(t, err, codes.InvalidArgument, pb.ErrorCode_INVALID_ARGUMENT)
	after, err := cl.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(before, after) {
		t.Fatalf("refused requests changed the nodes:\n%v\n%v", before, after)
	}
	if _, err := cl.GetConfig(ctx, &pb.GetConfigRequest{Key: "big"}); status.Code(err) != codes.NotFound {
		t.Fatalf("refused put left a value: %v", err)
	}

	// A follower refuses with a hint naming the leader.
	var follower uint64
	for _, id := range c.ids {
		if id != leader {
			follower = id
		}
	}
	conn, err := grpc.NewClient(c.addrs[follower], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewDirectoryClient(conn).PutConfig(ctx, &pb.PutConfigRequest{Key: "k", Value: []byte("v")})
	nl, ok := NotLeaderOf(err)
	if !ok || nl.LeaderId != leader || nl.LeaderAddress != c.addrs[leader] {
		t.Fatalf("follower answered %v (hint %v), want NotLeader naming %d", err, nl, leader)
	}
	local, err := pb.NewDirectoryClient(conn).Status(ctx, &pb.StatusRequest{Local: true})
	if err != nil || local.NodeId != follower {
		t.Fatalf("local status from follower: %v, %v", local, err)
	}
}

func sortedCopy(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// TestServiceLeaderFailover kills the leader's engine and server: a new
// leader takes over, the client follows, and no acknowledged write is lost.
func TestServiceLeaderFailover(t *testing.T) {
	c := newDirCluster(t, 3, DetectorConfig{})
	cl := c.client()
	ctx := testCtx(t, 30*time.Second)

	want := map[string]uint64{}
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		e, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: key, Value: []byte(key)})
		if err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		want[key] = e.Version
	}
	old := c.leader()
	c.stop(old)

	e, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "after", Value: []byte("failover"), ExpectedVersion: proto.Uint64(0)})
	if err != nil {
		t.Fatalf("put after failover: %v", err)
	}
	want["after"] = e.Version
	newLeader := c.leader()
	if newLeader == old {
		t.Fatalf("leader is still %d", old)
	}
	if cl.Leader() != c.addrs[newLeader] {
		t.Fatalf("client caches %q, want the new leader %q", cl.Leader(), c.addrs[newLeader])
	}
	for key, version := range want {
		got, err := cl.GetConfig(ctx, &pb.GetConfigRequest{Key: key})
		if err != nil || got.Version != version {
			t.Fatalf("get %s: %v, %v; want version %d", key, got, err, version)
		}
	}
	list, err := cl.ListConfig(ctx, &pb.ListConfigRequest{Prefix: "k", Limit: 2})
	if err != nil || len(list.Entries) != 2 || !list.More || list.Entries[0].Key != "k0" {
		t.Fatalf("list: %v, %v", list, err)
	}
	st, err := cl.Status(ctx, &pb.StatusRequest{})
	if err != nil || st.LeaderId != newLeader {
		t.Fatalf("status after failover: %v, %v", st, err)
	}
}

// TestServiceLeases: a stale node epoch is refused, a held lease refuses
// others, and an expired lease passes to a new holder with a new epoch.
func TestServiceLeases(t *testing.T) {
	c := newDirCluster(t, 3, DetectorConfig{})
	cl := c.client()
	ctx := testCtx(t, 20*time.Second)
	for _, id := range []uint64{21, 22} {
		if _, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: id, Address: fmt.Sprintf("10.2.0.%d:7000", id)}); err != nil {
			t.Fatalf("register %d: %v", id, err)
		}
	}
	reg, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: 21, Address: "10.2.0.21:7000"})
	if err != nil || reg.Node.Epoch != 2 {
		t.Fatalf("re-register: %v, %v", reg, err)
	}
	_, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "master", HolderNode: 21, HolderEpoch: 1, DurationMs: 300})
	wantCode(t, err, codes.FailedPrecondition, pb.ErrorCode_STALE_EPOCH)

	granted := time.Now()
	l, err := cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "master", HolderNode: 21, HolderEpoch: 2, DurationMs: 300})
	if err != nil || l.HolderNode != 21 || l.Epoch != 1 {
		t.Fatalf("grant: %v, %v", l, err)
	}
	_, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "master", HolderNode: 22, HolderEpoch: 1, DurationMs: 300})
	if time.Since(granted) < 300*time.Millisecond {
		wantCode(t, err, codes.FailedPrecondition, pb.ErrorCode_LEASE_HELD)
		if r, _ := ResultOf(err); r.GetLease().GetHolderNode() != 21 {
			t.Fatalf("LEASE_HELD names holder %v", r.GetLease())
		}
	}
	time.Sleep(time.Until(granted.Add(400 * time.Millisecond)))
	_, err = cl.RenewLease(ctx, &pb.RenewLeaseRequest{Name: "master", HolderNode: 21, LeaseEpoch: 1, DurationMs: 300})
	wantCode(t, err, codes.FailedPrecondition, pb.ErrorCode_EXPIRED)
	l, err = cl.GrantLease(ctx, &pb.GrantLeaseRequest{Name: "master", HolderNode: 22, HolderEpoch: 1, DurationMs: 5000})
	if err != nil || l.HolderNode != 22 || l.Epoch != 2 {
		t.Fatalf("grant after expiry: %v, %v", l, err)
	}
	got, err := cl.GetLease(ctx, &pb.GetLeaseRequest{Name: "master"})
	if err != nil || !proto.Equal(got, l) {
		t.Fatalf("get lease: %v, %v; want %v", got, err, l)
	}
	if _, err := cl.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Name: "master", HolderNode: 22, LeaseEpoch: 2}); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestServiceFailureDetector: a heartbeating agent stays alive; a silent
// node becomes suspect, then dead; its agent is told to register again and
// comes back with a new epoch.
func TestServiceFailureDetector(t *testing.T) {
	c := newDirCluster(t, 3, DetectorConfig{HeartbeatInterval: 100 * time.Millisecond, SuspectTimeout: 600 * time.Millisecond, DeadTimeout: 1200 * time.Millisecond})
	cl := c.client()
	ctx := testCtx(t, 30*time.Second)

	agent, err := NewNodeAgent(AgentConfig{
		Directory: cl,
		Node:      &pb.RegisterRequest{NodeId: 31, Address: "10.3.0.31:7000", Roles: []string{"storage"}},
		Stats:     func() *pb.MemberStats { return &pb.MemberStats{FreeBytes: 1, CapacityBytes: 2} },
		Interval:  100 * time.Millisecond,
		Logger:    c.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(agentCtx) }()
	defer func() { stopAgent(); <-agentDone }()

	if _, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: 32, Address: "10.3.0.32:7000"}); err != nil {
		t.Fatal(err)
	}
	state := func(id uint64) pb.NodeState {
		n, err := cl.GetNode(ctx, &pb.GetNodeRequest{NodeId: id})
		if err != nil {
			t.Fatalf("get node %d: %v", id, err)
		}
		return n.State
	}
	waitState := func(id uint64, want pb.NodeState, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for state(id) != want {
			if time.Now().After(deadline) {
				t.Fatalf("node %d is %v, want %v", id, state(id), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitState(32, pb.NodeState_NODE_STATE_SUSPECT, 5*time.Second)
	waitState(32, pb.NodeState_NODE_STATE_DEAD, 5*time.Second)
	// The heartbeating node is alive (a scheduling hiccup may make it
	// briefly suspect, never dead).
	waitState(31, pb.NodeState_NODE_STATE_ALIVE, 2*time.Second)
	hb, err := cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 32, Epoch: 1})
	if err != nil || hb.Action != pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER {
		t.Fatalf("heartbeat of a dead node: %v, %v", hb, err)
	}

	// The dead node's own agent comes back: it re-registers with epoch 2.
	agent32, err := NewNodeAgent(AgentConfig{
		Directory: cl, Node: &pb.RegisterRequest{NodeId: 32, Address: "10.3.0.32:7000"},
		Interval: 100 * time.Millisecond, Logger: c.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx32, stop32 := context.WithCancel(ctx)
	done32 := make(chan error, 1)
	go func() { done32 <- agent32.Run(ctx32) }()
	defer func() { stop32(); <-done32 }()
	deadline := time.Now().Add(5 * time.Second)
	for agent32.Epoch() != 2 || state(32) != pb.NodeState_NODE_STATE_ALIVE {
		if time.Now().After(deadline) {
			t.Fatalf("node 32 did not come back: epoch %d, state %v", agent32.Epoch(), state(32))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if agent.Epoch() != 1 || agent.LastAck().IsZero() {
		t.Fatalf("agent 31: epoch %d, last ack %v", agent.Epoch(), agent.LastAck())
	}

	// Decommissioning stops the agent.
	if _, err := cl.Decommission(ctx, &pb.DecommissionRequest{NodeId: 32}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done32:
		done32 <- err
		if err != ErrDecommissioned {
			t.Fatalf("agent 32 ended with %v, want ErrDecommissioned", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("agent of a decommissioned node kept running")
	}
}

// TestClientFollowsHint: a client that knows only a follower reaches the
// leader through the follower's NotLeader hint.
func TestClientFollowsHint(t *testing.T) {
	c := newDirCluster(t, 3, DetectorConfig{})
	leader := c.leader()
	follower := c.ids[0]
	if follower == leader {
		follower = c.ids[1]
	}
	cl := c.client(follower)
	ctx := testCtx(t, 20*time.Second)
	if _, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatalf("put through a follower's hint: %v", err)
	}
	if got := cl.Leader(); got != c.addrs[c.leader()] {
		t.Fatalf("client caches %q, want the leader %q", got, c.addrs[c.leader()])
	}
}
