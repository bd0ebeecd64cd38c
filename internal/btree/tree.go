package btree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	policy "github.com/arbor-storage/arbor/internal/retry"
)

// Limits. Every one is named, documented and validated by Open.
const (
	// MaxTxnValues bounds the values one transaction touches (FSS §5): a
	// value is a key (read or written), a leaf page a scan reads, a
	// non-tree page read or written, or a block allocated or freed. It is
	// what keeps every commit within MaxOpsPerCommit pages.
	MaxTxnValues = MaxOpsPerCommit

	// DefaultMaxKeyBytes and DefaultMaxValueBytes are the key and value
	// bounds of a tree on 8 KiB pages (MinPageBytes): one entry of each at
	// its bound, with two fences at the key bound, always fits one page, so
	// an insert can always be made to fit by splitting.
	DefaultMaxKeyBytes   = 1024
	DefaultMaxValueBytes = 4096
	// MinPageBytes is the smallest page the default bounds allow.
	MinPageBytes = 8192

	// minInnerFanout is how many child entries at the key bound an inner
	// page must hold, so an inner page can always be split in two.
	minInnerFanout = 4

	// Defaults of Config (see there).
	defaultMaxCachedPages = 1 << 18
	// The retry defaults are the project's one policy (internal/retry):
	// conflicts back off like its Fast backoff, and a transaction whose
	// context has no deadline gets its DefaultTransaction, retries
	// included.
	defaultMaxAttempts    = 100
	defaultTxnTimeout     = policy.DefaultTransaction
	defaultRebalanceQueue = 1024

	// maxWalkRestarts bounds how often one walk starts again from the top
	// after a page failed validation, and how many right links it follows.
	maxWalkRestarts = 16
	// maxResolveAttempts bounds the prepared transactions one read
	// resolves before giving up.
	maxResolveAttempts = 8
	// maxStructuralRetries bounds the attempts of one split or rebalance,
	// and the splits one transaction asks for before it backs off.
	maxStructuralRetries = 8
	// rebalanceTimeout bounds one background rebalance.
	rebalanceTimeout = 10 * time.Second
	// freeBlockCandidates is how many free blocks an allocation asks the
	// store for, to choose among.
	freeBlockCandidates = 4

	// A page under 1/underfullFraction of its size is rebalanced (FSS §5);
	// two pages merge when together they fill at most mergeFill of one,
	// so a merge is not followed by a split at once.
	underfullFraction    = 4
	mergeFillNumerator   = 3
	mergeFillDenominator = 4
	// An append-like split keeps splitSkew of the bytes on the side the
	// inserts are not going to (see splitPoint).
	splitSkewNumerator   = 9
	splitSkewDenominator = 10
)

// Config configures a Tree.
type Config struct {
	// Store is the page store (the extent store's client, or MemStore).
	Store PageStore
	// Root is the tree's root page: its fixed, well-known location (see the
	// package doc). Create makes one.
	Root PageRef
	// Extents are where the tree may allocate new blocks; a new page goes
	// to its neighbour's block, then the neighbour's extent, then these in
	// order. Empty means the root's extent only.
	Extents []uint64
	// MaxKeyBytes and MaxValueBytes bound keys and values; zero means the
	// defaults. Open refuses bounds the smallest page cannot hold.
	MaxKeyBytes, MaxValueBytes int
	// MaxCachedPages bounds the key-to-page cache (entries); zero means
	// 1<<18, negative disables the cache.
	MaxCachedPages int
	// LeafCacheBytes, if positive, keeps up to that many bytes of leaves
	// (contents and slots) in memory, and read-write transactions use them
	// without reading the store: the commit's slot checks validate them
	// (leafcache.go). For a client that writes most of the leaves it reads,
	// such as a metadata server over its own tables. Zero: no leaf cache.
	LeafCacheBytes int64
	// MaxAttempts bounds how often a transaction runs (zero: 100).
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts after a conflict or an unavailable store.
	MinBackoff, MaxBackoff time.Duration
	// TxnTimeout bounds one transaction, retries included, when its context
	// has no earlier deadline (zero: 30s).
	TxnTimeout time.Duration
	// RebalanceQueue bounds the underfull pages waiting for the background
	// rebalancer (zero: 1024); beyond it they wait for their next write.
	// Negative disables background rebalancing (Rebalance still works).
	RebalanceQueue int
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
}

