package extent

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Node defaults and bounds.
const (
	// defaultRecoveryInterval is how often a node looks for transactions
	// left prepared past their expiry in the extents it leads.
	defaultRecoveryInterval = time.Second
	// staleGrace is how long after its expiry a prepared transaction is
	// left to its coordinator before background recovery resolves it.
	staleGrace = time.Second
	// maxRecoveriesPerPass bounds the transactions one pass resolves per
	// extent.
	maxRecoveriesPerPass = 64
	// recoveryTimeout bounds the recovery of one transaction.
	recoveryTimeout = 5 * time.Second
	// defaultOrphanInterval is how often a node looks for orphan replicas
	// (the first look is at start).
	defaultOrphanInterval = 30 * time.Second
	// orphanAskTimeout bounds each question of an orphan check.
	orphanAskTimeout = 3 * time.Second
)

// NodeConfig configures the extent store of one node.
type NodeConfig struct {
	Engine    Engine
	Directory Directory
	// DialOptions reach other nodes (with the node's fault injector).
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
	// Metrics, if set, receives the node's extent metrics.
	Metrics prometheus.Registerer
	// Manager, if set, runs the extent manager (on directory members).
	Manager *ManagerConfig
	// RecoveryInterval is how often stale transactions are looked for
	// (default 1 s).
	RecoveryInterval time.Duration
	// CallTimeout is the default deadline of the node's own client calls.
	CallTimeout time.Duration
	// OrphanInterval is how often orphan replicas are looked for (default
	// 30 s; the first look is at Start).
	OrphanInterval time.Duration
}

// Node is the extent store on one node: the Extent service, a client for
// forwarding and recovery, the background recovery of transactions whose
// coordinator vanished, and (on directory members) the extent manager.
type Node struct {
	cfg     NodeConfig
	log     *slog.Logger
	server  *Server
	client  *Client
	manager *Manager

	cancel context.CancelFunc
	wg     sync.WaitGroup

	recovered, recoverFailed, orphansRemoved atomic.Uint64
}

// NewNode builds a node's extent store. Register its service before the
// gRPC server starts; Start it once the node serves.
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.Engine == nil || cfg.Directory == nil {
		return nil, errors.New("extent: node needs an engine and a directory")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RecoveryInterval == 0 {
		cfg.RecoveryInterval = defaultRecoveryInterval
	}
	if cfg.OrphanInterval == 0 {
		cfg.OrphanInterval = defaultOrphanInterval
	}
	if cfg.RecoveryInterval < time.Millisecond || cfg.OrphanInterval < time.Millisecond {
		return nil, errors.New("extent: recovery or orphan interval below 1ms")
	}
	client, err := NewClient(ClientConfig{Directory: cfg.Directory, DialOptions: cfg.DialOptions, CallTimeout: cfg.CallTimeout, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	server, err := NewServer(ServerConfig{Engine: cfg.Engine, Peers: client.NodeClient, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("component", "extent"), server: server, client: client}
	if cfg.Manager != nil {
		mc := *cfg.Manager
		if mc.Logger == nil {
			mc.Logger = cfg.Logger
		}
		if n.manager, err = NewManager(mc, client); err != nil {
			return nil, err
		}
	}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(nodeCollector{n: n}); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Register registers the Extent service.
// Every method checks the tenancy of the pages it names (tenancy.go).
func (n *Node) Register(s grpc.ServiceRegistrar) { s.RegisterService(n.server.serviceDesc(), n.server) }

// Client is the node's own client.
func (n *Node) Client() *Client { return n.client }

// Server is the node's Extent service.
func (n *Node) Server() *Server { return n.server }

// Start starts the background work.
func (n *Node) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		n.recoveryLoop(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.orphanLoop(ctx)
	}()
	if n.manager != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.manager.Run(ctx)
		}()
	}
}

// Stop stops the background work and closes the client.
func (n *Node) Stop() error {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	return n.client.Close()
}

func (n *Node) recoveryLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.RecoveryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.recoverStale(ctx)
	}
}

