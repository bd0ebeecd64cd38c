package extent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// ManagerDirectory is what the extent manager needs of the directory
// (*directory.Client implements it).
type ManagerDirectory interface {
	ListNodes(ctx context.Context, req *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error)
	ListExtents(ctx context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error)
	CreateExtent(ctx context.Context, req *dpb.CreateExtentRequest) (*dpb.Extent, error)
	ChangeExtentReplicas(ctx context.Context, req *dpb.ChangeExtentReplicasRequest) (*dpb.Extent, error)
}

// Manager defaults and bounds.
const (
	// DefaultInitialExtents is how many extents a new cluster creates by
	// itself.
	DefaultInitialExtents = 4
	maxInitialExtents     = 1024
	// defaultManagerInterval is how often the manager looks at the map.
	defaultManagerInterval = time.Second
	// defaultBootstrapGrace is how long a new directory leader waits for
	// enough storage nodes (one per replica) to register before it creates
	// the first extents with fewer replicas.
	defaultBootstrapGrace = 10 * time.Second
	// defaultCatchUpTimeout bounds the wait for a new replica to receive
	// its snapshot and catch up.
	defaultCatchUpTimeout = 2 * time.Minute
	// auditInterval is how often the manager checks that every replica of
	// every extent exists (a crash between recording an extent and
	// creating its replicas leaves some missing).
	auditInterval = 30 * time.Second
	// maxParallelRepairs bounds the extents repaired at once (FSS §3:
	// each extent recovers onto a different host, in parallel).
	maxParallelRepairs = 8
	// managerRPCTimeout bounds each call the manager makes.
	managerRPCTimeout = 5 * time.Second
	// StorageRole is the node role that hosts extent replicas.
	StorageRole = "storage"
)

// ManagerConfig configures the extent manager.
type ManagerConfig struct {
	Directory ManagerDirectory
	// IsLeader reports whether this node leads the directory group: the
	// manager acts only then.
	IsLeader func() bool
	// InitialExtents is how many extents a new cluster gets (default
	// DefaultInitialExtents).
	InitialExtents int
	// Geometry of the extents it creates (default DefaultGeometry()).
	Geometry       Geometry
	Interval       time.Duration
	BootstrapGrace time.Duration
	CatchUpTimeout time.Duration
	Logger         *slog.Logger
}

func (c *ManagerConfig) validate() error {
	if c.Directory == nil || c.IsLeader == nil {
		return errors.New("extent: manager needs a directory and a leadership test")
	}
	if c.InitialExtents == 0 {
		c.InitialExtents = DefaultInitialExtents
	}
	if c.Geometry == (Geometry{}) {
		c.Geometry = DefaultGeometry()
	}
	if c.Interval == 0 {
		c.Interval = defaultManagerInterval
	}
	if c.BootstrapGrace == 0 {
		c.BootstrapGrace = defaultBootstrapGrace
	}
	if c.CatchUpTimeout == 0 {
		c.CatchUpTimeout = defaultCatchUpTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.InitialExtents < 0 || c.InitialExtents > maxInitialExtents:
		return fmt.Errorf("extent: initial extents %d outside [0, %d]", c.InitialExtents, maxInitialExtents)
	case c.Interval < time.Millisecond || c.BootstrapGrace < 0 || c.CatchUpTimeout < time.Second:
		return fmt.Errorf("extent: manager intervals out of range (interval %v, grace %v, catch-up %v)", c.Interval, c.BootstrapGrace, c.CatchUpTimeout)
	}
	return c.Geometry.Validate()
}

// Manager is the extent store's placement loop (DESIGN.md §2.4, §2.2). It
// runs on every directory member and acts while its node leads the
// directory:
//
//   - a new cluster: it creates the first InitialExtents extents, each
//     with one replica per failure domain where it can (CreateExtent in the
//     directory, then the replicas on their nodes);
//   - a dead node: for each extent with a replica there it creates an
//     empty replica on another node (a failure domain the extent does not
//     use yet, the least loaded), adds it as a learner, waits until it has
//     caught up (by snapshot), promotes it, removes the dead replica, and
//     records the new replica set in the extent map under the next epoch.
//
// Every step is idempotent and the raft membership is the truth between
// steps, so a manager that dies half-way (or loses the directory
// leadership) is resumed by the next one.
type Manager struct {
	cfg    ManagerConfig
	client *Client
	log    *slog.Logger

	leadingSince time.Time
	lastAudit    time.Time

	mu          sync.Mutex
	repairing   map[uint64]bool
	unconfirmed map[uint64]bool
	wg          sync.WaitGroup
	sem         chan struct{}

	stats managerStats
}