// Tree is a client of one distributed B-tree. Many Trees (in one process or
// many) can use the same tree at once: they share nothing but the pages. A
// Tree is safe for concurrent use.
type Tree struct {
	store      PageStore
	root       PageRef
	extents    []uint64
	maxKey     int
	maxValue   int
	cfg        Config
	log        *slog.Logger
	cache      *pageCache
	leaves     *leafCache // nil unless Config.LeafCacheBytes > 0
	metrics    counters
	geomMu     sync.Mutex
	geometries map[uint64]Geometry

	rebalanceCh      chan rebalanceReq
	rebalanceMu      sync.Mutex
	rebalancePending map[PageRef]bool
	stop             chan struct{}
	wg               sync.WaitGroup
	closeOnce        sync.Once
}

// Open returns a client of the tree whose root is cfg.Root.
func Open(ctx context.Context, cfg Config) (*Tree, error) {
	if cfg.Store == nil {
		return nil, errors.New("btree: no store")
	}
	if cfg.Root.IsZero() {
		return nil, errors.New("btree: no root")
	}
	if cfg.MaxKeyBytes == 0 {
		cfg.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if cfg.MaxValueBytes == 0 {
		cfg.MaxValueBytes = DefaultMaxValueBytes
	}
	if cfg.MaxKeyBytes < 1 || cfg.MaxValueBytes < 0 || cfg.MaxKeyBytes > maxFieldBytes || cfg.MaxValueBytes > maxFieldBytes {
		return nil, fmt.Errorf("btree: key bound %d or value bound %d outside [1, %d]", cfg.MaxKeyBytes, cfg.MaxValueBytes, maxFieldBytes)
	}
	if cfg.MaxCachedPages == 0 {
		cfg.MaxCachedPages = defaultMaxCachedPages
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = defaultMaxAttempts
	}
	if cfg.MaxAttempts < 1 {
		return nil, fmt.Errorf("btree: MaxAttempts %d < 1", cfg.MaxAttempts)
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = policy.Fast.Min
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = policy.Fast.Max
	}
	if cfg.MinBackoff < 0 || cfg.MaxBackoff < cfg.MinBackoff {
		return nil, fmt.Errorf("btree: backoff [%v, %v] is not a range", cfg.MinBackoff, cfg.MaxBackoff)
	}
	if cfg.TxnTimeout == 0 {
		cfg.TxnTimeout = defaultTxnTimeout
	}
	if cfg.TxnTimeout < 0 {
		return nil, fmt.Errorf("btree: TxnTimeout %v < 0", cfg.TxnTimeout)
	}
	if cfg.RebalanceQueue == 0 {
		cfg.RebalanceQueue = defaultRebalanceQueue
	}
	if len(cfg.Extents) == 0 {
		cfg.Extents = []uint64{cfg.Root.Extent}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tree{
		store:            cfg.Store,
		root:             cfg.Root,
		extents:          append([]uint64(nil), cfg.Extents...),
		maxKey:           cfg.MaxKeyBytes,
		maxValue:         cfg.MaxValueBytes,
		cfg:              cfg,
		log:              log,
		cache:            newPageCache(cfg.MaxCachedPages),
		leaves:           newLeafCache(cfg.LeafCacheBytes),
		geometries:       map[uint64]Geometry{},
		rebalancePending: map[PageRef]bool{},
		stop:             make(chan struct{}),
	}
	exts := append([]uint64{cfg.Root.Extent}, cfg.Extents...)
	for _, e := range exts {
		g, err := t.geometry(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("btree: extent %d: %w", e, err)
		}
		if err := checkLimits(g, cfg.MaxKeyBytes, cfg.MaxValueBytes); err != nil {
			return nil, fmt.Errorf("btree: extent %d: %w", e, err)
		}
	}
	if cfg.RebalanceQueue > 0 {
		t.rebalanceCh = make(chan rebalanceReq, cfg.RebalanceQueue)
		t.wg.Add(1)
		go t.rebalanceLoop()
	}
	return t, nil
}

// checkLimits refuses key and value bounds a page of g cannot hold: one
// leaf entry at the bounds with fences at the key bound, and
// minInnerFanout inner entries.
func checkLimits(g Geometry, maxKey, maxValue int) error {
	if g.PagesPerBlock < 2 || g.PagesPerBlock > maxFieldBytes {
		return fmt.Errorf("%d pages per block outside [2, %d]", g.PagesPerBlock, maxFieldBytes)
	}
	fences := 2 * (lenBytes + maxKey)
	leaf := pageHeaderBytes + fences + 2*lenBytes + maxKey + maxValue
	inner := pageHeaderBytes + fences + minInnerFanout*(lenBytes+maxKey+refBytes)
	if need := max(leaf, inner); need > g.PageBytes {
		return fmt.Errorf("page of %d bytes cannot hold keys of %d and values of %d bytes (needs %d)", g.PageBytes, maxKey, maxValue, need)
	}
	return nil
}

// Close stops the background rebalancer. It does not close the store.
func (t *Tree) Close() {
	t.closeOnce.Do(func() {
		close(t.stop)
		t.wg.Wait()
	})
}

// Root returns the root's tagged pointer.
func (t *Tree) Root() PageRef { return t.root }

// MaxKeyBytes and MaxValueBytes return the tree's bounds.
func (t *Tree) MaxKeyBytes() int   { return t.maxKey }
func (t *Tree) MaxValueBytes() int { return t.maxValue }

func (t *Tree) geometry(ctx context.Context, extent uint64) (Geometry, error) {
	t.geomMu.Lock()
	g, ok := t.geometries[extent]
	t.geomMu.Unlock()
	if ok {
		return g, nil
	}
	g, err := t.store.Geometry(ctx, extent)
	if err != nil {
		return Geometry{}, err
	}
	t.geomMu.Lock()
	t.geometries[extent] = g
	t.geomMu.Unlock()
	return g, nil
}

// Create makes a new, empty tree in extent for tenant: it allocates a block
// near the start of the extent whose page 0 is the block header and page 1
// the root, an empty leaf owning every key. It returns the root's tagged
// pointer, which is the tree's name: record it where its users find it.
func Create(ctx context.Context, store PageStore, extent, tenant uint64) (PageRef, error) {
	// Clients creating trees at once find the same free block; the losers
	// of its allocation look again.
	const attempts = 16
	for range attempts - 1 {
		root, err := create(ctx, store, extent, tenant)
		if !errors.Is(err, ErrConflict) {
			return root, err
		}
	}
	return create(ctx, store, extent, tenant)
}

func create(ctx context.Context, store PageStore, extent, tenant uint64) (PageRef, error) {
	g, err := store.Geometry(ctx, extent)
	if err != nil {
		return PageRef{}, fmt.Errorf("btree: create: %w", err)
	}
	if g.PagesPerBlock < 2 {
		return PageRef{}, fmt.Errorf("btree: create: extent %d has %d pages per block, need 2", extent, g.PagesPerBlock)
	}
	free, err := store.FreeBlocks(ctx, extent, 0, 1)
	if err != nil {
		return PageRef{}, fmt.Errorf("btree: create: %w", err)
	}
	if len(free) == 0 {
		return PageRef{}, fmt.Errorf("btree: create: %w in extent %d", ErrNoSpace, extent)
	}
	fb := free[0]
	block := PageRef{Extent: extent, Page: fb.Page, Generation: fb.Generation + 1, Tenant: tenant}
	root := block
	root.Page++
	header := newBlockHeader(g.PagesPerBlock)
	header.used[1] = true
	writer := rand.Uint64()
	header.stamp(writer)
	leaf := &page{kind: kindLeaf, hiInf: true, lo: []byte{}, hi: []byte{}}
	leaf.stamp(writer)
	_, err = store.Commit(ctx, []Op{
		{Kind: OpAllocBlock, Ref: block, Slot: fb.Generation},
		{Kind: OpWriteFresh, Ref: block, Data: header.encode()},
		{Kind: OpWriteFresh, Ref: root, Data: leaf.encode()},
	})
	if errors.Is(err, ErrAmbiguous) {
		if data, _, rerr := store.Read(ctx, root); rerr == nil {
			if p, derr := decodePage(data); derr == nil && p.writer() == writer {
				err = nil
			}
		}
	}
	if err != nil {
		return PageRef{}, fmt.Errorf("btree: create: %w", err)
	}
	return root, nil
}

func newBlockHeader(pages int) *page {
	h := &page{kind: kindBlockHeader, lo: []byte{}, hi: []byte{}, hiInf: true, used: make([]bool, pages)}
	h.used[0] = true
	return h
}

// readPage reads and decodes a tree page. It resolves a prepared
// transaction in the way (bounded), and turns a page that is not a tree
// page into a retryable error.
func (t *Tree) readPage(ctx context.Context, ref PageRef) (*page, uint64, error) {
	data, slot, err := t.readRaw(ctx, ref)
	if err != nil {
		return nil, 0, err
	}
	p, err := decodePage(data)
	if err != nil {
		return nil, 0, retry("page "+ref.String(), err)
	}
	return p, slot, nil
}

// ownedPage returns the tree page at ref for a structural change: from the
// leaf cache when the tree keeps one (its client is the main writer of its
// pages), else read (and then cached). The caller must write or check the
// page at the returned slot in its commit (leafcache.go); cached says the
// copy came from the cache unread.
func (t *Tree) ownedPage(ctx context.Context, ref PageRef) (p *page, slot uint64, cached bool, err error) {
	if !freshReads(ctx) {
		if p, slot, ok := t.leaves.get(ref); ok {
			t.metrics.leafCacheHits.Add(1)
			return p, slot, true, nil
		}
		t.leafCacheMiss()
	}
	p, slot, err = t.readPage(ctx, ref)
	if err == nil {
		t.leaves.put(ref, p, slot)
	}
	return p, slot, false, err
}

// locateOwned is locate for a structural change: a page the key-to-page
// cache names is taken from the leaf cache when it is there and still
// owns k at height (the change's commit checks its slot).
func (t *Tree) locateOwned(ctx context.Context, k []byte, height int) (located, error) {
	if ref, ok := t.cache.lookup(height, k); ok && !freshReads(ctx) {
		if p, slot, ok := t.leaves.get(ref); ok && p.isTree() && p.height == height && p.owns(k) {
			t.metrics.leafCacheHits.Add(1)
			return located{ref, p, slot}, nil
		}
		t.leafCacheMiss()
	}
	loc, err := t.locate(ctx, k, height)
	if err == nil {
		t.leaves.put(loc.ref, loc.p, loc.slot)
	}
	return loc, err
}

type freshReadsKey struct{}

// withFreshReads marks ctx for a structural change that reads every page
// from the store (ownedPage, locateOwned): its last attempt failed, maybe
// because of a cached page.
func withFreshReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, freshReadsKey{}, true)
}