// recoverStale resolves, in every extent this node leads, the transactions
// still prepared (or decided but not released) past their expiry: their
// coordinator is gone (FSS §6: anyone may finish or abort them).
func (n *Node) recoverStale(ctx context.Context) {
	before := time.Now().Add(-staleGrace).UnixMilli()
	for _, gid := range n.cfg.Engine.Groups() {
		st, err := n.cfg.Engine.Status(gid)
		if err != nil || !st.IsLeader() {
			continue
		}
		raw, err := n.cfg.Engine.StateMachine(gid)
		sm, ok := raw.(*StateMachine)
		if err != nil || !ok {
			continue
		}
		stale, err := sm.Stale(before, maxRecoveriesPerPass)
		if err != nil {
			n.log.Warn("scan for stale transactions", "extent", gid, "err", err)
			continue
		}
		for _, rec := range stale {
			rctx, cancel := context.WithTimeout(ctx, recoveryTimeout)
			outcome, err := n.client.Recover(rctx, TxnRef{ID: rec.TxnId, Extent: gid})
			cancel()
			if err != nil {
				n.recoverFailed.Add(1)
				n.log.Debug("recovery of a stale transaction incomplete", "extent", gid, "txn", rec.TxnId, "outcome", outcome.String(), "err", err)
				continue
			}
			n.recovered.Add(1)
			n.log.Info("stale transaction recovered", "extent", gid, "txn", rec.TxnId, "outcome", outcome.String())
		}
	}
}

func (n *Node) orphanLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.OrphanInterval)
	defer t.Stop()
	for {
		n.collectOrphans(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// collectOrphans removes this node's replicas that their extents no longer
// count (issue 13): the replica of a node that was declared dead while its
// extents were re-replicated elsewhere (or recovered from another replica,
// arbor extent recover), and that came back with its old copy. Such a
// replica never learnt of its removal, so it would keep its disk space,
// and its group's old members could even elect a leader among themselves.
//
// A replica is an orphan when all three hold:
//
//  1. it belongs to a group (its conf state names members): a new empty
//     replica, waiting to be added and sent a snapshot, is left alone;
//  2. the directory's extent map does not list this node for the extent;
//  3. a replica the map does list leads the group, and its membership
//     (voters and learners) does not include this node: a replica being
//     added (a learner, not yet in the map) is a member, so it stays.
//
// Anything not known for sure (the directory or the map's replicas
// unreachable) leaves the replica alone until the next look.
func (n *Node) collectOrphans(ctx context.Context) {
	self := n.cfg.Engine.NodeID()
	for _, gid := range n.cfg.Engine.Groups() {
		if ctx.Err() != nil {
			return
		}
		if gid < FirstExtentID {
			continue
		}
		if raw, err := n.cfg.Engine.StateMachine(gid); err != nil {
			continue
		} else if _, ok := raw.(*StateMachine); !ok {
			continue
		}
		st, err := n.cfg.Engine.Status(gid)
		if err != nil || len(st.Voters)+len(st.Learners) == 0 {
			continue
		}
		if n.isOrphan(ctx, self, gid) {
			rctx, cancel := context.WithTimeout(ctx, orphanAskTimeout)
			err := n.cfg.Engine.RemoveGroup(rctx, gid)
			cancel()
			if err != nil {
				n.log.Warn("removing an orphan extent replica", "extent", gid, "err", err)
				continue
			}
			n.orphansRemoved.Add(1)
			n.log.Warn("orphan extent replica removed: the extent map and the group's leader no longer count this node",
				"extent", gid, "local_voters", st.Voters, "local_term", st.Term)
		}
	}
}

func (n *Node) isOrphan(ctx context.Context, self, gid uint64) bool {
	actx, cancel := context.WithTimeout(ctx, orphanAskTimeout)
	defer cancel()
	e, err := n.cfg.Directory.GetExtent(actx, &dpb.GetExtentRequest{ExtentId: gid})
	if err != nil || slices.Contains(e.Replicas, self) {
		return false
	}
	for _, r := range e.Replicas {
		rs, err := n.client.ReplicaStatus(actx, r, gid, false)
		if err != nil || !rs.Exists || rs.LeaderId != r {
			continue
		}
		return !slices.Contains(rs.Voters, self) && !slices.Contains(rs.Learners, self)
	}
	return false
}

// nodeCollector exports the node's counters to Prometheus.
type nodeCollector struct{ n *Node }

type nodeMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*Node) float64
}

