package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/retry"
)

// Directory is what metadata servers and their clients ask of the cluster
// directory. *directory.Client implements it.
type Directory interface {
	GetDelegationMap(ctx context.Context, req *dpb.GetDelegationMapRequest) (*dpb.DelegationMap, error)
	SetDelegation(ctx context.Context, req *dpb.SetDelegationRequest) (*dpb.Delegation, error)
	RenewDelegations(ctx context.Context, req *dpb.RenewDelegationsRequest) (*dpb.RenewDelegationsResponse, error)
	DeleteDelegation(ctx context.Context, req *dpb.DeleteDelegationRequest) (*dpb.DeleteDelegationResponse, error)
	SplitDelegation(ctx context.Context, req *dpb.SplitDelegationRequest) (*dpb.DelegationPair, error)
	ListNodes(ctx context.Context, req *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error)
	GetMemberStats(ctx context.Context, req *dpb.GetMemberStatsRequest) (*dpb.GetMemberStatsResponse, error)
	GetTLT(ctx context.Context, req *dpb.GetTLTRequest) (*dpb.TLT, error)
	CreateFileSystem(ctx context.Context, req *dpb.CreateFileSystemRequest) (*dpb.FileSystem, error)
	DeleteFileSystem(ctx context.Context, req *dpb.DeleteFileSystemRequest) (*dpb.FileSystem, error)
	GetFileSystem(ctx context.Context, req *dpb.GetFileSystemRequest) (*dpb.FileSystem, error)
	CreateSnapshot(ctx context.Context, req *dpb.CreateSnapshotRequest) (*dpb.Snapshot, error)
	DeleteSnapshot(ctx context.Context, req *dpb.DeleteSnapshotRequest) (*dpb.FileSystem, error)
	GrantLease(ctx context.Context, req *dpb.GrantLeaseRequest) (*dpb.Lease, error)
	RenewLease(ctx context.Context, req *dpb.RenewLeaseRequest) (*dpb.Lease, error)
	ReleaseLease(ctx context.Context, req *dpb.ReleaseLeaseRequest) (*dpb.Lease, error)
	// Status and ListExtents tell how many lost nodes the metadata
	// survives (a file system's data layout may not survive more).
	Status(ctx context.Context, req *dpb.StatusRequest) (*dpb.StatusResponse, error)
	ListExtents(ctx context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error)
}

var _ Directory = (*directory.Client)(nil)

// RoleMeta is the role a node runs metadata servers under (its Node
// record's roles name it).
const RoleMeta = "meta"

// Config configures a metadata server.
type Config struct {
	// Node is this server's node id; NodeEpoch its current incarnation
	// (leases are held per incarnation).
	Node      uint64
	NodeEpoch func() uint64
	Directory Directory
	// Tree is the cluster's B-tree (file systems keep their metadata in
	// it); it should keep a leaf cache (btree.Config.LeafCacheBytes): the
	// server writes most leaves it reads.
	Tree *btree.Tree
	// Data is the tract store, for what the metadata side does to file
	// data: emptying replaced tracts, deleting the blobs of reclaimed
	// files, truncating.
	Data fs.DataStore
	// OpenStores, if Tree is nil, opens the tree and the data store in the
	// background after Start (they need the cluster to be up); until then
	// every request is answered RETRY.
	OpenStores func(ctx context.Context) (*btree.Tree, fs.DataStore, error)
	// Dial connects to other metadata servers (moves, snapshots).
	Dial func(addr string) (grpc.ClientConnInterface, error)
	// Limits bound each file system's table store (zero: DefaultLimits).
	Limits Limits
	// LeaseDuration is a table delegation's lease (zero: 5 s); the owner
	// renews it every RenewInterval (zero: a fifth of it) and stops
	// serving a table whose lease it could not renew in time.
	LeaseDuration, RenewInterval time.Duration
	// PollInterval is how often the server reads the delegation map for
	// tables given to it or taken from it (zero: 2 s). It is a fallback:
	// whoever gives a server a table (a move, a split, the coordinator's
	// reassignment) tells it at once (tellFollow), and a server stops
	// serving a table whose lease it could not renew without reading
	// the map.
	PollInterval time.Duration
	// ReclaimInterval is how often orphans of dead sessions are reclaimed
	// in the tables served here (zero: 30 s; negative: never).
	ReclaimInterval time.Duration
	// Split says when the server splits its tables on its own (zero:
	// DefaultSplitPolicy; Cooldown < 0: never; autosplit.go).
	Split  SplitPolicy
	Logger *slog.Logger
	// Metrics, if set, receives arbor_meta_* series.
	Metrics prometheus.Registerer
}

