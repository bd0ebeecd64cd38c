package tract

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// DiskConfig is one disk a node serves: one tractserver.
type DiskConfig struct {
	// Path is the disk's directory; tracts go to Path/tracts.
	Path string
	// FS is the file system the path is on (nil: the real one).
	FS vfs.FS
}

// Config configures a node's tract service.
type Config struct {
	NodeID uint64
	Disks  []DiskConfig
	// DB is the node's pebble database; the service owns prefix 't'.
	DB *pebble.DB
	// SyncWrites makes every write durable (fsync) before it is
	// acknowledged; without it a write survives a process crash but not a
	// machine crash.
	SyncWrites bool
	// EmbedBytes: tracts of at most this many bytes keep their data in DB
	// with their record instead of a file of their own (0:
	// DefaultEmbedBytes; negative: none).
	EmbedBytes int
	// Directory gives the TLT and the node table.
	Directory Directory
	// Dial connects to other nodes (a node's fault-injecting dialer).
	Dial DialFunc
	// Epoch returns the node's registration epoch (0: unknown). A new epoch
	// means the directory declared the node dead: every row it holds must
	// be caught up again before it serves reads.
	Epoch func() uint64
	// Timing; zero takes the defaults in limits.go.
	TLTPoll          time.Duration
	TLTValidity      time.Duration
	RPCTimeout       time.Duration
	SyncParallelism  int
	FetchParallelism int
	DropGrace        time.Duration
	ReturnGrace      time.Duration
	ScrubInterval    time.Duration
	VerifyInterval   time.Duration
	OrphanGrace      time.Duration
	// TornStripeGrace is how old every shard of an erasure-coded stripe
	// must be before the scrubber rewrites a shard of another write than
	// the stripe's (a writer that died mid-stripe), so that it never
	// undoes a write in progress.
	TornStripeGrace time.Duration
	Logger          *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// DiskFull, if set, reports that the node's store is out of space
	// (raftengine's ballast is released): the disks then refuse every
	// write, OVERLOADED, until it has room again, except a blob's delete
	// (BlobOp, Replicate), which frees space.
	DiskFull func() bool
}

func (c *Config) normalize() error {
	if c.NodeID == 0 || c.DB == nil || c.Directory == nil || c.Dial == nil {
		return errors.New("tract: service needs a node id, a database, the directory and a dialer")
	}
	if len(c.Disks) == 0 || len(c.Disks) > 64 {
		return fmt.Errorf("tract: %d disks, want 1 to 64", len(c.Disks))
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.EmbedBytes == 0 {
		c.EmbedBytes = DefaultEmbedBytes
	}
	def(&c.TLTPoll, defaultTLTPoll)
	def(&c.TLTValidity, defaultTLTValidity)
	def(&c.RPCTimeout, defaultRPCTimeout)
	def(&c.DropGrace, defaultDropGrace)
	def(&c.ReturnGrace, defaultReturnGrace)
	def(&c.ScrubInterval, defaultScrubInterval)
	def(&c.VerifyInterval, defaultVerifyInterval)
	def(&c.OrphanGrace, defaultOrphanGrace)
	def(&c.TornStripeGrace, defaultTornStripeGrace)
	if c.SyncParallelism == 0 {
		c.SyncParallelism = defaultSyncParallelism
	}
	if c.FetchParallelism == 0 {
		c.FetchParallelism = defaultFetchParallelism
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"TLTPoll", c.TLTPoll}, {"TLTValidity", c.TLTValidity}, {"RPCTimeout", c.RPCTimeout}, {"DropGrace", c.DropGrace},
		{"ReturnGrace", c.ReturnGrace}, {"ScrubInterval", c.ScrubInterval}, {"VerifyInterval", c.VerifyInterval}, {"OrphanGrace", c.OrphanGrace}, {"TornStripeGrace", c.TornStripeGrace}} {
		if d.v < time.Millisecond || d.v > 24*time.Hour {
			return fmt.Errorf("tract: %s %v out of [1ms, 24h]", d.name, d.v)
		}
	}
	if c.TLTValidity < 2*c.TLTPoll {
		return fmt.Errorf("tract: TLT validity %v must be at least two polls (%v)", c.TLTValidity, 2*c.TLTPoll)
	}
	if c.SyncParallelism < 1 || c.SyncParallelism > 256 || c.FetchParallelism < 1 || c.FetchParallelism > 256 {
		return fmt.Errorf("tract: sync parallelism %d and fetch parallelism %d must be in [1, 256]", c.SyncParallelism, c.FetchParallelism)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Epoch == nil {
		c.Epoch = func() uint64 { return 0 }
	}
	return nil
}

// Service is a node's tract service: one tractserver per disk behind one
// gRPC service (tractpb.TractServer). Register it, then Run it for as long
// as the node serves.
type Service struct {
	tpb.UnimplementedTractServerServer

	cfg   Config
	log   *slog.Logger
	disks []*disk
	peers *peers
	m     counters
	// coders caches the Reed-Solomon encoders of rebuilds and scrubs.
	coders coders

	// table is the newest TLT fetched, with the time its fetch was sent.
	table atomic.Pointer[tableView]

	// applyMu serialises fetching and applying tables.
	applyMu   sync.Mutex
	lastEpoch uint64
	lapsed    bool
	refreshCh chan struct{}
	started   atomic.Bool

	// owners: the owners of the blobs tenants named (tenancy.go).
	owners blobOwners
}

type tableView struct {
	t    *Table
	sent time.Time
}

// NewService opens every disk's store and returns the service.
func NewService(cfg Config) (*Service, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Logger.With("component", "tract", "node", cfg.NodeID), refreshCh: make(chan struct{}, 1)}
	s.peers = newPeers(cfg.Directory, cfg.Dial)
	for i, dc := range cfg.Disks {
		fs := dc.FS
		if fs == nil {
			fs = vfs.Default
		}
		st, err := OpenStore(uint32(i), dc.Path, fs, cfg.DB, cfg.SyncWrites, cfg.EmbedBytes)
		if err != nil {
			return nil, err
		}
		s.disks = append(s.disks, newDisk(s, uint32(i), dc.Path, st))
	}
	return s, nil
}

