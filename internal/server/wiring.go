package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/tract"
)

// Modules returns the subsystems a node with configuration cfg runs, in
// start order. It is the one place where a node's parts are wired together:
//
//  1. the multi-Raft engine, on every node (EngineModule);
//  2. the directory group replica and its gRPC service, on directory
//     members (directoryModule);
//  3. the node agent, on every node: it registers the node with the
//     directory and heartbeats (agentModule);
//  4. the tract store (tractModule) and, on metadata nodes, the metadata
//     server (metaModule);
//  5. the NFSv3 gateway, on gateway nodes (gatewayModule);
//  6. the web dashboard at /ui/, on every node (uiModule).
//
// A later module may use an earlier one: they are constructed here and the
// earlier module (whose Init has run by the time a later Init runs) is
// handed to the later one's constructor. A module that runs a replicated
// state machine registers its kind with the engine module before Init.
func Modules(cfg Config) []Module {
	book := &addressBook{peers: map[uint64]string{}}
	for _, p := range cfg.DirectoryPeers {
		book.peers[p.ID] = p.Addr
	}
	engine := NewEngineModule(book.resolve)
	modules := []Module{engine}
	if cfg.HasRole(RoleDirectory) {
		modules = append(modules, newDirectoryModule(engine))
	}
	modules = append(modules, newExtentModule(engine))
	modules = append(modules, newAgentModule(book))
	modules = append(modules, newTractModule(cfg, engine, modules))
	if cfg.HasRole(RoleMeta) {
		modules = append(modules, newMetaModule(modules))
	}
	if cfg.HasRole(RoleGateway) {
		modules = append(modules, newGatewayModule())
	}
	modules = append(modules, newUIModule())
	return modules
}

// addressBook maps node ids to gRPC addresses for the raft transport: the
// configured directory peers first, then the directory's node table,
// refreshed at most once per addressRefresh when an id is missing.
type addressBook struct {
	mu      sync.Mutex
	peers   map[uint64]string
	nodes   map[uint64]string
	client  *directory.Client
	fetched time.Time
}

const addressRefresh = time.Second

func (b *addressBook) setClient(c *directory.Client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.client = c
}

func (b *addressBook) resolve(ctx context.Context, id uint64) (string, error) {
	b.mu.Lock()
	if a, ok := b.peers[id]; ok {
		b.mu.Unlock()
		return a, nil
	}
	if a, ok := b.nodes[id]; ok && time.Since(b.fetched) < 10*addressRefresh {
		b.mu.Unlock()
		return a, nil
	}
	c := b.client
	stale := time.Since(b.fetched) >= addressRefresh
	b.mu.Unlock()
	if c != nil && stale {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.ListNodes(ctx, &pb.ListNodesRequest{})
		cancel()
		if err == nil {
			nodes := make(map[uint64]string, len(resp.GetNodes()))
			for _, n := range resp.GetNodes() {
				nodes[n.GetId()] = n.GetAddress()
			}
			b.mu.Lock()
			b.nodes, b.fetched = nodes, time.Now()
			b.mu.Unlock()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if a, ok := b.nodes[id]; ok {
		return a, nil
	}
	return "", fmt.Errorf("no address known for node %d", id)
}

// EngineModule runs the node's multi-Raft engine. Modules that run a
// replicated state machine register its kind with RegisterKind before Init.
type EngineModule struct {
	resolve raftengine.Resolver

	mu        sync.Mutex
	factories map[string]raftengine.Factory

	Engine    *raftengine.Engine
	transport *raftengine.GRPCTransport
}

// NewEngineModule returns the engine module; resolve maps node ids to
// addresses.
func NewEngineModule(resolve raftengine.Resolver) *EngineModule {
	return &EngineModule{resolve: resolve, factories: map[string]raftengine.Factory{}}
}

// RegisterKind makes the engine build state machines of kind with f.
func (m *EngineModule) RegisterKind(kind string, f raftengine.Factory) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.factories[kind] = f
}

func (m *EngineModule) factory(desc raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
	m.mu.Lock()
	f := m.factories[desc.Kind]
	m.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("no state machine registered for group kind %q", desc.Kind)
	}
	return f(desc)
}

