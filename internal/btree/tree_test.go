package btree

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestPutGetDeleteThroughSplitsAndMerges(t *testing.T) {
	ctx := context.Background()
	env := newTestEnv(t, 1, testGeometry)
	tr := env.open(t, nil)
	model := map[string]string{}
	r := rand.New(rand.NewPCG(1, 1))
	const n = 2000
	for _, i := range r.Perm(n) {
		v := fmt.Sprintf("v%d-%d", i, r.IntN(1000))
		if err := tr.Put(ctx, key(i), []byte(v)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		model[string(key(i))] = v
	}
	rep := mustCheck(t, tr)
	if rep.Height < 2 || rep.Keys != n {
		t.Fatalf("after %d inserts: height %d, %d keys", n, rep.Height, rep.Keys)
	}
	if err := equalMaps(scanAll(t, tr), model); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		v, ok, err := tr.Get(ctx, key(i))
		if err != nil || !ok || string(v) != model[string(key(i))] {
			t.Fatalf("get %d = %q %v %v", i, v, ok, err)
		}
	}
	// Delete 90% and compact: pages merge, the tree shrinks.
	for _, i := range r.Perm(n) {
		if i%10 == 0 {
			continue
		}
		if err := tr.Delete(ctx, key(i)); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
		delete(model, string(key(i)))
	}
	if _, err := tr.RebalanceAll(ctx); err != nil {
		t.Fatal(err)
	}
	rep2 := mustCheck(t, tr)
	m := tr.Metrics()
	t.Logf("before: height %d pages %v; after: height %d pages %v; metrics %+v", rep.Height, rep.Pages, rep2.Height, rep2.Pages, m)
	if m.Merges == 0 || rep2.Pages[0] >= rep.Pages[0]/2 {
		t.Fatalf("deletes did not merge pages: %v -> %v, %d merges", rep.Pages, rep2.Pages, m.Merges)
	}
	if err := equalMaps(scanAll(t, tr), model); err != nil {
		t.Fatal(err)
	}
	// Delete the rest: back to a single empty leaf root.
	for k := range model {
		if err := tr.Delete(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.RebalanceAll(ctx); err != nil {
		t.Fatal(err)
	}
	rep3 := mustCheck(t, tr)
	if rep3.Keys != 0 || rep3.Height != 0 {
		t.Fatalf("empty tree: height %d, %d keys, pages %v", rep3.Height, rep3.Keys, rep3.Pages)
	}
	if rep3.Blocks != 1 {
		t.Errorf("empty tree holds %d blocks, want the root's only", rep3.Blocks)
	}
}