// Server is one node's metadata server (DESIGN.md §2.6): it serves the
// tables the delegation map gives it, runs the delegation coordinator
// when it holds the coordinator lease, and answers the Meta gRPC service.
type Server struct {
	pb.UnimplementedMetaServer
	cfg Config
	log *slog.Logger
	m   *storeMetrics

	mu  sync.Mutex
	fss map[uint64]*fsState

	peers peers
	coord coordinatorState
	// leases: the tables served here, by id, with the lease state.
	leaseMu sync.Mutex
	leases  map[uint64]*lease

	// splits: what the automatic splits remember per table served here;
	// only the automatic splits' loop touches it.
	splits map[uint64]*splitState
	// servingMu serializes what changes the tables served here: following
	// the map, renewing (and taking back) leases, moves and splits. Without
	// it, a map read during a split would drop the parts the split just
	// acquired.
	servingMu sync.Mutex

	inflightMu sync.Mutex
	inflight   map[[2]uint64]*call

	borrowMu sync.Mutex
	borrowed map[uint64]*borrowed

	// owners: the tenant of each file system callers named (tenancy.go).
	owners ownerCache

	place placer

	// capacity is the cluster's capacity statfs reports (capacity.go).
	capacity capacityCache

	// jobs: the progress of the long requests under way (progress.go).
	jobs jobTable

	stores atomic.Pointer[stores]

	// ctx ends when the server stops: it bounds all background work.
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
}

// stores are the tree and the data store the server works on.
type stores struct {
	tree *btree.Tree
	data fs.DataStore
}

// errNotReady answers requests that come before the stores are open.
var errNotReady = fmt.Errorf("%w: the metadata server is starting", errRetry)

func (s *Server) tree() *btree.Tree  { return s.stores.Load().tree }
func (s *Server) data() fs.DataStore { return s.stores.Load().data }
func (s *Server) ready() bool        { return s.stores.Load() != nil }

// fsState is what the server runs for one file system.
type fsState struct {
	f      uint64
	st     *store
	live   *fs.FS
	direct *fs.FS // over the tree itself: superblock records, fsck
	mu     sync.Mutex
	snaps  map[uint64]*fs.FS
	stats  *tableStats
}

// lease is a table delegation held here.
type lease struct {
	f     uint64
	table uint64
	epoch uint64
}

// call is a recorded request being executed, so a retry arriving
// meanwhile waits for it instead of running it again.
type call struct {
	seq  uint64
	done chan struct{}
}

// Defaults of Config.
const (
	defaultLeaseDuration = 5 * time.Second
	// Each poll is a linearized read of the directory (a ReadIndex
	// round): at 500 ms, five servers' polls were 10 of the 60 calls a
	// second an untar's cluster served besides the file system's own.
	defaultPollInterval    = 2 * time.Second
	defaultReclaimInterval = 30 * time.Second
	// coordinatorLease names the directory lease the delegation
	// coordinator holds (Ursa Minor §3.1: one coordinator).
	coordinatorLease = "meta/coordinator"
)

