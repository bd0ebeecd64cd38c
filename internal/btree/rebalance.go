package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
)

// Structural changes: splits, merges, redistributions and root changes.
// Each is a transaction of its own (FSS §5), over a handful of pages: the
// page, its new or old neighbour, their parent and the block header(s)
// recording which pages of a block are in use, plus a block allocation or
// free. None of them touches a page above the parent, so none touches the
// root unless the root is the parent.

func compareKeys(a, b []byte) int { return bytes.Compare(a, b) }

// splitPoint chooses where to cut page p, which could not take key: the
// first i entries stay left and sep becomes the right page's low fence. An
// insert past the last key (an append, as sequential loads and new files
// in a directory make) keeps 9/10 of the bytes on the left, one before the
// first keeps 1/10, anything else halves. ok is false when p cannot be cut
// (no entries, or its only entry is key itself, which then fits alone).
func splitPoint(p *page, key []byte) (i int, sep []byte, ok bool) {
	n := len(p.keys)
	if p.kind == kindLeaf && n == 1 {
		switch c := bytes.Compare(key, p.keys[0]); {
		case c > 0:
			return 1, separator(p.keys[0], key), true
		case c < 0:
			return 0, separator(key, p.keys[0]), true
		}
		return 0, nil, false
	}
	if n < 2 {
		return 0, nil, false
	}
	total := 0
	for j := range n {
		total += p.entryBytes(j)
	}
	target := total / 2
	switch pos, _ := p.search(key); {
	case pos >= n:
		target = total * splitSkewNumerator / splitSkewDenominator
	case pos == 0:
		target = total * (splitSkewDenominator - splitSkewNumerator) / splitSkewDenominator
	}
	acc := 0
	i = 1
	for j := range n - 1 {
		acc += p.entryBytes(j)
		i = j + 1
		if acc >= target {
			break
		}
	}
	if p.kind == kindLeaf {
		return i, separator(p.keys[i-1], p.keys[i]), true
	}
	return i, bytes.Clone(p.keys[i]), true
}

// cut returns the left and right halves of p at (i, sep), linked, the
// right one to be stored at rightRef.
func cut(p *page, i int, sep []byte, rightRef PageRef) (left, right *page) {
	left = p.clone()
	right = &page{kind: p.kind, height: p.height, lo: sep, hi: p.hi, hiInf: p.hiInf, next: p.next}
	right.keys = append([][]byte(nil), p.keys[i:]...)
	left.keys = left.keys[:i:i]
	if p.kind == kindLeaf {
		right.vals = append([][]byte(nil), p.vals[i:]...)
		left.vals = left.vals[:i:i]
	} else {
		right.kids = append([]PageRef(nil), p.kids[i:]...)
		left.kids = left.kids[:i:i]
	}
	left.hi, left.hiInf, left.next = sep, false, rightRef
	return left, right
}

// newPage is where a structural change puts a page it creates.
type newPage struct {
	ref   PageRef
	fresh bool   // in a block allocated by the same commit
	slot  uint64 // else: the slot the free page was read at
}

// placeNew finds room for n new pages next to the page at near, of the
// given height (FSS §5 Figure 6), in the first of these with room: near's
// block; the block of near's right neighbour alt (the new page goes
// between the two in key order). When near's block is full it is split
// first (moveBlockTail: its last pages in key order move to a new block,
// in a transaction of their own) and the caller is told to try again, so
// a block keeps holding one key range of one level. Only when that cannot
// be done does the new page go to a new block of its own, as close to near
// as the store finds, in near's extent first. It returns the pages and the
// ops that claim them (block allocation, block header), which must go into
// the same commit.
func (t *Tree) placeNew(ctx context.Context, near, alt PageRef, height, n int, writer uint64) ([]newPage, []Op, error) {
	out, ops, nearHdr, err := t.placeInBlock(ctx, near, n, writer)
	if err != nil || out != nil {
		return out, ops, err
	}
	if !alt.IsZero() && !t.sameBlock(ctx, alt, near) {
		out, ops, _, err := t.placeInBlock(ctx, alt, n, writer)
		if err != nil && !isRetry(err) {
			return nil, nil, err
		}
		if out != nil {
			return out, ops, nil
		}
	}
	moved, err := t.moveBlockTail(ctx, nearHdr, near, height)
	if err != nil && !transient(err) {
		return nil, nil, err
	}
	if moved {
		return nil, nil, retry("block split: place again", nil)
	}
	return t.placeInNewBlock(ctx, near, n, writer)
}

