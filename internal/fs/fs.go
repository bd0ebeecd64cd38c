package fs

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Config configures an FS.
type Config struct {
	// Meta holds the metadata (the cluster's FS B-tree); Data the file
	// bytes (the tract store).
	Meta MetaStore
	Data DataStore
	// Number is the file system number F that prefixes all its keys.
	Number uint64
	// Snapshot, if non-zero, opens the file system as snapshot Snapshot
	// saw it, read only.
	Snapshot uint64
	// ReadOnly refuses every change with EROFS.
	ReadOnly bool
	// MountID names this client in orphan and session records (random if
	// zero).
	MountID uint64
	// Clock gives the time for timestamps (time.Now if nil).
	Clock func() time.Time
	// Logger receives debug and warning logs (discarded if nil).
	Logger *slog.Logger
	// MaxDirtyBytesPerFile and MaxDirtyBytes bound the written data a
	// client buffers before it flushes (per file, and in all); zero means
	// 64 MiB and 256 MiB.
	MaxDirtyBytesPerFile, MaxDirtyBytes int64
	// TractCacheBytes bounds the cache of tracts read (zero: 128 MiB,
	// negative: none).
	TractCacheBytes int64
	// SessionInterval is how often the mount renews its session record
	// (zero: 20 s; negative: no session record and no background work,
	// for tests that drive reclaim themselves).
	SessionInterval time.Duration
}

// headSnapshot is the snapshot number reads at the head use: above every
// epoch, so they see the newest version of every key.
const headSnapshot = math.MaxInt64

// FS is a client of one file system: POSIX operations over the metadata
// and data stores. Every operation that changes metadata is one
// transaction. It is safe for concurrent use. See doc.go.
type FS struct {
	cfg      Config
	keys     keys
	meta     MetaStore
	data     DataStore
	log      *slog.Logger
	now      func() time.Time
	readAt   uint64 // snapshot reads are at: headSnapshot or cfg.Snapshot
	readOnly bool
	layout   Layout
	mountID  uint64

	tractSize int
	tracts    *tractCache

	snapMu sync.Mutex
	snaps  *snapCache

	filesMu sync.Mutex
	files   map[Handle]*file
	dirty   atomic.Int64

	stop    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
	stats   Stats
}

// snapCache is a client's copy of the snapshot set, valid for one
// (epoch, generation) of the superblock.
type snapCache struct {
	epoch, gen uint64
	set        *snapSet
}

// Stats counts what an FS did (a snapshot; fields only grow).
type Stats struct {
	Txns, Refreshes, Flushes, TractWrites, TractReads, TractFrees, StaleReads atomic.Int64
}

// Format creates file system number f in meta if it has no superblock yet
// (it is idempotent): the superblock at epoch 1 and the root directory.
func Format(ctx context.Context, meta MetaStore, f uint64, layout Layout, now time.Time) error {
	if err := layout.validate(); err != nil {
		return err
	}
	if f == 0 {
		return errors.New("fs: file system number 0 is reserved")
	}
	k := keys{f: f}
	return meta.Update(ctx, func(tx MetaTxn) error {
		_, ok, err := tx.Get(k.superblock())
		if err != nil || ok {
			return err
		}
		ns := now.UnixNano()
		sb := &superblock{Epoch: 1, Gen: 1, Layout: layout, Created: ns}
		root := &inode{Mode: sIFDIR | 0o755, Nlink: 2, Atime: ns, Mtime: ns, Ctime: ns, Btime: ns,
			Parent: 0, NextChild: 1, NextCookie: firstCookie, FileD: 0, NextC: 1}
		if err := tx.Put(k.superblock(), sb.encode()); err != nil {
			return err
		}
		return tx.Put(versioned(k.inode(RootHandle), 1), encodeVersioned(0, root.encode()))
	})
}

// RootHandle is the root directory's handle in every file system.
var RootHandle = Handle{D: 0, C: 0}

// firstCookie is the first readdir cookie a directory hands out; 1 and 2
// are left for "." and "..".
const firstCookie = 3

