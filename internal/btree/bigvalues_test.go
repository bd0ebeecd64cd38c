package btree

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// TestBigValuesInBatches: transactions over many keys (UpdatePages) that
// mix values near the largest with small ones land, each after a few
// splits at most: a batch must never need more splits than it has keys.
func TestBigValuesInBatches(t *testing.T) {
	env := newTestEnv(t, 1, Geometry{PageBytes: 8192, PagesPerBlock: 32, Blocks: 256})
	tr := env.open(t, func(c *Config) { c.MaxKeyBytes, c.MaxValueBytes = DefaultMaxKeyBytes, DefaultMaxValueBytes })
	ctx := context.Background()
	big := bytes.Repeat([]byte("v"), 3600)
	small := bytes.Repeat([]byte("s"), 150)
	n := 0
	for batch := range 60 {
		before := tr.Metrics().Retries
		err := tr.UpdatePages(ctx, func(tx *Txn) error {
			for i := range 12 {
				k := fmt.Sprintf("d%03d/%02d/%s", batch/6, batch%6*12+i, "x")
				v := small
				if i%4 == 1 {
					v = big
				}
				if err := tx.Put([]byte(k), v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		n += int(tr.Metrics().Retries - before)
	}
	t.Logf("%d retries over 60 batches", n)
	mustCheck(t, tr)
}

// TestSplitAtTransactionSeparatorKeepsPagesInSize: a split asked to cut
// where a transaction's writes halve a leaf falls back to the usual cut when
// the leaf as stored (filled meanwhile by others) would leave one half
// holding nearly everything plus a longer fence than a page has room for.
// The store refused such a page as malformed (seen in TestModelConcurrent).
func TestSplitAtTransactionSeparatorKeepsPagesInSize(t *testing.T) {
	const pageBytes, maxKey = 320, 16
	env := newTestEnv(t, 1, Geometry{PageBytes: pageBytes, PagesPerBlock: 8, Blocks: 64})
	tr := env.open(t, func(c *Config) { c.MaxKeyBytes = maxKey })
	ctx := context.Background()
	// Fill the root leaf until another entry would not fit.
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("k%03d", i))
		x, _, err := tr.readPage(ctx, tr.root)
		if err != nil {
			t.Fatal(err)
		}
		if x.size()+2*lenBytes+len(k)+1 > pageBytes {
			break
		}
		if err := tr.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// A separator past every stored key, as long as a key may be: cut
	// there, the left half would be the whole page with a long high fence.
	sep := append([]byte("kz"), bytes.Repeat([]byte("z"), maxKey-2)...)
	req := &errNeedSplit{ref: tr.root, key: sep, sep: sep}
	if _, err := tr.splitOnce(ctx, req); err != nil {
		t.Fatalf("split: %v", err)
	}
	if tr.Metrics().Splits != 1 {
		t.Errorf("%d splits, want 1", tr.Metrics().Splits)
	}
	mustCheck(t, tr)
}
