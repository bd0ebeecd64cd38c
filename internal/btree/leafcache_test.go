package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestLeafCacheSkipsReads: a client with a leaf cache writes the same keys
// again and again without reading their leaves from the store, and still
// commits conditional on their slots.
func TestLeafCacheSkipsReads(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 11, testGeometry)
	tr := env.open(t, func(c *Config) { c.LeafCacheBytes = 1 << 20; c.RebalanceQueue = -1 })
	loadKeys(t, tr, 200)
	before := tr.Metrics()
	for i := range 50 {
		if err := tr.Update(ctx, func(tx *Txn) error { return tx.Put(key(i%5), []byte(fmt.Sprint(i))) }); err != nil {
			t.Fatal(err)
		}
	}
	after := tr.Metrics()
	if hits := after.LeafCacheHits - before.LeafCacheHits; hits < 45 {
		t.Errorf("%d leaf cache hits in 50 updates of cached leaves", hits)
	}
	if reads := after.PageReads - before.PageReads; reads > 5 {
		t.Errorf("%d page reads in 50 updates of cached leaves", reads)
	}
	// The load found its leaves missing from the cache at first; the
	// updates of cached leaves miss no more than they read.
	if before.LeafCacheMisses == 0 {
		t.Error("no leaf cache misses counted while loading into an empty cache")
	}
	if misses := after.LeafCacheMisses - before.LeafCacheMisses; misses > 5 {
		t.Errorf("%d leaf cache misses in 50 updates of cached leaves", misses)
	}
	// A tree without a leaf cache counts no misses of it.
	plain := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	if err := plain.Put(ctx, key(3), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if m := plain.Metrics(); m.LeafCacheHits+m.LeafCacheMisses != 0 {
		t.Errorf("a tree without a leaf cache counts %d hits and %d misses of it", m.LeafCacheHits, m.LeafCacheMisses)
	}
	if v, _, err := tr.Get(ctx, key(4)); err != nil || string(v) != "49" {
		t.Fatalf("key 4 = %q, %v; want 49", v, err)
	}
}