// Open opens file system cfg.Number, which must have been formatted.
func Open(ctx context.Context, cfg Config) (*FS, error) {
	if cfg.Meta == nil || cfg.Data == nil {
		return nil, errors.New("fs: Config needs Meta and Data")
	}
	if cfg.Number == 0 {
		return nil, errors.New("fs: file system number 0 is reserved")
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
		return nil, fmt.Errorf("fs: dirty bounds %d per file, %d in all: need 0 <= per file <= all", cfg.MaxDirtyBytesPerFile, cfg.MaxDirtyBytes)
	}
	if cfg.TractCacheBytes == 0 {
		cfg.TractCacheBytes = defaultTractCacheBytes
	}
	if cfg.SessionInterval == 0 {
		cfg.SessionInterval = defaultSessionInterval
	}
	ts := cfg.Data.TractSize()
	if ts < minBlockBytes || ts > maxTractBytes {
		return nil, fmt.Errorf("fs: tract size %d outside [%d, %d]", ts, minBlockBytes, maxTractBytes)
	}
	for cfg.MountID == 0 {
		var b [8]byte
		_, _ = crand.Read(b[:])
		cfg.MountID = binary.BigEndian.Uint64(b[:])
	}
	f := &FS{
		cfg: cfg, keys: keys{f: cfg.Number}, meta: cfg.Meta, data: cfg.Data,
		log: cfg.Logger.With("fs", cfg.Number), now: cfg.Clock, readAt: headSnapshot,
		readOnly: cfg.ReadOnly || cfg.Snapshot != 0, mountID: cfg.MountID, tractSize: ts,
		tracts: newTractCache(cfg.TractCacheBytes), files: map[Handle]*file{}, stop: make(chan struct{}),
	}
	sb, err := f.readSuperblock(ctx)
	if err != nil {
		return nil, err
	}
	f.layout = sb.Layout
	if cfg.Snapshot != 0 {
		rec, err := f.snapshotRecord(ctx, cfg.Snapshot)
		if err != nil {
			return nil, err
		}
		if rec == nil || rec.Deleting || cfg.Snapshot >= sb.Epoch {
			return nil, errf(syscall.ENOENT, "file system %d has no snapshot %d", cfg.Number, cfg.Snapshot)
		}
		f.readAt = cfg.Snapshot
	}
	if _, err := f.refreshSnapshots(ctx); err != nil {
		return nil, err
	}
	if !f.readOnly && cfg.SessionInterval > 0 {
		if err := f.renewSession(ctx); err != nil {
			return nil, err
		}
		f.wg.Add(1)
		go f.background()
	}
	return f, nil
}

// Close flushes every buffered write, ends the mount's session and stops
// background work. The FS must not be used afterwards.
func (f *FS) Close(ctx context.Context) error {
	f.closeMu.Lock()
	if f.closed {
		f.closeMu.Unlock()
		return nil
	}
	f.closed = true
	f.closeMu.Unlock()
	err := f.syncAll(ctx, true)
	close(f.stop)
	f.wg.Wait()
	if !f.readOnly && f.cfg.SessionInterval > 0 {
		err = errors.Join(err, f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(f.keys.session(f.mountID)) }))
	}
	return err
}

// Number returns the file system number.
func (f *FS) Number() uint64 { return f.cfg.Number }

// Snapshot returns the snapshot the FS reads (0: the live file system).
func (f *FS) Snapshot() uint64 { return f.cfg.Snapshot }

// ReadOnly reports whether changes are refused.
func (f *FS) ReadOnly() bool { return f.readOnly }

// MountID returns the id of this client's session.
func (f *FS) MountID() uint64 { return f.mountID }

// Counters returns the FS's statistics.
func (f *FS) Counters() *Stats { return &f.stats }

func (f *FS) readSuperblock(ctx context.Context) (*superblock, error) {
	var sb *superblock
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		var err error
		sb, err = getSuperblock(tx, f.keys)
		return err
	})
	return sb, err
}

func getSuperblock(tx MetaTxn, k keys) (*superblock, error) {
	v, ok, err := tx.Get(k.superblock())
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errf(syscall.ENOENT, "file system %d is not formatted", k.f)
	}
	sb, err := decodeSuperblock(v)
	if err != nil {
		return nil, err
	}
	if sb.Deleting {
		return nil, errf(syscall.ENOENT, "file system %d is being deleted", k.f)
	}
	return sb, nil
}

func (f *FS) snapshotRecord(ctx context.Context, n uint64) (*snapshotRecord, error) {
	var rec *snapshotRecord
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		v, ok, err := tx.Get(f.keys.snapshot(n))
		if err != nil || !ok {
			return err
		}
		rec, err = decodeSnapshotRecord(v)
		return err
	})
	return rec, err
}

// refreshSnapshots reloads the snapshot set: the superblock, the records,
// and the superblock again, until the two superblock reads agree (the
// records only change with the superblock's generation).
func (f *FS) refreshSnapshots(ctx context.Context) (*snapCache, error) {
	f.stats.Refreshes.Add(1)
	for range maxRefreshes {
		sb, err := f.readSuperblock(ctx)
		if err != nil {
			return nil, err
		}
		set := &snapSet{}
		from, to := tuple.PrefixRange(f.keys.snapshotPrefix())
		err = f.meta.Scan(ctx, from, to, func(k, _ []byte) error {
			t, err := tuple.Unpack(k)
			if err != nil || len(t) != 4 {
				return fmt.Errorf("%w: snapshot key %x", errCorrupt, k)
			}
			n, ok := t[3].(int64)
			if !ok || n <= 0 {
				return fmt.Errorf("%w: snapshot key %x", errCorrupt, k)
			}
			set.nums = append(set.nums, uint64(n))
			return nil
		})
		if err != nil {
			return nil, err
		}
		again, err := f.readSuperblock(ctx)
		if err != nil {
			return nil, err
		}
		if again.Epoch == sb.Epoch && again.Gen == sb.Gen {
			c := &snapCache{epoch: sb.Epoch, gen: sb.Gen, set: set}
			f.snapMu.Lock()
			f.snaps = c
			f.snapMu.Unlock()
			return c, nil
		}
	}
	return nil, errors.New("fs: the snapshot set kept changing")
}