func (t *Tree) sameBlock(ctx context.Context, a, b PageRef) bool {
	if a.Extent != b.Extent {
		return false
	}
	g, err := t.geometry(ctx, a.Extent)
	return err == nil && g.BlockOf(a.Page) == g.BlockOf(b.Page)
}

// placeInBlock claims n free pages of the block holding near. If the block
// has fewer, it returns no pages and the block's header.
func (t *Tree) placeInBlock(ctx context.Context, near PageRef, n int, writer uint64) ([]newPage, []Op, located, error) {
	g, err := t.geometry(ctx, near.Extent)
	if err != nil {
		return nil, nil, located{}, err
	}
	hdrRef := near
	hdrRef.Page = g.BlockOf(near.Page)
	// The header is written at its slot when the block has room; a cached
	// one that says it has none is read again, as the block split that
	// follows decides from it.
	hdr, hslot, cached, err := t.ownedPage(ctx, hdrRef)
	if err == nil && cached && (hdr.kind != kindBlockHeader || len(hdr.used) != g.PagesPerBlock || freePages(hdr, n) < n) {
		t.leaves.drop(hdrRef)
		hdr, hslot, _, err = t.ownedPage(ctx, hdrRef)
	}
	if err != nil {
		return nil, nil, located{}, err
	}
	if hdr.kind != kindBlockHeader || len(hdr.used) != g.PagesPerBlock {
		return nil, nil, located{}, fmt.Errorf("%w: block %v has no valid header", ErrCorrupt, hdrRef)
	}
	var free []int
	for i, u := range hdr.used {
		if !u && len(free) < n {
			free = append(free, i)
		}
	}
	if len(free) < n {
		return nil, nil, located{hdrRef, hdr, hslot}, nil
	}
	var out []newPage
	h := hdr.clone()
	h.stamp(writer)
	for _, i := range free {
		ref := hdrRef
		ref.Page += uint64(i)
		// The new page is written at its slot: a free-page marker this
		// client wrote (cached) stands in for reading it.
		slot, err := t.freePageSlot(ctx, ref)
		if err != nil {
			return nil, nil, located{}, err
		}
		h.used[i] = true
		out = append(out, newPage{ref: ref, slot: slot})
	}
	return out, []Op{{Kind: OpWrite, Ref: hdrRef, Slot: hslot, Data: h.encode()}}, located{}, nil
}

// freePages counts the free pages of block header hdr, up to n.
func freePages(hdr *page, n int) int {
	free := 0
	for _, u := range hdr.used {
		if !u && free < n {
			free++
		}
	}
	return free
}

// freePageSlot returns the slot of the free page at ref, which a new page
// is about to be written at: a cached free-page marker's, else read.
func (t *Tree) freePageSlot(ctx context.Context, ref PageRef) (uint64, error) {
	if p, slot, ok := t.leaves.get(ref); ok && p.kind == kindFree && !freshReads(ctx) {
		t.metrics.leafCacheHits.Add(1)
		return slot, nil
	}
	if !freshReads(ctx) {
		t.leafCacheMiss()
	}
	_, slot, err := t.readRaw(ctx, ref)
	return slot, err
}

func (t *Tree) placeInNewBlock(ctx context.Context, near PageRef, n int, writer uint64) ([]newPage, []Op, error) {
	candidates := []uint64{near.Extent}
	for _, e := range t.extents {
		if !slices.Contains(candidates, e) {
			candidates = append(candidates, e)
		}
	}
	for _, ext := range candidates {
		g, err := t.geometry(ctx, ext)
		if err != nil {
			return nil, nil, err
		}
		if g.PagesPerBlock < n+1 {
			continue
		}
		hint := uint64(0)
		if ext == near.Extent {
			hint = near.Page
		}
		free, err := t.store.FreeBlocks(ctx, ext, hint, freeBlockCandidates)
		if err != nil {
			return nil, nil, err
		}
		if len(free) == 0 {
			continue
		}
		// Concurrent splitters near each other would all pick the nearest
		// block; spreading over the nearest few avoids most conflicts.
		fb := free[rand.IntN(min(len(free), 2))]
		block := PageRef{Extent: ext, Page: fb.Page, Generation: fb.Generation + 1, Tenant: t.root.Tenant}
		h := newBlockHeader(g.PagesPerBlock)
		h.stamp(writer)
		var out []newPage
		for i := 1; i <= n; i++ {
			h.used[i] = true
			ref := block
			ref.Page += uint64(i)
			out = append(out, newPage{ref: ref, fresh: true})
		}
		t.metrics.blocksAllocated.Add(1)
		return out, []Op{
			{Kind: OpAllocBlock, Ref: block, Slot: fb.Generation},
			{Kind: OpWriteFresh, Ref: block, Data: h.encode()},
		}, nil
	}
	return nil, nil, fmt.Errorf("%w: no extent of the tree has a free block", ErrNoSpace)
}