// Name implements Module.
func (m *EngineModule) Name() string { return "raft-engine" }

// Init implements Module: it opens the engine (reopening every local
// replica) and registers the raft transport service.
func (m *EngineModule) Init(_ context.Context, env *Env) error {
	m.transport = raftengine.NewGRPCTransport(env.Config.NodeID, m.resolve, env.Logger, env.Dialer.DialOptions()...)
	m.transport.Register(env.GRPC)
	e, err := raftengine.Open(raftengine.Config{
		NodeID:       env.Config.NodeID,
		Store:        env.Store,
		Transport:    m.transport,
		Factory:      m.factory,
		TickInterval: env.Config.Timeouts.RaftTick,
		Logger:       env.Logger,
	})
	if err != nil {
		return err
	}
	m.Engine = e
	return env.Metrics.Register(engineCollector{e: e})
}

// Start implements Module.
func (m *EngineModule) Start(context.Context) error { return m.Engine.Start() }

// Stop implements Module.
func (m *EngineModule) Stop(context.Context) error {
	if m.Engine != nil {
		m.Engine.Stop()
	}
	if m.transport != nil {
		return m.transport.Close()
	}
	return nil
}

// directoryModule hosts this node's replica of the directory group and
// serves the Directory service.
type directoryModule struct {
	engine *EngineModule
	peers  []uint64 // the configured directory peers (--directory-peers)
	sm     *directory.StateMachine
	svc    *directory.Service
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	env    *Env
}

func newDirectoryModule(engine *EngineModule) *directoryModule {
	m := &directoryModule{engine: engine, sm: directory.NewStateMachine()}
	engine.RegisterKind(directory.Kind, func(raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
		return m.sm, nil
	})
	return m
}

func (m *directoryModule) Name() string { return "directory" }

func (m *directoryModule) Init(ctx context.Context, env *Env) error {
	m.env = env
	m.log = env.Logger.With("component", "directory")
	e := m.engine.Engine
	voters := make([]uint64, 0, len(env.Config.DirectoryPeers))
	for _, p := range env.Config.DirectoryPeers {
		voters = append(voters, p.ID)
	}
	m.peers = voters
	switch {
	case slices.Contains(e.Groups(), directory.GroupID):
	case env.Config.DirectoryJoin:
		// An empty replica: the leader adds it (regrowVoters) and sends it
		// a snapshot.
		if err := e.CreateGroup(ctx, raftengine.GroupDescriptor{GroupID: directory.GroupID, Kind: directory.Kind}, nil); err != nil {
			return fmt.Errorf("join directory group: %w", err)
		}
		m.log.Warn("new directory replica joins the running directory (--directory-join): it serves once the leader adds it")
	default:
		if err := e.CreateGroup(ctx, raftengine.GroupDescriptor{GroupID: directory.GroupID, Kind: directory.Kind}, voters); err != nil {
			return fmt.Errorf("bootstrap directory group: %w", err)
		}
	}
	peers := map[uint64]string{}
	for _, p := range env.Config.DirectoryPeers {
		peers[p.ID] = p.Addr
	}
	svc, err := directory.NewService(directory.ServiceConfig{
		NodeID:       env.Config.NodeID,
		Engine:       e,
		StateMachine: m.sm,
		AddressOf:    func(id uint64) string { return peers[id] },
		Detector: directory.DetectorConfig{
			HeartbeatInterval: env.Config.Timeouts.Heartbeat,
			DeadTimeout:       env.Config.Timeouts.NodeDead,
		},
		Logger: env.Logger,
	})
	if err != nil {
		return err
	}
	m.svc = svc
	pb.RegisterDirectoryServer(env.GRPC, svc)
	return env.Health.AddCheck("directory-leader", func(context.Context) error {
		st, err := e.Status(directory.GroupID)
		if err != nil {
			return err
		}
		if st.Leader == 0 {
			return errors.New("this directory replica knows no leader")
		}
		return nil
	})
}

