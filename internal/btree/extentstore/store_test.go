package extentstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/btreetest"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/extent/extenttest"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// Small geometries, as in the B-tree's own model tests: 512-byte pages (the
// extent store's smallest), 4 pages a block; the first extent has only 3
// blocks, so the tree spills into the second and commits cross extents.
var (
	smallGeometry = extent.Geometry{PageSizeBytes: 512, BlockSizeBytes: 2048, ExtentSizeBytes: 3 * 2048}
	largeGeometry = extent.Geometry{PageSizeBytes: 512, BlockSizeBytes: 2048, ExtentSizeBytes: 2 << 20}
)

const tenant = 7

// newCluster is a 3-node in-process extent store (extenttest), quiet: node
// kills log errors by design (ARBOR_TEST_DEBUG shows everything).
func newCluster(t *testing.T, seed uint64) *extenttest.Cluster {
	level := slog.LevelError + 4
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return extenttest.NewCluster(t, extenttest.Options{Nodes: 3, Seed: seed,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))})
}

// env is a 3-node extent store with two extents replicated on all nodes,
// and a B-tree created in the first.
type env struct {
	c       *extenttest.Cluster
	extents []uint64
	root    btree.PageRef

	mu     sync.Mutex
	stores []*Store // the adapters open made
}

// deltas sums the page-delta counters of the adapters open made.
func (e *env) deltas() (m Metrics) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.stores {
		sm := s.Metrics()
		m.PageWrites += sm.PageWrites
		m.DeltaWrites += sm.DeltaWrites
		m.DeltaFallbacks += sm.DeltaFallbacks
		m.PageBytes += sm.PageBytes
		m.PageWriteBytes += sm.PageWriteBytes
	}
	return m
}