// NewServer returns a metadata server; Start starts its background work.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Node == 0 || cfg.Directory == nil || cfg.Dial == nil {
		return nil, errors.New("meta: Config needs Node, Directory and Dial")
	}
	if (cfg.Tree == nil || cfg.Data == nil) && cfg.OpenStores == nil {
		return nil, errors.New("meta: Config needs Tree and Data, or OpenStores")
	}
	if cfg.NodeEpoch == nil {
		cfg.NodeEpoch = func() uint64 { return 0 }
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	switch {
	case cfg.Split == (SplitPolicy{}):
		cfg.Split = DefaultSplitPolicy
	case cfg.Split.Cooldown < 0:
		cfg.Split = SplitPolicy{}
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = defaultLeaseDuration
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = cfg.LeaseDuration / 5
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = defaultPollInterval
	}
	if cfg.ReclaimInterval == 0 {
		cfg.ReclaimInterval = defaultReclaimInterval
	}
	if cfg.LeaseDuration < 2*directory.LeaseSafetyMargin || cfg.RenewInterval >= cfg.LeaseDuration-directory.LeaseSafetyMargin {
		return nil, fmt.Errorf("meta: lease %v renewed every %v leaves no margin", cfg.LeaseDuration, cfg.RenewInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("meta", cfg.Node), m: newStoreMetrics(),
		fss: map[uint64]*fsState{}, leases: map[uint64]*lease{}, splits: map[uint64]*splitState{}, inflight: map[[2]uint64]*call{}, borrowed: map[uint64]*borrowed{},
		stop: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.peers = peers{dir: cfg.Directory, dial: cfg.Dial}
	s.capacity = capacityCache{dir: cfg.Directory, now: time.Now}
	if cfg.Tree != nil {
		s.stores.Store(&stores{tree: cfg.Tree, data: cfg.Data})
	}
	if cfg.Metrics != nil {
		if err := s.m.register(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Register registers the Meta service on r.
// Every method checks the caller's tenant first (tenancy.go).
func (s *Server) Register(r grpc.ServiceRegistrar) { r.RegisterService(s.serviceDesc(), s) }

// Start starts the background work: following the delegation map,
// renewing leases, the coordinator, reclaiming orphans.
func (s *Server) Start() {
	if !s.ready() {
		s.wg.Add(1)
		go s.openStores()
	}
	s.loop("delegation map", s.cfg.PollInterval, s.followMap)
	s.loop("lease renewal", s.cfg.RenewInterval, s.renewLeases)
	s.loop("coordinator", coordinatorCheck, s.coordinate)
	s.loop("unsettled tables", 20*time.Millisecond, s.pollUnsettled)
	s.loop("borrowed tables", time.Second, s.returnBorrowed)
	s.loop("placement refresh", time.Second, s.refreshPlacement)
	s.loop("automatic splits", time.Second, s.autoSplit)
	s.loop("live sessions", time.Second, s.refreshSessions)
	if s.cfg.ReclaimInterval > 0 {
		s.loop("orphan reclaim", s.cfg.ReclaimInterval, s.reclaim)
	}
}

// openStores opens the stores, retrying until it can or the server
// stops.
func (s *Server) openStores() {
	defer s.wg.Done()
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		tree, data, err := s.cfg.OpenStores(ctx)
		cancel()
		if err == nil {
			s.stores.Store(&stores{tree: tree, data: data})
			s.log.Info("metadata server ready")
			return
		}
		s.log.Debug("opening the metadata tree and the data store", "attempt", attempt, "err", err)
		select {
		case <-s.stop:
			return
		case <-time.After(min(time.Second, 50*time.Millisecond<<min(attempt, 5))):
		}
	}
}

func (s *Server) loop(what string, every time.Duration, fn func(ctx context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if s.ready() {
				ctx, cancel := context.WithTimeout(s.ctx, max(every, 10*time.Second))
				fn(ctx)
				cancel()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// Stop stops the server: the tables it serves are no longer served (their
// leases run out and the coordinator gives them to others).
func (s *Server) Stop() {
	s.stop1(true)
}

// crash stops the server as a crash would (tests): what it answered early
// and did not make durable yet is lost, and its tables are not marked
// clean.
func (s *Server) crash() { s.stop1(false) }

func (s *Server) stop1(drain bool) {
	if s.closed.Swap(true) {
		return
	}
	if drain {
		s.drainAll()
	}
	close(s.stop)
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.fss {
		st.st.close()
	}
}

// drainAll makes what every store answered durable and marks its tables
// clean, so that their next owners need not wait for replays (a stop
// loses nothing).
func (s *Server) drainAll() {
	ctx, cancel := context.WithTimeout(context.Background(), stopDrain)
	defer cancel()
	for _, st := range s.fsStates() {
		if err := st.st.drain(ctx, time.Minute); err != nil {
			s.log.Warn("draining a table store at stop; its tables' next owners wait for replays", "fs", st.f, "err", err)
			continue
		}
		st.st.markAllClean(ctx)
	}
}

// stopDrain bounds the drain at stop.
const stopDrain = 3 * time.Second

// fsStates returns the file systems the server runs, in no order.
func (s *Server) fsStates() []*fsState {
	s.mu.Lock()
	defer s.mu.Unlock()
	sts := make([]*fsState, 0, len(s.fss))
	for _, st := range s.fss {
		sts = append(sts, st)
	}
	return sts
}

// fsOf returns what the server runs for file system f, opening it on
// first use (ENOENT if f is not formatted).
func (s *Server) fsOf(ctx context.Context, f uint64) (*fsState, error) {
	if f == 0 {
		return nil, invalidf("file system number 0")
	}
	if !s.ready() {
		return nil, errNotReady
	}
	s.mu.Lock()
	st := s.fss[f]
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	direct, err := fs.Open(ctx, fs.Config{Meta: fs.BTreeMeta{Tree: s.tree()}, Data: s.data(), Number: f, Logger: s.log})
	if err != nil {
		return nil, err
	}
	store := newStore(f, s.cfg.Node, s.tree(), s.cfg.Limits, s.log, s.m)
	st = &fsState{f: f, st: store, direct: direct, snaps: map[uint64]*fs.FS{}, stats: newTableStats()}
	st.live, err = fs.Open(ctx, fs.Config{Meta: store, Data: s.data(), Number: f, Logger: s.log,
		Shared: shared{tree: s.tree(), f: f, lock: s.fsLock(f, "rename")}, OpensKnown: store.opensKnown})
	if err != nil {
		store.close()
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.fss[f]; old != nil {
		store.close()
		return old, nil
	}
	s.fss[f] = st
	return st, nil
}

// engine returns the engine for snapshot snap of st (0: the live one).
func (s *Server) engine(ctx context.Context, st *fsState, snap uint64) (*fs.FS, error) {
	if snap == 0 {
		return st.live, nil
	}
	st.mu.Lock()
	e := st.snaps[snap]
	st.mu.Unlock()
	if e != nil {
		return e, nil
	}
	e, err := fs.Open(ctx, fs.Config{Meta: st.st, Data: s.data(), Number: st.f, Snapshot: snap, Logger: s.log})
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if old := st.snaps[snap]; old != nil {
		return old, nil
	}
	st.snaps[snap] = e
	return e, nil
}

// fsLock is a lock named what over file system f that every server of f
// asks for: a directory lease, held until released or for at most hold
// (its holder dies: the lease lapses). The file system's locks:
//
//	rename  directory moves (fs.Shared's LockRenames)
//	tables  snapshots and table splits: a split during a snapshot would
//	        leave its new table out of the freeze
func (s *Server) fsLock(f uint64, what string) func(ctx context.Context) (func(), error) {
	name := fmt.Sprintf("fs/%d/%s", f, what)
	const hold = 30 * time.Second
	return func(ctx context.Context) (func(), error) {
		for attempt := 0; ; attempt++ {
			l, err := s.cfg.Directory.GrantLease(ctx, &dpb.GrantLeaseRequest{Name: name, HolderNode: s.cfg.Node,
				HolderEpoch: s.cfg.NodeEpoch(), DurationMs: hold.Milliseconds()})
			if err == nil {
				return func() {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, _ = s.cfg.Directory.ReleaseLease(rctx, &dpb.ReleaseLeaseRequest{Name: name, HolderNode: s.cfg.Node, LeaseEpoch: l.GetEpoch()})
				}, nil
			}
			if errors.Is(err, directory.ErrStaleEpoch) {
				// This server's incarnation is not the directory's (it
				// restarted, or was declared dead and came back): the
				// client asks again, here once the epoch is current or
				// at the table's next owner.
				return nil, fmt.Errorf("%w: lock %s: %w", errRetry, name, err)
			}
			// Another holder, or a race with one, passes; no answer
			// may come next time; any other refusal will not.
			if directory.IsRefusal(err) && !errors.Is(err, directory.ErrLeaseHeld) && !errors.Is(err, directory.ErrConflict) {
				return nil, fmt.Errorf("lock %s: %w", name, err)
			}
			if err := retry.Sleep(ctx, backoff(attempt)); err != nil {
				return nil, fmt.Errorf("lock %s: %w", name, err)
			}
		}
	}
}

func backoff(attempt int) time.Duration {
	d := time.Millisecond << min(attempt, 9)
	return min(d, 500*time.Millisecond)
}

// followMap acquires the tables the delegation map gives this server and
// drops those it no longer does.
func (s *Server) followMap(ctx context.Context) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{})
	if err != nil {
		s.log.Debug("reading the delegation map", "err", err)
		return
	}
	mine := map[uint64]*dpb.Delegation{}
	for _, d := range dm.GetDelegations() {
		if d.GetOwnerNode() == s.cfg.Node {
			mine[d.GetTableId()] = d
		}
	}
	s.leaseMu.Lock()
	var lost []*lease
	for id, l := range s.leases {
		if d, ok := mine[id]; !ok || d.GetEpoch() != l.epoch || !s.holds(l) {
			// Gone from the map, or at a new epoch, or dropped by the
			// store (a commit found its header changed): the map's word,
			// if it still names this server, is acquired again below.
			lost = append(lost, l)
			delete(s.leases, id)
		}
	}
	var gained []*dpb.Delegation
	for id, d := range mine {
		if _, ok := s.leases[id]; !ok {
			gained = append(gained, d)
		}
	}
	s.leaseMu.Unlock()
	for _, l := range lost {
		s.dropTable(ctx, l)
	}
	for _, d := range gained {
		if err := s.acquire(ctx, d); err != nil {
			s.log.Warn("acquiring a table", "table", d.GetTableId(), "fs", d.GetFileSystem(), "epoch", d.GetEpoch(), "err", err)
		}
	}
}

// acquire takes table d: its header, then a renewed lease, then serving.
func (s *Server) acquire(ctx context.Context, d *dpb.Delegation) error {
	r, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
	if err != nil {
		return err
	}
	st, err := s.fsOf(ctx, d.GetFileSystem())
	if err != nil {
		return err
	}
	l := &lease{f: d.GetFileSystem(), table: d.GetTableId(), epoch: d.GetEpoch()}
	if err := st.st.acquire(ctx, assignment{id: l.table, r: r, epoch: l.epoch}); err != nil {
		return err
	}
	// The engine's snapshot set may be older than a snapshot deletion made
	// while this server served none of the file system's tables (it is
	// told to refresh only when it owns some): writes must not copy for a
	// snapshot being deleted (fs refreshSnapshots).
	if err := st.live.RefreshSnapshots(ctx); err != nil {
		s.log.Warn("refreshing the snapshot set at a table's acquisition", "table", l.table, "err", err)
	}
	s.leaseMu.Lock()
	s.leases[l.table] = l
	s.leaseMu.Unlock()
	// Serve only under a lease counted from before the renewal was sent;
	// one that lapsed already is taken back by the next renewal round.
	s.renew(ctx, l)
	return nil
}

// dropTable stops serving a table.
func (s *Server) dropTable(ctx context.Context, l *lease) {
	s.mu.Lock()
	st := s.fss[l.f]
	s.mu.Unlock()
	if st != nil {
		st.st.drop(ctx, l.table)
	}
}

// holds reports whether the store still has table l at its epoch. Callers
// hold leaseMu.
func (s *Server) holds(l *lease) bool {
	s.mu.Lock()
	st := s.fss[l.f]
	s.mu.Unlock()
	return st != nil && st.st.has(l.table, l.epoch)
}

// renewLeases renews the lease of every table served here.
func (s *Server) renewLeases(ctx context.Context) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	s.leaseMu.Lock()
	ls := make([]*lease, 0, len(s.leases))
	for _, l := range s.leases {
		ls = append(ls, l)
	}
	s.leaseMu.Unlock()
	// One directory commit renews them all (up to renewalsPerCall): one
	// per table, with hundreds of tables, made the renewals a large share
	// of the directory's commits (and of the cluster's CPU in an untar).
	// Tables whose lease lapsed are taken back after, one at a time.
	var lapsed []*lease
	for len(ls) > 0 {
		n := min(len(ls), renewalsPerCall)
		lapsed = append(lapsed, s.renewBatch(ctx, ls[:n])...)
		ls = ls[n:]
	}
	for _, l := range lapsed {
		s.retake(ctx, l)
	}
}

// renewalsPerCall bounds the leases one RenewDelegations renews (the
// directory takes up to 4,096).
const renewalsPerCall = 1024

// renew extends table l's lease and reports whether it had lapsed.
func (s *Server) renew(ctx context.Context, l *lease) (lapsed bool) {
	return len(s.renewBatch(ctx, []*lease{l})) > 0
}

// renewBatch extends the leases ls in one directory command; each table is
// served until its lease's holder deadline, measured from before the
// request was sent. A lease the directory refuses (the table moved) stops
// the serving; it returns the ones that had expired (nobody took them yet).
func (s *Server) renewBatch(ctx context.Context, ls []*lease) (lapsed []*lease) {
	sent := time.Now()
	ms := s.cfg.LeaseDuration.Milliseconds()
	req := &dpb.RenewDelegationsRequest{Renewals: make([]*dpb.RenewDelegationRequest, len(ls))}
	for i, l := range ls {
		req.Renewals[i] = &dpb.RenewDelegationRequest{TableId: l.table, Epoch: l.epoch, OwnerNode: s.cfg.Node, LeaseDurationMs: ms}
	}
	resp, err := s.cfg.Directory.RenewDelegations(ctx, req)
	if err == nil && len(resp.GetResults()) != len(ls) {
		err = fmt.Errorf("meta: %d lease renewals answered with %d results", len(ls), len(resp.GetResults()))
	}
	if err != nil {
		s.log.Debug("renewing table leases", "tables", len(ls), "err", err)
		return nil
	}
	for i, l := range ls {
		s.mu.Lock()
		st := s.fss[l.f]
		s.mu.Unlock()
		if st == nil {
			continue
		}
		switch err := directory.ResultError(resp.GetResults()[i]); {
		case err == nil:
			st.st.setLease(l.table, l.epoch, directory.HolderDeadline(sent, ms))
		case errors.Is(err, directory.ErrStaleEpoch), errors.Is(err, directory.ErrNotFound):
			s.log.Info("lost a table's delegation", "table", l.table, "epoch", l.epoch, "err", err)
			s.leaseMu.Lock()
			if s.leases[l.table] == l {
				delete(s.leases, l.table)
			}
			s.leaseMu.Unlock()
			st.st.drop(ctx, l.table)
		case errors.Is(err, directory.ErrExpired):
			lapsed = append(lapsed, l)
		default:
			s.log.Debug("renewing a table's lease", "table", l.table, "err", err)
		}
	}
	return lapsed
}

// retake takes back a table whose lease expired before its renewal and
// that nobody took yet, at a new epoch (the old one was not served past
// its deadline). Callers hold servingMu.
func (s *Server) retake(ctx context.Context, l *lease) {
	s.log.Warn("a table's lease expired before its renewal; taking it again", "table", l.table, "epoch", l.epoch)
	d, err := s.regrant(ctx, l)
	if err == nil {
		err = s.acquire(ctx, d)
	}
	if err != nil {
		s.log.Warn("taking back an expired table", "table", l.table, "err", err)
	}
}

func (s *Server) regrant(ctx context.Context, l *lease) (*dpb.Delegation, error) {
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: l.f})
	if err != nil {
		return nil, err
	}
	for _, d := range dm.GetDelegations() {
		if d.GetTableId() == l.table && d.GetEpoch() == l.epoch {
			return s.cfg.Directory.SetDelegation(ctx, &dpb.SetDelegationRequest{TableId: l.table, FileSystem: l.f,
				StartKey: d.GetStartKey(), EndKey: d.GetEndKey(), OwnerNode: s.cfg.Node,
				LeaseDurationMs: s.cfg.LeaseDuration.Milliseconds(), ExpectedEpoch: l.epoch, RequireExpired: true})
		}
	}
	return nil, fmt.Errorf("table %d is no longer at epoch %d", l.table, l.epoch)
}

// pollUnsettled reads the headers of frozen tables until a snapshot thaws
// them, and of tables behind the newest write epoch until they catch up.
func (s *Server) pollUnsettled(ctx context.Context) {
	for _, st := range s.fsStates() {
		st.st.refreshUnsettled(ctx)
		s.completeFrozen(ctx, st)
	}
}

// refreshSessions reads which sessions are live, for each file system
// served here (store.opensKnown).
func (s *Server) refreshSessions(ctx context.Context) {
	for _, st := range s.fsStates() {
		at := time.Now()
		live, err := st.direct.LiveSessions(ctx)
		if err != nil {
			s.log.Debug("reading the live sessions", "fs", st.f, "err", err)
			continue
		}
		st.st.setLive(live, at)
	}
}

// reclaim reclaims, in each table served here, the orphans of sessions
// that expired; the server of each file system's first table also deletes
// its queued blobs.
func (s *Server) reclaim(ctx context.Context) {
	for _, st := range s.fsStates() {
		for _, t := range st.st.owned() {
			if err := st.live.ReclaimOrphansIn(ctx, t.r, false); err != nil {
				s.log.Warn("reclaiming orphans", "fs", st.f, "table", t.id, "err", err)
			}
			if t.r.Lo == 0 {
				if err := st.live.DeleteQueuedBlobs(ctx); err != nil {
					s.log.Warn("deleting queued blobs", "fs", st.f, "err", err)
				}
			}
		}
	}
}

// metaNodes returns the live nodes that run metadata servers.
func metaNodes(nodes []*dpb.Node) []*dpb.Node {
	var out []*dpb.Node
	for _, n := range nodes {
		if n.GetState() == dpb.NodeState_NODE_STATE_ALIVE && slices.Contains(n.GetRoles(), RoleMeta) {
			out = append(out, n)
		}
	}
	return out
}