// Store returns disk i's store (tests and tools).
func (s *Service) Store(i int) *Store { return s.disks[i].store }

// Run fetches the TLT every poll, applies it, and runs every disk's
// catch-up workers and scrubber, until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	s.started.Store(true)
	var wg sync.WaitGroup
	for _, d := range s.disks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.run(ctx)
		}()
	}
	ticker := time.NewTicker(s.cfg.TLTPoll)
	defer ticker.Stop()
	for {
		s.refresh(ctx)
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-ticker.C:
		case <-s.refreshCh:
		}
	}
}

// refresh fetches the TLT and applies it if it changed (or continuity
// changed).
func (s *Service) refresh(ctx context.Context) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	sent := s.cfg.Now()
	fctx, cancel := context.WithTimeout(ctx, s.cfg.TLTValidity)
	p, err := s.cfg.Directory.GetTLT(fctx, &dpb.GetTLTRequest{})
	cancel()
	cur := s.table.Load()
	if err != nil {
		if cur != nil && s.cfg.Now().Sub(cur.sent) > s.cfg.TLTValidity && !s.lapsed {
			s.lapsed = true
			s.log.Warn("cannot reach the directory; not serving until it answers", "err", err, "last_fetch", cur.sent)
		} else {
			s.log.Debug("TLT fetch failed", "err", err)
		}
		return
	}
	t, err := TableFromProto(p)
	if err != nil {
		s.log.Error("the directory's TLT is unusable", "err", err)
		return
	}
	if cur != nil && s.cfg.Now().Sub(cur.sent) > s.cfg.TLTValidity {
		s.lapsed = true
	}
	epoch := s.cfg.Epoch()
	continuous := cur != nil && !s.lapsed && (epoch == s.lastEpoch || s.lastEpoch == 0 || epoch == 0)
	changed := cur == nil || cur.t.Version != t.Version || !continuous
	if cur != nil && t.Version < cur.t.Version {
		// A lagging directory replica answered; never go back.
		return
	}
	s.table.Store(&tableView{t: t, sent: sent})
	if changed {
		if cur != nil && !continuous {
			s.log.Warn("TLT continuity lost (directory unreachable or node declared dead); every row will be caught up", "epoch", epoch)
		}
		for _, d := range s.disks {
			d.observe(ctx, t, continuous)
		}
	}
	s.lapsed = false
	if epoch != 0 {
		s.lastEpoch = epoch
	}
}

// refreshSoon asks Run to fetch the TLT now.
func (s *Service) refreshSoon() {
	select {
	case s.refreshCh <- struct{}{}:
	default:
	}
}

