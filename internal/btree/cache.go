package btree

import (
	"bytes"
	"slices"
	"sort"
	"sync"
)

// pageCache maps key ranges to pages, one level of the tree at a time (FSS
// §5: the cache that lets almost every transaction go straight to its leaf).
// An entry is only a guess: whoever uses it reads the page and validates it
// (fences, height), and drops the entry when the guess is wrong. The entries
// of one level never overlap: adding one removes those it overlaps, which
// are necessarily out of date. It holds at most maxEntries entries; beyond
// that it forgets entries in a rotating order.
type pageCache struct {
	mu         sync.Mutex
	levels     []cacheLevel
	maxEntries int
	evict      uint64
}

type cacheLevel struct {
	entries []cacheEntry // sorted by lo
}

type cacheEntry struct {
	lo, hi []byte
	hiInf  bool
	ref    PageRef
}

func newPageCache(maxEntries int) *pageCache {
	return &pageCache{maxEntries: maxEntries}
}

func (e *cacheEntry) owns(k []byte) bool {
	return bytes.Compare(k, e.lo) >= 0 && (e.hiInf || bytes.Compare(k, e.hi) < 0)
}

// lookup returns the page at height believed to own k.
func (c *pageCache) lookup(height int, k []byte) (PageRef, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if height >= len(c.levels) {
		return PageRef{}, false
	}
	es := c.levels[height].entries
	i := sort.Search(len(es), func(i int) bool { return bytes.Compare(es[i].lo, k) > 0 }) - 1
	if i < 0 || !es[i].owns(k) {
		return PageRef{}, false
	}
	return es[i].ref, true
}

// put records that the page ref at height owns [lo, hi).
func (c *pageCache) put(height int, p *page, ref PageRef) {
	if c.maxEntries <= 0 || !p.isTree() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.levels) <= height {
		c.levels = append(c.levels, cacheLevel{})
	}
	lv := &c.levels[height]
	es := lv.entries
	// Remove every entry overlapping [lo, hi): they start before hi and end
	// after lo.
	start := sort.Search(len(es), func(i int) bool { return bytes.Compare(es[i].lo, p.lo) >= 0 })
	if start > 0 && (es[start-1].hiInf || bytes.Compare(es[start-1].hi, p.lo) > 0) {
		start--
	}
	end := start
	for end < len(es) && (p.hiInf || bytes.Compare(es[end].lo, p.hi) < 0) {
		end++
	}
	if end-start == 1 {
		if o := es[start]; o.ref == ref && o.hiInf == p.hiInf && bytes.Equal(o.lo, p.lo) && bytes.Equal(o.hi, p.hi) {
			return // already known
		}
	}
	// The fences are copied: the page's slices share its whole buffer.
	e := cacheEntry{lo: bytes.Clone(p.lo), hi: bytes.Clone(p.hi), hiInf: p.hiInf, ref: ref}
	switch end - start {
	case 1: // the usual case: the page's range is cached already, or moved
		es[start] = e
	case 0:
		es = slices.Insert(es, start, e)
	default:
		es[start] = e
		es = slices.Delete(es, start+1, end)
	}
	lv.entries = es
	for n := c.lenLocked(); n > c.maxEntries; n-- {
		c.evictOne()
	}
}

// evictOne forgets one entry, rotating over levels and positions; leaves
// hold nearly all entries, so they are nearly always the ones forgotten.
func (c *pageCache) evictOne() {
	c.evict++
	for i := range c.levels {
		lv := &c.levels[i]
		if len(lv.entries) == 0 {
			continue
		}
		j := int(c.evict*0x9e3779b97f4a7c15>>33) % len(lv.entries)
		lv.entries = append(lv.entries[:j], lv.entries[j+1:]...)
		return
	}
}

// drop forgets the entry for ref at height, if it is still there.
func (c *pageCache) drop(height int, ref PageRef, k []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if height >= len(c.levels) {
		return
	}
	lv := &c.levels[height]
	es := lv.entries
	i := sort.Search(len(es), func(i int) bool { return bytes.Compare(es[i].lo, k) > 0 }) - 1
	if i >= 0 && es[i].ref == ref {
		lv.entries = append(es[:i], es[i+1:]...)
	}
}

// dropRef forgets every entry pointing at ref (at any level).
func (c *pageCache) dropRef(ref PageRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for li := range c.levels {
		lv := &c.levels[li]
		out := lv.entries[:0]
		for _, e := range lv.entries {
			if e.ref != ref {
				out = append(out, e)
			}
		}
		lv.entries = out
	}
}

// len returns the number of entries.
func (c *pageCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lenLocked()
}

func (c *pageCache) lenLocked() int {
	n := 0
	for _, lv := range c.levels {
		n += len(lv.entries)
	}
	return n
}