var nodeMetrics = func() []nodeMetric {
	def := func(name, help string, kind prometheus.ValueType, v func(*Node) float64) nodeMetric {
		return nodeMetric{desc: prometheus.NewDesc("arbor_extent_"+name, help, nil, nil), kind: kind, value: v}
	}
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	u := func(a *atomic.Uint64) float64 { return float64(a.Load()) }
	mgr := func(f func(*managerStats) float64) func(*Node) float64 {
		return func(n *Node) float64 {
			if n.manager == nil {
				return 0
			}
			return f(&n.manager.stats)
		}
	}
	return []nodeMetric{
		def("reads_total", "Page reads served as leader.", c, func(n *Node) float64 { return u(&n.server.stats.reads) }),
		def("commits_total", "Single-extent MPSCs proposed as leader.", c, func(n *Node) float64 { return u(&n.server.stats.commits) }),
		def("txn_steps_total", "Cross-extent transaction steps proposed as leader.", c, func(n *Node) float64 { return u(&n.server.stats.steps) }),
		def("forwards_total", "Calls forwarded to an extent's leader.", c, func(n *Node) float64 { return u(&n.server.stats.forwards) }),
		def("refused_total", "Commands refused (conflict, stale pointer, prepared, bad input).", c, func(n *Node) float64 { return u(&n.server.stats.refused) }),
		def("delta_mismatches_total", "Page deltas refused as leader because they did not rebuild the promised page (a client's base was wrong; the client resends the image).", c, func(n *Node) float64 { return u(&n.server.stats.deltaMismatches) }),
		def("ambiguous_total", "Writes answered with an unknown outcome.", c, func(n *Node) float64 { return u(&n.server.stats.ambiguous) }),
		def("stale_txns_recovered_total", "Transactions past their expiry resolved by background recovery.", c, func(n *Node) float64 { return u(&n.recovered) }),
		def("stale_txn_recoveries_failed_total", "Background recoveries left incomplete.", c, func(n *Node) float64 { return u(&n.recoverFailed) }),
		def("orphan_replicas_removed_total", "Replicas removed because their extent no longer counts this node.", c, func(n *Node) float64 { return u(&n.orphansRemoved) }),
		def("manager_extents", "Extents in the map (directory leader only).", g, mgr(func(s *managerStats) float64 { return float64(s.extents.Load()) })),
		def("manager_under_replicated", "Extents with a replica on a gone node or too few replicas.", g, mgr(func(s *managerStats) float64 { return float64(s.underReplicated.Load()) })),
		def("manager_extents_created_total", "Extents the manager created.", c, mgr(func(s *managerStats) float64 { return u(&s.created) })),
		def("manager_repairs_started_total", "Re-replication attempts started.", c, mgr(func(s *managerStats) float64 { return u(&s.repairsStarted) })),
		def("manager_repairs_completed_total", "Re-replications recorded in the extent map.", c, mgr(func(s *managerStats) float64 { return u(&s.repairsDone) })),
		def("manager_repairs_failed_total", "Re-replication attempts that failed (retried).", c, mgr(func(s *managerStats) float64 { return u(&s.repairsFailed) })),
		def("manager_membership_changes_total", "Membership changes the manager made.", c, mgr(func(s *managerStats) float64 { return u(&s.membershipChanges) })),
	}
}()

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range nodeMetrics {
		ch <- m.desc
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range nodeMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(c.n))
	}
}
