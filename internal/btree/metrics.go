package btree

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are the Tree's live counters.
type counters struct {
	txns, commits, retries, conflicts, ambiguous atomic.Int64
	reads, cacheHits, cacheMisses, resolves      atomic.Int64
	splits, rootSplits, merges, redistributions  atomic.Int64
	rootCollapses, blocksAllocated, blocksFreed  atomic.Int64
	rebalanceDropped, blockSplits                atomic.Int64
	leafCacheHits, leafCacheMisses               atomic.Int64
}

// leafCacheMiss counts a page the leaf cache was asked for and did not
// have (or had stale), when the tree keeps one.
func (t *Tree) leafCacheMiss() {
	if t.leaves != nil {
		t.metrics.leafCacheMisses.Add(1)
	}
}

// Metrics is a snapshot of what a Tree did since it was opened.
type Metrics struct {
	// Txns counts transactions run (Update, View and the one-key calls);
	// Commits the MPSC commits they and the structural changes made;
	// Retries the extra attempts; Conflicts the commits refused for a slot
	// or ownership change; Ambiguous the transactions whose outcome could
	// not be learned.
	Txns, Commits, Retries, Conflicts, Ambiguous int64
	// PageReads counts page reads; Resolves the prepared cross-extent
	// transactions this client finished or aborted.
	PageReads, Resolves int64
	// CacheHits counts lookups the key-to-page cache answered with a page
	// that validated; CacheMisses those that had to walk the tree.
	CacheHits, CacheMisses int64
	// Splits counts page splits (RootSplits of them at the root, growing
	// the tree); Merges pages merged into a neighbour; Redistributions
	// entries moved between neighbours; RootCollapses the root absorbing
	// its only child.
	Splits, RootSplits, Merges, Redistributions, RootCollapses int64
	// BlocksAllocated and BlocksFreed count the tree's own blocks;
	// BlockSplits the full blocks whose last pages moved to a new block.
	BlocksAllocated, BlocksFreed, BlockSplits int64
	// RebalanceDropped counts underfull pages not queued because the
	// queue was full (they are rebalanced when next written).
	RebalanceDropped int64
	// CachedPages is the number of entries in the key-to-page cache.
	CachedPages int
	// LeafCacheHits counts leaves read-write transactions took from the
	// leaf cache (Config.LeafCacheBytes) instead of reading them;
	// LeafCacheMisses those it asked the cache for and read instead;
	// CachedLeaves is the number of leaves it holds.
	LeafCacheHits, LeafCacheMisses int64
	CachedLeaves                   int
}

// CacheHitRatio is CacheHits / (CacheHits + CacheMisses), or 0.
func (m Metrics) CacheHitRatio() float64 {
	if n := m.CacheHits + m.CacheMisses; n > 0 {
		return float64(m.CacheHits) / float64(n)
	}
	return 0
}

// Metrics returns a snapshot of the counters.
func (t *Tree) Metrics() Metrics {
	c := &t.metrics
	return Metrics{
		Txns: c.txns.Load(), Commits: c.commits.Load(), Retries: c.retries.Load(),
		Conflicts: c.conflicts.Load(), Ambiguous: c.ambiguous.Load(),
		PageReads: c.reads.Load(), Resolves: c.resolves.Load(),
		CacheHits: c.cacheHits.Load(), CacheMisses: c.cacheMisses.Load(),
		Splits: c.splits.Load(), RootSplits: c.rootSplits.Load(), Merges: c.merges.Load(),
		Redistributions: c.redistributions.Load(), RootCollapses: c.rootCollapses.Load(),
		BlocksAllocated: c.blocksAllocated.Load(), BlocksFreed: c.blocksFreed.Load(), BlockSplits: c.blockSplits.Load(),
		RebalanceDropped: c.rebalanceDropped.Load(),
		CachedPages:      t.cache.len(),
		LeafCacheHits:    c.leafCacheHits.Load(),
		LeafCacheMisses:  c.leafCacheMisses.Load(),
		CachedLeaves:     t.leaves.len(),
	}
}

// MetricsRegisterer is what a PageStore implements to have its own
// counters exported with the tree's (the extent store adapter's page
// deltas).
type MetricsRegisterer interface {
	RegisterMetrics(reg prometheus.Registerer) error
}

// RegisterMetrics exports the counters to reg (never the global registry)
// as arbor_btree_* series, and the store's if it is a MetricsRegisterer.
func (t *Tree) RegisterMetrics(reg prometheus.Registerer) error {
	c := &t.metrics
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "arbor", Subsystem: "btree", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	cs := []prometheus.Collector{
		counter("txns_total", "Transactions run.", &c.txns),
		counter("commits_total", "MPSC commits issued.", &c.commits),
		counter("retries_total", "Transaction attempts beyond the first.", &c.retries),
		counter("conflicts_total", "Commits refused for a slot or ownership change.", &c.conflicts),
		counter("ambiguous_total", "Transactions whose outcome could not be learned.", &c.ambiguous),
		counter("page_reads_total", "Pages read.", &c.reads),
		counter("cache_hits_total", "Key-to-page cache lookups that validated.", &c.cacheHits),
		counter("cache_misses_total", "Key-to-page lookups that walked the tree.", &c.cacheMisses),
		counter("splits_total", "Page splits.", &c.splits),
		counter("merges_total", "Page merges.", &c.merges),
		counter("redistributions_total", "Entry moves between neighbour pages.", &c.redistributions),
		counter("leaf_cache_hits_total", "Leaves read-write transactions took from the leaf cache.", &c.leafCacheHits),
		counter("leaf_cache_misses_total", "Leaves read-write transactions asked the leaf cache for and read instead.", &c.leafCacheMisses),
		counter("root_splits_total", "Splits of the root (the tree grew a level).", &c.rootSplits),
		counter("block_splits_total", "Full blocks whose last pages moved to a new block.", &c.blockSplits),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "arbor", Subsystem: "btree", Name: "cached_leaves", Help: "Leaves in the leaf cache."},
			func() float64 { return float64(t.leaves.len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "arbor", Subsystem: "btree", Name: "cached_pages", Help: "Entries in the key-to-page cache."},
			func() float64 { return float64(t.cache.len()) }),
	}
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	if m, ok := t.store.(MetricsRegisterer); ok {
		return m.RegisterMetrics(reg)
	}
	return nil
}