func freshReads(ctx context.Context) bool {
	v, _ := ctx.Value(freshReadsKey{}).(bool)
	return v
}

// readRaw reads a page, resolving prepared transactions in its way.
func (t *Tree) readRaw(ctx context.Context, ref PageRef) ([]byte, uint64, error) {
	t.metrics.reads.Add(1)
	for attempt := 0; ; attempt++ {
		data, slot, err := t.store.Read(ctx, ref)
		var pe *PreparedError
		if errors.As(err, &pe) && attempt < maxResolveAttempts {
			if rerr := t.resolve(ctx, pe.Txn); rerr != nil {
				return nil, 0, rerr
			}
			continue
		}
		if errors.Is(err, ErrStale) {
			t.cache.dropRef(ref)
			t.leaves.drop(ref)
			return nil, 0, retry("stale pointer", err)
		}
		return data, slot, err
	}
}

func (t *Tree) resolve(ctx context.Context, txn PreparedTxn) error {
	t.metrics.resolves.Add(1)
	if err := t.store.Resolve(ctx, txn); err != nil {
		// Whatever went wrong (the recovery's own steps may end
		// ambiguous), the page is still held: the caller may try again
		// later, and nothing of the caller's own was applied.
		if errors.Is(err, ErrInvalid) {
			return fmt.Errorf("resolving prepared transaction %d: %w", txn.ID, err)
		}
		return fmt.Errorf("%w: resolving prepared transaction %d: %v", ErrUnavailable, txn.ID, err)
	}
	return nil
}