func (np newPage) op(p *page) Op {
	if np.fresh {
		return Op{Kind: OpWriteFresh, Ref: np.ref, Data: p.encode()}
	}
	return Op{Kind: OpWrite, Ref: np.ref, Slot: np.slot, Data: p.encode()}
}

// freeMarker is the free-page marker that replaces old. It keeps old's
// writer history, so a client probing an ambiguous commit to the page
// still finds its answer (Txn.probe).
func freeMarker(old *page, writer uint64) *page {
	tomb := &page{kind: kindFree, lo: []byte{}, hi: []byte{}, hiInf: true, writers: old.writers}
	tomb.stamp(writer)
	return tomb
}

// release returns the ops that give the page at ref back to its block: a
// free-page marker and the header's bit, or, when it was the block's last
// page (and the block is not the root's), the free of the whole block.
func (t *Tree) release(ctx context.Context, ref PageRef, slot uint64, old *page, writer uint64) ([]Op, error) {
	g, err := t.geometry(ctx, ref.Extent)
	if err != nil {
		return nil, err
	}
	hdrRef := ref
	hdrRef.Page = g.BlockOf(ref.Page)
	hdr, hslot, err := t.readPage(ctx, hdrRef)
	if err != nil {
		return nil, err
	}
	idx := int(ref.Page - hdrRef.Page)
	if hdr.kind != kindBlockHeader || len(hdr.used) != g.PagesPerBlock {
		return nil, fmt.Errorf("%w: block %v has no valid header", ErrCorrupt, hdrRef)
	}
	if !hdr.used[idx] {
		// Read after the page: someone released it meanwhile (Check would
		// report a live page its header does not record).
		return nil, retry(fmt.Sprintf("page %v already released", ref), nil)
	}
	h := hdr.clone()
	h.used[idx] = false
	h.stamp(writer)
	others := 0
	for _, u := range h.used[1:] {
		if u {
			others++
		}
	}
	rootBlock := hdrRef.Extent == t.root.Extent && hdrRef.Page == g.BlockOf(t.root.Page)
	if others == 0 && !rootBlock {
		// The checks come first: the free must not go ahead if the page
		// changed (a write we would lose) or the header did (a page placed
		// in the block meanwhile).
		t.metrics.blocksFreed.Add(1)
		return []Op{
			{Kind: OpCheck, Ref: ref, Slot: slot},
			{Kind: OpCheck, Ref: hdrRef, Slot: hslot},
			{Kind: OpFreeBlock, Ref: hdrRef},
		}, nil
	}
	tomb := freeMarker(old, writer)
	return []Op{
		{Kind: OpWrite, Ref: ref, Slot: slot, Data: tomb.encode()},
		{Kind: OpWrite, Ref: hdrRef, Slot: hslot, Data: h.encode()},
	}, nil
}

