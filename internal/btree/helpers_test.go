package btree

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// testGeometry is small so a few hundred keys make a tree of several
// levels, and blocks fill up so new blocks are allocated.
var testGeometry = Geometry{PageBytes: 512, PagesPerBlock: 8, Blocks: 4096}

const (
	testExtent      = 1000
	testTenant      = 7
	testMaxKey      = 32
	testMaxValue    = 64
	testExtraExtent = 1001
)

type testEnv struct {
	store *MemStore
	root  PageRef
}

func newTestEnv(t testing.TB, seed uint64, g Geometry) *testEnv {
	t.Helper()
	s := NewMemStore(seed)
	for _, e := range []uint64{testExtent, testExtraExtent} {
		if err := s.AddExtent(e, g); err != nil {
			t.Fatal(err)
		}
	}
	root, err := Create(context.Background(), s, testExtent, testTenant)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{store: s, root: root}
}

func (e *testEnv) open(t testing.TB, mod func(*Config)) *Tree {
	t.Helper()
	cfg := Config{
		Store: e.store, Root: e.root, Extents: []uint64{testExtent, testExtraExtent},
		MaxKeyBytes: testMaxKey, MaxValueBytes: testMaxValue,
		MinBackoff: 50 * time.Microsecond, MaxBackoff: 2 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	tr, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func key(i int) []byte { return []byte(fmt.Sprintf("k%06d", i)) }

// mustCheck runs Check and fails the test on any problem.
func mustCheck(t testing.TB, tr *Tree) *CheckReport {
	t.Helper()
	rep, err := tr.Check(context.Background())
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if !rep.OK() {
		t.Fatalf("check found problems:\n%s", bytes.Join(toBytes(rep.Problems), []byte("\n")))
	}
	return rep
}

func toBytes(ss []string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

// scanAll returns the whole tree, by a streaming scan.
func scanAll(t testing.TB, tr *Tree) map[string]string {
	t.Helper()
	out := map[string]string{}
	var prev []byte
	err := tr.Scan(context.Background(), nil, nil, func(k, v []byte) error {
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("scan out of order: %q then %q", prev, k)
		}
		prev = bytes.Clone(k)
		out[string(k)] = string(v)
		return nil
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

func equalMaps(a, b map[string]string) error {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return fmt.Errorf("key %q: %q vs %q (present %v)", k, v, w, ok)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			return fmt.Errorf("key %q=%q only on one side", k, v)
		}
	}
	return nil
}
