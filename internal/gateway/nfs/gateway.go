package nfs

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
)

// FSInfo describes a file system the gateway exports.
type FSInfo struct {
	Number uint64
	Name   string
	// Gen is the file system's generation (its creation time): handles
	// carry it (FileHandle).
	Gen       uint64
	Snapshots []SnapInfo
}

// SnapInfo names a snapshot.
type SnapInfo struct {
	Name   string
	Number uint64
}

// Backend is what the gateway needs of the cluster: the file systems and
// a client session of each. ClusterBackend is the real one; tests run
// file systems in the process.
type Backend interface {
	FileSystems(ctx context.Context) ([]FSInfo, error)
	FileSystemByName(ctx context.Context, name string) (FSInfo, error)
	FileSystemByNumber(ctx context.Context, number uint64) (FSInfo, error)
	// Open opens a client session of file system info at snapshot snap
	// (0: live). Its metadata changes must be durable when answered (NFS
	// replies promise it).
	Open(ctx context.Context, info FSInfo, snap uint64) (FS, error)
}

// ErrNoFileSystem is what a Backend returns for a file system that does
// not exist.
var ErrNoFileSystem = errors.New("nfs: no such file system")

// FS is one client session of a file system: the operations of
// internal/fsclient's FS the gateway serves.
type FS interface {
	Lookup(ctx context.Context, dir fs.Handle, name string) (fs.Attr, error)
	GetAttr(ctx context.Context, h fs.Handle) (fs.Attr, error)
	SetAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error)
	Mknod(ctx context.Context, dir fs.Handle, name string, mode uint32, rdev uint64, cred fs.Cred) (fs.Attr, error)
	Mkdir(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error)
	Symlink(ctx context.Context, dir fs.Handle, name, target string, cred fs.Cred) (fs.Attr, error)
	Readlink(ctx context.Context, h fs.Handle) (string, error)
	Link(ctx context.Context, h, dir fs.Handle, newName string) (fs.Attr, error)
	Unlink(ctx context.Context, dir fs.Handle, name string) error
	Rmdir(ctx context.Context, dir fs.Handle, name string) error
	Rename(ctx context.Context, srcDir fs.Handle, srcName string, dstDir fs.Handle, dstName string, flags uint32) error
	ReadDir(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntry, error)
	ReadDirPlus(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntryPlus, error)
	StatFS(ctx context.Context) (fs.StatFS, error)
	Open(ctx context.Context, h fs.Handle) (fs.Attr, error)
	Release(ctx context.Context, h fs.Handle) error
	Read(ctx context.Context, h fs.Handle, off int64, dest []byte) (int, error)
	Write(ctx context.Context, h fs.Handle, off int64, data []byte) (int, error)
	Fsync(ctx context.Context, h fs.Handle) error
	Close(ctx context.Context) error
}

// Config configures a Gateway.
type Config struct {
	Backend Backend
	Logger  *slog.Logger
	// OpTimeout bounds one NFS call (FSS §8: Orca gives each 55 s, under
	// the clients' 60 s retry).
	OpTimeout time.Duration
	// Window configures the congestion window (zero: defaults).
	Window WindowConfig
	// Replies keeps the duplicate-request cache (drc.go): the cluster's
	// KV store (KVReplies), so every gateway shares it. Nil: no cache.
	Replies ReplyStore
	// Locks keeps the NLM byte-range locks (nlm.go): the cluster's KV
	// store (KVLocks), so every gateway sees them and they outlive the
	// gateway that granted them. Nil: every LOCK is refused
	// (NLM4_DENIED_NOLOCKS).
	Locks LockStore
}

// Defaults and bounds.
const (
	defaultOpTimeout = 55 * time.Second
	// revalidateAfter is how long the gateway reads a file from what it
	// cached before it asks the metadata service again (an NFS client's
	// own attribute cache time is 3 s or more): writes made through other
	// gateways show within it.
	revalidateAfter = time.Second
	// idleRelease is how long a file stays open at the gateway after its
	// last READ or WRITE; its buffered writes are flushed then.
	idleRelease = 5 * time.Second
	// maxParallelReleases bounds the files released at once.
	maxParallelReleases = 16
	// maxIO is the largest READ and WRITE the gateway offers (rtmax,
	// wtmax); prefIO the size it prefers.
	maxIO  = 1 << 20
	prefIO = 1 << 20
	// maxReadDirReply bounds a READDIR(PLUS) reply whatever the client
	// asks.
	maxReadDirReply = 1 << 20
)