// structCommit commits a structural change. An ambiguous outcome is learned
// from the page at probe: it carries writer if the commit was applied.
func (t *Tree) structCommit(ctx context.Context, ops []Op, probe PageRef, writer uint64) error {
	// Pages read at different times can disagree (a free page in a stale
	// header that is now the parent just read): the commit would fail on
	// its slots anyway, but the store refuses a page named twice as
	// malformed, so catch it here as the conflict it is.
	type opKey struct {
		extent, page uint64
		block        bool // an allocation or free names the block, not its first page
	}
	seen := map[opKey]bool{}
	for _, op := range ops {
		k := opKey{op.Ref.Extent, op.Ref.Page, op.Kind == OpAllocBlock || op.Kind == OpFreeBlock}
		if seen[k] {
			for _, op := range ops {
				t.leaves.drop(op.Ref) // a cached page may be why
			}
			return retry(fmt.Sprintf("page %v twice in a structural change: reads disagree", op.Ref), nil)
		}
		seen[k] = true
	}
	t.metrics.commits.Add(1)
	slots, err := t.store.Commit(ctx, ops)
	// The leaf cache forgets every page a structural change named, whatever
	// the outcome, and then learns the pages a successful one wrote at the
	// slots the store reported (leafcache.go).
	for _, op := range ops {
		t.leaves.drop(op.Ref)
	}
	var pe *PreparedError
	switch {
	case err == nil:
		t.rememberStructural(ops, slots)
		return nil
	case errors.As(err, &pe):
		if rerr := t.resolve(ctx, pe.Txn); rerr != nil {
			return rerr
		}
		return retry("resolved a prepared transaction", err)
	case errors.Is(err, ErrConflict) || errors.Is(err, ErrStale):
		t.metrics.conflicts.Add(1)
		return retry("structural change conflicted", err)
	case errors.Is(err, ErrAmbiguous):
		if data, _, rerr := t.readRaw(ctx, probe); rerr == nil {
			if p, derr := decodePage(data); derr == nil {
				if _, ok := p.wroteBy(writer); ok {
					return nil
				}
			}
		}
		// Not applied, or applied and already changed again: either way the
		// caller re-reads and finds out what is left to do.
		return retry("structural change outcome unknown", err)
	}
	return err
}

// rememberStructural puts the pages a successful structural commit wrote
// into the leaf cache at their new slots, so the transaction that needed
// the change, and the next change nearby, need not read them again.
func (t *Tree) rememberStructural(ops []Op, slots []uint64) {
	if t.leaves == nil {
		return
	}
	for i, op := range ops {
		if (op.Kind != OpWrite && op.Kind != OpWriteFresh) || i >= len(slots) || slots[i] == 0 {
			continue
		}
		p, err := decodePage(op.Data)
		if err != nil {
			continue
		}
		t.leaves.put(op.Ref, p, slots[i])
	}
}

// findParent returns the parent of the page x at ref and x's index in it,
// validated: the parent is one level up, owns x's low fence, and its entry
// there points at ref with the same fences as x.
func (t *Tree) findParent(ctx context.Context, x *page, ref PageRef) (located, int, error) {
	par, err := t.locateOwned(ctx, x.lo, x.height+1)
	if err != nil {
		return located{}, 0, err
	}
	i := par.p.childIndex(x.lo)
	hi, hiInf := par.p.childHi(i)
	if !bytes.Equal(par.p.keys[i], x.lo) || par.p.kids[i] != ref || hiInf != x.hiInf || !bytes.Equal(hi, x.hi) {
		t.cache.drop(par.p.height, par.ref, x.lo)
		t.leaves.drop(par.ref)
		return located{}, 0, retry(fmt.Sprintf("parent %v does not point at %v", par.ref, ref), nil)
	}
	return par, i, nil
}

// split splits the page of req so that req.key fits, in transactions of
// its own; a parent without room is split first.
func (t *Tree) split(ctx context.Context, req *errNeedSplit) error {
	var err error
	for attempt := 0; attempt < maxStructuralRetries; attempt++ {
		var parentFull *errNeedSplit
		actx := ctx
		if attempt > 0 {
			// A cached page may be what failed the last attempt.
			actx = withFreshReads(ctx)
		}
		parentFull, err = t.splitOnce(actx, req)
		if err == nil && parentFull == nil {
			return nil
		}
		if err != nil && !transient(err) {
			return err
		}
		if parentFull != nil {
			if perr := t.split(ctx, parentFull); perr != nil && !transient(perr) {
				return perr
			}
			continue
		}
		if berr := t.backoff(ctx, attempt); berr != nil {
			return berr
		}
	}
	return err
}