// TestLeafCacheStaleLeafOnlyConflicts: another client changes a leaf the
// first one holds in its cache; the first one's next transaction on it
// conflicts, reads it again and commits on top of the other's write: no
// write is lost.
func TestLeafCacheStaleLeafOnlyConflicts(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 12, testGeometry)
	a := env.open(t, func(c *Config) { c.LeafCacheBytes = 1 << 20; c.RebalanceQueue = -1 })
	b := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	loadKeys(t, a, 100)
	incr := func(tr *Tree, k []byte) {
		t.Helper()
		err := tr.Update(ctx, func(tx *Txn) error {
			v, _, err := tx.Get(k)
			if err != nil {
				return err
			}
			n := 0
			fmt.Sscan(string(v), &n)
			return tx.Put(k, []byte(fmt.Sprint(n+1)))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	k := key(7)
	if err := a.Put(ctx, k, []byte("0")); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		incr(a, k) // from a's cache
		incr(b, k) // behind a's back
	}
	v, _, err := b.Get(ctx, k)
	if err != nil || string(v) != "20" {
		t.Fatalf("counter = %q, %v; want 20 (a lost write)", v, err)
	}
	if a.Metrics().Conflicts == 0 {
		t.Error("the stale leaf never conflicted")
	}
	// A read-only transaction never trusts the cache.
	if err := b.Put(ctx, k, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, _, err := a.Get(ctx, k); err != nil || string(v) != "x" {
		t.Fatalf("View read %q, %v after another client's write; want x", v, err)
	}
	// An update that only reads a stale cached leaf still validates it.
	if err := b.Put(ctx, k, []byte("y")); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := a.Update(ctx, func(tx *Txn) error {
		v, _, err := tx.Get(k)
		got = string(v)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got != "y" {
		t.Fatalf("read-only Update saw %q after another client's write; want y", got)
	}
	// So does one whose function fails on what it read: the failure must
	// not rest on a stale leaf (a table owner that read an old header
	// would think itself fenced).
	if err := a.Update(ctx, func(tx *Txn) error { _, _, err := tx.Get(k); return err }); err != nil {
		t.Fatal(err) // a's cache now holds y
	}
	if err := b.Put(ctx, k, []byte("z")); err != nil {
		t.Fatal(err)
	}
	errNotZ := errors.New("not z")
	err = a.Update(ctx, func(tx *Txn) error {
		v, _, err := tx.Get(k)
		if err != nil {
			return err
		}
		if string(v) != "z" {
			return errNotZ
		}
		return nil
	})
	if err != nil {
		t.Fatalf("an Update failed on a stale cached leaf: %v", err)
	}
}

// TestUpdatePagesChargesPages: UpdatePages takes any number of keys on few
// leaves, and refuses a transaction whose leaves exceed MaxTxnValues.
func TestUpdatePagesChargesPages(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 13, testGeometry)
	tr := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	loadKeys(t, tr, 2000)
	// 40 neighbouring keys live on a few leaves: too many keys for
	// Update, fine for UpdatePages.
	write := func(tx *Txn, from, n int) error {
		for i := from; i < from+n; i++ {
			if err := tx.Put(key(i), []byte("batch")); err != nil {
				return err
			}
		}
		return nil
	}
	if err := tr.Update(ctx, func(tx *Txn) error { return write(tx, 100, 40) }); !errors.Is(err, ErrTooManyValues) {
		t.Fatalf("Update of 40 keys: %v, want ErrTooManyValues", err)
	}
	if err := tr.UpdatePages(ctx, func(tx *Txn) error { return write(tx, 100, 40) }); err != nil {
		t.Fatalf("UpdatePages of 40 neighbouring keys: %v", err)
	}
	for i := 100; i < 140; i++ {
		if v, _, err := tr.Get(ctx, key(i)); err != nil || string(v) != "batch" {
			t.Fatalf("key %d = %q, %v", i, v, err)
		}
	}
	// Keys spread over the whole tree need a leaf each.
	err := tr.UpdatePages(ctx, func(tx *Txn) error {
		for i := 0; i < 2000; i += 100 {
			if err := tx.Put(key(i), []byte("far")); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, ErrTooManyValues) {
		t.Fatalf("UpdatePages over 20 leaves: %v, want ErrTooManyValues", err)
	}
	if v, _, _ := tr.Get(ctx, key(0)); string(v) == "far" {
		t.Fatal("a refused transaction wrote")
	}
	mustCheck(t, tr)
}

// TestLeafCacheStaleFullLeaf: a client's cached copies of leaves are
// full, but another client has split them since; the first client's
// writes to keys that moved to the new halves must not keep splitting
// what it cached (and give up): a page found full is read again.
func TestLeafCacheStaleFullLeaf(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 13, testGeometry)
	a := env.open(t, func(c *Config) { c.LeafCacheBytes = 1 << 20; c.RebalanceQueue = -1 })
	b := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	value := bytes.Repeat([]byte("v"), testMaxValue)
	const n = 200
	for i := range n {
		if err := a.Put(ctx, key(i), value); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if err := b.Put(ctx, append(key(i), 'b'), value); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if err := a.Put(ctx, append(key(i), 'a'), value); err != nil {
			t.Fatalf("a's write next to key %d, in its stale full leaf: %v", i, err)
		}
	}
	mustCheck(t, b)
}

// TestLeafCacheSplitsReadLess: a client with a leaf cache splits leaves
// from the pages it cached (the leaf, its parent, the block header) and
// keeps the halves a split wrote, so the writes that caused the splits
// read far fewer pages than without the cache; the tree stays valid and
// holds every key.
func TestLeafCacheSplitsReadLess(t *testing.T) {
	ctx := context.Background()
	const n = 600
	run := func(leafCache int64) Metrics {
		env := newTestEnv(t, 14, testGeometry)
		tr := env.open(t, func(c *Config) { c.LeafCacheBytes = leafCache; c.RebalanceQueue = -1 })
		for i := range n {
			if err := tr.Put(ctx, key(i), bytes.Repeat([]byte("v"), 40)); err != nil {
				t.Fatal(err)
			}
		}
		mustCheck(t, tr)
		for _, i := range []int{0, n / 2, n - 1} {
			if _, ok, err := tr.Get(ctx, key(i)); err != nil || !ok {
				t.Fatalf("key %d: found %v, %v", i, ok, err)
			}
		}
		return tr.Metrics()
	}
	with, without := run(1<<20), run(0)
	if with.Splits < 20 || without.Splits < 20 {
		t.Fatalf("too few splits to compare: %d with the cache, %d without", with.Splits, without.Splits)
	}
	if with.PageReads*2 > without.PageReads {
		t.Errorf("%d page reads with the leaf cache (%d splits), %d without (%d splits): want under half", with.PageReads, with.Splits, without.PageReads, without.Splits)
	}
	t.Logf("page reads: %d with the leaf cache, %d without; splits %d, %d", with.PageReads, without.PageReads, with.Splits, without.Splits)
}

// TestLeafCacheSplitsWithAnotherWriter: two clients, one with a leaf
// cache, split the same leaves, parents and blocks in turn, so the cached
// client's inner pages and block headers go stale behind its back; its
// splits must fail and read again, never give up or damage the tree.
func TestLeafCacheSplitsWithAnotherWriter(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 15, testGeometry)
	a := env.open(t, func(c *Config) { c.LeafCacheBytes = 1 << 20; c.RebalanceQueue = -1 })
	b := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
	const n = 400
	v := bytes.Repeat([]byte("v"), 40)
	for i := range n {
		tr, k := a, key(2*i)
		if i%3 == 2 {
			tr, k = b, key(2*i+1)
		}
		if err := tr.Put(ctx, k, v); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	mustCheck(t, b)
	for i := range n {
		k := key(2 * i)
		if i%3 == 2 {
			k = key(2*i + 1)
		}
		if _, ok, err := b.Get(ctx, k); err != nil || !ok {
			t.Fatalf("key %q: found %v, %v", k, ok, err)
		}
	}
}
