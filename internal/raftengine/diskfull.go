package raftengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
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
// second on a goroutine of its own (Engine.diskLoop), never on the tick
// goroutine: a slow statfs or the writing of a ballast must not hold back
// every group's ticks (elections).
//
// The ballast is reserved with fallocate, or, on a file system without it,
// by writing zeros. A whole ballast has its full size, so a restart keeps
// the one it finds rather than writing it again. A ballast that cannot be
// made for another reason than want of room (a read-only or odd file
// system) is logged once and the node runs without one: it still refuses
// writes under the low water mark, but a write that meets a full disk
// then stops it.

// DefaultBallastBytes is the ballast a node keeps: room for pebble to
// flush a memtable and log what it must while the node stops writing.
const DefaultBallastBytes = 2*storeMemTableBytes + 8<<20

// ErrDiskFull is returned by Propose (and the services map it to their
// errors) while the node's disk is full.
var ErrDiskFull = errors.New("raftengine: the node's disk is full; it refuses writes until space is freed")

const ballastName = "ballast"

// ballastChunkBytes is the size of one write of zeros where the ballast
// cannot be fallocated; the maker checks its context between two.
const ballastChunkBytes = 1 << 20

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
	// noBallast: the ballast could not be made for another reason than
	// want of room; the store runs without one (logged once).
	noBallast atomic.Bool
	// mu serialises making and removing the ballast, and guards what
	// follows.
	mu    sync.Mutex
	since time.Time
	// waitLogged: this full spell's "space is back, no ballast yet" was
	// logged.
	waitLogged bool
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

// start keeps the ballast a previous run left, or makes it. With no room
// for it the store starts full; a ballast that cannot be made for another
// reason leaves the store running without one.
func (g *diskGuard) start(ctx context.Context) {
	if g.bytes <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if fi, err := g.fs.Stat(g.path()); err == nil && fi.Size() == g.bytes {
		return
	}
	if err := g.makeBallast(ctx); err != nil {
		if g.noRoom(err) {
			g.enterFullLocked(fmt.Sprintf("no room for the ballast at start: %v", err))
			return
		}
		g.runWithoutBallast(err)
	}
}

// makeBallast writes the ballast file: fallocated where the file system
// can, else written with zeros. It leaves no partial ballast behind.
func (g *diskGuard) makeBallast(ctx context.Context) error {
	f, err := g.fs.Create(g.path(), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("make the ballast %s: %w", g.path(), err)
	}
	err = g.reserve(ctx, f)
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

// reserve takes the ballast's space for f and gives f the ballast's size
// (start keeps a ballast of that size).
func (g *diskGuard) reserve(ctx context.Context, f vfs.File) error {
	if err := f.Preallocate(0, g.bytes); err == nil && allocated(f, g.bytes) {
		// fallocate keeps the file's size: set it with the last byte.
		_, err = f.WriteAt([]byte{0}, g.bytes-1)
		return err
	}
	// No fallocate here (it failed, or reserved nothing): write the space.
	zeros := make([]byte, min(ballastChunkBytes, g.bytes))
	for off := int64(0); off < g.bytes; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(int64(len(zeros)), g.bytes-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// allocated reports whether f holds at least n bytes of disk blocks; a
// file system that does not say (an in-memory one) is taken at its word.
func allocated(f vfs.File, n int64) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks*512 >= n
	}
	return true
}

// noRoom reports whether the ballast failed for want of space rather than
// because this file system cannot hold one.
func (g *diskGuard) noRoom(err error) bool {
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	avail, aerr := g.avail()
	return aerr == nil && avail < uint64(g.bytes)
}

// runWithoutBallast gives the ballast up for this process's life.
func (g *diskGuard) runWithoutBallast(err error) {
	if g.noBallast.Swap(true) {
		return
	}
	g.log.Error("disk full protection degraded: the ballast cannot be made, so the node runs without one; "+
		"it still refuses writes when the free space runs low, but a write that meets a full disk will stop it",
		"path", g.path(), "err", err)
}

// enterFull releases the ballast and marks the store full. It is pebble's
// disk-full callback (all writes wait while it runs) and the watcher's.
func (g *diskGuard) enterFull(why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.enterFullLocked(why)
}

func (g *diskGuard) enterFullLocked(why string) {
	if err := g.fs.Remove(g.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		g.log.Error("disk full: removing the ballast", "path", g.path(), "err", err)
	}
	if !g.full.Swap(true) {
		g.since, g.waitLogged = time.Now(), false
		g.log.Error("disk full: the node refuses writes and gives up its leaderships until space is freed",
			"reason", why, "dir", g.dir, "ballast_released_bytes", g.bytes)
	}
}

// poll checks the free space: a store short of it becomes full; a full
// store with room again makes its ballast and serves writes. It may write
// the whole ballast: run it off the tick goroutine, with a context that
// ends at the engine's stop.
func (g *diskGuard) poll(ctx context.Context) {
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
	if !g.noBallast.Load() {
		if err := g.makeBallast(ctx); err != nil {
			switch {
			case ctx.Err() != nil:
				return
			case g.noRoom(err):
				if !g.waitLogged {
					g.waitLogged = true
					g.log.Warn("disk full: space is back but the ballast cannot be made yet", "err", err)
				}
				return
			}
			g.runWithoutBallast(err)
		}
	}
	g.full.Store(false)
	g.log.Warn("disk full: space is back; the node serves writes again", "free_bytes", avail, "full_for", time.Since(g.since).Round(time.Millisecond))
}
