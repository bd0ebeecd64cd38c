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
	// Clock gives the time for timestamps (time.Now if nil).
	Clock func() time.Time
	// Logger receives debug and warning logs (discarded if nil).
	Logger *slog.Logger
	// Shared, if set, is what the metadata servers of a file system cut
	// into tables share (DESIGN.md §2.6): the superblock's id counters and
	// the lock on directory moves. Nil: this FS is the only writer of its
	// metadata and keeps both in the superblock, inside its transactions.
	Shared Shared
	// OpensKnown, if set, reports whether this FS has heard from every
	// session holding h open. A metadata server that just took h's table
	// over has not (its sessions tell it within a bound): until then an
	// object that loses its last name is kept as an orphan with no known
	// holder, and reclaimed in the background once the opens are known.
	// Nil: always (every session opens its files through this FS).
	OpensKnown func(h Handle) bool
}

// Shared is what the file system's servers share beyond their own tables.
type Shared interface {
	// NextID returns the next value of the superblock counter c: durable
	// and never handed out twice (SuperblockCounter does it).
	NextID(ctx context.Context, c Counter) (uint64, error)
	// LockRenames takes the file system's lock on moves of directories
	// between parents, which makes the ancestor check of such a move
	// (done outside its transaction) sound; unlock releases it.
	LockRenames(ctx context.Context) (unlock func(), err error)
}

// Counter names one of the superblock's id counters (layout.go).
type Counter int

// The superblock's counters: the roots of the too-deep region, the ids of
// the too-wide region, and the catch-all ids.
const (
	CounterTooDeep Counter = iota + 1
	CounterTooWide
	CounterCatchAll
)

// SuperblockCounter increments counter c of file system f's superblock in
// a transaction of its own and returns the new value: what a Shared
// implementation does over the metadata store itself (not a server's
// tables).
func SuperblockCounter(ctx context.Context, meta MetaStore, f uint64, c Counter) (uint64, error) {
	k := keys{f: f}
	var v uint64
	err := meta.Update(ctx, func(tx MetaTxn) error {
		sb, err := getSuperblock(tx, k)
		if err != nil {
			return err
		}
		p := sb.counter(c)
		if p == nil {
			return fmt.Errorf("fs: unknown superblock counter %d", c)
		}
		*p++
		v = *p
		return tx.Put(k.superblock(), sb.encode())
	})
	return v, err
}

func (sb *superblock) counter(c Counter) *uint64 {
	switch c {
	case CounterTooDeep:
		return &sb.NextTooDeep
	case CounterTooWide:
		return &sb.NextTooWide
	case CounterCatchAll:
		return &sb.NextCatchAll
	}
	return nil
}

// EpochTxn is implemented by the transactions of a metadata store that
// fences writes itself: a metadata server's tables, whose headers carry the
// write epoch W and which a snapshot fences one by one (DESIGN.md §2.6).
// Such a transaction gives W instead of the superblock's, and the store
// guarantees that a snapshot taken concurrently fails it.
type EpochTxn interface {
	WriteEpoch() (uint64, error)
}

// headSnapshot is the snapshot number reads at the head use: above every
// epoch, so they see the newest version of every key.
const headSnapshot = math.MaxInt64

// FS runs one file system: POSIX operations over the metadata store, for
// the clients that ask (a metadata server runs one per file system it
// serves; tests run one in process). Every operation that changes
// metadata is one transaction. Clients are told apart by the session in
// their context (WithSession): orphans and open files are per session. It
// is safe for concurrent use. See doc.go.
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

	tractSize int

	snapMu sync.Mutex
	snaps  *snapCache

	// holds are the data holds (SetHold) this FS placed and has not seen
	// cleared, with when each lapses: WaitHolds waits for them.
	holdsMu sync.Mutex
	holds   map[Handle]int64

	// deferred are orphans to reclaim once the opens of their table are
	// known here (Config.OpensKnown; reclaimDeferred).
	deferMu      sync.Mutex
	deferred     map[Handle]time.Time
	deferRunning bool

	opens openFiles
	stats Stats
}

