package btree_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/btreetest"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// The model tests run over the in-memory twin, with small pages (a few
// dozen keys make a tree of several levels) and a first extent of only 3
// blocks, so the tree spills into a second and many commits cross extents
// (two-phase commit, prepared pages).
var (
	modelGeometry      = btree.Geometry{PageBytes: 320, PagesPerBlock: 4, Blocks: 3}
	modelExtraGeometry = btree.Geometry{PageBytes: 320, PagesPerBlock: 4, Blocks: 1024}
)

const (
	modelExtent      = 1000
	modelExtraExtent = 1001
	modelTenant      = 7
)

// modelFaults exercise every failure path of the store, often.
var modelFaults = btree.MemFaults{
	ReadUnavailable:   0.02,
	CommitUnavailable: 0.02,
	CommitAmbiguous:   0.01,
	PreparedCrash:     0.05,
}

type modelEnv struct {
	store *btree.MemStore
	root  btree.PageRef
}

func newModelEnv(t testing.TB, seed uint64) *modelEnv {
	t.Helper()
	s := btree.NewMemStore(seed)
	if err := s.AddExtent(modelExtent, modelGeometry); err != nil {
		t.Fatal(err)
	}
	if err := s.AddExtent(modelExtraExtent, modelExtraGeometry); err != nil {
		t.Fatal(err)
	}
	root, err := btree.Create(context.Background(), s, modelExtent, modelTenant)
	if err != nil {
		t.Fatal(err)
	}
	return &modelEnv{store: s, root: root}
}

func (e *modelEnv) open(t testing.TB) *btree.Tree { return e.openWith(t, 0) }

// openLeafCached opens a client that trusts its leaf cache (a metadata
// server's configuration): its read-write transactions read no leaf they
// hold, so other clients' writes reach it only through failed commits.
func (e *modelEnv) openLeafCached(t testing.TB) *btree.Tree { return e.openWith(t, 1<<20) }

func (e *modelEnv) openWith(t testing.TB, leafCacheBytes int64) *btree.Tree {
	t.Helper()
	tr, err := btree.Open(context.Background(), btree.Config{
		Store: e.store, Root: e.root, Extents: []uint64{modelExtent, modelExtraExtent},
		MaxKeyBytes: 16, MaxValueBytes: 64, LeafCacheBytes: leafCacheBytes,
		MinBackoff: 50 * time.Microsecond, MaxBackoff: 2 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// outages kills and revives extents' leaders now and then: while one is
// down, every call to it fails as unavailable.
func (e *modelEnv) outages(seed uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 99))
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(2+r.IntN(5)) * time.Millisecond):
			}
			ext := []uint64{modelExtent, modelExtraExtent}[r.IntN(2)]
			e.store.SetDown(ext, true)
			time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
			e.store.SetDown(ext, false)
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// TestModelSequential runs one client against the map model under every
// store fault, checking every result, the atomicity of every ambiguous
// transaction, and the final state.
func TestModelSequential(t *testing.T) {
	seed := testseed.Seed(t)
	env := newModelEnv(t, seed)
	tr := env.open(t)
	defer tr.Close()
	ops := 3000
	if testing.Short() {
		ops = 800
	}
	rep := btreetest.RunSequential(t, tr, btreetest.Options{
		Seed: seed, OpsPerClient: ops, Keys: 120,
		Chaos: func() func() {
			env.store.SetFaults(modelFaults)
			return func() { env.store.SetFaults(btree.MemFaults{}) }
		},
	})
	m := tr.Metrics()
	st := env.store.Stats()
	t.Logf("%d ops (%d ambiguous, %d gave up); tree height %d pages %v; metrics %+v; store %+v",
		rep.Ops, rep.Ambiguous, rep.GaveUp, rep.Check.Height, rep.Check.Pages, m, st)
	if m.Splits == 0 || m.Merges == 0 || st.CrossExtentCommits == 0 || m.Resolves == 0 {
		t.Errorf("the run did not exercise splits (%d), merges (%d), cross-extent commits (%d) and resolution (%d)",
			m.Splits, m.Merges, st.CrossExtentCommits, m.Resolves)
	}
}

// TestModelConcurrent runs several clients at once, each with its own tree
// client, under every store fault, extent outages (killed leaders) and
// client restarts (a killed client loses its cache and queued rebalances);
// the history must linearize against the map model and the tree must check
// clean.
func TestModelConcurrent(t *testing.T) {
	seed := testseed.Seed(t)
	rounds := 4
	if testing.Short() {
		rounds = 1
	}
	var splits, merges int64
	for round := range rounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			seed := seed + uint64(round)
			env := newModelEnv(t, seed)
			open := env.open
			if round%2 == 1 {
				// Every other round, clients trust their leaf caches: stale
				// leaves must only ever cost failed commits.
				open = env.openLeafCached
			}
			rep := btreetest.RunConcurrent(t, btreetest.Options{
				Seed: seed, Open: open, Clients: 4, OpsPerClient: 200, Keys: 40, RestartOneIn: 40,
				Chaos: func() func() {
					f := modelFaults
					f.MaxDelay = 100 * time.Microsecond // interleave the clients more
					env.store.SetFaults(f)
					stopOutages := env.outages(seed)
					return func() {
						stopOutages()
						env.store.SetFaults(btree.MemFaults{})
					}
				},
			})
			st := env.store.Stats()
			m := rep.Clients
			t.Logf("%d operations (%d ambiguous, %d gave up) linearize; %d keys at the end; tree height %d pages %v; clients: %d splits, %d merges, %d redistributions, %d resolves, %d retries; store %+v",
				rep.Ops, rep.Ambiguous, rep.GaveUp, len(rep.Final), rep.Check.Height, rep.Check.Pages,
				m.Splits, m.Merges, m.Redistributions, m.Resolves, m.Retries, st)
			if st.CrossExtentCommits == 0 {
				t.Error("no commit crossed extents")
			}
			splits += m.Splits
			merges += m.Merges
		})
	}
	if splits == 0 || merges == 0 {
		t.Errorf("the clients made %d splits and %d merges: the run did not go through both", splits, merges)
	}
}