// splitOnce makes one attempt; it returns a request to split the parent
// when the parent has no room for another entry.
func (t *Tree) splitOnce(ctx context.Context, req *errNeedSplit) (*errNeedSplit, error) {
	x, xslot, cached, err := t.ownedPage(ctx, req.ref)
	if err != nil {
		return nil, err
	}
	done := func() (*errNeedSplit, error) {
		// Nothing to split here: a cached copy may be why, so the caller
		// looks again at the page as stored.
		if cached {
			t.leaves.drop(req.ref)
		}
		return nil, nil
	}
	if !x.isTree() || x.height != req.height || !x.owns(req.key) {
		return done() // someone else changed it; the caller looks again
	}
	i, sep, ok := splitPoint(x, req.key)
	if req.sep != nil && x.kind == kindLeaf && bytes.Compare(req.sep, x.lo) > 0 && (x.hiInf || bytes.Compare(req.sep, x.hi) < 0) {
		// Cut where the writing transaction's content halves (one side
		// may be empty as stored).
		ri, _ := x.search(req.sep)
		fits, err := t.halvesFit(ctx, x, ri, req.sep, req.ref.Extent)
		if err != nil {
			return nil, err
		}
		// As stored, one side may hold nearly the whole page and gain a
		// longer fence than it had: then the usual cut is the only safe one.
		if fits {
			i, sep, ok = ri, bytes.Clone(req.sep), true
		}
	}
	if !ok {
		return done()
	}
	writer := rand.Uint64() | 1
	if req.ref == t.root {
		return nil, t.splitRoot(ctx, x, xslot, i, sep, writer)
	}
	par, idx, err := t.findParent(ctx, x, req.ref)
	if err != nil {
		return nil, err
	}
	pageBytes, err := t.pageBytes(ctx, par.ref.Extent)
	if err != nil {
		return nil, err
	}
	if par.p.size()+lenBytes+len(sep)+refBytes > pageBytes {
		return &errNeedSplit{ref: par.ref, height: par.p.height, lo: par.p.lo, key: sep}, nil
	}
	news, ops, err := t.placeNew(ctx, req.ref, x.next, x.height, 1, writer)
	if err != nil {
		return nil, err
	}
	left, right := cut(x, i, sep, news[0].ref)
	pp := par.p.clone()
	pp.keys = slices.Insert(pp.keys, idx+1, sep)
	pp.kids = slices.Insert(pp.kids, idx+1, news[0].ref)
	left.stamp(writer)
	right.stamp(writer)
	pp.stamp(writer)
	ops = append(ops,
		Op{Kind: OpWrite, Ref: req.ref, Slot: xslot, Data: left.encode()},
		Op{Kind: OpWrite, Ref: par.ref, Slot: par.slot, Data: pp.encode()},
		news[0].op(right))
	if err := t.structCommit(ctx, ops, req.ref, writer); err != nil {
		return nil, err
	}
	t.metrics.splits.Add(1)
	t.cache.put(left.height, left, req.ref)
	t.cache.put(right.height, right, news[0].ref)
	t.cache.put(pp.height, pp, par.ref)
	return nil, nil
}

// halvesFit reports whether both halves of x cut at (i, sep), fences
// included, fit a page of the extent.
func (t *Tree) halvesFit(ctx context.Context, x *page, i int, sep []byte, extent uint64) (bool, error) {
	pageBytes, err := t.pageBytes(ctx, extent)
	if err != nil {
		return false, err
	}
	left, right := cut(x, i, sep, PageRef{})
	return left.size() <= pageBytes && right.size() <= pageBytes, nil
}

// splitRoot grows the tree: the root keeps its fixed place and becomes the
// parent of two new pages holding its two halves.
func (t *Tree) splitRoot(ctx context.Context, x *page, xslot uint64, i int, sep []byte, writer uint64) error {
	if x.height+1 > maxHeight {
		return fmt.Errorf("%w: tree would exceed height %d", ErrCorrupt, maxHeight)
	}
	news, ops, err := t.placeNew(ctx, t.root, PageRef{}, x.height, 2, writer)
	if err != nil {
		return err
	}
	left, right := cut(x, i, sep, news[1].ref)
	left.lo = []byte{}
	left.stamp(writer)
	right.stamp(writer)
	root := &page{
		kind: kindInner, height: x.height + 1, lo: []byte{}, hi: []byte{}, hiInf: true, writers: x.writers,
		keys: [][]byte{{}, sep}, kids: []PageRef{news[0].ref, news[1].ref},
	}
	root.stamp(writer)
	ops = append(ops,
		Op{Kind: OpWrite, Ref: t.root, Slot: xslot, Data: root.encode()},
		news[0].op(left), news[1].op(right))
	if err := t.structCommit(ctx, ops, t.root, writer); err != nil {
		return err
	}
	t.metrics.splits.Add(1)
	t.metrics.rootSplits.Add(1)
	t.cache.dropRef(t.root)
	t.cache.put(left.height, left, news[0].ref)
	t.cache.put(right.height, right, news[1].ref)
	t.cache.put(root.height, root, t.root)
	return nil
}

