package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/fsclient/fsclienttest"
)

const testFS = 7

// storeEnv is one file system in an in-memory B-tree, served by one store
// that owns a single table covering it.
type storeEnv struct {
	t       testing.TB
	pages   *btree.MemStore
	tree    *btree.Tree
	data    *fs.MemData
	st      *store
	engine  *fs.FS
	direct  *fs.FS
	session atomic.Uint64
	nextSn  uint64
	main    *fsclient.FS
	renames sync.Mutex
}

func newTree(t testing.TB, pages btree.PageStore, root btree.PageRef, leafCache int64) *btree.Tree {
	t.Helper()
	tree, err := btree.Open(context.Background(), btree.Config{Store: pages, Root: root, Extents: []uint64{1, 2},
		LeafCacheBytes: leafCache, MinBackoff: 50 * time.Microsecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tree.Close)
	return tree
}

func newMemPages(t testing.TB) (*btree.MemStore, btree.PageRef) {
	t.Helper()
	pages := btree.NewMemStore(1)
	g := btree.Geometry{PageBytes: 8192, PagesPerBlock: 32, Blocks: 4096}
	for _, e := range []uint64{1, 2} {
		if err := pages.AddExtent(e, g); err != nil {
			t.Fatal(err)
		}
	}
	root, err := btree.Create(context.Background(), pages, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	return pages, root
}

func newStoreEnv(t testing.TB, tractSize int) *storeEnv {
	t.Helper()
	ctx := context.Background()
	pages, root := newMemPages(t)
	e := &storeEnv{t: t, pages: pages, tree: newTree(t, pages, root, 64<<20), data: fs.NewMemData(tractSize)}
	if err := fs.Format(ctx, fs.BTreeMeta{Tree: e.tree}, testFS, fs.DefaultLayout, time.Now()); err != nil {
		t.Fatal(err)
	}
	e.st = newStore(testFS, 1, e.tree, DefaultLimits, slog.New(slog.DiscardHandler), newStoreMetrics())
	t.Cleanup(e.st.close)
	if err := e.st.acquire(ctx, assignment{id: 1, r: fs.AllD, epoch: 1}); err != nil {
		t.Fatal(err)
	}
	e.st.setLease(1, 1, time.Now().Add(time.Hour))
	e.engine = e.open(0)
	var err error
	if e.direct, err = fs.Open(ctx, fs.Config{Meta: fs.BTreeMeta{Tree: e.tree}, Data: e.data, Number: testFS}); err != nil {
		t.Fatal(err)
	}
	e.main = e.client(e.engine, 0)
	// The server's poll of frozen tables.
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				e.st.refreshUnsettled(ctx)
			}
		}
	}()
	return e
}