// located is a page found for a key: its pointer, contents and slot.
type located struct {
	ref  PageRef
	p    *page
	slot uint64
}

// locate finds the page of the given height that owns k: first by the
// cache (one read when the guess is right), else by walking down from the
// lowest cached ancestor or the root, in reads separate from any
// transaction (FSS §5). Every page it returns has been validated: right
// kind, right height, owns k.
func (t *Tree) locate(ctx context.Context, k []byte, height int) (located, error) {
	if ref, ok := t.cache.lookup(height, k); ok {
		p, slot, err := t.readPage(ctx, ref)
		if err == nil && p.isTree() && p.height == height && p.owns(k) {
			t.metrics.cacheHits.Add(1)
			return located{ref, p, slot}, nil
		}
		if err != nil && !isRetry(err) {
			return located{}, err
		}
		t.cache.drop(height, ref, k)
	}
	t.metrics.cacheMisses.Add(1)
	return t.walk(ctx, k, height)
}

// walk descends to the page at height owning k. It starts at the lowest
// cached page above height that still validates, else at the root. A child
// that does not own k after a concurrent split is left by its right link
// (B-link move-right, Boxwood §3.7); anything else restarts the walk.
func (t *Tree) walk(ctx context.Context, k []byte, height int) (located, error) {
	var lastErr error
	for restart := 0; restart < maxWalkRestarts; restart++ {
		cur, err := t.walkStart(ctx, k, height)
		if err != nil {
			if !isRetry(err) {
				return located{}, err
			}
			lastErr = err
			continue
		}
		for err == nil && cur.p.height > height {
			i := cur.p.childIndex(k)
			childRef := cur.p.kids[i]
			var child located
			child, err = t.readChild(ctx, childRef, cur.p.height-1, k)
			if err == nil {
				t.cache.put(child.p.height, child.p, child.ref)
				cur = child
			}
		}
		if err == nil {
			return cur, nil
		}
		if !isRetry(err) {
			return located{}, err
		}
		lastErr = err
	}
	return located{}, fmt.Errorf("walking to %q at height %d: %w", k, height, lastErr)
}