func newEnv(t *testing.T, seed uint64) *env {
	t.Helper()
	c := newCluster(t, seed)
	e := &env{c: c}
	e.extents = []uint64{c.CreateExtent(smallGeometry, 1, 2, 3), c.CreateExtent(largeGeometry, 1, 2, 3)}
	store := New(c.Client(nil))
	var err error
	for try := 0; try < 50; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.root, err = btree.Create(ctx, store, e.extents[0], tenant)
		cancel()
		if err == nil {
			return e
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("create: %v", err)
	return nil
}

// open returns a tree client over its own extent client, faulted by inj.
func (e *env) open(t testing.TB, inj *faults.Injector) *btree.Tree {
	t.Helper()
	store := New(e.c.Client(inj))
	e.mu.Lock()
	e.stores = append(e.stores, store)
	e.mu.Unlock()
	tr, err := btree.Open(context.Background(), btree.Config{
		Store: store, Root: e.root, Extents: e.extents,
		MaxKeyBytes: 16, MaxValueBytes: 64, MaxAttempts: 200,
		MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestAdapterMPSC checks the mapping on the real store: allocation at the
// generation the B-tree predicts, fresh writes, conflicts, stale pointers,
// frees and refused input, each surfacing as the B-tree's error kind.
func TestAdapterMPSC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t, 1)
	ext := c.CreateExtent(largeGeometry, 1, 2, 3)
	s := New(c.Client(nil))
	g, err := s.Geometry(ctx, ext)
	if err != nil || g.PageBytes != 512 || g.PagesPerBlock != 4 || g.Blocks != 1024 {
		t.Fatalf("geometry %+v, %v", g, err)
	}
	free, err := s.FreeBlocks(ctx, ext, 40, 1)
	if err != nil || len(free) != 1 {
		t.Fatalf("free blocks: %+v, %v", free, err)
	}
	blk := btree.PageRef{Extent: ext, Page: free[0].Page, Generation: free[0].Generation + 1, Tenant: tenant}
	p1 := blk
	p1.Page++
	if _, err := s.Commit(ctx, []btree.Op{
		{Kind: btree.OpAllocBlock, Ref: blk, Slot: free[0].Generation},
		{Kind: btree.OpWriteFresh, Ref: p1, Data: []byte("hello")},
	}); err != nil {
		t.Fatal(err)
	}
	data, slot, err := s.Read(ctx, p1)
	if err != nil || string(data) != "hello" || slot == 0 {
		t.Fatalf("read %q %d %v", data, slot, err)
	}
	if _, err := s.Commit(ctx, []btree.Op{{Kind: btree.OpWrite, Ref: p1, Slot: slot - 1, Data: []byte("x")}}); !errors.Is(err, btree.ErrConflict) {
		t.Fatalf("old slot: %v, want ErrConflict", err)
	}
	other := p1
	other.Tenant++
	if _, _, err := s.Read(ctx, other); !errors.Is(err, btree.ErrStale) {
		t.Fatalf("other tenant: %v, want ErrStale", err)
	}
	if _, err := s.Commit(ctx, make([]btree.Op, btree.MaxOpsPerCommit+1)); !errors.Is(err, btree.ErrInvalid) {
		t.Fatalf("16 ops: %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, []btree.Op{{Kind: btree.OpCheck, Ref: p1, Slot: slot}, {Kind: btree.OpFreeBlock, Ref: blk}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Read(ctx, p1); !errors.Is(err, btree.ErrStale) {
		t.Fatalf("after free: %v, want ErrStale", err)
	}
}

// TestTreeOnExtents builds, shrinks (merging pages) and checks a tree of
// several levels over two real extents.
func TestTreeOnExtents(t *testing.T) {
	e := newEnv(t, 2)
	tr := e.open(t, nil)
	defer tr.Close()
	ctx := context.Background()
	want := map[string]string{}
	r := rand.New(rand.NewPCG(2, 2))
	for _, i := range r.Perm(600) {
		k, v := fmt.Sprintf("k%05d", i), fmt.Sprintf("v%d", i)
		if err := tr.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	rep := btreetest.MustCheck(t, tr)
	if rep.Height < 2 || len(rep.Extents) != 2 {
		t.Fatalf("tree of height %d over extents %v: too small to show anything", rep.Height, rep.Extents)
	}
	for i := range 600 {
		if i%10 == 0 {
			continue
		}
		k := fmt.Sprintf("k%05d", i)
		if err := tr.Delete(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
		delete(want, k)
	}
	if _, err := tr.RebalanceAll(ctx); err != nil {
		t.Fatal(err)
	}
	rep2 := btreetest.MustCheck(t, tr)
	got := btreetest.ScanAll(t, tr)
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s = %q, want %q", k, got[k], v)
		}
	}
	m := tr.Metrics()
	t.Logf("built: height %d pages %v extents %v; after deleting 90%%: height %d pages %v; metrics %+v",
		rep.Height, rep.Pages, rep.Extents, rep2.Height, rep2.Pages, m)
	if m.Merges == 0 {
		t.Error("no page merged")
	}
}

func injector(t testing.TB, seed uint64, fail float64) *faults.Injector {
	inj, err := faults.New(faults.Options{Config: faults.Config{FailRate: fail, Seed: seed}})
	if err != nil {
		t.Fatal(err)
	}
	return inj
}

// TestModelSequentialOnExtents: the sequential model test on real extents,
// with 2% of the client's calls failing (request or reply lost).
func TestModelSequentialOnExtents(t *testing.T) {
	seed := testseed.Seed(t)
	e := newEnv(t, seed)
	inj := injector(t, seed, 0)
	tr := e.open(t, inj)
	defer tr.Close()
	ops := 1000
	if testing.Short() {
		ops = 300
	}
	rep := btreetest.RunSequential(t, tr, btreetest.Options{
		Seed: seed, OpsPerClient: ops, Keys: 150, OpTimeout: 30 * time.Second,
		Chaos: func() func() {
			if err := inj.SetConfig(faults.Config{FailRate: 0.02, Seed: seed}); err != nil {
				t.Fatal(err)
			}
			return func() { _ = inj.SetConfig(faults.Config{}) }
		},
	})
	d := e.deltas()
	t.Logf("%d ops (%d ambiguous, %d gave up); tree height %d pages %v extents %v; metrics %+v; page writes %d, %d of them deltas, %d fallbacks",
		rep.Ops, rep.Ambiguous, rep.GaveUp, rep.Check.Height, rep.Check.Pages, rep.Check.Extents, tr.Metrics(), d.PageWrites, d.DeltaWrites, d.DeltaFallbacks)
	if d.DeltaWrites == 0 {
		t.Error("no page delta sent: the run did not exercise them")
	}
}

// TestModelConcurrentOnExtents: concurrent clients on real extents, with
// faulted client calls (lost requests and replies, delays, duplicates),
// client restarts, and node kills: one node at a time is crashed (kill -9:
// unsynced data lost) and restarted, every other time the leader of one of
// the tree's extents, so extents lose their leader and elect another. The
// history must linearize and the tree check clean. BTREE_MODEL_ROUNDS sets
// the rounds (default 3, 1 with -short) for longer runs.
func TestModelConcurrentOnExtents(t *testing.T) {
	seed := testseed.Seed(t)
	e := newEnv(t, seed)
	var injMu sync.Mutex
	var injs []*faults.Injector
	var faultCfg faults.Config // for the injectors of clients opened from now on
	clients, ops, rounds := 4, 200, 3
	if testing.Short() {
		rounds = 1
	}
	if s := os.Getenv("BTREE_MODEL_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("BTREE_MODEL_ROUNDS=%q: want a positive number", s)
		}
		rounds = v
	}
	var final map[string]string
	totalOps, totalAmbiguous, totalKills, totalLeaderKills := 0, 0, 0, 0
	var splits, merges int64
	for round := range rounds {
		rep := btreetest.RunConcurrent(t, btreetest.Options{
			Seed: seed + uint64(round), Clients: clients, OpsPerClient: ops, Keys: 100, RestartOneIn: 30, OpTimeout: 60 * time.Second,
			CheckTimeout: 3 * time.Minute,
			Initial:      final,
			Open: func(t testing.TB) *btree.Tree {
				injMu.Lock()
				cfg := faultCfg
				cfg.Seed = seed + uint64(len(injs))
				inj := injector(t, cfg.Seed, 0)
				if err := inj.SetConfig(cfg); err != nil {
					t.Fatal(err)
				}
				injs = append(injs, inj)
				injMu.Unlock()
				return e.open(t, inj)
			},
			Chaos: func() func() {
				setFaults := func(cfg faults.Config) {
					injMu.Lock()
					defer injMu.Unlock()
					faultCfg = cfg
					for i, inj := range injs {
						cfg.Seed = seed + uint64(i)
						_ = inj.SetConfig(cfg)
					}
				}
				countFaults := func() (n uint64) {
					injMu.Lock()
					defer injMu.Unlock()
					for _, inj := range injs {
						c := inj.Counts()
						n += c.RequestsLost + c.RepliesLost + c.CallsDelayed + c.CallsDuplicated
					}
					return n
				}
				faultsBefore := countFaults()
				done := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				kills, leaderKills := 0, 0
				go func() { // kill -9 one node at a time, then bring it back
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed+uint64(round), 5))
					for {
						// The first kill comes at once, so that even a
						// short round sees a leader die.
						wait := time.Duration(50+r.IntN(100)) * time.Millisecond
						if kills == 0 {
							wait = 5 * time.Millisecond
						}
						select {
						case <-done:
							return
						case <-time.After(wait):
						}
						setFaults(faults.Config{FailRate: 0.02, DelayRate: 0.05, DelayMin: 0, DelayMax: 5 * time.Millisecond, DupRate: 0.02})
						id := uint64(1 + r.IntN(3))
						if kills%2 == 0 {
							if l := e.c.LeaderOf(e.extents[r.IntN(len(e.extents))]); l != 0 {
								id = l
								leaderKills++
							}
						}
						e.c.Crash(id)
						kills++
						select {
						case <-done:
						case <-time.After(time.Duration(50+r.IntN(150)) * time.Millisecond):
						}
						e.c.Start(id)
					}
				}()
				return func() {
					close(done)
					wg.Wait()
					setFaults(faults.Config{})
					injected := countFaults() - faultsBefore
					t.Logf("%d node kills (%d of an extent's leader), %d client calls faulted", kills, leaderKills, injected)
					if leaderKills == 0 || injected == 0 {
						t.Errorf("the run ended before an extent's leader was killed (%d kills) or a call was faulted (%d)", kills, injected)
					}
					totalKills += kills
					totalLeaderKills += leaderKills
					for _, ext := range e.extents {
						e.c.Leader(ext)
					}
				}
			},
		})
		final = rep.Final
		totalOps += rep.Ops
		totalAmbiguous += rep.Ambiguous
		m := rep.Clients
		splits += m.Splits
		merges += m.Merges
		t.Logf("round %d: %d operations (%d ambiguous, %d gave up) linearize; %d keys at the end; tree height %d pages %v extents %v; clients: %d splits, %d merges, %d redistributions, %d resolves, %d retries",
			round, rep.Ops, rep.Ambiguous, rep.GaveUp, len(rep.Final), rep.Check.Height, rep.Check.Pages, rep.Check.Extents,
			m.Splits, m.Merges, m.Redistributions, m.Resolves, m.Retries)
	}
	d := e.deltas()
	t.Logf("%d rounds: %d operations (%d ambiguous) linearize, through %d node kills (%d leaders), %d splits and %d merges; page writes %d, %d of them deltas, %d fallbacks",
		rounds, totalOps, totalAmbiguous, totalKills, totalLeaderKills, splits, merges, d.PageWrites, d.DeltaWrites, d.DeltaFallbacks)
	if d.DeltaWrites == 0 {
		t.Error("no page delta sent: the run did not exercise them")
	}
	if splits == 0 || merges == 0 {
		t.Errorf("the clients made %d splits and %d merges: the run did not go through both", splits, merges)
	}
}