// payload is what a page holds beyond its fixed header.
func payload(p *page) int { return p.size() - pageHeaderBytes }

// underfull reports whether p holds less than 1/underfullFraction of what a
// page of pageBytes can (FSS §5: "less than 1/4 full").
func underfull(p *page, pageBytes int) bool {
	return payload(p) < (pageBytes-pageHeaderBytes)/underfullFraction
}

// rebalanceReq names a page that looked underfull.
type rebalanceReq struct {
	ref    PageRef
	height int
	lo     []byte
}

// maybeRebalance queues the page for the background rebalancer if it is
// underfull, or the root if it has a single child.
func (t *Tree) maybeRebalance(ref PageRef, p *page) {
	if t.rebalanceCh == nil || !p.isTree() {
		return
	}
	pageBytes, err := t.pageBytes(context.Background(), ref.Extent)
	if err != nil {
		return
	}
	if ref == t.root {
		if !(p.kind == kindInner && len(p.kids) == 1) {
			return
		}
	} else if !underfull(p, pageBytes) {
		return
	}
	t.rebalanceMu.Lock()
	defer t.rebalanceMu.Unlock()
	if t.rebalancePending[ref] {
		return
	}
	select {
	case t.rebalanceCh <- rebalanceReq{ref: ref, height: p.height, lo: bytes.Clone(p.lo)}:
		t.rebalancePending[ref] = true
	default:
		t.metrics.rebalanceDropped.Add(1)
	}
}

// rebalanceLoop is the background rebalancer (Boxwood's compression
// threads): it fixes the pages deletes left underfull, each in its own
// transaction. A fix it misses is made the next time the page is written.
func (t *Tree) rebalanceLoop() {
	defer t.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-t.stop
		cancel()
	}()
	for {
		select {
		case <-t.stop:
			return
		case req := <-t.rebalanceCh:
			t.rebalanceMu.Lock()
			delete(t.rebalancePending, req.ref)
			t.rebalanceMu.Unlock()
			rctx, rcancel := context.WithTimeout(ctx, rebalanceTimeout)
			if err := t.rebalanceRetrying(rctx, req); err != nil && ctx.Err() == nil {
				t.log.Debug("btree: rebalance failed", "page", req.ref, "err", err)
			}
			rcancel()
		}
	}
}

func (t *Tree) rebalanceRetrying(ctx context.Context, req rebalanceReq) error {
	var err error
	for attempt := 0; attempt < maxStructuralRetries; attempt++ {
		if err = t.rebalance(ctx, req); err == nil || !transient(err) {
			return err
		}
		if berr := t.backoff(ctx, attempt); berr != nil {
			return berr
		}
	}
	return err
}

// rebalance fixes one underfull page: it merges it with a sibling under the
// same parent when both fit in 3/4 of a page, else moves entries between
// them; a root left with one child absorbs it.
func (t *Tree) rebalance(ctx context.Context, req rebalanceReq) error {
	x, xslot, err := t.readPage(ctx, req.ref)
	if err != nil {
		if isRetry(err) {
			return nil // the page is gone or changed: nothing to do
		}
		return err
	}
	if !x.isTree() || x.height != req.height || !bytes.Equal(x.lo, req.lo) {
		return nil
	}
	if req.ref == t.root {
		if x.kind == kindInner && len(x.kids) == 1 {
			return t.collapseRoot(ctx, x, xslot)
		}
		return nil
	}
	pageBytes, err := t.pageBytes(ctx, req.ref.Extent)
	if err != nil {
		return err
	}
	if !underfull(x, pageBytes) {
		return nil
	}
	par, idx, err := t.findParent(ctx, x, req.ref)
	if err != nil {
		return err
	}
	if len(par.p.kids) == 1 {
		t.maybeRebalance(par.ref, par.p)
		return nil
	}
	li, ri := idx, idx+1
	if ri >= len(par.p.kids) {
		li, ri = idx-1, idx
	}
	var l, r located
	if li == idx {
		l = located{req.ref, x, xslot}
		r, err = t.readSibling(ctx, par.p.kids[ri], x.height)
	} else {
		r = located{req.ref, x, xslot}
		l, err = t.readSibling(ctx, par.p.kids[li], x.height)
	}
	if err != nil {
		return err
	}
	// The three pages were read at different moments: go on only if they
	// agree on every fence, else the entries merged below would not be in
	// order (a sibling that absorbed its own neighbour after the parent
	// was read ends past the parent's next separator). The commit would
	// refuse such a mix anyway, but the pages built from it must be valid.
	rhi, rhiInf := par.p.childHi(ri)
	if l.p.hiInf || !bytes.Equal(l.p.hi, r.p.lo) || !bytes.Equal(r.p.lo, par.p.keys[ri]) || l.p.next != r.ref ||
		!bytes.Equal(l.p.lo, par.p.keys[li]) || r.p.hiInf != rhiInf || (!rhiInf && !bytes.Equal(r.p.hi, rhi)) {
		return retry("siblings changed", nil)
	}
	writer := rand.Uint64() | 1
	merged := l.p.clone()
	merged.keys = append(merged.keys, r.p.keys...)
	merged.vals = append(merged.vals, r.p.vals...)
	merged.kids = append(merged.kids, r.p.kids...)
	merged.hi, merged.hiInf, merged.next = r.p.hi, r.p.hiInf, r.p.next
	if payload(merged) <= (pageBytes-pageHeaderBytes)*mergeFillNumerator/mergeFillDenominator {
		return t.merge(ctx, par, ri, l, r, merged, writer)
	}
	return t.redistribute(ctx, par, ri, l, r, merged, pageBytes, writer)
}

