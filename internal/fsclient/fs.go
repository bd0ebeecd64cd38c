package fsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
)

// FSConfig configures an FS.
type FSConfig struct {
	// Meta answers every metadata operation; Data holds the file bytes
	// (the tract store), which the FS reads and writes itself.
	Meta Metadata
	Data fs.DataStore
	// Snapshot, if non-zero, says the file system is read at that
	// snapshot (read only); ReadOnly refuses every change with EROFS.
	Snapshot uint64
	ReadOnly bool
	// Clock gives the time for modification times (time.Now if nil).
	Clock func() time.Time
	// Logger receives warnings (discarded if nil).
	Logger *slog.Logger
	// MaxDirtyBytesPerFile and MaxDirtyBytes bound the written data the
	// client buffers before it flushes (per file, and in all); zero means
	// 64 MiB and 256 MiB.
	MaxDirtyBytesPerFile, MaxDirtyBytes int64
	// TractCacheBytes bounds the cache of tracts read (zero: 128 MiB,
	// negative: none).
	TractCacheBytes int64
	// FlushAfterClose lets close (Flush) return before a file's data is
	// written to tracts: it places a data hold (fs.SetHold) that makes
	// other clients wait for the data, and flushes in the background
	// (files.go, Flushes after close). Fsync, syncfs, rename and unmount
	// wait for those flushes.
	FlushAfterClose bool
}

// Defaults of FSConfig.
const (
	defaultMaxDirtyBytesPerFile = 128 << 20
	defaultMaxDirtyBytes        = 256 << 20
	defaultTractCacheBytes      = 128 << 20
	// maxFlushAttempts bounds how often a flush starts again after another
	// writer changed its blocks.
	maxFlushAttempts = 8
	// maxStaleReads bounds how often a read retries after finding a tract
	// that was replaced under it.
	maxStaleReads = 4
	// maxParallelTracts bounds the tract reads or writes one call has in
	// flight.
	maxParallelTracts = 32
	// maxLateFlushes bounds the flushes after close running at once
	// (each writes its tracts in parallel), maxLateFlushesQueued those not
	// finished (past it, close flushes: the data a crash of the client
	// can lose after close returned stays small); lateFlushTimeout bounds
	// one.
	maxLateFlushes       = 32
	maxLateFlushesQueued = 64
	lateFlushTimeout     = 2 * time.Minute
	// prefetchTimeout bounds a read-ahead.
	prefetchTimeout = 30 * time.Second
	// readAheadTracts is how many tracts' worth past a sequential stream
	// of reads is loaded ahead (of 4 MiB: a quarter of the default tract
	// cache); readAheadSlack how far from the stream's end a read may
	// start and still belong to it.
	readAheadTracts = 8
	readAheadSlack  = 4 << 20
)

// FS is one client's view of one file system (DESIGN.md §2.6 and §2.7): the
// POSIX operations the FUSE mount and the NFS gateway serve. Metadata
// operations go to the metadata service; the file data goes straight to
// the data store: writes are buffered per file (write-back) and flushed on
// Flush (close), Fsync, Release and when the buffer is large, reads go
// through a tract cache. Close-to-open consistency: Open drops what the
// client cached of a file's blocks, so it sees what others flushed before.
// It is safe for concurrent use.
type FS struct {
	cfg       FSConfig
	md        Metadata
	data      fs.DataStore
	log       *slog.Logger
	now       func() time.Time
	tractSize int
	readOnly  bool
	tracts    *tractCache

	filesMu sync.Mutex
	files   map[fs.Handle]*file
	dirty   atomic.Int64

	// bare are objects seen without extended attributes, until when the
	// client answers their getxattr and listxattr itself (the kernel asks
	// for security.capability before every write).
	bareMu sync.Mutex
	bare   map[fs.Handle]time.Time

	closeMu sync.Mutex
	closed  bool
	stats   Stats

	// Flushes after close (files.go): late counts those not finished
	// (lateMu, lateDone broadcast as each ends), lateSlots bounds those
	// running; lateErr is the first that failed since a sync reported it.
	lateMu    sync.Mutex
	lateDone  *sync.Cond
	late      int
	lateErr   error
	lateSlots chan struct{}
}

// Stats counts what an FS did (fields only grow).
type Stats struct {
	Flushes, TractWrites, TractReads, TractFrees, StaleReads atomic.Int64
	// ReadAheads counts read-ahead windows started.
	ReadAheads atomic.Int64
	// InlineCommits counts flushes of small files whose bytes went into
	// the metadata.
	InlineCommits atomic.Int64
	// LateFlushes counts flushes run after close returned; LateFailures
	// those that failed (reported by the next fsync or syncfs).
	LateFlushes, LateFailures atomic.Int64
}