func (f *FS) cachedSnapshots(ctx context.Context) (*snapCache, error) {
	f.snapMu.Lock()
	c := f.snaps
	f.snapMu.Unlock()
	if c != nil {
		return c, nil
	}
	return f.refreshSnapshots(ctx)
}

// update runs fn in a write transaction at the current epoch: it reads the
// superblock (the fence of doc.go, Snapshots), checks the cached snapshot
// set against it, and writes the superblock back if fn changed it.
func (f *FS) update(ctx context.Context, fn func(w *wtx) error) error {
	if f.readOnly {
		return syscall.EROFS
	}
	for range maxRefreshes {
		c, err := f.cachedSnapshots(ctx)
		if err != nil {
			return err
		}
		f.stats.Txns.Add(1)
		err = f.meta.Update(ctx, func(tx MetaTxn) error {
			sb, err := getSuperblock(tx, f.keys)
			if err != nil {
				return err
			}
			if sb.Epoch != c.epoch || sb.Gen != c.gen {
				return errStaleSnapshots
			}
			w := &wtx{tx: tx, epoch: sb.Epoch, snaps: c.set, sb: sb}
			if err := fn(w); err != nil {
				return err
			}
			if w.sbDirty {
				return tx.Put(f.keys.superblock(), w.sb.encode())
			}
			return nil
		})
		if errors.Is(err, errStaleSnapshots) {
			if _, err := f.refreshSnapshots(ctx); err != nil {
				return err
			}
			continue
		}
		return err
	}
	return fmt.Errorf("fs: the snapshot set kept changing: %w", syscall.EAGAIN)
}

// view runs fn in a read-only transaction at the FS's read snapshot.
func (f *FS) view(ctx context.Context, fn func(tx MetaTxn, s uint64) error) error {
	return f.meta.View(ctx, func(tx MetaTxn) error { return fn(tx, f.readAt) })
}

// newGUID returns a new blob id for file system f: its number in the
// first 8 bytes (so a tract store listing can attribute blobs), random
// bytes after.
func newGUID(f uint64) GUID {
	var g GUID
	binary.BigEndian.PutUint64(g[:8], f)
	_, _ = crand.Read(g[8:])
	return g
}

// Attr is what stat(2) shows of an object.
type Attr struct {
	Handle Handle
	// Ino is the object's inode number: 1 for the root, else a hash of
	// the handle (two handles may collide; a client that needs unique
	// numbers, like the FUSE adapter, resolves collisions itself).
	Ino                        uint64
	Mode                       uint32
	Nlink                      uint32
	Uid, Gid                   uint32
	Size                       uint64
	Blocks                     uint64 // 512-byte units
	Rdev                       uint64
	Atime, Mtime, Ctime, Btime time.Time
	// DataGen changes whenever the file's data does (for cache checks).
	DataGen uint64
}

// IsDir reports whether the attributes are a directory's.
func (a *Attr) IsDir() bool { return a.Mode&sIFMT == sIFDIR }

// InoOf returns the inode number of h (see Attr.Ino).
func InoOf(h Handle) uint64 {
	if h == RootHandle {
		return 1
	}
	x := h.D*0x9e3779b97f4a7c15 ^ h.C*0xc2b2ae3d27d4eb4f
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	if x <= 1 {
		x += 2
	}
	return x
}

func (f *FS) attrOf(h Handle, n *inode) Attr {
	a := Attr{
		Handle: h, Ino: InoOf(h), Mode: n.Mode, Nlink: n.Nlink, Uid: n.Uid, Gid: n.Gid, Size: n.Size,
		Rdev: n.Rdev, Atime: time.Unix(0, n.Atime), Mtime: time.Unix(0, n.Mtime), Ctime: time.Unix(0, n.Ctime),
		Btime: time.Unix(0, n.Btime), DataGen: n.DataGen,
	}
	if n.Mode&sIFMT == sIFDIR {
		a.Size = 4096
	}
	f.overlayDirty(&a)
	a.Blocks = (a.Size + 511) / 512
	return a
}

// background renews the session and reclaims orphans left by mounts
// that are gone.
func (f *FS) background() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.SessionInterval)
	defer t.Stop()
	first := time.After(time.Second)
	for {
		select {
		case <-f.stop:
			return
		case <-first:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := f.ReclaimOrphans(ctx, false); err != nil {
				f.log.Warn("reclaiming orphans", "err", err)
			}
			cancel()
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := f.renewSession(ctx); err != nil {
				f.log.Warn("renewing the mount's session", "err", err)
			}
			if err := f.ReclaimOrphans(ctx, false); err != nil {
				f.log.Warn("reclaiming orphans", "err", err)
			}
			cancel()
		}
	}
}

func (f *FS) renewSession(ctx context.Context) error {
	rec := &sessionRecord{Seen: f.now().UnixNano()}
	return f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Put(f.keys.session(f.mountID), rec.encode()) })
}