type managerStats struct {
	extents, underReplicated                              atomic.Int64
	created, repairsStarted, repairsDone, repairsFailed   atomic.Uint64
	replicasCreated, membershipChanges, leaderlessRepairs atomic.Uint64
}

// NewManager returns a manager; client reaches the nodes.
func NewManager(cfg ManagerConfig, client *Client) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Manager{
		cfg: cfg, client: client, log: cfg.Logger.With("component", "extent-manager"),
		repairing: map[uint64]bool{}, unconfirmed: map[uint64]bool{}, sem: make(chan struct{}, maxParallelRepairs),
	}, nil
}

// Run runs the manager until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	defer m.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !m.cfg.IsLeader() {
			if !m.leadingSince.IsZero() {
				m.log.Info("directory leadership lost; extent manager idle")
			}
			m.leadingSince = time.Time{}
			continue
		}
		if m.leadingSince.IsZero() {
			m.leadingSince, m.lastAudit = time.Now(), time.Time{}
			m.log.Info("directory leader; extent manager active")
		}
		m.pass(ctx)
	}
}

func (m *Manager) listExtents(ctx context.Context) ([]*dpb.Extent, error) {
	var out []*dpb.Extent
	var after uint64
	for range maxListPages {
		resp, err := m.cfg.Directory.ListExtents(ctx, &dpb.ListExtentsRequest{StartAfter: after})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Extents...)
		if !resp.More || len(resp.Extents) == 0 {
			break
		}
		after = resp.Extents[len(resp.Extents)-1].ExtentId
	}
	return out, nil
}

// nodeView is the directory's node table, indexed.
type nodeView map[uint64]*dpb.Node

// usable reports whether node id can hold a replica now.
func (v nodeView) usable(id uint64) bool {
	n := v[id]
	return n != nil && (n.State == dpb.NodeState_NODE_STATE_ALIVE || n.State == dpb.NodeState_NODE_STATE_SUSPECT)
}

// gone reports whether node id's replicas must be replaced: it is dead,
// decommissioned or unknown.
func (v nodeView) gone(id uint64) bool {
	n := v[id]
	return n == nil || n.State == dpb.NodeState_NODE_STATE_DEAD || n.State == dpb.NodeState_NODE_STATE_DECOMMISSIONED
}

func (v nodeView) storage(id uint64) bool {
	n := v[id]
	return n != nil && n.State == dpb.NodeState_NODE_STATE_ALIVE && slices.Contains(n.Roles, StorageRole)
}

// pass looks at the whole map once and starts the work it finds.
func (m *Manager) pass(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
	nodesResp, err := m.cfg.Directory.ListNodes(lctx, &dpb.ListNodesRequest{})
	var extents []*dpb.Extent
	if err == nil {
		extents, err = m.listExtents(lctx)
	}
	cancel()
	if err != nil {
		m.log.Debug("extent manager cannot read the directory", "err", err)
		return
	}
	nodes := nodeView{}
	for _, n := range nodesResp.Nodes {
		nodes[n.Id] = n
	}
	load := map[uint64]int{}
	for _, e := range extents {
		for _, r := range e.Replicas {
			load[r]++
		}
	}
	if len(extents) < m.cfg.InitialExtents {
		if err := m.bootstrap(ctx, nodes, load, len(extents)); err != nil {
			m.log.Warn("creating the first extents", "err", err)
		}
		return
	}
	audit := time.Since(m.lastAudit) >= auditInterval
	if audit {
		m.lastAudit = time.Now()
	}
	under := 0
	for _, e := range extents {
		if m.needsRepair(e, nodes) {
			under++
			m.start(ctx, e, func(ctx context.Context) error { return m.repair(ctx, e, nodes, load) })
			continue
		}
		m.mu.Lock()
		check := audit || m.unconfirmed[e.ExtentId]
		m.mu.Unlock()
		if check {
			m.start(ctx, e, func(ctx context.Context) error { return m.ensureReplicas(ctx, e, nodes) })
		}
	}
	m.stats.extents.Store(int64(len(extents)))
	m.stats.underReplicated.Store(int64(under))
}