// NewFS returns a client of the file system cfg.Meta serves.
func NewFS(cfg FSConfig) (*FS, error) {
	if cfg.Meta == nil || cfg.Data == nil {
		return nil, errors.New("client: FSConfig needs Meta and Data")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxDirtyBytesPerFile == 0 {
		cfg.MaxDirtyBytesPerFile = defaultMaxDirtyBytesPerFile
	}
	if cfg.MaxDirtyBytes == 0 {
		cfg.MaxDirtyBytes = defaultMaxDirtyBytes
	}
	if cfg.MaxDirtyBytesPerFile < 0 || cfg.MaxDirtyBytes < cfg.MaxDirtyBytesPerFile {
		return nil, fmt.Errorf("client: dirty bounds %d per file, %d in all: need 0 <= per file <= all", cfg.MaxDirtyBytesPerFile, cfg.MaxDirtyBytes)
	}
	if cfg.TractCacheBytes == 0 {
		cfg.TractCacheBytes = defaultTractCacheBytes
	}
	ts := cfg.Data.TractSize()
	if err := fs.CheckTractSize(ts); err != nil {
		return nil, err
	}
	f := &FS{
		cfg: cfg, md: cfg.Meta, data: cfg.Data, log: cfg.Logger, now: cfg.Clock, tractSize: ts,
		readOnly: cfg.ReadOnly || cfg.Snapshot != 0, tracts: newTractCache(cfg.TractCacheBytes),
		files: map[fs.Handle]*file{}, bare: map[fs.Handle]time.Time{},
		lateSlots: make(chan struct{}, maxLateFlushes),
	}
	f.lateDone = sync.NewCond(&f.lateMu)
	return f, nil
}

// Close flushes every buffered write (a file removed meanwhile by another
// client loses its buffer, with a warning). The FS must not be used
// afterwards.
func (f *FS) Close(ctx context.Context) error {
	f.closeMu.Lock()
	defer f.closeMu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	return errors.Join(f.waitLate(ctx), f.syncAll(ctx, true), f.SyncMetadata(ctx))
}

// Snapshot returns the snapshot the FS reads (0: the live file system).
func (f *FS) Snapshot() uint64 { return f.cfg.Snapshot }

// ReadOnly reports whether changes are refused.
func (f *FS) ReadOnly() bool { return f.readOnly }

// Counters returns the FS's statistics.
func (f *FS) Counters() *Stats { return &f.stats }

// Metadata returns the metadata service the FS uses.
func (f *FS) Metadata() Metadata { return f.md }

func (f *FS) writable() error {
	if f.readOnly {
		return syscall.EROFS
	}
	return nil
}

// Lookup returns the attributes of name in directory dir.
func (f *FS) Lookup(ctx context.Context, dir fs.Handle, name string) (fs.Attr, error) {
	a, err := f.md.Lookup(ctx, dir, name)
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// saw notes attributes the metadata service answered: what this client
// buffered is laid over them, and an object with no extended attributes
// is remembered as such for bareFor.
func (f *FS) saw(a *fs.Attr) {
	f.overlayDirty(a)
	f.bareMu.Lock()
	if a.Xattrs == 0 {
		if len(f.bare) >= maxBare {
			now := time.Now()
			for h, until := range f.bare {
				if now.After(until) {
					delete(f.bare, h)
				}
			}
			if len(f.bare) >= maxBare {
				clear(f.bare)
			}
		}
		f.bare[a.Handle] = time.Now().Add(bareFor)
	} else {
		delete(f.bare, a.Handle)
	}
	f.bareMu.Unlock()
}

// isBare reports whether h was seen without extended attributes lately.
func (f *FS) isBare(h fs.Handle) bool {
	f.bareMu.Lock()
	defer f.bareMu.Unlock()
	until, ok := f.bare[h]
	return ok && time.Now().Before(until)
}

// forgetBare forgets what the client knew of h's extended attributes.
func (f *FS) forgetBare(h fs.Handle) {
	f.bareMu.Lock()
	delete(f.bare, h)
	f.bareMu.Unlock()
}

// bareFor is how long an object seen without extended attributes is
// taken to have none: the kernel's attribute cache time, so an attribute
// another client set shows as late as a mode it changed. maxBare bounds
// the objects remembered.
const (
	bareFor = time.Second
	maxBare = 1 << 16
)

// GetAttr returns h's attributes, with what this client buffered.
func (f *FS) GetAttr(ctx context.Context, h fs.Handle) (fs.Attr, error) {
	if a, ok := f.cachedAttr(h); ok {
		return a, nil
	}
	a, err := f.md.GetAttr(ctx, h)
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// SetAttr changes h's attributes (fs.FS.SetAttr). A size change or an
// explicit modification time first flushes what this client buffered for
// h, so the flush does not undo it.
func (f *FS) SetAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	if a, ok := f.holdAttr(h, in); ok {
		return a, nil
	}
	if in.Valid&(fs.SetSize|fs.SetMtime|fs.SetMtimeNow) != 0 || f.heldAttrs(h) {
		// Buffered data first (a flush must not undo the change), and
		// held attribute changes before this one.
		if err := f.flush(ctx, h, false); err != nil {
			return fs.Attr{}, err
		}
	}
	a, err := f.md.SetAttr(ctx, h, in)
	if err == nil && in.Valid&fs.SetSize != 0 {
		f.forgetBlocks(h)
	}
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// heldAttrs reports whether attribute changes to h are held back.
func (f *FS) heldAttrs(h fs.Handle) bool {
	f.filesMu.Lock()
	st := f.files[h]
	f.filesMu.Unlock()
	if st == nil {
		return false
	}
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	return st.pend.Valid != 0
}

// Create creates a regular file and opens it (Release closes it).
func (f *FS) Create(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	a, err := f.md.Create(ctx, dir, name, mode, cred, true)
	if err != nil {
		return a, err
	}
	st := f.pin(a.Handle, true)
	defer f.unpin(st)
	f.filesMu.Lock()
	st.opens++
	f.filesMu.Unlock()
	f.saw(&a)
	// A new file: its state is known and it has no blocks, so its first
	// flush needs no read of either.
	st.cacheMu.Lock()
	st.setState(fs.FileState{Mode: a.Mode, Size: a.Size, Blob: a.Blob, BlobExists: a.BlobExists, DataGen: a.DataGen})
	st.blocks, st.complete = map[uint64]fs.BlockRef{}, true
	st.cacheMu.Unlock()
	return a, nil
}

// Mknod creates a regular file, FIFO, socket or device node.
func (f *FS) Mknod(ctx context.Context, dir fs.Handle, name string, mode uint32, rdev uint64, cred fs.Cred) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	a, err := f.md.Mknod(ctx, dir, name, mode, rdev, cred)
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// Mkdir creates a directory.
func (f *FS) Mkdir(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	a, err := f.md.Mkdir(ctx, dir, name, mode, cred)
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// Symlink creates a symbolic link to target.
func (f *FS) Symlink(ctx context.Context, dir fs.Handle, name, target string, cred fs.Cred) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	a, err := f.md.Symlink(ctx, dir, name, target, cred)
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// Readlink returns a symlink's target.
func (f *FS) Readlink(ctx context.Context, h fs.Handle) (string, error) {
	return f.md.Readlink(ctx, h)
}

// Link gives object h the name newName in directory dir.
func (f *FS) Link(ctx context.Context, h, dir fs.Handle, newName string) (fs.Attr, error) {
	if err := f.writable(); err != nil {
		return fs.Attr{}, err
	}
	a, err := f.md.Link(ctx, h, dir, newName)
	f.forgetAttrs()
	if err == nil {
		f.saw(&a)
	}
	return a, err
}

// Unlink removes name from dir.
func (f *FS) Unlink(ctx context.Context, dir fs.Handle, name string) error {
	if err := f.writable(); err != nil {
		return err
	}
	defer f.forgetAttrs()
	return f.md.Unlink(ctx, dir, name)
}

// Rmdir removes the empty directory name from dir.
func (f *FS) Rmdir(ctx context.Context, dir fs.Handle, name string) error {
	if err := f.writable(); err != nil {
		return err
	}
	defer f.forgetAttrs()
	return f.md.Rmdir(ctx, dir, name)
}

// Rename moves srcName in srcDir to dstName in dstDir (fs.FS.Rename).
// It first waits for the flushes of files closed before (as ext4 does for
// a rename over a file): a file written, closed and renamed into place
// never shows up under its new name without its data, even after a
// crash of this client.
func (f *FS) Rename(ctx context.Context, srcDir fs.Handle, srcName string, dstDir fs.Handle, dstName string, flags uint32) error {
	if err := f.writable(); err != nil {
		return err
	}
	if err := f.waitLate(ctx); err != nil {
		return err
	}
	defer f.forgetAttrs()
	return f.md.Rename(ctx, srcDir, srcName, dstDir, dstName, flags)
}

// ReadDir returns up to max entries of dir after the cookie after.
func (f *FS) ReadDir(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntry, error) {
	return f.md.ReadDir(ctx, dir, after, max)
}

// ReadDirPlus is ReadDir with each entry's attributes.
func (f *FS) ReadDirPlus(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntryPlus, error) {
	es, err := f.md.ReadDirPlus(ctx, dir, after, max)
	for i := range es {
		if es[i].OK {
			f.saw(&es[i].Attr)
		}
	}
	return es, err
}

// GetXattr returns the value of h's attribute name (ENODATA at once for
// an object seen without attributes lately).
func (f *FS) GetXattr(ctx context.Context, h fs.Handle, name string) ([]byte, error) {
	if f.isBare(h) {
		return nil, fmt.Errorf("no attribute %q: %w", name, syscall.ENODATA)
	}
	return f.md.GetXattr(ctx, h, name)
}

// SetXattr sets h's attribute name to value.
func (f *FS) SetXattr(ctx context.Context, h fs.Handle, name string, value []byte, flags uint32) error {
	if err := f.writable(); err != nil {
		return err
	}
	f.forgetBare(h)
	defer f.forgetBare(h) // an answer read before this one may have said "none"
	return f.md.SetXattr(ctx, h, name, value, flags)
}

// ListXattr returns the names of h's attributes.
func (f *FS) ListXattr(ctx context.Context, h fs.Handle) ([]string, error) {
	if f.isBare(h) {
		return nil, nil
	}
	return f.md.ListXattr(ctx, h)
}

// RemoveXattr removes h's attribute name.
func (f *FS) RemoveXattr(ctx context.Context, h fs.Handle, name string) error {
	if err := f.writable(); err != nil {
		return err
	}
	f.forgetBare(h)
	defer f.forgetBare(h)
	return f.md.RemoveXattr(ctx, h, name)
}

// StatFS returns the file system's statistics.
func (f *FS) StatFS(ctx context.Context) (fs.StatFS, error) { return f.md.StatFS(ctx) }

// Open opens h for reading and writing its data (close-to-open: what
// other clients flushed before is seen). An open handle keeps a file alive
// after its last name goes, until Release.
func (f *FS) Open(ctx context.Context, h fs.Handle) (fs.Attr, error) {
	a, err := f.md.Open(ctx, h)
	if err != nil {
		return a, err
	}
	if a.IsDir() {
		f.saw(&a)
		return a, nil
	}
	st := f.pin(h, true)
	defer f.unpin(st)
	f.filesMu.Lock()
	st.opens++
	f.filesMu.Unlock()
	f.saw(&a)
	st.cacheMu.Lock()
	st.known, st.blocks, st.complete = false, nil, false
	st.cacheMu.Unlock()
	f.overlayDirty(&a)
	return a, nil
}

// Release closes one open handle of h: it flushes what is buffered and, at
// the client's last close of h, tells the metadata service (which reclaims
// a file that lost its last name once nobody holds it). The last close
// flushes now, a flush after close included: a reclaim must not run while
// the file's blocks are still being committed.
func (f *FS) Release(ctx context.Context, h fs.Handle) error {
	_, _, err := f.ReleaseGen(ctx, h)
	return err
}

// ReleaseGen is Release that also returns h's data generation as this
// client's flushes left it, when the client knows it without asking
// (known): a mount keeps its page cache across its own writes with it.
func (f *FS) ReleaseGen(ctx context.Context, h fs.Handle) (gen uint64, known bool, err error) {
	st := f.pin(h, false)
	if st == nil {
		return 0, false, nil
	}
	defer f.unpin(st)
	f.filesMu.Lock()
	later := st.opens > 1 && f.cfg.FlushAfterClose
	f.filesMu.Unlock()
	err = f.flush(ctx, h, later)
	f.filesMu.Lock()
	last := st.opens == 1
	if st.opens > 0 {
		st.opens--
	}
	f.filesMu.Unlock()
	if last {
		err = errors.Join(err, f.md.Release(ctx, h))
	}
	st.cacheMu.Lock()
	gen, known = st.state.DataGen, st.known && !later
	st.cacheMu.Unlock()
	return gen, known, err
}

// forgetBlocks drops what the client cached of h's state and blocks.
func (f *FS) forgetBlocks(h fs.Handle) {
	st := f.pin(h, false)
	if st == nil {
		return
	}
	defer f.unpin(st)
	st.cacheMu.Lock()
	st.known, st.blocks, st.complete = false, nil, false
	st.cacheMu.Unlock()
}
