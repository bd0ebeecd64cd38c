package fsclient

import (
	"container/list"
	"context"
	"sync"

	"github.com/arbor-storage/arbor/internal/fs"
)

// tractCache keeps recently read tracts, bounded in bytes (LRU). A tract
// a block map pair names never changes while the pair exists (tracts are
// copied on write, never rewritten: doc.go), so a cached tract is valid
// as long as the pair that led to it; a reader that finds it shorter than
// the pair says has a stale pair and reloads it.
type tractCache struct {
	max int64

	mu       sync.Mutex
	used     int64
	lru      *list.List // of *tractCacheEntry, most recent first
	entries  map[tractKey]*list.Element
	inflight map[tractKey]*tractLoad
}

type tractKey struct {
	blob  fs.GUID
	tract uint64
}

type tractCacheEntry struct {
	key  tractKey
	data []byte
}

type tractLoad struct {
	done chan struct{}
	data []byte
	err  error
}

func newTractCache(maxBytes int64) *tractCache {
	return &tractCache{max: maxBytes, lru: list.New(), entries: map[tractKey]*list.Element{}, inflight: map[tractKey]*tractLoad{}}
}

// get returns the tract, loading it once however many ask at once.
func (c *tractCache) get(ctx context.Context, k tractKey, load func(context.Context) ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if el, ok := c.entries[k]; ok {
		c.lru.MoveToFront(el)
		data := el.Value.(*tractCacheEntry).data
		c.mu.Unlock()
		return data, nil
	}
	if l, ok := c.inflight[k]; ok {
		c.mu.Unlock()
		select {
		case <-l.done:
			return l.data, l.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	l := &tractLoad{done: make(chan struct{})}
	c.inflight[k] = l
	c.mu.Unlock()
	l.data, l.err = load(ctx)
	c.mu.Lock()
	delete(c.inflight, k)
	if l.err == nil {
		c.insertLocked(k, l.data)
	}
	c.mu.Unlock()
	close(l.done)
	return l.data, l.err
}

// put records data as tract k's content (after writing it).
func (c *tractCache) put(k tractKey, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.insertLocked(k, data)
}

func (c *tractCache) insertLocked(k tractKey, data []byte) {
	if c.max <= 0 || int64(len(data)) > c.max/4 {
		return
	}
	if el, ok := c.entries[k]; ok {
		c.used -= int64(len(el.Value.(*tractCacheEntry).data))
		c.lru.Remove(el)
	}
	c.entries[k] = c.lru.PushFront(&tractCacheEntry{key: k, data: data})
	c.used += int64(len(data))
	for c.used > c.max {
		el := c.lru.Back()
		e := el.Value.(*tractCacheEntry)
		c.lru.Remove(el)
		delete(c.entries, e.key)
		c.used -= int64(len(e.data))
	}
}

// drop forgets tract k.
func (c *tractCache) drop(k tractKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		c.used -= int64(len(el.Value.(*tractCacheEntry).data))
		c.lru.Remove(el)
		delete(c.entries, k)
	}
}