func (t *Tree) readSibling(ctx context.Context, ref PageRef, height int) (located, error) {
	p, slot, err := t.readPage(ctx, ref)
	if err != nil {
		return located{}, err
	}
	if !p.isTree() || p.height != height {
		return located{}, retry("sibling is not a page of the level", nil)
	}
	return located{ref, p, slot}, nil
}

// merge makes l absorb r: r's entry leaves the parent and r's page goes
// back to its block.
func (t *Tree) merge(ctx context.Context, par located, ri int, l, r located, merged *page, writer uint64) error {
	merged.stamp(writer)
	pp := par.p.clone()
	pp.keys = slices.Delete(pp.keys, ri, ri+1)
	pp.kids = slices.Delete(pp.kids, ri, ri+1)
	pp.stamp(writer)
	rel, err := t.release(ctx, r.ref, r.slot, r.p, writer)
	if err != nil {
		return err
	}
	ops := append([]Op{
		{Kind: OpWrite, Ref: l.ref, Slot: l.slot, Data: merged.encode()},
		{Kind: OpWrite, Ref: par.ref, Slot: par.slot, Data: pp.encode()},
	}, rel...)
	if err := t.structCommit(ctx, ops, l.ref, writer); err != nil {
		return err
	}
	t.metrics.merges.Add(1)
	t.cache.dropRef(r.ref)
	t.cache.put(merged.height, merged, l.ref)
	t.cache.put(pp.height, pp, par.ref)
	t.maybeRebalance(par.ref, pp)
	return nil
}

// redistribute moves entries between l and r so both are about half full.
func (t *Tree) redistribute(ctx context.Context, par located, ri int, l, r located, merged *page, pageBytes int, writer uint64) error {
	if !underfull(l.p, pageBytes) && !underfull(r.p, pageBytes) {
		return nil
	}
	// Cut the merged entries near the middle of their bytes.
	total := 0
	for j := range merged.keys {
		total += merged.entryBytes(j)
	}
	acc, i := 0, 1
	for j := range len(merged.keys) - 1 {
		acc += merged.entryBytes(j)
		i = j + 1
		if acc >= total/2 {
			break
		}
	}
	if i == len(l.p.keys) {
		return nil
	}
	sep := bytes.Clone(merged.keys[i])
	if merged.kind == kindLeaf {
		sep = separator(merged.keys[i-1], merged.keys[i])
	}
	left, right := cut(merged, i, sep, r.ref)
	left.writers, right.writers = l.p.writers, r.p.writers
	left.stamp(writer)
	right.stamp(writer)
	pp := par.p.clone()
	pp.keys[ri] = sep
	pp.stamp(writer)
	if left.size() > pageBytes || right.size() > pageBytes || pp.size() > pageBytes {
		return nil // a longer separator would not fit; leave the pages be
	}
	ops := []Op{
		{Kind: OpWrite, Ref: l.ref, Slot: l.slot, Data: left.encode()},
		{Kind: OpWrite, Ref: r.ref, Slot: r.slot, Data: right.encode()},
		{Kind: OpWrite, Ref: par.ref, Slot: par.slot, Data: pp.encode()},
	}
	if err := t.structCommit(ctx, ops, l.ref, writer); err != nil {
		return err
	}
	t.metrics.redistributions.Add(1)
	t.cache.dropRef(r.ref)
	t.cache.put(left.height, left, l.ref)
	t.cache.put(right.height, right, r.ref)
	t.cache.put(pp.height, pp, par.ref)
	return nil
}

