package tract

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// ManagerDirectory is what the TLT manager needs of the directory: the
// local replica's state (read on the leader) and the leader's write path.
type ManagerDirectory interface {
	// IsLeader reports whether this replica leads the directory group.
	IsLeader() bool
	Cluster() *dpb.ClusterInfo
	Nodes() []*dpb.Node
	TLT() *dpb.TLT
	InitCluster(ctx context.Context, req *dpb.InitClusterRequest) (*dpb.ClusterInfo, error)
	InstallTLT(ctx context.Context, req *dpb.InstallTLTRequest) (*dpb.TLTVersion, error)
	UpdateTLTRows(ctx context.Context, req *dpb.UpdateTLTRowsRequest) (*dpb.TLTVersion, error)
}

// ManagerConfig configures the TLT manager.
type ManagerConfig struct {
	Directory ManagerDirectory
	// Dial reaches tractservers (their Status and Inventory).
	Dial DialFunc
	// ClusterID and TractSizeBytes initialise the cluster if nobody has
	// (0: DefaultTractSizeBytes).
	ClusterID      string
	TractSizeBytes uint64
	// Replication is the TLT's k (0: DefaultReplication).
	Replication int
	// MinRows: see LayoutOptions (0: DefaultMinRows).
	MinRows int
	// StorageRole is the node role that serves disks ("storage").
	StorageRole string
	// Tick is how often the manager looks (default 1 s); Settle how long
	// the set of tractservers must stay unchanged before the first table is
	// built, and how long a new tractserver must be alive before it is
	// given rows (default 3 s); BuildWait how long the first table waits
	// for k failure domains before it accepts shared ones (default 30 s).
	Tick, Settle, BuildWait time.Duration
	Logger                  *slog.Logger
	Now                     func() time.Time
}

// Manager maintains the TLT from the directory leader (FDS §3.2-§3.4): it
// builds the table once enough tractservers are up, repairs the rows of
// dead tractservers, gives new tractservers pending entries and commits
// them once they are caught up. Every change is a conditional row update,
// so a manager acting on a stale view only has its proposal refused.
type Manager struct {
	cfg ManagerConfig
	log *slog.Logger

	mu sync.Mutex
	// Leader-local memory, reset when leadership is lost.
	stableSince time.Time
	stableSet   string
	firstAlive  map[ServerID]time.Time
	recovering  bool
	recoverFrom time.Time
	lastReport  Recovery
	// Rows left alone for a dead member with the only complete copy, as
	// of the last step (decided afresh each step from what the
	// tractservers report, so a new leader's manager sees the same).
	waiting    []WaitingRow
	waitingKey string
}

// Recovery summarises the catch-up work the manager sees.
type Recovery struct {
	// Rows with at least one member or pending entry not in sync.
	RowsCatchingUp int
	// Tractservers whose status could not be read.
	Unreachable int
	// Total tracts and bytes copied by catch-up since the nodes started.
	RecoveredTracts, RecoveredBytes uint64
}

// NewManager validates cfg and returns a manager; Run runs it.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Directory == nil || cfg.Dial == nil {
		return nil, errors.New("tract: manager needs the directory and a dialer")
	}
	if cfg.TractSizeBytes == 0 {
		cfg.TractSizeBytes = DefaultTractSizeBytes
	}
	if cfg.TractSizeBytes < minTractSizeBytes || cfg.TractSizeBytes > maxTractSizeBytes || cfg.TractSizeBytes&(cfg.TractSizeBytes-1) != 0 {
		return nil, fmt.Errorf("tract: tract size %d must be a power of two in [%d, %d]", cfg.TractSizeBytes, minTractSizeBytes, maxTractSizeBytes)
	}
	if cfg.Replication == 0 {
		cfg.Replication = DefaultReplication
	}
	if cfg.Replication < 1 || cfg.Replication > maxReplication {
		return nil, fmt.Errorf("tract: replication %d must be in [1, %d]", cfg.Replication, maxReplication)
	}
	if cfg.MinRows == 0 {
		cfg.MinRows = DefaultMinRows
	}
	if cfg.MinRows < 0 || cfg.MinRows > maxTLTRows {
		return nil, fmt.Errorf("tract: min rows %d must be in [0, %d]", cfg.MinRows, maxTLTRows)
	}
	if cfg.StorageRole == "" {
		cfg.StorageRole = "storage"
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	if cfg.Settle == 0 {
		cfg.Settle = 3 * time.Second
	}
	if cfg.BuildWait == 0 {
		cfg.BuildWait = 30 * time.Second
	}
	if cfg.Tick < 10*time.Millisecond || cfg.Settle < 0 || cfg.BuildWait < cfg.Settle {
		return nil, fmt.Errorf("tract: manager tick %v, settle %v, build wait %v are inconsistent", cfg.Tick, cfg.Settle, cfg.BuildWait)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg, log: cfg.Logger.With("component", "tlt-manager"), firstAlive: map[ServerID]time.Time{}}, nil
}

