package extentstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/btreetest"
	"github.com/arbor-storage/arbor/internal/extent"
)

// wireCounter is the extent client with the bytes of the page writes it
// sends counted: images, or delta scripts.
type wireCounter struct {
	Client
	sent, deltas atomic.Int64
}

func (w *wireCounter) Commit(ctx context.Context, elems []extent.Element) ([]extent.Result, error) {
	for _, e := range elems {
		if e.Kind != extent.KindWrite {
			continue
		}
		if e.Delta != nil {
			w.sent.Add(int64(len(e.Delta.Script)))
			w.deltas.Add(1)
		} else {
			w.sent.Add(int64(len(e.Data)))
		}
	}
	return w.Client.Commit(ctx, elems)
}

// TestDeltasCutBytesSent: the same B-tree workload (inserts in random
// order, then updates) over real extents, once with full images and once
// with deltas: the trees end up the same, and the bytes of page writes
// sent fall by more than half.
func TestDeltasCutBytesSent(t *testing.T) {
	ctx := context.Background()
	run := func(cacheBytes int64) (*wireCounter, *Store, map[string]string) {
		e := newEnv(t, 3)
		wc := &wireCounter{Client: e.c.Client(nil)}
		store := NewWithConfig(wc, Config{DeltaCacheBytes: cacheBytes})
		tr, err := btree.Open(ctx, btree.Config{Store: store, Root: e.root, Extents: e.extents,
			MaxKeyBytes: 16, MaxValueBytes: 64, MaxAttempts: 200, RebalanceQueue: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		r := rand.New(rand.NewPCG(3, 3))
		for _, i := range r.Perm(400) {
			if err := tr.Put(ctx, []byte(fmt.Sprintf("k%05d", i)), []byte(fmt.Sprintf("value %d", i))); err != nil {
				t.Fatal(err)
			}
		}
		for _, i := range r.Perm(400)[:200] {
			if err := tr.Put(ctx, []byte(fmt.Sprintf("k%05d", i)), []byte(fmt.Sprintf("value %d, again", i))); err != nil {
				t.Fatal(err)
			}
		}
		btreetest.MustCheck(t, tr)
		return wc, store, btreetest.ScanAll(t, tr)
	}
	full, fullStore, fullKeys := run(-1)
	delta, deltaStore, deltaKeys := run(0)
	if len(fullKeys) != 400 || len(deltaKeys) != len(fullKeys) {
		t.Fatalf("%d and %d keys, want 400", len(fullKeys), len(deltaKeys))
	}
	for k, v := range fullKeys {
		if deltaKeys[k] != v {
			t.Fatalf("%s: %q with deltas, %q without", k, deltaKeys[k], v)
		}
	}
	fm, dm := fullStore.Metrics(), deltaStore.Metrics()
	t.Logf("page write bytes sent: %d with full images (%d writes), %d with deltas (%d writes, %d deltas, %d fallbacks); store metrics %+v",
		full.sent.Load(), fm.PageWrites, delta.sent.Load(), dm.PageWrites, delta.deltas.Load(), dm.DeltaFallbacks, dm)
	if full.deltas.Load() != 0 || fm.DeltaWrites != 0 {
		t.Fatal("deltas sent with the cache off")
	}
	if got := delta.sent.Load(); got*2 > full.sent.Load() {
		t.Errorf("deltas sent %d bytes of page writes, full images %d: less than half saved", got, full.sent.Load())
	}
	if dm.DeltaWrites != delta.deltas.Load() || dm.PageWriteBytes != delta.sent.Load() || dm.DeltaFallbacks != 0 {
		t.Errorf("the store's counters %+v disagree with the wire's: %d bytes, %d deltas", dm, delta.sent.Load(), delta.deltas.Load())
	}
}

// TestDeltaFallbackOnAWrongBase: a cached base that is not the page at
// its slot (as a bug would leave) makes the extent refuse the delta; the
// adapter forgets it and sends the full image once; the page is right.
func TestDeltaFallbackOnAWrongBase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t, 4)
	ext := c.CreateExtent(largeGeometry, 1, 2, 3)
	s := New(c.Client(nil))
	free, err := s.FreeBlocks(ctx, ext, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	blk := btree.PageRef{Extent: ext, Page: free[0].Page, Generation: free[0].Generation + 1, Tenant: tenant}
	p := blk
	p.Page++
	v1 := bytes.Repeat([]byte("0123456789abcdef"), 30)
	slots, err := s.Commit(ctx, []btree.Op{
		{Kind: btree.OpAllocBlock, Ref: blk, Slot: free[0].Generation},
		{Kind: btree.OpWriteFresh, Ref: p, Data: v1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if base, ok := s.bases.get(p, slots[1]); !ok || !bytes.Equal(base, v1) {
		t.Fatalf("the fresh write's page is not cached at its slot %d", slots[1])
	}

	// Tamper with the base: same slot, other bytes.
	wrong := bytes.Clone(v1)
	wrong[10] ^= 0xff
	s.bases.drop(p, slots[1])
	s.bases.put(p, slots[1], wrong)
	v2 := bytes.Clone(wrong)
	copy(v2[200:], "a small change")
	slot2, err := s.Commit(ctx, []btree.Op{{Kind: btree.OpWrite, Ref: p, Slot: slots[1], Data: v2}})
	if err != nil {
		t.Fatal(err)
	}
	m := s.Metrics()
	if m.DeltaWrites != 1 || m.DeltaFallbacks != 1 {
		t.Fatalf("metrics %+v: want one delta sent and one fallback", m)
	}
	got, slot, err := s.Read(ctx, p)
	if err != nil || !bytes.Equal(got, v2) || slot != slot2[0] {
		t.Fatalf("after the fallback: slot %d (want %d), page equal %v, %v", slot, slot2[0], bytes.Equal(got, v2), err)
	}

	// The next write goes as a delta against the page now cached, and
	// lands.
	v3 := bytes.Clone(v2)
	copy(v3[300:], "another")
	slot3, err := s.Commit(ctx, []btree.Op{{Kind: btree.OpWrite, Ref: p, Slot: slot, Data: v3}})
	if err != nil {
		t.Fatal(err)
	}
	if m := s.Metrics(); m.DeltaWrites != 2 || m.DeltaFallbacks != 1 {
		t.Fatalf("metrics %+v: want a second delta and no new fallback", m)
	}
	if got, slot, _ := s.Read(ctx, p); !bytes.Equal(got, v3) || slot != slot3[0] {
		t.Fatal("the second delta did not write its page")
	}

	// A stale slot is a conflict, delta or not.
	if _, err := s.Commit(ctx, []btree.Op{{Kind: btree.OpWrite, Ref: p, Slot: slot, Data: v2}}); !errors.Is(err, btree.ErrConflict) {
		t.Fatalf("write at an old slot: %v, want ErrConflict", err)
	}
}

// TestBaseCacheBound: the cache keeps to its byte bound, least recently
// used first out, and never replaces a later slot by an earlier one.
func TestBaseCacheBound(t *testing.T) {
	c := newBaseCache(4 * (1000 + baseEntryOverheadBytes))
	page := func(i uint64) btree.PageRef { return btree.PageRef{Extent: 1000, Page: i, Generation: 1, Tenant: 1} }
	for i := range uint64(4) {
		c.put(page(i), 10+i, make([]byte, 1000))
	}
	if _, ok := c.get(page(0), 10); !ok {
		t.Fatal("page 0 missing")
	}
	c.put(page(4), 20, make([]byte, 1000)) // evicts page 1, the least recent
	if _, ok := c.get(page(1), 11); ok {
		t.Error("page 1 kept past the bound")
	}
	for _, i := range []uint64{0, 2, 3, 4} {
		if _, ok := c.get(page(i), map[uint64]uint64{0: 10, 2: 12, 3: 13, 4: 20}[i]); !ok {
			t.Errorf("page %d evicted", i)
		}
	}
	if n, b := c.stats(); n != 4 || b > c.maxBytes {
		t.Errorf("%d entries, %d bytes (bound %d)", n, b, c.maxBytes)
	}
	c.put(page(4), 19, []byte("older"))
	if d, ok := c.get(page(4), 20); !ok || len(d) != 1000 {
		t.Error("an earlier slot replaced a later one")
	}
	if _, ok := c.get(page(4), 19); ok {
		t.Error("an earlier slot answered")
	}
	c.put(page(9), 1, make([]byte, 5*1000)) // larger than the whole cache
	if _, ok := c.get(page(9), 1); ok {
		t.Error("an entry larger than the bound was kept")
	}
	var off *baseCache = newBaseCache(-1)
	off.put(page(0), 1, []byte("x"))
	if _, ok := off.get(page(0), 1); ok {
		t.Error("a disabled cache answered")
	}
}