// collapseRoot shrinks the tree: a root with one child takes the child's
// entries and height, and the child's page is released.
func (t *Tree) collapseRoot(ctx context.Context, root *page, rslot uint64) error {
	c, err := t.readSibling(ctx, root.kids[0], root.height-1)
	if err != nil {
		return err
	}
	if len(c.p.lo) != 0 || !c.p.hiInf {
		return retry("root's only child does not own every key", nil)
	}
	writer := rand.Uint64() | 1
	nr := c.p.clone()
	nr.next, nr.writers = PageRef{}, root.writers
	nr.stamp(writer)
	rel, err := t.release(ctx, c.ref, c.slot, c.p, writer)
	if err != nil {
		return err
	}
	ops := append([]Op{{Kind: OpWrite, Ref: t.root, Slot: rslot, Data: nr.encode()}}, rel...)
	if err := t.structCommit(ctx, ops, t.root, writer); err != nil {
		return err
	}
	t.metrics.rootCollapses.Add(1)
	t.cache.dropRef(c.ref)
	t.cache.dropRef(t.root)
	t.cache.put(nr.height, nr, t.root)
	t.maybeRebalance(t.root, nr)
	return nil
}

// RebalanceAll rebalances every underfull page now, level by level from the
// leaves up, and collapses a root with one child; it returns how many
// structural changes it made. Deletes leave this to the background
// rebalancer and to later writes; tests and operators call it to compact a
// tree at once.
func (t *Tree) RebalanceAll(ctx context.Context) (int, error) {
	before := t.structuralChanges()
	// A merge at one level can make room for merges below it (cousins
	// become siblings), so passes repeat until one changes nothing.
	for pass := 0; pass < maxRebalancePasses; pass++ {
		passStart := t.structuralChanges()
		if err := t.rebalancePass(ctx); err != nil {
			return t.structuralChanges() - before, err
		}
		if t.structuralChanges() == passStart {
			break
		}
	}
	return t.structuralChanges() - before, nil
}

// maxRebalancePasses bounds RebalanceAll's passes over the tree.
const maxRebalancePasses = 2 * maxHeight

func (t *Tree) rebalancePass(ctx context.Context) error {
	for height := 0; height < maxHeight; height++ {
		root, _, err := t.readPage(ctx, t.root)
		if err != nil {
			return err
		}
		if height >= root.height {
			break
		}
		if err := t.rebalanceLevel(ctx, height); err != nil {
			return err
		}
	}
	for range maxHeight {
		root, rslot, err := t.readPage(ctx, t.root)
		if err != nil {
			return err
		}
		if root.kind != kindInner || len(root.kids) != 1 {
			return nil
		}
		if err := t.collapseRoot(ctx, root, rslot); err != nil && !transient(err) {
			return err
		}
	}
	return nil
}

// maxFixesPerPage bounds how often RebalanceAll works on one position.
const maxFixesPerPage = 8

func (t *Tree) rebalanceLevel(ctx context.Context, height int) error {
	resume := []byte{}
	for {
		var loc located
		var err error
		for fix := 0; ; fix++ {
			loc, err = t.locate(ctx, resume, height)
			if err != nil {
				return err
			}
			pageBytes, err := t.pageBytes(ctx, loc.ref.Extent)
			if err != nil {
				return err
			}
			if fix == maxFixesPerPage || !underfull(loc.p, pageBytes) {
				break
			}
			before := t.structuralChanges()
			if err := t.rebalanceRetrying(ctx, rebalanceReq{ref: loc.ref, height: height, lo: loc.p.lo}); err != nil && !transient(err) {
				return err
			}
			if t.structuralChanges() == before {
				break // nothing to do here (an only child): move on
			}
		}
		if loc.p.hiInf {
			return nil
		}
		resume = loc.p.hi
	}
}

func (t *Tree) structuralChanges() int {
	c := &t.metrics
	return int(c.merges.Load() + c.redistributions.Load() + c.rootCollapses.Load())
}
