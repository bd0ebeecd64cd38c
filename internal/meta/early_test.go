package meta

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// slowPages delays every commit by delay while it is non-zero: a metadata
// server then holds many operations answered early and not yet durable.
type slowPages struct {
	btree.PageStore
	delay atomic.Int64
	fail  atomic.Int32 // fail the next commits (as unavailable)
}

func (p *slowPages) Commit(ctx context.Context, ops []btree.Op) ([]uint64, error) {
	if d := time.Duration(p.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if p.fail.Load() > 0 {
		p.fail.Add(-1)
		return nil, btree.ErrInvalid
	}
	return p.PageStore.Commit(ctx, ops)
}

// newSlowCluster starts servers metadata servers over an in-memory page
// store whose commits c.slow can delay or fail.
func newSlowCluster(t *testing.T, servers int) *testCluster {
	pages, root := newMemPages(t)
	return newTestCluster(t, servers, func(c *testCluster) {
		c.pages, c.root = pages, root
		c.slow = &slowPages{PageStore: pages}
	})
}

// earlyCreates runs workers that create files f<w>-<i> in dir until stop
// is closed, and returns the names whose create was answered (ok), after
// every worker stopped.
func earlyCreates(t *testing.T, x *clusterFS, dir fs.Handle, workers int, stop <-chan struct{}) []string {
	t.Helper()
	var mu sync.Mutex
	var acked []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("f%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				a, err := x.main.Create(ctx, dir, name, 0o644, fs.Cred{})
				if err == nil {
					err = x.main.Release(ctx, a.Handle)
				}
				cancel()
				if err != nil {
					t.Errorf("create %s: %v", name, err)
					return
				}
				mu.Lock()
				acked = append(acked, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return acked
}

// checkCreated checks, through a new session, that dir holds exactly the
// names in acked, and that fsck is clean.
func checkCreated(t *testing.T, x *clusterFS, dir fs.Handle, acked []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := x.mount(0)
	want := map[string]bool{}
	for _, n := range acked {
		want[n] = true
	}
	var after uint64
	got := 0
	for {
		es, err := other.ReadDir(ctx, dir, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			after = e.Cookie
			if !want[e.Name] {
				t.Errorf("%s is there but its create was not answered", e.Name)
			}
			got++
		}
	}
	if got != len(acked) {
		t.Errorf("%d entries, %d creates answered", got, len(acked))
	}
	for n := range want {
		if _, err := other.Lookup(ctx, dir, n); err != nil {
			t.Errorf("%s, answered, is missing: %v", n, err)
		}
	}
	rep, err := x.Check(ctx)
	if err != nil || !rep.OK() {
		t.Fatalf("fsck: %v %+v", err, rep)
	}
}

// TestEarlyRepliesSurviveOwnerCrash: with commits slowed down, a table's
// owner answers many creates early, then crashes; the client replays them
// to the next owner, which lets nobody else in first, and every create
// answered is there exactly once.
func TestEarlyRepliesSurviveOwnerCrash(t *testing.T) {
	c := newSlowCluster(t, 2)
	x := c.newFS("early")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	c.slow.delay.Store(int64(150 * time.Millisecond))
	stop := make(chan struct{})
	go func() {
		waitUnsafe(x, 10)
		owner := c.owner(ctx, x.f, d.Handle.D)
		unsafe := x.mainMD.Unsafe()
		c.kill(owner)
		t.Logf("killed the owner, node %d, with %d operations answered early not durable", owner, unsafe)
		go func() {
			time.Sleep(2 * c.lease)
			c.start(owner)
		}()
		time.Sleep(3 * time.Second)
		c.slow.delay.Store(0)
		time.Sleep(500 * time.Millisecond)
		close(stop)
	}()
	acked := earlyCreates(t, x, d.Handle, 4, stop)
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	st := x.mainMD.JournalStats()
	t.Logf("%d creates answered; journal %+v", len(acked), st)
	if st.Replayed == 0 || st.Failed != 0 {
		t.Fatalf("journal %+v: want replays, none failed", st)
	}
	checkCreated(t, x, d.Handle, acked)
}

// TestEarlyRepliesSurviveAbort: commits fail until the owner gives up and
// aborts what it answered early; the client learns it from WaitSafe and
// replays to the same owner, which holds the table for everyone else
// meanwhile.
func TestEarlyRepliesSurviveAbort(t *testing.T) {
	c := newSlowCluster(t, 1)
	x := c.newFS("abort")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range c.servers {
		for _, st := range ts.srv.fsStates() {
			st.st.retryWait = time.Millisecond
		}
	}
	c.slow.delay.Store(int64(20 * time.Millisecond))
	stop := make(chan struct{})
	go func() {
		waitUnsafe(x, 10)
		c.slow.fail.Store(maxCommitTries + 2)
		time.Sleep(time.Second)
		close(stop)
	}()
	acked := earlyCreates(t, x, d.Handle, 4, stop)
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	st := x.mainMD.JournalStats()
	t.Logf("%d creates answered; journal %+v", len(acked), st)
	if st.Replayed == 0 || st.Failed != 0 {
		t.Fatalf("journal %+v: want replays, none failed", st)
	}
	checkCreated(t, x, d.Handle, acked)
}

// waitUnsafe waits (at most 20 s) until x's main session holds at least n
// operations answered early and not yet durable.
func waitUnsafe(x *clusterFS, n int) {
	for deadline := time.Now().Add(20 * time.Second); x.mainMD.Unsafe() < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRetryOfEarlyAnswerKeepsItsEntry: a request answered early whose
// answer was lost on the way is sent again with the same request id; its
// reply record is there but not durable, so the second answer must name
// the record's entry (the client keeps the request and replays it if the
// store loses it), not say it is durable.
func TestRetryOfEarlyAnswerKeepsItsEntry(t *testing.T) {
	c := newSlowCluster(t, 1)
	x := c.newFS("retry")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	h, release, err := x.mainMD.recorded(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	h.Early = true
	cl := c.rawClient(c.owner(ctx, x.f, d.Handle.D))
	req := &pb.SetAttrRequest{Header: h, Handle: handleToPB(d.Handle), Valid: fs.SetMode, Mode: 0o700}
	c.slow.delay.Store(int64(2 * time.Second))
	first, err := cl.SetAttr(ctx, req)
	if err != nil || first.GetError() != nil {
		t.Fatalf("setattr: %v %v", err, first.GetError())
	}
	if first.GetAck().GetSeq() == 0 || first.GetAck().GetDurable() >= first.GetAck().GetSeq() {
		t.Fatalf("the first answer is not early: %v", first.GetAck())
	}
	again, err := cl.SetAttr(ctx, req)
	if err != nil || again.GetError() != nil {
		t.Fatalf("setattr again: %v %v", err, again.GetError())
	}
	if a := again.GetAck(); a.GetDurable() < first.GetAck().GetSeq() && a.GetSeq() != first.GetAck().GetSeq() {
		t.Fatalf("the retry answered %v before the first run's entry %d is durable, without naming it", a, first.GetAck().GetSeq())
	}
	if got := again.GetAttr().GetMode() & 0o7777; got != 0o700 {
		t.Fatalf("the retry answered mode %o, want 700", got)
	}
	c.slow.delay.Store(0)
}

// TestReplayedAnswersDoNotStaleTheDirCache: a create in a directory and a
// chmod of it are answered early and lost with their owner; the replay
// of the create answers with the directory as it was before the chmod,
// and the session, which keeps the directory attributes its changes were
// answered with, must not show that old mode after the chmod's replay.
func TestReplayedAnswersDoNotStaleTheDirCache(t *testing.T) {
	c := newSlowCluster(t, 2)
	x := c.newFS("dircache")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	// Slow commits keep the create and the chmod answered early and not
	// durable until the owner is killed. The slowness ends on its own, so
	// that tables still moving (the mkdir put d in a table of its own and
	// moved it away) are acquired in the end; if that delays the two
	// past their commits, the run is tried again.
	for attempt := 0; ; attempt++ {
		c.slow.delay.Store(int64(2 * time.Second))
		time.AfterFunc(1500*time.Millisecond, func() { c.slow.delay.Store(0) })
		a, err := x.main.Create(ctx, d.Handle, fmt.Sprintf("f%d", attempt), 0o644, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.main.Release(ctx, a.Handle); err != nil {
			t.Fatal(err)
		}
		if _, err := x.main.SetAttr(ctx, d.Handle, fs.SetAttrIn{Valid: fs.SetMode, Mode: 0o700}); err != nil {
			t.Fatal(err)
		}
		if x.mainMD.Unsafe() >= 2 {
			break
		}
		if attempt == 3 {
			t.Fatalf("the create and the chmod were durable before the kill in %d tries", attempt+1)
		}
		if _, err := x.main.SetAttr(ctx, d.Handle, fs.SetAttrIn{Valid: fs.SetMode, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
		if err := x.main.SyncMetadata(ctx); err != nil {
			t.Fatal(err)
		}
	}
	owner := c.owner(ctx, x.f, d.Handle.D)
	c.kill(owner)
	c.slow.delay.Store(0)
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	if st := x.mainMD.JournalStats(); st.Replayed < 2 || st.Failed != 0 {
		t.Fatalf("journal %+v: want the create and the chmod replayed", st)
	}
	got, err := x.main.GetAttr(ctx, d.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode&0o7777 != 0o700 {
		t.Fatalf("after the replays the directory shows mode %o, want 700", got.Mode&0o7777)
	}
	if es, err := x.main.ReadDir(ctx, d.Handle, 0, 10); err != nil || len(es) == 0 {
		t.Fatalf("the replayed create: %v %v", es, err)
	}
}

// TestLookupSeesOwnEarlyChangesInAnotherTable: a file's inode stays in the
// table it was created in; a name of it in a directory served by another
// server is looked up there, which reads the inode from the committed
// tree. After an unlink of the file's other name answered early (not
// durable), the lookup through the second name must show the session's
// own change: one link, not two.
func TestLookupSeesOwnEarlyChangesInAnotherTable(t *testing.T) {
	c := newSlowCluster(t, 2)
	x := c.newFS("foreign")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := x.main.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.main.Release(ctx, f.Handle); err != nil {
		t.Fatal(err)
	}
	if _, err := x.main.Link(ctx, f.Handle, d.Handle, "g"); err != nil {
		t.Fatal(err)
	}
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	// The root's table and d's table on different servers.
	tabs, err := c.client.Tables(ctx, x.f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tab := range tabs {
		want := uint64(1)
		if tab.Range.Contains(d.Handle.D) {
			want = 2
		}
		if tab.Owner != want {
			if _, err := c.client.MoveTable(ctx, tab.Table, want); err != nil {
				t.Fatalf("moving table %d to %d: %v", tab.Table, want, err)
			}
		}
	}
	if a, err := x.main.Lookup(ctx, d.Handle, "g"); err != nil || a.Nlink != 2 {
		t.Fatalf("lookup d/g before the unlink: nlink %d, %v; want 2", a.Nlink, err)
	}
	c.slow.delay.Store(int64(2 * time.Second))
	defer c.slow.delay.Store(0)
	if err := x.main.Unlink(ctx, fs.RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	if x.mainMD.Unsafe() == 0 {
		t.Fatal("the unlink was not answered early")
	}
	if a, err := x.main.Lookup(ctx, d.Handle, "g"); err != nil || a.Nlink != 1 {
		t.Fatalf("lookup d/g after the unlink answered early: nlink %d, %v; want 1", a.Nlink, err)
	}
	es, err := x.main.ReadDirPlus(ctx, d.Handle, 0, 10)
	if err != nil || len(es) != 1 {
		t.Fatalf("readdirplus d: %v %v", es, err)
	}
	if es[0].OK && es[0].Attr.Nlink != 1 {
		t.Fatalf("readdirplus d shows g with nlink %d, want 1 (or no attributes)", es[0].Attr.Nlink)
	}
}
