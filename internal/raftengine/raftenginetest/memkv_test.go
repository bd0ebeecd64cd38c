package raftenginetest

import (
	"errors"
	"testing"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

func TestMemKVContract(t *testing.T) {
	kv := NewMemKV()
	for _, k := range []string{"b", "a", "c", "d"} {
		if err := kv.Set([]byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Get([]byte("x")); !errors.Is(err, raftengine.ErrNotFound) {
		t.Fatalf("missing key: %v, want ErrNotFound", err)
	}
	v, _ := kv.Get([]byte("a"))
	v[0] = 'X'
	if v2, _ := kv.Get([]byte("a")); string(v2) != "va" {
		t.Fatalf("Get returned the stored slice: %q", v2)
	}
	var seen []string
	_ = kv.Scan([]byte("b"), []byte("d"), func(k, _ []byte) error { seen = append(seen, string(k)); return nil })
	if len(seen) != 2 || seen[0] != "b" || seen[1] != "c" {
		t.Fatalf("scan [b, d) saw %v", seen)
	}
	before := kv.Clone()
	_ = kv.DeleteRange([]byte("b"), nil)
	_ = kv.Delete([]byte("a"))
	if kv.Len() != 0 || before.Len() != 4 || kv.Equal(before) || !before.Equal(before.Clone()) {
		t.Fatalf("after deletes: %d keys (clone %d)", kv.Len(), before.Len())
	}
	if d := before.Dump(); d != "61=7661\n62=7662\n63=7663\n64=7664\n" {
		t.Fatalf("dump %q", d)
	}
}
