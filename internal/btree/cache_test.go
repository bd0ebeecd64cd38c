package btree

import (
	"fmt"
	"testing"
)

// TestPageCacheBound fills the cache past its bound on two levels and
// checks it keeps at most that many entries, counts them right as
// overlapping entries replace each other, and forgets by ref and by key.
func TestPageCacheBound(t *testing.T) {
	const bound = 10
	c := newPageCache(bound)
	key := func(i int) []byte { return fmt.Appendf(nil, "k%04d", i) }
	for i := range 50 {
		c.put(0, &page{kind: kindLeaf, lo: key(2 * i), hi: key(2*i + 2)}, PageRef{Extent: 1, Page: uint64(i + 1)})
		if n := c.len(); n > bound {
			t.Fatalf("after %d puts: %d entries, bound %d", i+1, n, bound)
		}
	}
	c.put(1, &page{kind: kindInner, lo: []byte{}, hiInf: true}, PageRef{Extent: 1, Page: 1000})
	if n := c.len(); n != bound {
		t.Fatalf("full cache holds %d entries, want %d", n, bound)
	}
	// One wide leaf replaces every leaf entry it overlaps.
	c.put(0, &page{kind: kindLeaf, lo: []byte{}, hiInf: true}, PageRef{Extent: 1, Page: 2000})
	if n := c.len(); n != 2 {
		t.Fatalf("after a page covering every key: %d entries, want 2", n)
	}
	if ref, ok := c.lookup(0, key(7)); !ok || ref.Page != 2000 {
		t.Fatalf("lookup = %v, %v; want page 2000", ref, ok)
	}
	c.drop(0, PageRef{Extent: 1, Page: 2000}, key(7))
	c.dropRef(PageRef{Extent: 1, Page: 1000})
	if n := c.len(); n != 0 {
		t.Fatalf("after dropping both: %d entries", n)
	}
}