// TestMillionKeysOnExtents loads keys through the API into a tree over
// three real extents (default geometry, 3 replicas, in-memory disks), as
// `arbor kv put --stdin` does (transactions of 15 consecutive keys, 8 at a
// time, in shuffled batch order), then checks the tree and reports its
// shape. It takes minutes, so it runs only with ARBOR_BTREE_MILLION set
// (to the number of keys; "1" means a million).
func TestMillionKeysOnExtents(t *testing.T) {
	n := 1_000_000
	switch s := os.Getenv("ARBOR_BTREE_MILLION"); s {
	case "":
		t.Skip("set ARBOR_BTREE_MILLION=1 to run (minutes)")
	case "1":
	default:
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		n = v
	}
	c := newCluster(t, 7)
	g := extent.DefaultGeometry()
	exts := []uint64{c.CreateExtent(g, 1, 2, 3), c.CreateExtent(g, 1, 2, 3), c.CreateExtent(g, 1, 2, 3)}
	ctx := context.Background()
	store := New(c.Client(nil))
	root, err := btree.Create(ctx, store, exts[0], tenant)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := btree.Open(ctx, btree.Config{Store: store, Root: root, Extents: exts})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	batches := rand.New(rand.NewPCG(7, 7)).Perm((n + btree.MaxTxnValues - 1) / btree.MaxTxnValues)
	start := time.Now()
	var next sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				if len(batches) == 0 {
					next.Unlock()
					return
				}
				bi := batches[0]
				batches = batches[1:]
				next.Unlock()
				err := tr.Update(ctx, func(tx *btree.Txn) error {
					for i := bi * btree.MaxTxnValues; i < min((bi+1)*btree.MaxTxnValues, n); i++ {
						if err := tx.Put([]byte(fmt.Sprintf("key%09d", i)), []byte(fmt.Sprintf("value-%d", i))); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	d := time.Since(start)
	rep := btreetest.MustCheck(t, tr)
	if rep.Keys != int64(n) {
		t.Fatalf("check counted %d keys, want %d", rep.Keys, n)
	}
	m := tr.Metrics()
	t.Logf("%d keys in %v (%.0f keys/s): height %d, pages per level %v, leaf fill %.1f%%, inner fill %.1f%%, %d blocks (%d split runs), extents %v; splits %d, block splits %d, retries %d, cache hit ratio %.4f",
		n, d.Round(time.Second), float64(n)/d.Seconds(), rep.Height, rep.Pages, 100*rep.LeafFill(), 100*rep.InnerFill(),
		rep.Blocks, rep.SplitRuns, rep.Extents, m.Splits, m.BlockSplits, m.Retries, m.CacheHitRatio())
}
