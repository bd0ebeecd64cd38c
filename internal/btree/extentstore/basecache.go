package extentstore

import (
	"container/list"
	"sync"

	"github.com/arbor-storage/arbor/internal/btree"
)

// baseCache remembers, per page, the bytes of one slot the adapter read or
// wrote: the bases it encodes page deltas against. An entry is a fact
// that never goes wrong (a slot names exactly one content of a page,
// internal/extent delta.go); it only goes out of date when the page is
// written again, and then the write's slot no longer matches it and the
// write goes as a full image. So nothing needs invalidating for
// correctness: a failed or ambiguous commit leaves the entries as they
// are, and the least recently used entries go when the cache is over its
// byte bound.
//
// Entries are keyed by the full tagged pointer (extent, page, generation,
// tenant): a page reached through another block generation or tenant is
// another entry.
type baseCache struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	lru      list.List // of *baseEntry, most recent first
	entries  map[btree.PageRef]*list.Element
}

type baseEntry struct {
	ref  btree.PageRef
	slot uint64
	data []byte // never changed once here
}

// baseEntryOverheadBytes is what an entry costs beyond its data (map and
// list nodes, the entry), counted against the bound.
const baseEntryOverheadBytes = 160

func newBaseCache(maxBytes int64) *baseCache {
	if maxBytes <= 0 {
		return nil
	}
	return &baseCache{maxBytes: maxBytes, entries: map[btree.PageRef]*list.Element{}}
}

// get returns the cached bytes of ref if they are those of slot. The
// slice must not be changed.
func (c *baseCache) get(ref btree.PageRef, slot uint64) ([]byte, bool) {
	if c == nil || slot == 0 {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[ref]
	if !ok {
		return nil, false
	}
	e := el.Value.(*baseEntry)
	if e.slot != slot {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return e.data, true
}

// put records that ref holds data at slot, keeping its own copy. Slot 0
// (unknown, or the empty page) records nothing; an entry for a later slot
// than slot is kept (a read that raced with a write).
func (c *baseCache) put(ref btree.PageRef, slot uint64, data []byte) {
	if c == nil || slot == 0 {
		return
	}
	size := int64(len(data)) + baseEntryOverheadBytes
	if size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[ref]; ok {
		e := el.Value.(*baseEntry)
		if e.slot > slot {
			c.lru.MoveToFront(el)
			return
		}
		c.bytes -= int64(len(e.data)) + baseEntryOverheadBytes
		e.slot, e.data = slot, append([]byte(nil), data...)
		c.bytes += size
		c.lru.MoveToFront(el)
	} else {
		c.entries[ref] = c.lru.PushFront(&baseEntry{ref: ref, slot: slot, data: append([]byte(nil), data...)})
		c.bytes += size
	}
	for c.bytes > c.maxBytes {
		el := c.lru.Back()
		e := el.Value.(*baseEntry)
		c.lru.Remove(el)
		delete(c.entries, e.ref)
		c.bytes -= int64(len(e.data)) + baseEntryOverheadBytes
	}
}

// drop forgets ref's entry if it is still the one of slot.
func (c *baseCache) drop(ref btree.PageRef, slot uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[ref]; ok && el.Value.(*baseEntry).slot == slot {
		c.lru.Remove(el)
		delete(c.entries, ref)
		c.bytes -= int64(len(el.Value.(*baseEntry).data)) + baseEntryOverheadBytes
	}
}

// stats returns the entries and bytes held.
func (c *baseCache) stats() (entries int, bytes int64) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}
