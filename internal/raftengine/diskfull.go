package raftengine

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A full disk (issue 13). Pebble cannot go on after a write to its log
// fails (it stops the process: a commit it could not log would be lost),
// so a node whose disk fills up must stop writing before the disk does.
// The store keeps a ballast file of BallastBytes in its directory. When a
// write of the store fails for want of space (pebble's vfs.OnDiskFull sees
// ENOSPC and retries the write once after the callback), or the free space
// falls under a quarter of the ballast, the store deletes the ballast and
// counts as full: the engine then refuses new proposals (ErrDiskFull),
// drops the log entries and snapshots other leaders send (they go on with
// the other replicas; this one catches up later), and hands the leadership
// of every group it leads to another replica. What still writes (raft's
// hard state, applying entries already logged) fits in the ballast's
// space. Once the free space is back above twice the ballast, the ballast
// is made again and the store serves writes. The space check runs once a
// second (Engine.watchDisk).

// DefaultBallastBytes is the ballast a node keeps: room for pebble to
// flush a memtable and log what it must while the node stops writing.
const DefaultBallastBytes = 2*storeMemTableBytes + 8<<20

// ErrDiskFull is returned by Propose (and the services map it to their
// errors) while the node's disk is full.
var ErrDiskFull = errors.New("raftengine: the node's disk is full; it refuses writes until space is freed")

const ballastName = "ballast"

// diskGuard is a store's ballast and its full flag.
type diskGuard struct {
	fs    vfs.FS // unwrapped: the ballast is removed beneath OnDiskFull
	dir   string
	bytes int64
	log   *slog.Logger
	// avail returns the free bytes of the store's file system; tests
	// replace it.
	avail func() (uint64, error)

	full atomic.Bool
	// mu serialises making and removing the ballast.
	mu    sync.Mutex
	since time.Time
}

func newDiskGuard(fs vfs.FS, dir string, bytes int64, log *slog.Logger) *diskGuard {
	g := &diskGuard{fs: fs, dir: dir, bytes: bytes, log: log}
	g.avail = func() (uint64, error) {
		u, err := fs.GetDiskUsage(dir)
		return u.AvailBytes, err
	}
	return g
}

func (g *diskGuard) path() string { return filepath.Join(g.dir, ballastName) }

// start makes the ballast, or starts full if there is no room for it.
func (g *diskGuard) start() {
	if g.bytes <= 0 {
		return
	}
	if err := g.makeBallast(); err != nil {
		g.enterFull(fmt.Sprintf("no room for the ballast at start: %v", err))
	}
}

func (g *diskGuard) makeBallast() error {
	f, err := g.fs.Create(g.path(), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	err = f.Preallocate(0, g.bytes)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = g.fs.Remove(g.path())
		return fmt.Errorf("make the ballast %s: %w", g.path(), err)
	}
	return nil
}

// enterFull releases the ballast and marks the store full. It is pebble's
// disk-full callback (all writes wait while it runs) and the watcher's.
func (g *diskGuard) enterFull(why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.fs.Remove(g.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		g.log.Error("disk full: removing the ballast", "path", g.path(), "err", err)
	}
	if !g.full.Swap(true) {
		g.since = time.Now()
		g.log.Error("disk full: the node refuses writes and gives up its leaderships until space is freed",
			"reason", why, "dir", g.dir, "ballast_released_bytes", g.bytes)
	}
}

// poll checks the free space: a store short of it becomes full; a full
// store with room again makes its ballast and serves writes.
func (g *diskGuard) poll() {
	if g.bytes <= 0 {
		return
	}
	avail, err := g.avail()
	if err != nil {
		return
	}
	lowWater := uint64(g.bytes) / 4
	if !g.full.Load() {
		if avail < lowWater {
			g.enterFull(fmt.Sprintf("%d bytes free, under the low water mark of %d", avail, lowWater))
		}
		return
	}
	if avail < 2*uint64(g.bytes) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.makeBallast(); err != nil {
		g.log.Warn("disk full: space is back but the ballast cannot be made yet", "err", err)
		return
	}
	g.full.Store(false)
	g.log.Warn("disk full: space is back; the node serves writes again", "free_bytes", avail, "full_for", time.Since(g.since).Round(time.Millisecond))
}
