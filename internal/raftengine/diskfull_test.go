package raftengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestDiskFullRefusesWritesAndHandsOverLeadership: a node whose disk fills
// up releases its ballast, refuses proposals, hands its leadership to
// another replica and takes no new log entries, while the group goes on
// with the others; once space is back it makes its ballast again and
// catches up, nothing lost.
func TestDiskFullRefusesWritesAndHandsOverLeadership(t *testing.T) {
	ctx := context.Background()
	c := newTestCluster(t, 3, nil)
	var free atomic.Uint64
	free.Store(1 << 30)
	c.stop(1)
	c.disks = map[uint64]testDisk{1: {ballast: 1 << 20, avail: func() (uint64, error) { return free.Load(), nil }}}
	c.start(1)
	const gid = 7
	c.createGroup(gid, 1, 2, 3)
	if lead := c.leader(gid); lead != 1 {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.engines[lead].TransferLeadership(tctx, gid, 1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{}
	put := func(k, v string) {
		c.propose(gid, setCmd(k, v))
		want[k] = v
	}
	put("before", "1")
	if _, err := c.fs[1].Stat("/db/" + ballastName); err != nil {
		t.Fatalf("no ballast: %v", err)
	}

	free.Store(1000) // the disk fills up
	waitFor(t, "node 1's store to count as full", func() bool { return c.stores[1].Full() })
	if _, err := c.fs[1].Stat("/db/" + ballastName); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the ballast of a full disk: %v, want it removed", err)
	}
	_, err := c.engines[1].Propose(ctx, gid, setCmd("refused", "x"))
	if _, notLeader := IsNotLeader(err); !errors.Is(err, ErrDiskFull) && !notLeader {
		t.Fatalf("a proposal on the full node: %v, want ErrDiskFull or not leader", err)
	}
	waitFor(t, "the leadership to leave the full node", func() bool {
		st, err := c.engines[1].Status(gid)
		return err == nil && st.Leader != 0 && st.Leader != 1
	})
	full, _ := c.engines[1].Status(gid)
	for i := range 20 {
		put(fmt.Sprintf("during-%d", i), "v")
	}
	lead := c.leader(gid)
	if lead == 1 {
		t.Fatal("the full node leads again")
	}
	now, _ := c.engines[1].Status(gid)
	led, _ := c.engines[lead].Status(gid)
	if now.LastIndex != full.LastIndex || led.LastIndex < full.LastIndex+20 {
		t.Fatalf("the full node's log went from %d to %d while the leader's reached %d: it should take no entries",
			full.LastIndex, now.LastIndex, led.LastIndex)
	}

	free.Store(1 << 30) // space is back
	waitFor(t, "node 1 to serve writes again", func() bool { return !c.stores[1].Full() })
	if _, err := c.fs[1].Stat("/db/" + ballastName); err != nil {
		t.Fatalf("no ballast once space is back: %v", err)
	}
	put("after", "2")
	c.waitConverged(gid, []uint64{1, 2, 3}, want)
}

// TestENOSPCReleasesTheBallast: a store write that fails for want of
// space releases the ballast, succeeds on its retry, and leaves the store
// full (refusing new writes) rather than stopping the node.
func TestENOSPCReleasesTheBallast(t *testing.T) {
	fs := &enospcFS{FS: vfs.NewMem()}
	st, err := OpenStoreWith("/db", StoreOptions{FS: fs, BallastBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Full() {
		t.Fatal("full at start")
	}
	fs.failNext.Store(true)
	if err := st.DB.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
		t.Fatalf("a write that met a full disk once: %v", err)
	}
	if fs.failed.Load() != 1 {
		t.Fatalf("%d writes failed, want 1", fs.failed.Load())
	}
	if !st.Full() {
		t.Fatal("the store does not count as full after ENOSPC")
	}
	if _, err := fs.Stat("/db/" + ballastName); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the ballast after ENOSPC: %v, want it removed", err)
	}
	if v, closer, err := st.DB.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("read back %q, %v", v, err)
	} else {
		closer.Close()
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// enospcFS fails the next write to any file it created with ENOSPC once
// failNext is set, as a disk that just filled up would.
type enospcFS struct {
	vfs.FS
	failNext atomic.Bool
	failed   atomic.Int32
}

func (fs *enospcFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &enospcFile{File: f, fs: fs}, nil
}

func (fs *enospcFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.Create(name, c))
}

func (fs *enospcFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.ReuseForWrite(old, name, c))
}

type enospcFile struct {
	vfs.File
	fs *enospcFS
}

func (f *enospcFile) fail() bool {
	if f.fs.failNext.CompareAndSwap(true, false) {
		f.fs.failed.Add(1)
		return true
	}
	return false
}

func (f *enospcFile) Write(p []byte) (int, error) {
	if f.fail() {
		return 0, syscall.ENOSPC
	}
	return f.File.Write(p)
}

func (f *enospcFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fail() {
		return 0, syscall.ENOSPC
	}
	return f.File.WriteAt(p, off)
}

// noFallocateFS is a file system without fallocate (Preallocate fails, as
// on tmpfs of old kernels or some network file systems); failCreate, if
// set, fails the creation of the ballast as a read-only directory would.
// It counts the ballasts created.
type noFallocateFS struct {
	vfs.FS
	failCreate atomic.Bool
	created    atomic.Int32
}