// walkStart returns a validated page above height owning k: the lowest
// cached one that validates, else the root.
func (t *Tree) walkStart(ctx context.Context, k []byte, height int) (located, error) {
	for h := height + 1; h < maxHeight; h++ {
		ref, ok := t.cache.lookup(h, k)
		if !ok {
			continue
		}
		p, slot, err := t.readPage(ctx, ref)
		if err == nil && p.isTree() && p.height == h && p.owns(k) {
			return located{ref, p, slot}, nil
		}
		if err != nil && !isRetry(err) {
			return located{}, err
		}
		t.cache.drop(h, ref, k)
	}
	p, slot, err := t.readPage(ctx, t.root)
	if err != nil {
		return located{}, err
	}
	if !p.isTree() || !p.owns(k) || len(p.lo) != 0 || !p.hiInf {
		return located{}, fmt.Errorf("%w: root %v is not a tree page owning every key", ErrCorrupt, t.root)
	}
	if p.height < height {
		return located{}, retry("tree lower than the height sought", nil)
	}
	return located{t.root, p, slot}, nil
}

// readChild reads the child at height that should own k, moving right
// along the level's links while k is past the page's high fence.
func (t *Tree) readChild(ctx context.Context, ref PageRef, height int, k []byte) (located, error) {
	for hop := 0; hop < maxWalkRestarts; hop++ {
		p, slot, err := t.readPage(ctx, ref)
		if err != nil {
			return located{}, err
		}
		if !p.isTree() || p.height != height {
			return located{}, retry(fmt.Sprintf("page %v is not a tree page at height %d", ref, height), nil)
		}
		if p.owns(k) {
			return located{ref, p, slot}, nil
		}
		if p.hiInf || compareKeys(k, p.lo) < 0 || p.next.IsZero() {
			return located{}, retry(fmt.Sprintf("page %v does not own %q", ref, k), nil)
		}
		ref = p.next
	}
	return located{}, retry("too many right links", nil)
}

func isRetry(err error) bool {
	var r *errRetry
	return errors.As(err, &r)
}

// backoff sleeps the jittered exponential backoff of attempt, or returns
// ctx's error.
func (t *Tree) backoff(ctx context.Context, attempt int) error {
	return policy.Sleep(ctx, policy.Backoff{Min: t.cfg.MinBackoff, Max: t.cfg.MaxBackoff}.Delay(attempt))
}