// Gateway serves NFSv3 and MOUNT v3 over a cluster's file systems. It keeps
// caches only (file system records, open sessions, files it has open for
// reads and buffered writes): any gateway answers any handle.
type Gateway struct {
	cfg    Config
	log    *slog.Logger
	window *Window

	// verifier is the write verifier (WRITE, COMMIT): it changes whenever
	// unstable data may have been lost (this process started, or a flush
	// of buffered writes failed).
	verifier atomic.Uint64

	mu       sync.Mutex
	sessions map[sessionKey]*session
	closed   bool
	// records caches file system records by number for recordTTL: a
	// deleted file system's handles go stale within it.
	records map[uint64]cachedRecord

	// stop ends the background work (its context: stopCtx).
	stop    context.CancelFunc
	stopCtx context.Context
	wg      sync.WaitGroup
	stats   Stats
}

// Stats counts what the gateway did (fields only grow).
type Stats struct {
	// Replayed counts calls answered from the duplicate-request cache;
	// Retried those run again in retry mode.
	Replayed, Retried atomic.Int64
}

// Counters returns the gateway's statistics.
func (g *Gateway) Counters() *Stats { return &g.stats }

type sessionKey struct{ f, s uint64 }

type cachedRecord struct {
	info FSInfo
	at   time.Time
}

// recordTTL is how long a file system record is used before it is read
// again.
const recordTTL = 2 * time.Second

// record returns file system number's record (cached for recordTTL).
func (g *Gateway) record(ctx context.Context, number uint64, fresh bool) (FSInfo, error) {
	g.mu.Lock()
	c, ok := g.records[number]
	g.mu.Unlock()
	if ok && !fresh && time.Since(c.at) < recordTTL {
		return c.info, nil
	}
	info, err := g.cfg.Backend.FileSystemByNumber(ctx, number)
	if err != nil {
		return info, err
	}
	g.mu.Lock()
	if len(g.records) > 1<<12 {
		clear(g.records)
	}
	g.records[number] = cachedRecord{info: info, at: time.Now()}
	g.mu.Unlock()
	return info, nil
}

// session is one open client session of a file system at a snapshot, with
// the files the gateway holds open in it.
type session struct {
	info FSInfo
	snap uint64
	fsys FS

	mu    sync.Mutex
	files map[fs.Handle]*openFile
}

// openFile is a file the gateway holds open for READ and WRITE.
type openFile struct {
	openedAt, usedAt time.Time
	// dirty: written since its last flush (COMMIT or release).
	dirty bool
}

// New returns a gateway.
func New(cfg Config) (*Gateway, error) {
	if cfg.Backend == nil {
		return nil, errors.New("nfs: Config needs a Backend")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = defaultOpTimeout
	}
	w, err := NewWindow(cfg.Window)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, window: w, sessions: map[sessionKey]*session{}, records: map[uint64]cachedRecord{}}
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	g.newVerifier()
	g.wg.Add(1)
	go g.releaser()
	return g, nil
}

func (g *Gateway) newVerifier() {
	var b [8]byte
	_, _ = crand.Read(b[:])
	v := uint64(0)
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	g.verifier.Store(v)
}

// Programs returns the RPC programs the gateway serves: NFS v3, MOUNT
// v3, NLM v4 and the status monitor NSM v1 (nlm.go).
func (g *Gateway) Programs() []sunrpc.Program {
	return append([]sunrpc.Program{
		{Prog: ProgNFS, Low: Version3, High: Version3, Serve: g.serveNFS},
		{Prog: ProgMount, Low: Version3, High: Version3, Serve: g.serveMount},
	}, g.lockPrograms()...)
}

