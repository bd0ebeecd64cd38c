package btree

import "sync"

// leafCache keeps the contents and slots of leaves a client read or wrote,
// for a client that is the main writer of the keys it touches (a metadata
// server over the tables it owns, DESIGN.md §2.6). A read-write
// transaction takes a leaf from it without asking the store; the commit
// checks the leaf's slot like any read, so a leaf someone else changed
// makes the commit fail with a conflict, after which the transaction's
// leaves are dropped and read again. Only a commit validates what came from
// here: a transaction that used a cached leaf always commits, even with
// nothing to write (Txn.commit).
//
// Structural changes (splits, merges) keep the other pages they write here
// too: inner pages, block headers, free-page markers (ownedPage). They use
// a cached page only where their commit writes or checks it at the cached
// slot, so a stale copy fails the commit instead of landing; a failed
// structural commit forgets every page it named.
//
// It holds at most maxBytes of encoded pages; past that it forgets entries
// in an arbitrary order (a forgotten leaf costs one read).
type leafCache struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	entries  map[PageRef]leafEntry
}

type leafEntry struct {
	p    *page // never changed once here: writers clone it
	slot uint64
	size int64
}

func newLeafCache(maxBytes int64) *leafCache {
	if maxBytes <= 0 {
		return nil
	}
	return &leafCache{maxBytes: maxBytes, entries: map[PageRef]leafEntry{}}
}

// get returns the cached leaf at ref.
func (c *leafCache) get(ref PageRef) (*page, uint64, bool) {
	if c == nil {
		return nil, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[ref]
	return e.p, e.slot, ok
}

// put records page p at ref as of slot (replacing what was there). A zero
// slot means the slot is unknown: the entry is dropped instead.
func (c *leafCache) put(ref PageRef, p *page, slot uint64) {
	if c == nil {
		return
	}
	if slot == 0 || p == nil {
		c.drop(ref)
		return
	}
	size := int64(p.size())
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[ref]; ok {
		c.bytes -= old.size
	}
	for c.bytes+size > c.maxBytes && len(c.entries) > 0 {
		for r, e := range c.entries {
			delete(c.entries, r)
			c.bytes -= e.size
			break
		}
	}
	c.entries[ref] = leafEntry{p: p, slot: slot, size: size}
	c.bytes += size
}

// drop forgets the leaf at ref.
func (c *leafCache) drop(ref PageRef) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[ref]; ok {
		delete(c.entries, ref)
		c.bytes -= e.size
	}
}

// len returns the number of cached leaves.
func (c *leafCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
