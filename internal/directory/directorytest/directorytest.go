// Package directorytest runs a real directory group in the test's process
// for the layers above it (metadata servers, clients): replicas on real
// raft engines over the engine's in-process network and in-memory pebble,
// each served by a real gRPC server on a loopback port. Nodes of the
// cluster under test register and heartbeat through real node agents.
package directorytest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Cluster is a running directory group.
type Cluster struct {
	t      testing.TB
	net    *raftengine.LocalNetwork
	logger *slog.Logger
	ids    []uint64
	addrs  map[uint64]string
	nodes  []*replica
	client *directory.Client
}

type replica struct {
	store   *raftengine.Store
	engine  *raftengine.Engine
	server  *grpc.Server
	cancel  context.CancelFunc
	running sync.WaitGroup
}

// Detector is the failure detector the test directory runs: fast, so a
// test sees a killed node declared dead within seconds.
var Detector = directory.DetectorConfig{
	HeartbeatInterval: 100 * time.Millisecond,
	SuspectTimeout:    500 * time.Millisecond,
	DeadTimeout:       1500 * time.Millisecond,
}

// Start starts a directory group of n replicas, initialised, and stops it
// when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	c := &Cluster{t: t, net: raftengine.NewLocalNetwork(uint64(time.Now().UnixNano())),
		logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), addrs: map[uint64]string{}}
	lis := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		id := uint64(i + 1)
		c.ids = append(c.ids, id)
		c.addrs[id] = l.Addr().String()
		lis[i] = l
	}
	for i, id := range c.ids {
		c.nodes = append(c.nodes, c.start(id, lis[i]))
	}
	t.Cleanup(c.stop)
	var addrs []string
	for _, id := range c.ids {
		addrs = append(addrs, c.addrs[id])
	}
	cl, err := directory.NewClient(directory.ClientConfig{Addresses: addrs,
		DialOptions:    []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		AttemptTimeout: time.Second, Logger: c.logger})
	if err != nil {
		t.Fatal(err)
	}
	c.client = cl
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := cl.InitCluster(ctx, &pb.InitClusterRequest{ClusterId: "test", TractSizeBytes: directory.DefaultTractSizeBytes})
		if err == nil || directory.CodeOf(err) == pb.ErrorCode_ALREADY_EXISTS {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("init the test directory: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

func (c *Cluster) start(id uint64, lis net.Listener) *replica {
	c.t.Helper()
	store, err := raftengine.OpenStore("/db", vfs.NewMem(), c.logger)
	if err != nil {
		c.t.Fatal(err)
	}
	sm := directory.NewStateMachine()
	engine, err := raftengine.Open(raftengine.Config{
		NodeID: id, Store: store, Transport: c.net.Transport(id),
		Factory: func(desc raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
			if desc.Kind != directory.Kind {
				return nil, fmt.Errorf("unexpected kind %q", desc.Kind)
			}
			return sm, nil
		},
		Logger: c.logger, TickInterval: 10 * time.Millisecond, Workers: 2,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := engine.Start(); err != nil {
		c.t.Fatal(err)
	}
	if err := engine.CreateGroup(context.Background(), raftengine.GroupDescriptor{GroupID: directory.GroupID, Kind: directory.Kind}, c.ids); err != nil {
		c.t.Fatal(err)
	}
	svc, err := directory.NewService(directory.ServiceConfig{
		NodeID: id, Engine: engine, StateMachine: sm,
		AddressOf: func(n uint64) string { return c.addrs[n] },
		Detector:  Detector, DetectorTick: 20 * time.Millisecond, Logger: c.logger,
		// Member statistics recorded quickly, so that a test sees what
		// its nodes report within a fraction of a second.
		StatsFlushInterval: 100 * time.Millisecond,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	server := grpc.NewServer()
	pb.RegisterDirectoryServer(server, svc)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{store: store, engine: engine, server: server, cancel: cancel}
	r.running.Add(2)
	go func() { defer r.running.Done(); _ = server.Serve(lis) }()
	go func() { defer r.running.Done(); _ = svc.Run(ctx) }()
	return r
}

func (c *Cluster) stop() {
	if c.client != nil {
		_ = c.client.Close()
	}
	for _, r := range c.nodes {
		r.server.Stop()
		r.cancel()
		r.engine.Stop()
		r.running.Wait()
		_ = r.store.Close()
	}
	c.net.Close()
}

// Client returns a client of the directory (closed with the cluster).
func (c *Cluster) Client() *directory.Client { return c.client }

// Node is a node of the cluster under test, registered and heartbeating
// through a real node agent until Stop (after which the directory
// declares it dead).
type Node struct {
	agent  *directory.NodeAgent
	cancel context.CancelFunc
	done   chan struct{}
}

// Epoch returns the node's registration epoch.
func (n *Node) Epoch() uint64 { return n.agent.Epoch() }

// Stop stops the node's heartbeats.
func (n *Node) Stop() {
	n.cancel()
	<-n.done
}

// Register registers node id at addr with roles and keeps it
// heartbeating; it returns once the node is registered.
func (c *Cluster) Register(id uint64, addr string, roles ...string) *Node {
	c.t.Helper()
	a, err := directory.NewNodeAgent(directory.AgentConfig{Directory: c.client,
		Node:     &pb.RegisterRequest{NodeId: id, Address: addr, Roles: roles},
		Interval: Detector.HeartbeatInterval, Logger: c.logger})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{agent: a, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(n.done); _ = a.Run(ctx) }()
	c.t.Cleanup(n.Stop)
	deadline := time.Now().Add(20 * time.Second)
	for a.Epoch() == 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d never registered", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}