func (e *storeEnv) open(snapshot uint64) *fs.FS {
	e.t.Helper()
	f, err := fs.Open(context.Background(), fs.Config{Meta: e.st, Data: e.data, Number: testFS, Snapshot: snapshot,
		Shared: shared{tree: e.tree, f: testFS, lock: func(context.Context) (func(), error) {
			e.renames.Lock()
			return e.renames.Unlock, nil
		}}})
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

func (e *storeEnv) client(engine *fs.FS, snapshot uint64) *fsclient.FS {
	e.t.Helper()
	c, err := fsclient.NewFS(fsclient.FSConfig{Meta: fsclient.Local{FS: engine, Session: e.session.Add(1)}, Data: e.data, Snapshot: snapshot})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *storeEnv) FS() *fsclient.FS { return e.main }

func (e *storeEnv) CreateSnapshot(ctx context.Context, name string) (uint64, error) {
	e.nextSn++
	err := takeSnapshot(ctx, e.tree, e.direct, []uint64{0}, e.nextSn, name)
	e.st.refreshHeaders(ctx, false)
	return e.nextSn, err
}

func (e *storeEnv) DeleteSnapshot(ctx context.Context, n uint64) error {
	if err := e.direct.MarkSnapshotDeleting(ctx, n); err != nil {
		return err
	}
	if err := e.engine.RefreshSnapshots(ctx); err != nil {
		return err
	}
	if _, err := e.engine.SweepRange(ctx, fs.AllD); err != nil {
		return err
	}
	return e.direct.RemoveSnapshotRecord(ctx, n)
}

func (e *storeEnv) OpenSnapshot(t testing.TB, n uint64) *fsclient.FS { return e.client(e.open(n), n) }

func (e *storeEnv) Check(ctx context.Context) (*fs.CheckReport, error) {
	return e.direct.Check(ctx, fs.CheckOptions{Data: true})
}

// TestStoreModel runs the file-system model over one store: every read
// from its cache, every write through group commit, snapshots through
// freezing and thawing its table.
func TestStoreModel(t *testing.T) {
	seed := fsclienttest.Seed(t)
	steps := 2000
	if testing.Short() {
		steps = 600
	}
	e := newStoreEnv(t, 64<<10)
	rep := fsclienttest.Run(t, e, fsclienttest.Options{Seed: seed, Steps: steps, ReclaimWithin: 15 * time.Second,
		DataTracts: func() int { _, tracts, _ := e.data.Usage(); return tracts }})
	m := e.tree.Metrics()
	t.Logf("ops %v; %d objects, %d tracts; %d commits for %d operations, %d aborts, %d loads; tree: %d commits, %d leaf cache hits, %d page reads",
		rep.Ops, rep.Objects, rep.Tracts, e.st.m.commits.Load(), e.st.m.committedEntries.Load(), e.st.m.aborts.Load(), e.st.m.loads.Load(),
		m.Commits, m.LeafCacheHits, m.PageReads)
}

// failingPages fails commits while armed (the store sees its batch commit
// fail, as when the extent store is unavailable).
type failingPages struct {
	btree.PageStore
	armed atomic.Int32
}

func (f *failingPages) Commit(ctx context.Context, ops []btree.Op) ([]uint64, error) {
	if f.armed.Load() > 0 {
		f.armed.Add(-1)
		return nil, btree.ErrInvalid
	}
	return f.PageStore.Commit(ctx, ops)
}

// TestStoreGroupCommitAndAbort: concurrent creates in many directories
// share commits; a failed commit aborts every pending operation (they
// fail and change nothing), the cache forgets what they wrote, and later
// operations see exactly what the tree holds.
func TestStoreGroupCommitAndAbort(t *testing.T) {
	ctx := context.Background()
	pages, root := newMemPages(t)
	fp := &failingPages{PageStore: pages}
	e := &storeEnv{t: t, pages: pages, tree: newTree(t, fp, root, 64<<20), data: fs.NewMemData(64 << 10)}
	if err := fs.Format(ctx, fs.BTreeMeta{Tree: e.tree}, testFS, fs.DefaultLayout, time.Now()); err != nil {
		t.Fatal(err)
	}
	e.st = newStore(testFS, 1, e.tree, DefaultLimits, slog.New(slog.DiscardHandler), newStoreMetrics())
	t.Cleanup(e.st.close)
	if err := e.st.acquire(ctx, assignment{id: 1, r: fs.AllD, epoch: 1}); err != nil {
		t.Fatal(err)
	}
	e.st.setLease(1, 1, time.Now().Add(time.Hour))
	e.engine = e.open(0)
	const workers, files = 16, 40
	dirs := make([]fs.Handle, workers)
	for w := range workers {
		a, err := e.engine.Mkdir(ctx, fs.RootHandle, fmt.Sprintf("d%d", w), 0o755, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		dirs[w] = a.Handle
	}
	before := e.st.m.commits.Load()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range files {
				if _, err := e.engine.Create(ctx, dirs[w], fmt.Sprintf("f%d", i), 0o644, fs.Cred{}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	commits := e.st.m.commits.Load() - before
	t.Logf("%d creates in %d commits", workers*files, commits)
	if commits >= workers*files {
		t.Errorf("%d commits for %d concurrent creates: no group commit", commits, workers*files)
	}
	// Fail the next commits, fewer times than the committer tries: every
	// create in flight succeeds once a retry lands.
	fp.armed.Store(3)
	for w := range workers {
		wg.Go(func() {
			if _, err := e.engine.Create(ctx, dirs[w], "retried", 0o644, fs.Cred{}); err != nil {
				t.Errorf("create during failing commits that are retried: %v", err)
			}
		})
	}
	wg.Wait()
	for w := range workers {
		if _, err := e.engine.Lookup(ctx, dirs[w], "retried"); err != nil {
			t.Fatalf("a create retried through failing commits is not there: %v", err)
		}
	}
	// Fail them past the committer's tries: every create in flight fails
	// and is not there.
	e.st.retryWait = time.Millisecond
	fp.armed.Store(1000)
	var failed, done atomic.Int32
	for w := range workers {
		wg.Go(func() {
			_, err := e.engine.Create(ctx, dirs[w], "late", 0o644, fs.Cred{})
			switch {
			case err == nil:
				done.Add(1)
			case errors.Is(err, errRetry):
				failed.Add(1)
			default:
				t.Errorf("create during failed commits: %v", err)
			}
		})
	}
	wg.Wait()
	fp.armed.Store(0)
	if failed.Load() == 0 {
		t.Fatal("no create failed while commits failed")
	}
	for w := range workers {
		_, err := e.engine.Lookup(ctx, dirs[w], "late")
		switch {
		case err == nil:
			done.Add(-1)
		case fs.Errno(err) != syscall.ENOENT:
			t.Fatal(err)
		}
	}
	if done.Load() != 0 {
		t.Fatalf("%d creates answered ok are not there, or creates that failed are", done.Load())
	}
	direct, err := fs.Open(ctx, fs.Config{Meta: fs.BTreeMeta{Tree: e.tree}, Data: e.data, Number: testFS})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := direct.Check(ctx, fs.CheckOptions{})
	if err != nil || !rep.OK() {
		t.Fatalf("check: %v %+v", err, rep)
	}
	if rep.Objects != 1+workers+workers*files+workers+countLate(t, e, dirs) {
		t.Fatalf("%d objects", rep.Objects)
	}
}

func countLate(t *testing.T, e *storeEnv, dirs []fs.Handle) int {
	n := 0
	for _, d := range dirs {
		if _, err := e.engine.Lookup(context.Background(), d, "late"); err == nil {
			n++
		}
	}
	return n
}

// TestStoreCachedInodes: the inodes a table's cached units hold are kept
// as keys change (not counted again), and always equal a count from
// scratch, across creates, links, renames and removes.
func TestStoreCachedInodes(t *testing.T) {
	e := newStoreEnv(t, 64<<10)
	ctx := context.Background()
	d, err := e.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	count := func() uint64 {
		n, _, _ := e.st.cachedCounts(fs.AllD)
		return n
	}
	recount := func() uint64 {
		e.st.mu.Lock()
		for _, u := range e.st.units {
			u.inodes.Store(-1)
		}
		e.st.mu.Unlock()
		return count()
	}
	check := func(what string) uint64 {
		t.Helper()
		kept := count()
		if scratch := recount(); kept != scratch {
			t.Fatalf("after %s: %d inodes kept, %d counted from scratch", what, kept, scratch)
		}
		return kept
	}
	base := check("mkdir")
	for i := range 20 {
		a, err := e.main.Create(ctx, d.Handle, fmt.Sprintf("f%d", i), 0o644, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.main.Release(ctx, a.Handle); err != nil {
			t.Fatal(err)
		}
		if got := check(fmt.Sprintf("%d creates", i+1)); got != base+uint64(i)+1 {
			t.Fatalf("after %d creates: %d inodes, want %d", i+1, got, base+uint64(i)+1)
		}
	}
	sub, err := e.main.Mkdir(ctx, d.Handle, "sub", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	check("a second mkdir")
	if err := e.main.Rename(ctx, d.Handle, "f1", sub.Handle, "g1", 0); err != nil {
		t.Fatal(err)
	}
	check("a rename into another directory")
	f2, err := e.main.Lookup(ctx, d.Handle, "f2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.main.Link(ctx, f2.Handle, sub.Handle, "h2"); err != nil {
		t.Fatal(err)
	}
	check("a link")
	for _, name := range []string{"f0", "f2", "f3"} {
		if err := e.main.Unlink(ctx, d.Handle, name); err != nil {
			t.Fatal(err)
		}
		// An unlinked file keeps a tombstone version (snapshots may see
		// it) until the sweep; the count follows what the cache holds.
		check("unlink " + name)
	}
}

// TestStoreCatchesUpWithAThawItMissed: a snapshot froze and thawed both
// tables of a store without telling it (the coordinator's refresh was
// lost). A commit to one table learns the new write epoch from its fence;
// the other table lags, and the store, which writes only while its tables
// agree, must learn it from its poll instead of waiting forever (seen as a
// replay that timed out after minutes in TestServersModel).
func TestStoreCatchesUpWithAThawItMissed(t *testing.T) {
	ctx := context.Background()
	pages, root := newMemPages(t)
	tree := newTree(t, pages, root, 64<<20)
	if err := fs.Format(ctx, fs.BTreeMeta{Tree: tree}, testFS, fs.DefaultLayout, time.Now()); err != nil {
		t.Fatal(err)
	}
	direct, err := fs.Open(ctx, fs.Config{Meta: fs.BTreeMeta{Tree: tree}, Data: fs.NewMemData(64 << 10), Number: testFS})
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(testFS, 1, tree, DefaultLimits, slog.New(slog.DiscardHandler), newStoreMetrics())
	t.Cleanup(st.close)
	const mid = 1 << 40
	for _, a := range []assignment{{id: 1, r: fs.DRange{Hi: mid}, epoch: 1}, {id: 2, r: fs.DRange{Lo: mid}, epoch: 1}} {
		if err := st.acquire(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	st.mu.RLock()
	w0, ok := st.writeEpochLocked()
	first := st.tables[0]
	st.mu.RUnlock()
	if !ok {
		t.Fatal("the tables disagree before any snapshot")
	}
	if err := takeSnapshot(ctx, tree, direct, []uint64{0, mid}, 1, "s1"); err != nil {
		t.Fatal(err)
	}
	// What a commit to the first table learns from its fence.
	v, _, err := tree.Get(ctx, headerKey(testFS, 0))
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(v)
	if err != nil {
		t.Fatal(err)
	}
	st.fenced(&errFenced{t: first, hdr: h})
	st.mu.RLock()
	_, ok = st.writeEpochLocked()
	st.mu.RUnlock()
	if ok {
		t.Fatal("the store would write although its second table still has the old write epoch")
	}
	st.refreshUnsettled(ctx)
	st.mu.RLock()
	w1, ok := st.writeEpochLocked()
	st.mu.RUnlock()
	if !ok || w1 <= w0 {
		t.Fatalf("after the poll: write epoch %d (writable %v), want past %d", w1, ok, w0)
	}
}
