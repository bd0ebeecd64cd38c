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