// Run runs the manager until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	ticker := time.NewTicker(m.cfg.Tick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if err := m.Step(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("TLT manager step", "err", err)
		}
	}
}

// LastRecovery returns the recovery figures of the last step.
func (m *Manager) LastRecovery() Recovery {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastReport
}

// Waiting returns the rows the last step left waiting for a dead member
// that may hold their only complete copy.
func (m *Manager) Waiting() []WaitingRow {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.waiting)
}

// noteWaiting records the waiting rows and logs when the set changes.
func (m *Manager) noteWaiting(w []WaitingRow) {
	key := ""
	if len(w) > 0 {
		key = fmt.Sprint(w)
	}
	m.mu.Lock()
	changed := key != m.waitingKey
	m.waiting, m.waitingKey = w, key
	m.mu.Unlock()
	if !changed {
		return
	}
	if len(w) == 0 {
		m.log.Info("no TLT row waits for a dead member any more")
		return
	}
	for _, r := range w {
		m.log.Warn("TLT row waits for a dead member: the only complete copy is on one of them; the row is not repaired until one returns",
			"row", r.Row, "version", r.Version, "waiting_for", fmt.Sprint(r.For))
	}
}

// server is one tractserver as the directory sees it.
type serverState struct {
	info  ServerInfo
	node  *dpb.Node
	alive bool // ALIVE: may be given places
	live  bool // ALIVE or SUSPECT: keeps its places
	gone  bool // DECOMMISSIONED: never returns, no row waits for it
}

func (m *Manager) servers(nodes []*dpb.Node) map[ServerID]serverState {
	out := map[ServerID]serverState{}
	for _, n := range nodes {
		if !slices.Contains(n.Roles, m.cfg.StorageRole) {
			continue
		}
		alive := n.State == dpb.NodeState_NODE_STATE_ALIVE
		live := alive || n.State == dpb.NodeState_NODE_STATE_SUSPECT
		for i, d := range n.Disks {
			id := ServerID{Node: n.Id, Disk: uint32(i)}
			out[id] = serverState{
				info:  ServerInfo{ID: id, Domain: n.FailureDomain, Weight: float64(d.CapacityBytes)},
				node:  n,
				alive: alive,
				live:  live,
				gone:  n.State == dpb.NodeState_NODE_STATE_DECOMMISSIONED,
			}
		}
	}
	return out
}

func (m *Manager) seed(version uint64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(m.cfg.ClusterID))
	return h.Sum64() ^ (version * 0x9e3779b97f4a7c15)
}