func (m *directoryModule) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			m.initCluster(ctx)
		}()
		go func() {
			defer wg.Done()
			directory.RunRegrow(ctx, m.engine.Engine, m.peers, directory.RegrowInterval, m.log)
		}()
		if err := m.svc.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			m.log.Error("directory service stopped", "err", err)
		}
		wg.Wait()
	}()
	return nil
}

// initCluster records the cluster's identity and tract size in the
// directory once: the first proposal every directory member makes,
// harmlessly repeated (InitCluster is idempotent for the same values). The
// TLT manager may propose it too, from the same configuration.
func (m *directoryModule) initCluster(ctx context.Context) {
	for ctx.Err() == nil {
		if m.sm.Cluster() != nil {
			return
		}
		if st, err := m.engine.Engine.Status(directory.GroupID); err == nil && st.IsLeader() {
			cctx, cancel := context.WithTimeout(ctx, m.env.Config.Timeouts.RPC)
			size := m.env.Config.Tract.TractSizeBytes
			if size == 0 {
				size = tract.DefaultTractSizeBytes
			}
			_, err := m.svc.InitCluster(cctx, &pb.InitClusterRequest{ClusterId: m.env.Config.ClusterID, TractSizeBytes: size})
			cancel()
			if err == nil {
				return
			}
			m.log.Warn("init cluster", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (m *directoryModule) Stop(context.Context) error {
	if m.cancel != nil {
		m.cancel()
		<-m.done
	}
	return nil
}

// agentModule registers the node with the directory and heartbeats.
type agentModule struct {
	book   *addressBook
	client *directory.Client
	agent  *directory.NodeAgent
	cancel context.CancelFunc
	done   chan struct{}
	log    *slog.Logger
}

func newAgentModule(book *addressBook) *agentModule { return &agentModule{book: book} }

func (m *agentModule) Name() string { return "node-agent" }

func (m *agentModule) Init(_ context.Context, env *Env) error {
	m.log = env.Logger
	addrs := make([]string, 0, len(env.Config.DirectoryPeers))
	for _, p := range env.Config.DirectoryPeers {
		addrs = append(addrs, p.Addr)
	}
	c, err := directory.NewClient(directory.ClientConfig{
		Addresses:   addrs,
		DialOptions: env.Dialer.DialOptions(),
		Logger:      env.Logger,
	})
	if err != nil {
		return err
	}
	m.client = c
	m.book.setClient(c)
	disks := make([]*pb.Disk, 0, len(env.Config.Disks))
	for _, d := range env.Config.Disks {
		disks = append(disks, &pb.Disk{Path: d, CapacityBytes: diskCapacity(d)})
	}
	roles := make([]string, 0, len(env.Config.Roles))
	for _, r := range env.Config.Roles {
		roles = append(roles, string(r))
	}
	agent, err := directory.NewNodeAgent(directory.AgentConfig{
		Directory: c,
		Node: &pb.RegisterRequest{
			NodeId:        env.Config.NodeID,
			Address:       env.AdvertiseAddr,
			HttpAddress:   env.HTTPAddr,
			FailureDomain: env.Config.FailureDomain,
			Disks:         disks,
			Roles:         roles,
		},
		// The disks' space travels with each heartbeat: statfs of the
		// file systems reports the cluster's from it (internal/meta).
		Stats:    func() *pb.MemberStats { return diskStats(env.Config.Disks) },
		Interval: env.Config.Timeouts.Heartbeat,
		Logger:   env.Logger,
	})
	if err != nil {
		return err
	}
	m.agent = agent
	limit := 3 * env.Config.Timeouts.Heartbeat
	return env.Health.AddCheck("directory-registration", func(context.Context) error {
		if m.agent.Epoch() == 0 {
			return errors.New("not yet registered with the directory")
		}
		if age := time.Since(m.agent.LastAck()); age > limit {
			return fmt.Errorf("no heartbeat acknowledged for %v", age.Round(time.Millisecond))
		}
		return nil
	})
}

func (m *agentModule) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		if err := m.agent.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			m.log.Error("node agent stopped", "err", err)
		}
	}()
	return nil
}

func (m *agentModule) Stop(context.Context) error {
	if m.cancel != nil {
		m.cancel()
		<-m.done
	}
	if m.client != nil {
		return m.client.Close()
	}
	return nil
}

// diskCapacity returns the size of the file system holding path, or 0 if
// it cannot be read.
func diskCapacity(path string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0
	}
	return st.Blocks * uint64(st.Bsize)
}