// currentTable returns the TLT the service acts on, or an error if it has
// none or it is too old.
func (s *Service) currentTable() (*Table, error) {
	v := s.table.Load()
	if v == nil {
		return nil, errorf(tpb.ErrorCode_TLT_BEHIND, "tractserver %d has no TLT yet", s.cfg.NodeID)
	}
	if age := s.cfg.Now().Sub(v.sent); age > s.cfg.TLTValidity {
		return nil, errorf(tpb.ErrorCode_TLT_BEHIND, "tractserver %d has not reached the directory for %v", s.cfg.NodeID, age.Round(time.Millisecond))
	}
	return v.t, nil
}

// rowAt checks a request's row version against the server's TLT: an older
// one is stale (the client refreshes), a newer one makes the server fetch
// the table (briefly waiting for it).
func (s *Service) rowAt(ctx context.Context, row int, version uint64) (*Table, Row, error) {
	for attempt := 0; ; attempt++ {
		t, err := s.currentTable()
		if err != nil {
			return nil, Row{}, err
		}
		if row < 0 || row >= len(t.Rows) {
			return nil, Row{}, invalidf("row %d of %d", row, len(t.Rows))
		}
		r := t.Rows[row]
		switch {
		case version == r.Version:
			return t, r, nil
		case version < r.Version:
			s.m.staleRejections.Add(1)
			return nil, Row{}, &Error{Code: tpb.ErrorCode_STALE_TLT, RowVersion: r.Version,
				Message: fmt.Sprintf("row %d is at version %d, the request has %d: refresh the TLT", row, r.Version, version)}
		}
		if attempt >= 20 || ctx.Err() != nil {
			return nil, Row{}, &Error{Code: tpb.ErrorCode_TLT_BEHIND, RowVersion: r.Version,
				Message: fmt.Sprintf("row %d: tractserver %d has version %d, the request has %d", row, s.cfg.NodeID, r.Version, version)}
		}
		s.refreshSoon()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Service) disk(i uint32) (*disk, error) {
	if int(i) >= len(s.disks) {
		return nil, invalidf("node %d has %d disks, no disk %d", s.cfg.NodeID, len(s.disks), i)
	}
	return s.disks[i], nil
}

// writableDisk is disk for a call that stores something: refused while
// the node's store is out of space.
func (s *Service) writableDisk(i uint32) (*disk, error) {
	if s.cfg.DiskFull != nil && s.cfg.DiskFull() {
		return nil, errorf(tpb.ErrorCode_OVERLOADED, "node %d's disk is full: it refuses writes until space is freed", s.cfg.NodeID)
	}
	return s.disk(i)
}

// peer returns a client of the tractserver's node.
func (s *Service) peer(ctx context.Context, id ServerID) (tpb.TractServerClient, error) {
	return s.peers.client(ctx, id.Node)
}

// declaredDead reports whether a call to node failed for want of the
// node (unreachable, timed out, or cut off from the directory) and the
// directory has declared it dead: it then catches up every row it
// holds before it serves again.
func (s *Service) declaredDead(ctx context.Context, node uint64, err error) bool {
	if te, ok := ErrorOf(err); ok {
		if te.Code != tpb.ErrorCode_TLT_BEHIND {
			return false
		}
	} else if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		return false
	}
	st, ok := s.peers.nodeState(ctx, node)
	return ok && (st == dpb.NodeState_NODE_STATE_DEAD || st == dpb.NodeState_NODE_STATE_DECOMMISSIONED)
}

// --- RPC handlers: each checks its arguments and hands over to the disk ---

// WriteTract implements tractpb.TractServerServer.
func (s *Service) WriteTract(ctx context.Context, req *tpb.WriteTractRequest) (*tpb.WriteTractResponse, error) {
	d, err := s.writableDisk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.writeTract(ctx, req)
	return resp, toStatus(ctx, err)
}

// ReadTract implements tractpb.TractServerServer.
func (s *Service) ReadTract(ctx context.Context, req *tpb.ReadTractRequest) (*tpb.ReadTractResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.readTract(ctx, req)
	return resp, toStatus(ctx, err)
}