func (m *Manager) needsRepair(e *dpb.Extent, nodes nodeView) bool {
	live := 0
	for _, r := range e.Replicas {
		if !nodes.gone(r) {
			live++
		}
	}
	return live < len(e.Replicas) || live < int(e.GetGeometry().GetReplication())
}

// start runs work on e in the background unless work on e is running.
func (m *Manager) start(ctx context.Context, e *dpb.Extent, work func(context.Context) error) {
	m.mu.Lock()
	if m.repairing[e.ExtentId] {
		m.mu.Unlock()
		return
	}
	m.repairing[e.ExtentId] = true
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.repairing, e.ExtentId)
			m.mu.Unlock()
		}()
		select {
		case m.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-m.sem }()
		wctx, cancel := context.WithTimeout(ctx, m.cfg.CatchUpTimeout+4*managerRPCTimeout)
		defer cancel()
		if err := work(wctx); err != nil {
			m.log.Warn("extent work incomplete; will retry", "extent", e.ExtentId, "epoch", e.Epoch, "err", err)
		}
	}()
}

// place picks a node for a new replica: alive, storage role, not in
// exclude; preferring a failure domain not in domains, then the fewest
// replicas, then the lowest id.
func place(nodes nodeView, exclude map[uint64]bool, domains map[string]bool, load map[uint64]int) uint64 {
	var cands []*dpb.Node
	for id, n := range nodes {
		if nodes.storage(id) && !exclude[id] {
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		return 0
	}
	slices.SortFunc(cands, func(a, b *dpb.Node) int {
		da, db := domains[a.FailureDomain], domains[b.FailureDomain]
		if da != db {
			if da {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(load[a.Id], load[b.Id]); c != 0 {
			return c
		}
		return cmp.Compare(a.Id, b.Id)
	})
	return cands[0].Id
}

// bootstrap creates extents until the map holds InitialExtents.
func (m *Manager) bootstrap(ctx context.Context, nodes nodeView, load map[uint64]int, have int) error {
	var storage int
	for id := range nodes {
		if nodes.storage(id) {
			storage++
		}
	}
	g := m.cfg.Geometry
	if storage < int(g.Replication) {
		if time.Since(m.leadingSince) < m.cfg.BootstrapGrace || storage == 0 {
			return nil
		}
		g.Replication = uint32(storage)
	}
	for i := have; i < m.cfg.InitialExtents; i++ {
		chosen, domains := map[uint64]bool{}, map[string]bool{}
		var replicas []uint64
		for range g.Replication {
			id := place(nodes, chosen, domains, load)
			if id == 0 {
				return fmt.Errorf("no node for replica %d of %d", len(replicas)+1, g.Replication)
			}
			chosen[id], domains[nodes[id].FailureDomain] = true, true
			replicas = append(replicas, id)
			load[id]++
		}
		cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
		e, err := m.cfg.Directory.CreateExtent(cctx, &dpb.CreateExtentRequest{Geometry: dirGeometry(g), Replicas: replicas})
		cancel()
		if err != nil {
			return fmt.Errorf("record extent: %w", err)
		}
		m.stats.created.Add(1)
		m.mu.Lock()
		m.unconfirmed[e.ExtentId] = true
		m.mu.Unlock()
		m.log.Info("extent created", "extent", e.ExtentId, "replicas", replicas, "geometry", g.String())
		if err := m.ensureReplicas(ctx, e, nodes); err != nil {
			m.log.Warn("extent replicas not all created yet", "extent", e.ExtentId, "err", err)
		}
	}
	return nil
}

func dirGeometry(g Geometry) *dpb.ExtentGeometry {
	return &dpb.ExtentGeometry{PageSizeBytes: g.PageSizeBytes, BlockSizeBytes: g.BlockSizeBytes, ExtentSizeBytes: g.ExtentSizeBytes, Replication: g.Replication}
}

// statuses asks every usable replica of e about its replica.
func (m *Manager) statuses(ctx context.Context, e *dpb.Extent, nodes nodeView) map[uint64]*pb.ReplicaStatusResponse {
	out := map[uint64]*pb.ReplicaStatusResponse{}
	for _, r := range e.Replicas {
		if nodes.gone(r) {
			continue
		}
		if st, err := m.replicaStatus(ctx, r, e.ExtentId, false); err == nil {
			out[r] = st
		}
	}
	return out
}

// ensureReplicas creates the replicas of e that are missing on usable
// nodes: all of them (bootstrapping the group) if none exists and the
// group was never changed, else empty ones that the leader fills by
// snapshot, for nodes the group's membership lists.
func (m *Manager) ensureReplicas(ctx context.Context, e *dpb.Extent, nodes nodeView) error {
	sts := m.statuses(ctx, e, nodes)
	var members []uint64
	for _, st := range sts {
		if st.Exists && (members == nil || st.LeaderId == st.NodeId) {
			members = append(slices.Clone(st.Voters), st.Learners...)
		}
	}
	g := geometryFromDir(e.Geometry)
	complete := true
	for _, r := range e.Replicas {
		if !nodes.usable(r) {
			continue
		}
		st, asked := sts[r]
		if !asked {
			complete = false
			continue
		}
		if st.Exists {
			continue
		}
		var voters []uint64
		switch {
		case members == nil && e.Epoch == 1:
			voters = e.Replicas // nobody has it: bootstrap the group
		case slices.Contains(members, r):
			// A member whose replica is gone (a new disk): an empty
			// replica gets a snapshot from the leader.
		default:
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
		cl, err := m.client.NodeClient(cctx, r)
		if err == nil {
			_, err = cl.CreateReplica(cctx, &pb.CreateReplicaRequest{ExtentId: e.ExtentId, Geometry: g.toProto(), Voters: voters})
		}
		cancel()
		if err != nil {
			complete = false
			m.log.Debug("create extent replica", "extent", e.ExtentId, "node", r, "err", err)
			continue
		}
		m.stats.replicasCreated.Add(1)
	}
	if complete {
		m.mu.Lock()
		delete(m.unconfirmed, e.ExtentId)
		m.mu.Unlock()
	}
	return nil
}

func geometryFromDir(g *dpb.ExtentGeometry) Geometry {
	return Geometry{PageSizeBytes: g.GetPageSizeBytes(), BlockSizeBytes: g.GetBlockSizeBytes(), ExtentSizeBytes: g.GetExtentSizeBytes(), Replication: g.GetReplication()}
}

// repair brings e back to full replication on usable nodes: one new
// replica per pass (add learner, catch up, promote), then the removal of
// replicas on gone nodes, then the extent map under the next epoch.
func (m *Manager) repair(ctx context.Context, e *dpb.Extent, nodes nodeView, load map[uint64]int) error {
	id := e.ExtentId
	m.stats.repairsStarted.Add(1)
	fail := func(err error) error {
		m.stats.repairsFailed.Add(1)
		return err
	}
	var live, gone []uint64
	for _, r := range e.Replicas {
		if nodes.gone(r) {
			gone = append(gone, r)
		} else {
			live = append(live, r)
		}
	}
	leader, err := m.findLeader(ctx, e, live)
	if err != nil {
		m.stats.leaderlessRepairs.Add(1)
		return fail(err)
	}
	ls, err := m.replicaStatus(ctx, leader, id, true)
	if err != nil {
		return fail(err)
	}
	if !ls.Exists || ls.LeaderId != leader {
		return fail(fmt.Errorf("node %d no longer leads extent %d", leader, id))
	}
	members := map[uint64]bool{}
	for _, n := range append(slices.Clone(ls.Voters), ls.Learners...) {
		members[n] = true
	}
	// A live replica the group no longer counts (it was recovered from
	// another replica by arbor extent recover while this one was away) is
	// dropped from the map like a gone one; its node collects it as an
	// orphan (Node.collectOrphans).
	kept := live[:0:0]
	for _, r := range live {
		if members[r] {
			kept = append(kept, r)
		} else {
			gone = append(gone, r)
		}
	}
	live = kept
	// A member not in the map is an earlier pass's new replica: finish it.
	var target uint64
	for n := range members {
		if !slices.Contains(e.Replicas, n) && nodes.usable(n) {
			target = n
		}
	}
	if target == 0 && len(live) < int(e.Geometry.GetReplication()) {
		exclude, domains := map[uint64]bool{}, map[string]bool{}
		for _, r := range e.Replicas {
			exclude[r] = true
		}
		for n := range members {
			exclude[n] = true
		}
		for _, r := range live {
			if n := nodes[r]; n != nil {
				domains[n.FailureDomain] = true
			}
		}
		if target = place(nodes, exclude, domains, load); target == 0 {
			return fail(fmt.Errorf("no usable storage node for a new replica of extent %d", id))
		}
	}
	if target != 0 {
		m.log.Info("re-replicating extent", "extent", id, "epoch", e.Epoch, "gone", gone, "new_replica", target, "leader", leader)
		if err := m.addReplica(ctx, e, leader, target, members); err != nil {
			return fail(err)
		}
	}
	for _, d := range gone {
		if members[d] {
			if err := m.changeMembership(ctx, id, leader, pb.MembershipOp_MEMBERSHIP_OP_REMOVE, d); err != nil {
				return fail(err)
			}
		}
	}
	replicas := slices.Clone(live)
	if target != 0 && !slices.Contains(replicas, target) {
		replicas = append(replicas, target)
	}
	cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
	ne, err := m.cfg.Directory.ChangeExtentReplicas(cctx, &dpb.ChangeExtentReplicasRequest{ExtentId: id, ExpectedEpoch: e.Epoch, Replicas: replicas})
	cancel()
	if err != nil {
		if errors.Is(err, directory.ErrStaleEpoch) {
			return nil // another pass recorded a newer epoch
		}
		return fail(fmt.Errorf("record replicas %v of extent %d: %w", replicas, id, err))
	}
	m.client.Forget(id)
	m.stats.repairsDone.Add(1)
	m.log.Info("extent replicas changed", "extent", id, "epoch", ne.Epoch, "replicas", ne.Replicas, "removed", gone, "added", target)
	return nil
}

// findLeader asks the live replicas of e who leads it.
func (m *Manager) findLeader(ctx context.Context, e *dpb.Extent, live []uint64) (uint64, error) {
	for _, r := range live {
		st, err := m.replicaStatus(ctx, r, e.ExtentId, false)
		if err == nil && st.Exists && st.LeaderId != 0 {
			return st.LeaderId, nil
		}
	}
	return 0, fmt.Errorf("no live replica of extent %d knows a leader (replicas %v live %v)", e.ExtentId, e.Replicas, live)
}

func (m *Manager) replicaStatus(ctx context.Context, node, id uint64, progress bool) (*pb.ReplicaStatusResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
	defer cancel()
	return m.client.ReplicaStatus(cctx, node, id, progress)
}

func (m *Manager) changeMembership(ctx context.Context, id, leader uint64, op pb.MembershipOp, node uint64) error {
	cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
	defer cancel()
	cl, err := m.client.NodeClient(cctx, leader)
	if err != nil {
		return err
	}
	if _, err := cl.ChangeReplicas(cctx, &pb.ChangeReplicasRequest{ExtentId: id, Op: op, NodeId: node}); err != nil {
		return fmt.Errorf("%v node %d in extent %d at leader %d: %w", op, node, id, leader, err)
	}
	m.stats.membershipChanges.Add(1)
	return nil
}

// addReplica makes target a caught-up voter of e: create its empty
// replica, add it as a learner, wait for its snapshot and catch-up, then
// promote it.
func (m *Manager) addReplica(ctx context.Context, e *dpb.Extent, leader, target uint64, members map[uint64]bool) error {
	id := e.ExtentId
	cctx, cancel := context.WithTimeout(ctx, managerRPCTimeout)
	cl, err := m.client.NodeClient(cctx, target)
	if err == nil {
		_, err = cl.CreateReplica(cctx, &pb.CreateReplicaRequest{ExtentId: id, Geometry: geometryFromDir(e.Geometry).toProto()})
	}
	cancel()
	if err != nil {
		return fmt.Errorf("create replica of extent %d on node %d: %w", id, target, err)
	}
	if !members[target] {
		if err := m.changeMembership(ctx, id, leader, pb.MembershipOp_MEMBERSHIP_OP_ADD_LEARNER, target); err != nil {
			return err
		}
	}
	var goal uint64
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := m.replicaStatus(ctx, leader, id, true)
		if err != nil {
			return err
		}
		if slices.Contains(st.Voters, target) {
			return nil
		}
		if goal == 0 {
			goal = st.Commit
		}
		for _, p := range st.Progress {
			if p.NodeId == target && p.Match >= goal && !p.Snapshot {
				return m.changeMembership(ctx, id, leader, pb.MembershipOp_MEMBERSHIP_OP_ADD_VOTER, target)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica of extent %d on node %d did not catch up: %w", id, target, ctx.Err())
		case <-tick.C:
		}
	}
}
