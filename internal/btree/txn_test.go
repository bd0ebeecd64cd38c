package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
)

// recordingStore records every successful commit.
type recordingStore struct {
	PageStore
	mu      sync.Mutex
	commits [][]Op
}

func (r *recordingStore) Commit(ctx context.Context, ops []Op) ([]uint64, error) {
	slots, err := r.PageStore.Commit(ctx, ops)
	if err == nil {
		r.mu.Lock()
		r.commits = append(r.commits, append([]Op(nil), ops...))
		r.mu.Unlock()
	}
	return slots, err
}

func (r *recordingStore) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.commits)
}

func loadKeys(t testing.TB, tr *Tree, n int) {
	t.Helper()
	ctx := context.Background()
	for lo := 0; lo < n; lo += MaxTxnValues {
		err := tr.Update(ctx, func(tx *Txn) error {
			for i := lo; i < min(lo+MaxTxnValues, n); i++ {
				if err := tx.Put(key(i), []byte("v"+strconv.Itoa(i))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestCommitHoldsOnlyLeaves counts the pages of every transaction's
// commit: at most one per key touched, all of them leaves, never the root
// or an inner page (FSS §5 self-validating pages).
func TestCommitHoldsOnlyLeaves(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 3, testGeometry)
	rec := &recordingStore{PageStore: env.store}
	tr := env.open(t, func(c *Config) { c.Store = rec; c.RebalanceQueue = -1 })
	const n = 3000
	loadKeys(t, tr, n)
	rep := mustCheck(t, tr)
	if rep.Height < 2 {
		t.Fatalf("tree of height %d: too low to show anything", rep.Height)
	}
	r := rand.New(rand.NewPCG(3, 3))
	totalKeys, totalPages := 0, 0
	for txn := range 300 {
		nkeys := 1 + r.IntN(MaxTxnValues)
		keys := map[int]bool{}
		for len(keys) < nkeys {
			// Clustered keys share leaves, scattered ones do not.
			base := r.IntN(n)
			keys[(base+r.IntN(40))%n] = true
		}
		before := rec.count()
		err := tr.Update(ctx, func(tx *Txn) error {
			for k := range keys {
				var err error
				switch r.IntN(3) {
				case 0:
					_, _, err = tx.Get(key(k))
				case 1:
					err = tx.Put(key(k), []byte(fmt.Sprintf("t%d", txn)))
				default:
					err = tx.Delete(key(k))
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		commits := rec.commits[before:]
		rec.mu.Unlock()
		if len(commits) == 0 {
			continue // a read of a single leaf needs no commit
		}
		final := commits[len(commits)-1]
		if len(final) > len(keys) {
			t.Fatalf("transaction on %d keys committed %d pages", len(keys), len(final))
		}
		for _, op := range final {
			if op.Kind != OpWrite && op.Kind != OpCheck {
				t.Fatalf("transaction commit holds a %v", op.Kind)
			}
			if op.Ref == tr.Root() {
				t.Fatal("transaction commit holds the root")
			}
			data, _, err := env.store.Read(ctx, op.Ref)
			if err != nil {
				t.Fatal(err)
			}
			p, err := decodePage(data)
			if err != nil || p.kind != kindLeaf || p.height != 0 {
				t.Fatalf("transaction commit holds page %v that is not a leaf (%v)", op.Ref, err)
			}
		}
		totalKeys += len(keys)
		totalPages += len(final)
	}
	t.Logf("tree height %d; 300 transactions touched %d keys and committed %d pages (%.2f per key)",
		rep.Height, totalKeys, totalPages, float64(totalPages)/float64(totalKeys))
}

// TestBadInputChangesNothing: every kind of bad input gets a clear error
// and leaves the tree (and the store) untouched.
func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 4, testGeometry)
	rec := &recordingStore{PageStore: env.store}
	// No background rebalancing: every commit must come from the input.
	tr := env.open(t, func(c *Config) { c.Store = rec; c.RebalanceQueue = -1 })
	loadKeys(t, tr, 200)
	want := scanAll(t, tr)
	commits := rec.count()
	long := bytes.Repeat([]byte("k"), testMaxKey+1)
	cases := []struct {
		name string
		fn   func(*Txn) error
		want error
	}{
		{"oversize key", func(tx *Txn) error {
			if err := tx.Put(key(1), []byte("changed")); err != nil {
				return err
			}
			return tx.Put(long, []byte("x"))
		}, ErrKeyTooLarge},
		{"oversize value", func(tx *Txn) error {
			if err := tx.Delete(key(2)); err != nil {
				return err
			}
			return tx.Put(key(3), bytes.Repeat([]byte("v"), testMaxValue+1))
		}, ErrValueTooLarge},
		{"oversize key in get", func(tx *Txn) error { _, _, err := tx.Get(long); return err }, ErrKeyTooLarge},
		{"16 values", func(tx *Txn) error {
			for i := range MaxTxnValues + 1 {
				if err := tx.Put(key(1000+i), []byte("new")); err != nil {
					return err
				}
			}
			return nil
		}, ErrTooManyValues},
		{"15 keys and a block", func(tx *Txn) error {
			for i := range MaxTxnValues {
				if err := tx.Delete(key(i)); err != nil {
					return err
				}
			}
			_, err := tx.AllocBlock(testExtraExtent, 0, testTenant)
			return err
		}, ErrTooManyValues},
		{"reversed scan", func(tx *Txn) error {
			if err := tx.Put(key(5), []byte("changed")); err != nil {
				return err
			}
			_, err := tx.Scan(key(9), key(1), 0)
			return err
		}, ErrBadRange},
		{"oversize page write", func(tx *Txn) error {
			if err := tx.Put(key(6), []byte("changed")); err != nil {
				return err
			}
			return tx.WritePage(tr.Root(), make([]byte, testGeometry.PageBytes+1))
		}, ErrValueTooLarge},
		{"error swallowed by the function", func(tx *Txn) error {
			_ = tx.Put(long, nil)
			return tx.Put(key(7), []byte("changed"))
		}, ErrKeyTooLarge},
	}
	for _, c := range cases {
		err := tr.Update(ctx, c.fn)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		t.Logf("%s: %v", c.name, err)
	}
	// The one-key calls refuse the same input.
	if err := tr.Put(ctx, long, nil); !errors.Is(err, ErrKeyTooLarge) {
		t.Errorf("Put of a long key: %v", err)
	}
	if err := tr.Scan(ctx, key(9), key(1), func(k, v []byte) error { return nil }); !errors.Is(err, ErrBadRange) {
		t.Errorf("reversed Scan: %v", err)
	}
	// A transaction used after its function returned.
	var kept *Txn
	if err := tr.View(ctx, func(tx *Txn) error { kept = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := kept.Put(key(1), []byte("late")); !errors.Is(err, ErrTxnDone) {
		t.Errorf("late Put: %v, want ErrTxnDone", err)
	}
	// The only commits allowed are splits an earlier, valid part of a
	// transaction asked for before the bad input came: they move keys
	// between pages but change no key or value.
	rec.mu.Lock()
	for _, c := range rec.commits[commits:] {
		if !structural(c) {
			t.Errorf("bad input committed %d ops that are not a structural change", len(c))
		}
	}
	rec.mu.Unlock()
	if err := equalMaps(scanAll(t, tr), want); err != nil {
		t.Errorf("bad input changed the tree: %v", err)
	}
	// A tree cannot be opened with bounds its pages cannot hold.
	_, err := Open(ctx, Config{Store: env.store, Root: env.root, MaxKeyBytes: 200, MaxValueBytes: 300})
	if err == nil {
		t.Error("Open accepted bounds a 512-byte page cannot hold")
	}
}

// structural reports whether a commit is a split or merge: it writes an
// inner page, a block header or a free-page marker, or allocates or frees a
// block. A transaction's commit writes only leaves.
func structural(ops []Op) bool {
	for _, op := range ops {
		switch op.Kind {
		case OpAllocBlock, OpFreeBlock, OpWriteFresh:
			return true
		case OpWrite:
			p, err := decodePage(op.Data)
			if err == nil && p.kind != kindLeaf {
				return true
			}
		}
	}
	return false
}

// TestStaleCacheIsRepaired: a client whose cache was right goes on working
// after another client split and merged every page under it; wrong guesses
// are dropped and refilled, and then the cache hits again.
func TestStaleCacheIsRepaired(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 5, testGeometry)
	// The writer reshapes the tree only when told to.
	writer := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	reader := env.open(t, nil)
	const n = 1500
	loadKeys(t, writer, n)
	readAll := func(want func(i int) (string, bool)) {
		t.Helper()
		for i := range n {
			v, ok, err := reader.Get(ctx, key(i))
			w, wok := want(i)
			if err != nil || ok != wok || string(v) != w {
				t.Fatalf("get %d = %q %v %v, want %q %v", i, v, ok, err, w, wok)
			}
		}
	}
	readAll(func(i int) (string, bool) { return "v" + strconv.Itoa(i), true })
	warm := reader.Metrics()
	// The writer reshapes the tree: deletes nine keys in ten, compacts
	// (merging pages), then gives the rest long values (splitting pages).
	for i := range n {
		if i%10 != 0 {
			if err := writer.Delete(ctx, key(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := writer.RebalanceAll(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 10 {
		if err := writer.Put(ctx, key(i), bytes.Repeat([]byte{'w'}, testMaxValue)); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, writer)
	want := func(i int) (string, bool) {
		if i%10 != 0 {
			return "", false
		}
		return string(bytes.Repeat([]byte{'w'}, testMaxValue)), true
	}
	readAll(want)
	stale := reader.Metrics()
	readAll(want)
	again := reader.Metrics()
	staleMisses := stale.CacheMisses - warm.CacheMisses
	hits := again.CacheHits - stale.CacheHits
	misses := again.CacheMisses - stale.CacheMisses
	t.Logf("cold pass: %d hits, %d misses; after reshaping: %d misses; next pass: %d hits, %d misses",
		warm.CacheHits, warm.CacheMisses, staleMisses, hits, misses)
	if staleMisses == 0 {
		t.Error("reshaping the tree caused no cache miss: the test shows nothing")
	}
	if misses != 0 || hits != n {
		t.Errorf("the repaired cache missed %d of %d lookups", misses, n)
	}
}

// TestScanDuringChanges: streaming scans while another client inserts and
// deletes keys between them (splitting and merging the pages under the
// scan) see every untouched key once, in order, with its value.
func TestScanDuringChanges(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 6, testGeometry)
	tr := env.open(t, nil)
	const stable = 600
	for i := range stable {
		if err := tr.Put(ctx, []byte(fmt.Sprintf("s%04d", i)), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		churn := env.open(t, nil)
		r := rand.New(rand.NewPCG(6, 6))
		for {
			select {
			case <-stop:
				return
			default:
			}
			i := r.IntN(stable)
			// s%04d-x sorts between s%04d and the next stable key.
			k := []byte(fmt.Sprintf("s%04d-x", i))
			var err error
			if r.IntN(2) == 0 {
				err = churn.Put(ctx, k, bytes.Repeat([]byte("c"), r.IntN(60)))
			} else {
				err = churn.Delete(ctx, k)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 40 {
		next := 0
		var prev []byte
		err := tr.Scan(ctx, nil, nil, func(k, v []byte) error {
			if prev != nil && bytes.Compare(prev, k) >= 0 {
				return fmt.Errorf("%q after %q", k, prev)
			}
			prev = bytes.Clone(k)
			if bytes.HasSuffix(k, []byte("-x")) {
				return nil
			}
			if want := fmt.Sprintf("s%04d", next); string(k) != want || string(v) != strconv.Itoa(next) {
				return fmt.Errorf("got %q=%q, want %s", k, v, want)
			}
			next++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if next != stable {
			t.Fatalf("scan saw %d stable keys of %d", next, stable)
		}
	}
	close(stop)
	wg.Wait()
	m := tr.Metrics()
	t.Logf("scanner: %+v", m)
	mustCheck(t, tr)
}

// TestBlockLocality: a split puts the new page in its neighbour's block,
// and a full block moves its last pages to a new block (FSS §5 Figure 6),
// so neighbouring leaves mostly share a block, whatever the insertion
// order, and a tree that fits in one extent stays in it.
func TestBlockLocality(t *testing.T) {
	ctx := context.Background()
	for _, order := range []string{"sequential", "random"} {
		t.Run(order, func(t *testing.T) {
			env := newTestEnv(t, 7, testGeometry)
			tr := env.open(t, nil)
			const n = 3000
			idx := make([]int, n)
			for i := range idx {
				idx[i] = i
			}
			if order == "random" {
				rand.New(rand.NewPCG(7, 7)).Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
			}
			for _, i := range idx {
				if err := tr.Put(ctx, key(i), []byte("value")); err != nil {
					t.Fatal(err)
				}
			}
			rep := mustCheck(t, tr)
			leaves := leafRefs(t, tr)
			same := 0
			for i := 1; i < len(leaves); i++ {
				if leaves[i].Extent == leaves[i-1].Extent && testGeometry.BlockOf(leaves[i].Page) == testGeometry.BlockOf(leaves[i-1].Page) {
					same++
				}
			}
			frac := float64(same) / float64(len(leaves)-1)
			t.Logf("%s: %d leaves in %d blocks; %.0f%% of neighbouring leaves share a block; %d blocks hold more than one run; extents %v; %d block splits",
				order, len(leaves), rep.Blocks, 100*frac, rep.SplitRuns, rep.Extents, tr.Metrics().BlockSplits)
			// A block holds 7 pages, so at best 6 of 7 neighbours share one.
			if frac < 0.7 {
				t.Errorf("only %.0f%% of neighbouring leaves share a block", 100*frac)
			}
			if len(rep.Extents) != 1 {
				t.Errorf("a tree that fits one extent spread over %v", rep.Extents)
			}
		})
	}
}

// leafRefs lists the leaves in key order.
func leafRefs(t testing.TB, tr *Tree) []PageRef {
	var out []PageRef
	resume := []byte{}
	for {
		loc, err := tr.locate(context.Background(), resume, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, loc.ref)
		if loc.p.hiInf {
			return out
		}
		resume = loc.p.hi
	}
}

// TestNonTreePagesAndBlocks: a transaction allocates a data block, writes a
// page of it and stores its pointer under a key, atomically; freeing the
// block later makes the pointer stale (FSS §3 block ownership).
func TestNonTreePagesAndBlocks(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 8, testGeometry)
	tr := env.open(t, nil)
	const dataTenant = 99
	var blk PageRef
	err := tr.Update(ctx, func(tx *Txn) error {
		var err error
		if blk, err = tx.AllocBlock(testExtraExtent, 0, dataTenant); err != nil {
			return err
		}
		pg := blk
		pg.Page++
		if err := tx.WritePage(pg, []byte("file contents")); err != nil {
			return err
		}
		var enc [refBytes]byte
		putRef(enc[:], blk)
		return tx.Put([]byte("file"), enc[:])
	})
	if err != nil {
		t.Fatal(err)
	}
	v, ok, err := tr.Get(ctx, []byte("file"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ptr := getRef(v)
	pg := ptr
	pg.Page++
	data, _, err := env.store.Read(ctx, pg)
	if err != nil || string(data) != "file contents" {
		t.Fatalf("data page = %q, %v", data, err)
	}
	// Read-modify-write of the data page with a key, atomically.
	err = tr.Update(ctx, func(tx *Txn) error {
		d, err := tx.ReadPage(pg)
		if err != nil {
			return err
		}
		if err := tx.WritePage(pg, append(d, " v2"...)); err != nil {
			return err
		}
		return tx.Put([]byte("file.version"), []byte("2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	// Truncate: free the block and drop the key together.
	err = tr.Update(ctx, func(tx *Txn) error {
		if err := tx.FreeBlock(ptr); err != nil {
			return err
		}
		return tx.Delete([]byte("file"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := env.store.Read(ctx, pg); !errors.Is(err, ErrStale) {
		t.Fatalf("cached pointer after free: %v, want ErrStale", err)
	}
	if _, ok, _ := tr.Get(ctx, []byte("file")); ok {
		t.Fatal("key survived its block's free")
	}
}

// ambiguousStore turns some commits into ErrAmbiguous, half of them
// applied first.
type ambiguousStore struct {
	PageStore
	mu sync.Mutex
	r  *rand.Rand
	p  float64
}

func (a *ambiguousStore) Commit(ctx context.Context, ops []Op) ([]uint64, error) {
	a.mu.Lock()
	hit, apply := a.r.Float64() < a.p, a.r.IntN(2) == 0
	a.mu.Unlock()
	if !hit {
		return a.PageStore.Commit(ctx, ops)
	}
	if apply {
		if _, err := a.PageStore.Commit(ctx, ops); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: injected", ErrAmbiguous)
}

// TestAmbiguousCommitsAreLearned: a counter incremented by read-modify-write
// transactions through a store that loses a third of commit replies ends
// exactly at the number of increments: no increment lost, none doubled.
func TestAmbiguousCommitsAreLearned(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 9, testGeometry)
	amb := &ambiguousStore{PageStore: env.store, r: rand.New(rand.NewPCG(9, 9)), p: 0.33}
	tr := env.open(t, func(c *Config) { c.Store = amb })
	loadKeys(t, tr, 300) // a few levels, so counters live in different leaves
	const increments = 300
	for i := range increments {
		k := key(i % 7 * 40)
		err := tr.Update(ctx, func(tx *Txn) error {
			v, _, err := tx.Get([]byte("counter"))
			if err != nil {
				return err
			}
			n, _ := strconv.Atoi(string(v))
			if err := tx.Put([]byte("counter"), []byte(strconv.Itoa(n+1))); err != nil {
				return err
			}
			return tx.Put(k, []byte(strconv.Itoa(i)))
		})
		if err != nil {
			t.Fatalf("increment %d: %v", i, err)
		}
	}
	v, _, err := tr.Get(ctx, []byte("counter"))
	if err != nil || string(v) != strconv.Itoa(increments) {
		t.Fatalf("counter = %q (%v), want %d", v, err, increments)
	}
	t.Logf("metrics: %+v", tr.Metrics())
}