// BlobOp implements tractpb.TractServerServer. Only create and extend
// are refused on a full disk: a get only reads, and a delete is how an
// operator frees space (its tombstone is a small record, and the
// scrubber then reclaims the blob's tracts).
func (s *Service) BlobOp(ctx context.Context, req *tpb.BlobOpRequest) (*tpb.BlobOpResponse, error) {
	pick := s.disk
	if req.Op == tpb.BlobOpKind_BLOB_OP_CREATE || req.Op == tpb.BlobOpKind_BLOB_OP_EXTEND {
		pick = s.writableDisk
	}
	d, err := pick(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.blobOp(ctx, req)
	return resp, toStatus(ctx, err)
}

// BlobMetas implements tractpb.TractServerServer.
func (s *Service) BlobMetas(ctx context.Context, req *tpb.BlobMetasRequest) (*tpb.BlobMetasResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if len(req.Blobs) > maxBlobMetas {
		return nil, toStatus(ctx, invalidf("%d blobs in one call; at most %d (maxBlobMetas)", len(req.Blobs), maxBlobMetas))
	}
	resp, err := d.answerBlobMetas(ctx, req.Blobs)
	return resp, toStatus(ctx, err)
}

// Replicate implements tractpb.TractServerServer. A full disk still
// takes a deleted blob's tombstone, so that a delete goes through on a
// row with a full member (BlobOp).
func (s *Service) Replicate(ctx context.Context, req *tpb.ReplicateRequest) (*tpb.ReplicateResponse, error) {
	pick := s.writableDisk
	if req.GetMeta().GetBlob().GetDeleted() {
		pick = s.disk
	}
	d, err := pick(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	err = d.replicate(ctx, req)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	return &tpb.ReplicateResponse{}, nil
}

// ListRow implements tractpb.TractServerServer.
func (s *Service) ListRow(ctx context.Context, req *tpb.ListRowRequest) (*tpb.ListRowResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.listRow(ctx, req)
	return resp, toStatus(ctx, err)
}

// FetchTract implements tractpb.TractServerServer.
func (s *Service) FetchTract(ctx context.Context, req *tpb.FetchTractRequest) (*tpb.FetchTractResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.fetchTract(ctx, req)
	return resp, toStatus(ctx, err)
}

// SyncRow implements tractpb.TractServerServer.
func (s *Service) SyncRow(ctx context.Context, req *tpb.SyncRowRequest) (*tpb.SyncRowResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	if err := d.requestSync(ctx, req); err != nil {
		return nil, toStatus(ctx, err)
	}
	return &tpb.SyncRowResponse{}, nil
}

// Status implements tractpb.TractServerServer.
func (s *Service) Status(ctx context.Context, req *tpb.StatusRequest) (*tpb.StatusResponse, error) {
	resp := &tpb.StatusResponse{NodeId: s.cfg.NodeID}
	if t, err := s.currentTable(); err == nil {
		resp.TltVersion, resp.Serving = t.Version, true
	} else if v := s.table.Load(); v != nil {
		resp.TltVersion = v.t.Version
	}
	for _, d := range s.disks {
		resp.Disks = append(resp.Disks, d.status(req.AllRows))
	}
	return resp, nil
}

// Scrub implements tractpb.TractServerServer.
func (s *Service) Scrub(ctx context.Context, req *tpb.ScrubRequest) (*tpb.ScrubResponse, error) {
	total := &tpb.ScrubResponse{}
	for _, d := range s.disks {
		if req.Disk < uint32(len(s.disks)) && d.index != req.Disk {
			continue
		}
		r, err := d.scrub(ctx, req.VerifyChecksums)
		if err != nil {
			return nil, toStatus(ctx, err)
		}
		total.CheckedTracts += r.CheckedTracts
		total.CorruptTracts += r.CorruptTracts
		total.RepairedTracts += r.RepairedTracts
		total.ReclaimedTracts += r.ReclaimedTracts
		total.ReclaimedBytes += r.ReclaimedBytes
		total.UnreferencedFiles += r.UnreferencedFiles
		total.CheckedStripes += r.CheckedStripes
		total.ParityMismatches += r.ParityMismatches
		total.RewrittenShards += r.RewrittenShards
	}
	return total, nil
}

// ListBlobs implements tractpb.TractServerServer.
func (s *Service) ListBlobs(ctx context.Context, req *tpb.ListBlobsRequest) (*tpb.ListBlobsResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.listBlobs(req)
	return resp, toStatus(ctx, err)
}

// Inventory implements tractpb.TractServerServer.
func (s *Service) Inventory(ctx context.Context, _ *tpb.InventoryRequest) (*tpb.InventoryResponse, error) {
	resp := &tpb.InventoryResponse{}
	for _, d := range s.disks {
		syncs := d.store.RowSyncs()
		for row, n := range d.store.Rows() {
			resp.Rows = append(resp.Rows, &tpb.RowData{Disk: d.index, Row: row, Tracts: uint64(n), SyncedVersion: syncs[row].GetSyncedVersion()})
		}
	}
	return resp, nil
}

// Register registers the service on a gRPC server.
// Every method checks the tenancy of the blob it names (tenancy.go).
func (s *Service) Register(r grpc.ServiceRegistrar) { r.RegisterService(s.serviceDesc(), s) }