func (fs *noFallocateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if filepath.Base(name) == ballastName {
		if fs.failCreate.Load() {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
		}
		fs.created.Add(1)
	}
	f, err := fs.FS.Create(name, c)
	if err != nil {
		return nil, err
	}
	return noFallocateFile{f}, nil
}

type noFallocateFile struct{ vfs.File }

func (noFallocateFile) Preallocate(int64, int64) error { return syscall.EOPNOTSUPP }

// countingHandler counts the log records whose message contains want.
type countingHandler struct {
	want string
	n    *atomic.Int32
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.want) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestBallastWithoutFallocate: on a file system without fallocate the
// ballast is written with zeros (before, the node counted as full from
// its start for ever); a restart keeps the ballast it finds rather than
// writing it again.
func TestBallastWithoutFallocate(t *testing.T) {
	fs := &noFallocateFS{FS: vfs.NewMem()}
	const ballast = 1 << 20
	st, err := OpenStoreWith("/db", StoreOptions{FS: fs, BallastBytes: ballast})
	if err != nil {
		t.Fatal(err)
	}
	if st.Full() {
		t.Fatal("full at start on a file system without fallocate")
	}
	if fi, err := fs.Stat("/db/" + ballastName); err != nil || fi.Size() != ballast {
		t.Fatalf("the ballast: %v, %v; want %d bytes", fi, err, ballast)
	}
	if err := st.DB.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = OpenStoreWith("/db", StoreOptions{FS: fs, BallastBytes: ballast})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if n := fs.created.Load(); n != 1 {
		t.Fatalf("the ballast was written %d times over a restart, want once", n)
	}
	if st.Full() {
		t.Fatal("full after a restart")
	}
}

// TestNoBallastRunsWithoutOne: a ballast that cannot be made (not for
// want of room) is logged once, and the node serves writes without one:
// it still turns full under the low water mark and serves again once
// space is back (before, it stayed full for ever).
func TestNoBallastRunsWithoutOne(t *testing.T) {
	fs := &noFallocateFS{FS: vfs.NewMem()}
	fs.failCreate.Store(true)
	if err := fs.MkdirAll("/db", 0o755); err != nil {
		t.Fatal(err)
	}
	var logged atomic.Int32
	g := newDiskGuard(fs, "/db", 1<<20, slog.New(countingHandler{want: "the ballast cannot be made", n: &logged}))
	var free atomic.Uint64
	free.Store(1 << 30)
	g.avail = func() (uint64, error) { return free.Load(), nil }
	ctx := context.Background()
	g.start(ctx)
	if g.full.Load() {
		t.Fatal("full at start with room and no ballast possible")
	}
	free.Store(1000)
	g.poll(ctx)
	if !g.full.Load() {
		t.Fatal("not full under the low water mark")
	}
	free.Store(1 << 30)
	for range 3 {
		g.poll(ctx)
	}
	if g.full.Load() {
		t.Fatal("still full with space back: a node that cannot make its ballast must serve writes without one")
	}
	if n := logged.Load(); n != 1 {
		t.Fatalf("the missing ballast was logged %d times, want once", n)
	}
}

// TestSlowDiskCheckDoesNotStallTicks: a statfs that does not return (a
// hung disk) holds up only the disk watcher: groups still elect leaders
// and commit (before, the check ran on the tick goroutine, and no group
// of the node ticked again).
func TestSlowDiskCheckDoesNotStallTicks(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	hung := make(chan struct{})
	var released atomic.Bool
	release := func() {
		if !released.Swap(true) {
			close(hung)
		}
	}
	t.Cleanup(release) // before the cluster's close: its stop waits for the watcher
	slow := func() (uint64, error) {
		<-hung
		return 1 << 30, nil
	}
	c.disks = map[uint64]testDisk{}
	for _, id := range c.ids {
		c.stop(id)
		c.disks[id] = testDisk{ballast: 1 << 20, avail: slow}
		c.start(id)
	}
	const gid = 9
	c.createGroup(gid, c.ids...)
	c.leader(gid)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lead := c.leader(gid)
	if _, err := c.engines[lead].Propose(ctx, gid, setCmd("k", "v")); err != nil {
		t.Fatalf("a proposal while every node's disk check hangs: %v", err)
	}
	release()
}

// TestBallastOnTheRealFileSystem: on the machine's file system the
// ballast holds its space in disk blocks (fallocated, or written where
// fallocate is missing) and has its full size, and a restart keeps it.
func TestBallastOnTheRealFileSystem(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	const ballast = 4 << 20
	st, err := OpenStoreWith(dir, StoreOptions{BallastBytes: ballast})
	if err != nil {
		t.Fatal(err)
	}
	if st.Full() {
		t.Skip("the temporary directory's file system has no room for a 4 MiB ballast")
	}
	fi, err := os.Stat(filepath.Join(dir, ballastName))
	if err != nil {
		t.Fatal(err)
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if fi.Size() != ballast || !ok || sys.Blocks*512 < ballast {
		t.Fatalf("the ballast is %d bytes with %d bytes of blocks; want %d of each", fi.Size(), sys.Blocks*512, ballast)
	}
	st.Close()
	st, err = OpenStoreWith(dir, StoreOptions{BallastBytes: ballast})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	again, err := os.Stat(filepath.Join(dir, ballastName))
	if err != nil || !os.SameFile(fi, again) || !again.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("the ballast was made again at the restart (%v)", err)
	}
}
