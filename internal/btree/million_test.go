package btree

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// defaultGeometry is the extent store's default: 8 KiB pages in 256 KiB
// blocks, 1 GiB extents.
var defaultGeometry = Geometry{PageBytes: 8 << 10, PagesPerBlock: 32, Blocks: 4096}

// TestMillionKeys inserts a million keys through the API, in random order
// by several concurrent clients in transactions of 15 keys, then reports
// the tree's height and fill and checks it (arbor kv check's verification)
// and every key. A million takes a minute on a loaded machine, so by
// default it loads 250,000 (already a tree of three levels; 50,000 with
// -short); ARBOR_BTREE_MILLION=1 loads the million, and any other number
// that many.
func TestMillionKeys(t *testing.T) {
	n := 250_000
	if testing.Short() {
		n = 50_000
	}
	switch s := os.Getenv("ARBOR_BTREE_MILLION"); s {
	case "":
	case "1":
		n = 1_000_000
	default:
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("ARBOR_BTREE_MILLION=%q: want 1 (a million) or a number of keys", s)
		}
		n = v
	}
	ctx := context.Background()
	s := NewMemStore(11)
	for _, e := range []uint64{testExtent, testExtraExtent} {
		if err := s.AddExtent(e, defaultGeometry); err != nil {
			t.Fatal(err)
		}
	}
	root, err := Create(ctx, s, testExtent, testTenant)
	if err != nil {
		t.Fatal(err)
	}
	open := func() *Tree {
		tr, err := Open(ctx, Config{Store: s, Root: root, Extents: []uint64{testExtent, testExtraExtent}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		return tr
	}
	// Keys are tuples (user, item), as a schema would make them; the
	// order of insertion is random.
	keyOf := func(i int) []byte { return tuple.MustPack(tuple.Tuple{uint64(i % 1000), uint64(i)}) }
	valOf := func(i int) []byte { return binary.BigEndian.AppendUint64([]byte("value-"), uint64(i)*2654435761) }
	perm := rand.New(rand.NewPCG(11, 11)).Perm(n)
	const clients = 4
	start := time.Now()
	var wg sync.WaitGroup
	trees := make([]*Tree, clients)
	for c := range clients {
		trees[c] = open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := perm[c*n/clients : (c+1)*n/clients]
			for lo := 0; lo < len(mine); lo += MaxTxnValues {
				batch := mine[lo:min(lo+MaxTxnValues, len(mine))]
				err := trees[c].Update(ctx, func(tx *Txn) error {
					for _, i := range batch {
						if err := tx.Put(keyOf(i), valOf(i)); err != nil {
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
	elapsed := time.Since(start)
	rep := mustCheck(t, trees[0])
	if rep.Keys != int64(n) {
		t.Fatalf("check counted %d keys, want %d", rep.Keys, n)
	}
	var m Metrics
	for _, tr := range trees {
		x := tr.Metrics()
		m.Splits += x.Splits
		m.Retries += x.Retries
		m.Conflicts += x.Conflicts
		m.CacheHits += x.CacheHits
		m.CacheMisses += x.CacheMisses
	}
	t.Logf("%d keys in %v (%.0f keys/s) by %d clients: height %d, pages per level %v, leaf fill %.1f%%, inner fill %.1f%%, %d blocks, extents %v",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), clients, rep.Height, rep.Pages,
		100*rep.LeafFill(), 100*rep.InnerFill(), rep.Blocks, rep.Extents)
	t.Logf("splits %d, retries %d, conflicts %d, cache hit ratio %.4f", m.Splits, m.Retries, m.Conflicts, m.CacheHitRatio())
	// Every key reads back, and a scan returns them all in order.
	for _, i := range perm[:min(n, 20000)] {
		v, ok, err := trees[1].Get(ctx, keyOf(i))
		if err != nil || !ok || string(v) != string(valOf(i)) {
			t.Fatalf("get %d = %q %v %v", i, v, ok, err)
		}
	}
	count := 0
	var prev []byte
	err = trees[2].Scan(ctx, nil, nil, func(k, v []byte) error {
		if prev != nil && string(prev) >= string(k) {
			return fmt.Errorf("scan order: %x then %x", prev, k)
		}
		prev = append(prev[:0], k...)
		count++
		return nil
	})
	if err != nil || count != n {
		t.Fatalf("scan: %d keys, %v", count, err)
	}
	// The scan of one user's keys returns exactly them, in item order.
	begin, end := tuple.PrefixRange(tuple.MustPack(tuple.Tuple{uint64(7)}))
	var items []uint64
	err = trees[3].Scan(ctx, begin, end, func(k, v []byte) error {
		tu, err := tuple.Unpack(k)
		if err != nil {
			return err
		}
		items = append(items, uint64(tu[1].(int64)))
		return nil
	})
	want := 0
	for i := 7; i < n; i += 1000 {
		want++
	}
	if err != nil || len(items) != want || !sort.SliceIsSorted(items, func(i, j int) bool { return items[i] < items[j] }) {
		t.Fatalf("prefix scan: %d items (want %d), %v", len(items), want, err)
	}
}