// RegisterMetrics registers the gateway's figures on reg: the congestion
// window (size, calls in flight, calls admitted and refused) and the
// duplicate-request cache (replies replayed, calls rerun in retry mode).
func (g *Gateway) RegisterMetrics(reg prometheus.Registerer) error {
	opts := func(name, help string) (prometheus.GaugeOpts, prometheus.CounterOpts) {
		return prometheus.GaugeOpts{Namespace: "arbor", Subsystem: "nfs", Name: name, Help: help},
			prometheus.CounterOpts{Namespace: "arbor", Subsystem: "nfs", Name: name, Help: help}
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		o, _ := opts(name, help)
		return prometheus.NewGaugeFunc(o, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		_, o := opts(name, help)
		return prometheus.NewCounterFunc(o, f)
	}
	for _, c := range []prometheus.Collector{
		gauge("window_size", "The congestion window: NFS calls the gateway runs at once (FSS §8).", func() float64 { return g.window.Stats().Size }),
		gauge("calls_in_flight", "NFS calls running.", func() float64 { return float64(g.window.Stats().InFlight) }),
		counter("calls_admitted_total", "NFS calls admitted by the congestion window.", func() float64 { return float64(g.window.Stats().Admitted) }),
		counter("calls_refused_total", "NFS calls that found no place in the window before their deadline (answered JUKEBOX).", func() float64 { return float64(g.window.Stats().Refused) }),
		counter("replies_replayed_total", "Retransmitted calls answered from the duplicate-request cache.", func() float64 { return float64(g.stats.Replayed.Load()) }),
		counter("calls_retried_total", "Calls found started by another attempt and rerun in retry mode.", func() float64 { return float64(g.stats.Retried.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("nfs: register metrics: %w", err)
		}
	}
	return nil
}

// Logger returns the gateway's logger.
func (g *Gateway) Logger() *slog.Logger { return g.log }

// Window returns the gateway's congestion window.
func (g *Gateway) Window() *Window { return g.window }

// Close flushes what the gateway buffered and closes its sessions.
func (g *Gateway) Close(ctx context.Context) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	ss := g.sessions
	g.sessions = map[sessionKey]*session{}
	g.mu.Unlock()
	g.stop()
	g.wg.Wait()
	var errs []error
	for _, s := range ss {
		s.releaseIdle(ctx, g, time.Time{})
		errs = append(errs, s.fsys.Close(ctx))
	}
	return errors.Join(errs...)
}

// releaser releases files idle for idleRelease (flushing their writes).
func (g *Gateway) releaser() {
	defer g.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-g.stopCtx.Done():
			return
		case <-t.C:
		}
		if g.cfg.Replies != nil && time.Since(lastSweep) > sweepEvery {
			lastSweep = time.Now()
			ctx, cancel := context.WithTimeout(g.stopCtx, g.cfg.OpTimeout)
			if err := g.cfg.Replies.Sweep(ctx, time.Now().Add(-replyTTL)); err != nil {
				g.log.Warn("nfs: sweeping the duplicate-request cache", "err", err)
			}
			cancel()
		}
		g.mu.Lock()
		ss := make([]*session, 0, len(g.sessions))
		for _, s := range g.sessions {
			ss = append(ss, s)
		}
		g.mu.Unlock()
		for _, s := range ss {
			ctx, cancel := context.WithTimeout(g.stopCtx, g.cfg.OpTimeout)
			s.releaseIdle(ctx, g, time.Now().Add(-idleRelease))
			cancel()
		}
	}
}

// releaseIdle releases the files last used before cutoff (every file if
// cutoff is zero). A failed flush of buffered writes changes the write
// verifier: clients resend what they did not commit.
func (s *session) releaseIdle(ctx context.Context, g *Gateway, cutoff time.Time) {
	s.mu.Lock()
	var idle []fs.Handle
	for h, of := range s.files {
		if cutoff.IsZero() || of.usedAt.Before(cutoff) {
			idle = append(idle, h)
			delete(s.files, h)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelReleases)
	for _, h := range idle {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.fsys.Release(ctx, h); err != nil {
				g.log.Warn("nfs: releasing a file lost its buffered writes; new write verifier", "fs", s.info.Name, "handle", h, "err", err)
				g.newVerifier()
			}
		})
	}
	wg.Wait()
}

// session returns the open session of file system f at snapshot snap.
func (g *Gateway) session(ctx context.Context, info FSInfo, snap uint64) (*session, error) {
	k := sessionKey{info.Number, snap}
	g.mu.Lock()
	if s := g.sessions[k]; s != nil && s.info.Gen == info.Gen {
		g.mu.Unlock()
		return s, nil
	}
	g.mu.Unlock()
	fsys, err := g.cfg.Backend.Open(ctx, info, snap)
	if err != nil {
		return nil, err
	}
	s := &session{info: info, snap: snap, fsys: fsys, files: map[fs.Handle]*openFile{}}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		_ = fsys.Close(ctx)
		return nil, errors.New("nfs: gateway closed")
	}
	if old := g.sessions[k]; old != nil {
		if old.info.Gen == info.Gen {
			_ = fsys.Close(ctx)
			return old, nil
		}
		go func() { _ = old.fsys.Close(context.Background()) }()
	}
	g.sessions[k] = s
	return s, nil
}

// resolve returns the session a handle belongs to, or the NFS status to
// answer: BADHANDLE for bytes that are no handle, STALE for a handle of a
// file system or snapshot that is gone.
func (g *Gateway) resolve(ctx context.Context, raw []byte) (*session, FileHandle, Status) {
	fh, err := DecodeHandle(raw)
	if err != nil {
		return nil, fh, ErrBadHandle
	}
	info, err := g.record(ctx, fh.F, false)
	if err == nil && (info.Gen != fh.Gen || fh.S != 0 && !hasSnapshot(info, fh.S)) {
		// Made since the record was cached?
		info, err = g.record(ctx, fh.F, true)
	}
	if errors.Is(err, ErrNoFileSystem) {
		return nil, fh, ErrStale
	}
	if err != nil {
		g.log.Warn("nfs: looking up a file system", "fs", fh.F, "err", err)
		return nil, fh, ErrJukebox
	}
	if info.Gen != fh.Gen {
		return nil, fh, ErrStale
	}
	if fh.S != 0 && !hasSnapshot(info, fh.S) {
		return nil, fh, ErrStale
	}
	s, err := g.session(ctx, info, fh.S)
	if err != nil {
		g.log.Warn("nfs: opening a file system", "fs", info.Name, "err", err)
		return nil, fh, ErrJukebox
	}
	return s, fh, OK
}