// sessionKey carries the calling session in a context.
type sessionKey struct{}

// WithSession returns ctx naming the session (a mount, a gateway) an
// operation is made for: orphans it creates name it, and opens are counted
// per session.
func WithSession(ctx context.Context, session uint64) context.Context {
	return context.WithValue(ctx, sessionKey{}, session)
}

// SessionOf returns the session ctx names (0: none).
func SessionOf(ctx context.Context) uint64 {
	s, _ := ctx.Value(sessionKey{}).(uint64)
	return s
}

// snapCache is a client's copy of the snapshot set, valid for one
// (epoch, generation) of the superblock.
type snapCache struct {
	epoch, gen uint64
	set        *snapSet
}

// Stats counts what an FS did (a snapshot; fields only grow).
type Stats struct {
	Txns, Refreshes atomic.Int64
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
	ts := cfg.Data.TractSize()
	if err := CheckTractSize(ts); err != nil {
		return nil, err
	}
	f := &FS{
		cfg: cfg, keys: keys{f: cfg.Number}, meta: cfg.Meta, data: cfg.Data,
		log: cfg.Logger.With("fs", cfg.Number), now: cfg.Clock, readAt: headSnapshot,
		readOnly: cfg.ReadOnly || cfg.Snapshot != 0, tractSize: ts,
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
	return f, nil
}

// CheckTractSize refuses a data store whose tracts the block layout cannot
// use.
func CheckTractSize(ts int) error {
	if ts < minBlockBytes || ts > maxTractBytes {
		return fmt.Errorf("fs: tract size %d outside [%d, %d]", ts, minBlockBytes, maxTractBytes)
	}
	return nil
}

// Number returns the file system number.
func (f *FS) Number() uint64 { return f.cfg.Number }

// Snapshot returns the snapshot the FS reads (0: the live file system).
func (f *FS) Snapshot() uint64 { return f.cfg.Snapshot }

// ReadOnly reports whether changes are refused.
func (f *FS) ReadOnly() bool { return f.readOnly }

// TractSize is the data store's tract size.
func (f *FS) TractSize() int { return f.tractSize }

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
		err = f.meta.Scan(ctx, from, to, func(k, v []byte) error {
			t, err := tuple.Unpack(k)
			if err != nil || len(t) != 4 {
				return fmt.Errorf("%w: snapshot key %x", errCorrupt, k)
			}
			n, ok := t[3].(int64)
			if !ok || n <= 0 {
				return fmt.Errorf("%w: snapshot key %x", errCorrupt, k)
			}
			rec, err := decodeSnapshotRecord(v)
			if err != nil {
				return err
			}
			if rec.Deleting {
				// Writers stop copying for a snapshot once it is marked
				// deleting: the sweep counts it gone (liveSnapshots),
				// so a version kept for it after the sweep is garbage
				// nothing sweeps, and its tract leaks. A metadata
				// server's engine refreshes only when W moves or when
				// told to sweep (after the mark, before the record
				// goes), so it must drop the snapshot then.
				return nil
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
// superblock (the fence of doc.go, Snapshots), or asks an EpochTxn its
// epoch, checks the cached snapshot set against it, and writes the
// superblock back if fn changed it. A transaction that moves directories
// between parents runs with the rename lock held when the FS has Shared.
func (f *FS) update(ctx context.Context, fn func(w *wtx) error) error {
	if f.readOnly {
		return syscall.EROFS
	}
	var checked []dirMove
	drawn := map[Counter]uint64{} // ids drawn by an attempt, reused by the next
	var unlock func()
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	for range maxRefreshes {
		c, err := f.cachedSnapshots(ctx)
		if err != nil {
			return err
		}
		f.stats.Txns.Add(1)
		err = f.meta.Update(ctx, func(tx MetaTxn) error {
			w := &wtx{tx: tx, ctx: ctx, snaps: c.set, session: SessionOf(ctx), checked: checked, drawn: drawn}
			if et, ok := tx.(EpochTxn); ok {
				epoch, err := et.WriteEpoch()
				if err != nil {
					return err
				}
				if epoch != c.epoch {
					return errStaleSnapshots
				}
				w.epoch = epoch
			} else {
				sb, err := getSuperblock(tx, f.keys)
				if err != nil {
					return err
				}
				if sb.Epoch != c.epoch || sb.Gen != c.gen {
					return errStaleSnapshots
				}
				w.epoch, w.sb = sb.Epoch, sb
			}
			if err := fn(w); err != nil {
				return err
			}
			if len(drawn) > 0 {
				// A replay would draw other ids: answer once durable.
				requireDurable(tx)
			}
			if w.sbDirty {
				return tx.Put(f.keys.superblock(), w.sb.encode())
			}
			return nil
		})
		var nl *needRenameLock
		switch {
		case errors.Is(err, errStaleSnapshots):
			if _, err := f.refreshSnapshots(ctx); err != nil {
				return err
			}
			continue
		case errors.As(err, &nl):
			if unlock == nil {
				if unlock, err = f.cfg.Shared.LockRenames(ctx); err != nil {
					unlock = nil
					return fmt.Errorf("fs: lock directory moves: %w", err)
				}
			}
			if err := f.checkBelow(ctx, nl.moves); err != nil {
				return err
			}
			checked = nl.moves
			continue
		}
		return err
	}
	return fmt.Errorf("fs: the snapshot set kept changing: %w", syscall.EAGAIN)
}

// RefreshSnapshots reloads the snapshot set writers copy on write for
// (after a snapshot was marked for deletion, before sweeping).
func (f *FS) RefreshSnapshots(ctx context.Context) error {
	_, err := f.refreshSnapshots(ctx)
	return err
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

// ownsGUID reports whether g is a blob id newGUID could give this file
// system: its number in the first 8 bytes.
func (f *FS) ownsGUID(g GUID) bool {
	return binary.BigEndian.Uint64(g[:8]) == f.cfg.Number
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
	// Blob holds a regular file's data (clients read and write its tracts
	// directly); BlobExists says whether it was created yet.
	Blob       GUID
	BlobExists bool
	// Xattrs counts the object's extended attributes.
	Xattrs uint32
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
		Btime: time.Unix(0, n.Btime), DataGen: n.DataGen, Blob: n.Blob, BlobExists: n.BlobExists, Xattrs: n.Xattrs,
	}
	if n.Mode&sIFMT == sIFDIR {
		a.Size = 4096
	}
	a.Blocks = (a.Size + 511) / 512
	return a
}

// RenewSession records that session is alive: orphans it holds open are
// kept until its record is SessionExpiry old (ReclaimOrphans).
func (f *FS) RenewSession(ctx context.Context, session uint64) error {
	if f.readOnly {
		return nil
	}
	rec := &sessionRecord{Seen: f.now().UnixNano()}
	return f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Put(f.keys.session(session), rec.encode()) })
}

// EndSession removes session's record: what it held open may be reclaimed.
func (f *FS) EndSession(ctx context.Context, session uint64) error {
	if f.readOnly {
		return nil
	}
	return f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(f.keys.session(session)) })
}

// ReadEpoch returns file system f's write epoch W and snapshot generation,
// from its superblock.
func ReadEpoch(ctx context.Context, meta MetaStore, f uint64) (epoch, gen uint64, err error) {
	err = meta.View(ctx, func(tx MetaTxn) error {
		sb, err := getSuperblock(tx, keys{f: f})
		if err != nil {
			return err
		}
		epoch, gen = sb.Epoch, sb.Gen
		return nil
	})
	return epoch, gen, err
}