// Step runs one round of the manager (exported for tests).
func (m *Manager) Step(ctx context.Context) error {
	dir := m.cfg.Directory
	if !dir.IsLeader() {
		m.mu.Lock()
		m.stableSet, m.firstAlive = "", map[ServerID]time.Time{}
		m.waiting, m.waitingKey = nil, ""
		m.mu.Unlock()
		return nil
	}
	if dir.Cluster() == nil {
		_, err := dir.InitCluster(ctx, &dpb.InitClusterRequest{ClusterId: m.cfg.ClusterID, TractSizeBytes: m.cfg.TractSizeBytes})
		if err != nil {
			return fmt.Errorf("initialise the cluster: %w", err)
		}
		m.log.Info("cluster initialised", "cluster", m.cfg.ClusterID, "tract_size", m.cfg.TractSizeBytes)
		return nil
	}
	states := m.servers(dir.Nodes())
	now := m.cfg.Now()
	var eligible []ServerInfo
	m.mu.Lock()
	for id, s := range states {
		if s.alive {
			eligible = append(eligible, s.info)
			if _, ok := m.firstAlive[id]; !ok {
				m.firstAlive[id] = now
			}
		} else {
			delete(m.firstAlive, id)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(eligible, func(a, b ServerInfo) int {
		if a.ID.less(b.ID) {
			return -1
		}
		if b.ID.less(a.ID) {
			return 1
		}
		return 0
	})
	p := dir.TLT()
	if p == nil {
		return m.build(ctx, eligible, now)
	}
	t, err := TableFromProto(p)
	if err != nil {
		return err
	}
	live := func(s ServerID) bool { return states[s].live }
	sync := m.pollSync(ctx, t, states)
	inSync := func(row int, s ServerID) bool { return sync.inSync[rowServer{row, s}] }
	complete := func(row int, s ServerID) bool { return MemberComplete(t.Rows[row], sync.status[rowServer{row, s}]) }
	opts := LayoutOptions{Seed: m.seed(t.Version), MinRows: m.cfg.MinRows, AllowSharedDomains: distinctDomains(eligible) < t.Replication}
	repair := RepairInput{Table: t, Live: live, Eligible: eligible, InSync: complete,
		Gone: func(s ServerID) bool { return states[s].gone },
		Held: func(row int, s ServerID) uint64 { return sync.status[rowServer{row, s}].GetTracts() }}
	waiting := RowsWaiting(repair)
	m.noteWaiting(waiting)
	if changes := PlanRepair(repair, opts); len(changes) > 0 {
		return m.apply(ctx, "repair", changes)
	}
	if changes := PlanCommit(t, inSync); len(changes) > 0 {
		return m.apply(ctx, "commit", changes)
	}
	m.report(t, sync)
	var newcomers []ServerID
	m.mu.Lock()
	for _, s := range GrowthCandidates(t, eligible) {
		if now.Sub(m.firstAlive[s]) >= m.cfg.Settle {
			newcomers = append(newcomers, s)
		}
	}
	m.mu.Unlock()
	if len(newcomers) == 0 {
		return nil
	}
	hasData, unknown := m.inventories(ctx, newcomers, states)
	// A server whose inventory cannot be read yet waits: giving it rows
	// other than those it holds would copy data for nothing.
	newcomers = slices.DeleteFunc(newcomers, func(s ServerID) bool { return unknown[s.Node] })
	if len(newcomers) == 0 {
		return nil
	}
	changes := PlanGrowth(GrowthInput{Table: t, Servers: eligible, Newcomers: newcomers,
		HasData: func(row int, s ServerID) bool { return hasData[rowServer{row, s}] }, InSync: inSync}, opts)
	// A waiting row gets no new member: there is no complete copy to
	// give it.
	changes = slices.DeleteFunc(changes, func(c RowChange) bool {
		return slices.ContainsFunc(waiting, func(w WaitingRow) bool { return w.Row == c.Row })
	})
	if len(changes) == 0 {
		return nil
	}
	return m.apply(ctx, "growth", changes)
}

func distinctDomains(servers []ServerInfo) int {
	d := map[string]bool{}
	for _, s := range servers {
		d[s.Domain] = true
	}
	return len(d)
}

// build installs the first table once the set of tractservers has been
// stable for the settle time and spans k failure domains (or the build
// wait has passed).
func (m *Manager) build(ctx context.Context, eligible []ServerInfo, now time.Time) error {
	key := fmt.Sprint(eligible)
	m.mu.Lock()
	if key != m.stableSet {
		m.stableSet, m.stableSince = key, now
	}
	since := m.stableSince
	m.mu.Unlock()
	if len(eligible) == 0 || now.Sub(since) < m.cfg.Settle {
		return nil
	}
	k := min(m.cfg.Replication, len(eligible))
	domains := distinctDomains(eligible)
	if domains < k && now.Sub(since) < m.cfg.BuildWait {
		return nil
	}
	opts := LayoutOptions{Seed: m.seed(0), MinRows: m.cfg.MinRows, AllowSharedDomains: domains < k}
	if opts.AllowSharedDomains {
		m.log.Warn("fewer failure domains than replicas: some rows will hold two replicas in one domain",
			"domains", domains, "replication", k)
	}
	rows, err := BuildTable(eligible, k, opts)
	if err != nil {
		return err
	}
	req := &dpb.InstallTLTRequest{ExpectedVersion: 0, Replication: uint32(k)}
	for _, r := range rows {
		slots, pending := rowToProto(r)
		req.Rows = append(req.Rows, &dpb.TLTRow{Slots: slots, Pending: pending})
	}
	v, err := m.cfg.Directory.InstallTLT(ctx, req)
	if err != nil {
		return fmt.Errorf("install the TLT: %w", err)
	}
	m.log.Info("TLT installed", "version", v.GetVersion(), "rows", len(rows), "replication", k, "tractservers", len(eligible), "domains", domains)
	return nil
}

// apply proposes row changes in batches.
func (m *Manager) apply(ctx context.Context, what string, changes []RowChange) error {
	for start := 0; start < len(changes); start += maxRowUpdates {
		batch := changes[start:min(start+maxRowUpdates, len(changes))]
		req := &dpb.UpdateTLTRowsRequest{}
		for _, c := range batch {
			slots, pending := rowToProto(c.row())
			req.Updates = append(req.Updates, &dpb.RowUpdate{Row: uint32(c.Row), ExpectedVersion: c.ExpectedVersion, Slots: slots, Pending: pending})
		}
		v, err := m.cfg.Directory.UpdateTLTRows(ctx, req)
		if err != nil {
			return fmt.Errorf("%s: update %d TLT rows: %w", what, len(batch), err)
		}
		for _, c := range batch {
			m.log.Info("TLT row changed", "what", what, "row", c.Row, "version", v.GetVersion(), "change", c.Why)
		}
	}
	return nil
}

type rowServer struct {
	row int
	s   ServerID
}

type syncView struct {
	inSync map[rowServer]bool
	// status: each member's report of a row at the row's version (see
	// MemberComplete).
	status      map[rowServer]*tpb.RowStatus
	unreachable int
	tracts      uint64
	bytes       uint64
}

// pollSync reads the status of every live tractserver node in the table
// and returns which (row, server) pairs are in sync at the table's row
// version.
func (m *Manager) pollSync(ctx context.Context, t *Table, states map[ServerID]serverState) syncView {
	nodes := map[uint64]string{}
	for _, s := range t.Servers() {
		if st, ok := states[s]; ok && st.live {
			nodes[s.Node] = st.node.Address
		}
	}
	v := syncView{inSync: map[rowServer]bool{}, status: map[rowServer]*tpb.RowStatus{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, addr := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := m.status(ctx, addr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				v.unreachable++
				m.log.Debug("tractserver status", "node", id, "err", err)
				return
			}
			for _, d := range resp.Disks {
				v.tracts += d.RecoveredTracts
				v.bytes += d.RecoveredBytes
				s := ServerID{Node: id, Disk: d.Disk}
				for _, r := range d.Rows {
					if int(r.Row) < len(t.Rows) && r.Version == t.Rows[r.Row].Version {
						v.inSync[rowServer{int(r.Row), s}] = r.InSync
						v.status[rowServer{int(r.Row), s}] = r
					}
				}
			}
		}()
	}
	wg.Wait()
	return v
}

func (m *Manager) status(ctx context.Context, addr string) (*tpb.StatusResponse, error) {
	cc, err := m.cfg.Dial(addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return tpb.NewTractServerClient(cc).Status(cctx, &tpb.StatusRequest{AllRows: true})
}

// inventories asks newcomers which rows they still hold data of; unknown
// lists the nodes that did not answer.
func (m *Manager) inventories(ctx context.Context, newcomers []ServerID, states map[ServerID]serverState) (map[rowServer]bool, map[uint64]bool) {
	out := map[rowServer]bool{}
	unknown := map[uint64]bool{}
	asked := map[uint64]bool{}
	for _, s := range newcomers {
		if asked[s.Node] {
			continue
		}
		asked[s.Node] = true
		cc, err := m.cfg.Dial(states[s].node.Address)
		if err != nil {
			unknown[s.Node] = true
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := tpb.NewTractServerClient(cc).Inventory(cctx, &tpb.InventoryRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			m.log.Debug("tractserver inventory", "node", s.Node, "err", err)
			unknown[s.Node] = true
			continue
		}
		for _, r := range resp.Rows {
			out[rowServer{int(r.Row), ServerID{Node: s.Node, Disk: r.Disk}}] = true
		}
	}
	return out, unknown
}

// report logs the start and the end of catch-up work.
func (m *Manager) report(t *Table, v syncView) {
	catching := 0
	for ri, r := range t.Rows {
		members := append(append([]ServerID(nil), r.Slots...), pendingServers(r)...)
		for _, s := range members {
			if !v.inSync[rowServer{ri, s}] {
				catching++
				break
			}
		}
	}
	now := m.cfg.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastReport = Recovery{RowsCatchingUp: catching, Unreachable: v.unreachable, RecoveredTracts: v.tracts, RecoveredBytes: v.bytes}
	switch {
	case catching > 0 && !m.recovering:
		m.recovering, m.recoverFrom = true, now
		m.log.Info("rows catching up", "rows", catching, "tlt_version", t.Version)
	case catching == 0 && m.recovering && v.unreachable == 0:
		m.recovering = false
		m.log.Info("every row in sync", "took", now.Sub(m.recoverFrom).Round(time.Millisecond), "tlt_version", t.Version,
			"recovered_tracts_total", v.tracts, "recovered_bytes_total", v.bytes)
	}
}

func pendingServers(r Row) []ServerID {
	out := make([]ServerID, len(r.Pending))
	for i, p := range r.Pending {
		out[i] = p.Server
	}
	return out
}