func hasSnapshot(info FSInfo, s uint64) bool {
	for _, sn := range info.Snapshots {
		if sn.Number == s {
			return true
		}
	}
	return false
}

// handleOf returns the handle of object h in session s.
func (s *session) handleOf(h fs.Handle) FileHandle {
	return FileHandle{F: s.info.Number, H: h, S: s.snap, Gen: s.info.Gen}
}

func (s *session) fsid() uint64 { return fsid(s.info.Number, s.snap) }

// use opens file h for a READ or WRITE if the gateway does not hold it
// open yet, or holds it from longer ago than revalidateAfter (reads then
// see what was written through other gateways since).
func (s *session) use(ctx context.Context, h fs.Handle, write bool) error {
	now := time.Now()
	s.mu.Lock()
	of := s.files[h]
	if of != nil && (write || now.Sub(of.openedAt) < revalidateAfter) {
		of.usedAt = now
		of.dirty = of.dirty || write
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	if _, err := s.fsys.Open(ctx, h); err != nil {
		return err
	}
	s.mu.Lock()
	if old := s.files[h]; old != nil {
		// Held already: the new open refreshed the cache; give the extra
		// open back (it flushes what is buffered).
		old.openedAt, old.usedAt = now, now
		old.dirty = old.dirty || write
		s.mu.Unlock()
		return s.fsys.Release(ctx, h)
	}
	s.files[h] = &openFile{openedAt: now, usedAt: now, dirty: write}
	s.mu.Unlock()
	return nil
}

// Cred is who makes a call: AUTH_SYS's uid, gid and groups (AUTH_NONE is
// nobody).
type Cred struct {
	Uid, Gid uint32
	Gids     []uint32
}

const nobody = 65534

func credOf(c *sunrpc.Call) Cred {
	if c.Sys != nil {
		return Cred{Uid: c.Sys.Uid, Gid: c.Sys.Gid, Gids: c.Sys.Gids}
	}
	return Cred{Uid: nobody, Gid: nobody}
}

func (c Cred) fs() fs.Cred { return fs.Cred{Uid: c.Uid, Gid: c.Gid} }

func (c Cred) inGroup(g uint32) bool {
	if c.Gid == g {
		return true
	}
	for _, x := range c.Gids {
		if x == g {
			return true
		}
	}
	return false
}

// Permission bits asked of an object.
const (
	permRead  = 4
	permWrite = 2
	permExec  = 1
)

// permits reports whether c may do want (permRead|permWrite|permExec) to
// an object with attributes a, as POSIX's permission check: root may do
// anything but execute a file no one may execute.
func (c Cred) permits(a *fs.Attr, want uint32) bool {
	mode := a.Mode
	if c.Uid == 0 {
		if want&permExec != 0 && !a.IsDir() && mode&0o111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case c.Uid == a.Uid:
		bits = (mode >> 6) & 7
	case c.inGroup(a.Gid):
		bits = (mode >> 3) & 7
	default:
		bits = mode & 7
	}
	return bits&want == want
}

// check returns EACCES unless c may do want to a.
func (c Cred) check(a *fs.Attr, want uint32) error {
	if !c.permits(a, want) {
		return fmt.Errorf("uid %d may not do %o to %v: %w", c.Uid, want, a.Handle, syscall.EACCES)
	}
	return nil
}

// mayDelete checks the sticky bit of dir for removing or renaming the
// entry whose attributes are victim.
func (c Cred) mayDelete(dir, victim *fs.Attr) error {
	if dir.Mode&syscall.S_ISVTX == 0 || c.Uid == 0 || c.Uid == dir.Uid || c.Uid == victim.Uid {
		return nil
	}
	return fmt.Errorf("sticky directory %v: uid %d owns neither it nor the entry: %w", dir.Handle, c.Uid, syscall.EPERM)
}

// setAttr changes h's attributes durably before it returns, as an NFS
// reply promises: the client library holds changes to a file it has open
// until its next flush, so the change is flushed at once.
func (s *session) setAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error) {
	a, err := s.fsys.SetAttr(ctx, h, in)
	if err != nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return a, err
	}
	if err := s.fsys.Fsync(ctx, h); err != nil {
		return a, err
	}
	return a, nil
}