// diskStats returns the space of the file systems holding the node's
// disks, summed: what an unprivileged writer could fill (the blocks the
// file system reserves for root are left out of the capacity, as they are
// of what is free) and what of it is still free. A disk whose file system
// cannot be read counts for nothing.
func diskStats(disks []string) *pb.MemberStats {
	st := &pb.MemberStats{}
	for _, d := range disks {
		var fs syscall.Statfs_t
		if err := syscall.Statfs(d, &fs); err != nil {
			continue
		}
		reserved := fs.Bfree - min(fs.Bavail, fs.Bfree)
		capacity := (fs.Blocks - min(reserved, fs.Blocks)) * uint64(fs.Bsize)
		st.CapacityBytes += capacity
		st.FreeBytes += min(fs.Bavail*uint64(fs.Bsize), capacity)
	}
	return st
}

// engineCollector exports the engine's Metrics snapshot to Prometheus.
type engineCollector struct{ e *raftengine.Engine }

type engineMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(raftengine.Metrics) float64
}

var engineMetrics = func() []engineMetric {
	def := func(name, help string, kind prometheus.ValueType, v func(raftengine.Metrics) float64) engineMetric {
		return engineMetric{desc: prometheus.NewDesc("arbor_raft_"+name, help, nil, nil), kind: kind, value: v}
	}
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	return []engineMetric{
		def("groups", "Local raft group replicas.", g, func(m raftengine.Metrics) float64 { return float64(m.Groups) }),
		def("leaders", "Local replicas that lead their group.", g, func(m raftengine.Metrics) float64 { return float64(m.Leaders) }),
		def("quiesced", "Local replicas asleep because their group is idle.", g, func(m raftengine.Metrics) float64 { return float64(m.Quiesced) }),
		def("proposals_total", "Proposals accepted by local leaders.", c, func(m raftengine.Metrics) float64 { return float64(m.Proposals) }),
		def("proposals_dropped_total", "Proposals that will never commit.", c, func(m raftengine.Metrics) float64 { return float64(m.ProposalsDropped) }),
		def("applied_total", "Committed entries applied locally.", c, func(m raftengine.Metrics) float64 { return float64(m.Applied) }),
		def("synced_writes_total", "Synced pebble commits of raft state.", c, func(m raftengine.Metrics) float64 { return float64(m.SyncedWrites) }),
		def("messages_sent_total", "Raft messages handed to the transport.", c, func(m raftengine.Metrics) float64 { return float64(m.MessagesSent) }),
		def("messages_received_total", "Raft messages received.", c, func(m raftengine.Metrics) float64 { return float64(m.MessagesReceived) }),
		def("messages_dropped_total", "Raft messages for unknown or stopped groups.", c, func(m raftengine.Metrics) float64 { return float64(m.MessagesDropped) }),
		def("snapshots_sent_total", "Snapshots streamed to other replicas.", c, func(m raftengine.Metrics) float64 { return float64(m.SnapshotsSent) }),
		def("snapshots_applied_total", "Snapshots installed locally.", c, func(m raftengine.Metrics) float64 { return float64(m.SnapshotsApplied) }),
		def("snapshot_bytes_sent_total", "Payload bytes of snapshots sent.", c, func(m raftengine.Metrics) float64 { return float64(m.SnapshotBytesSent) }),
		def("leader_changes_total", "Leader changes seen by local replicas.", c, func(m raftengine.Metrics) float64 { return float64(m.LeaderChanges) }),
		def("lease_reads_total", "Linearizable reads answered from a leader's lease, without a heartbeat round.", c, func(m raftengine.Metrics) float64 { return float64(m.LeaseReads) }),
		def("read_rounds_total", "Linearizable reads (and lease renewals) that took a heartbeat round.", c, func(m raftengine.Metrics) float64 { return float64(m.ReadRounds) }),
	}
}()

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range engineMetrics {
		ch <- m.desc
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.e.Metrics()
	for _, m := range engineMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(snap))
	}
}
