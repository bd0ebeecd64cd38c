package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// maxCheckProblems bounds the problems a CheckReport lists.
const maxCheckProblems = 100

// CheckReport is what Check found.
type CheckReport struct {
	// Height is the root's height: the tree has Height+1 levels.
	Height int
	// Pages counts the pages of each level, index = height.
	Pages []int
	// Keys counts the pairs in the leaves.
	Keys int64
	// LeafBytes and InnerBytes are the encoded bytes of the leaves and of
	// the inner pages; LeafCapacity and InnerCapacity their page sizes
	// summed.
	LeafBytes, LeafCapacity, InnerBytes, InnerCapacity int64
	// Blocks counts the blocks holding the tree's pages; Extents the
	// pages in each extent. SplitRuns counts, over all levels, the blocks
	// whose pages of that level are not one run of neighbours (FSS §5
	// Figure 6 wants each block to hold one key range of a level): a
	// locality measure, not a problem.
	Blocks    int
	Extents   map[uint64]int
	SplitRuns int
	// Problems lists what is wrong (at most maxCheckProblems); empty when
	// the tree is sound.
	Problems []string
}

// OK reports whether Check found nothing wrong.
func (r *CheckReport) OK() bool { return len(r.Problems) == 0 }

// LeafFill is the fraction of leaf page bytes in use.
func (r *CheckReport) LeafFill() float64 {
	if r.LeafCapacity == 0 {
		return 0
	}
	return float64(r.LeafBytes) / float64(r.LeafCapacity)
}

// InnerFill is the fraction of inner page bytes in use.
func (r *CheckReport) InnerFill() float64 {
	if r.InnerCapacity == 0 {
		return 0
	}
	return float64(r.InnerBytes) / float64(r.InnerCapacity)
}

func (r *CheckReport) problem(format string, args ...any) {
	if len(r.Problems) < maxCheckProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Check reads the whole tree, level by level from the root, and verifies
// its structure: every page decodes and validates; each level's pages
// have the height of the level and fences that tile the key space with no
// gap or overlap (the first starts at the empty key, each ends where the
// next begins, the last at +infinity); each child's fences are the ones
// its parent's entries give it; the right links chain each level in key
// order; every key lies within its page's fences (so in the only page that
// owns it); no page is reachable twice; and every block's header marks in
// use exactly the tree's pages in that block. An error means it could not
// read the tree, problems are in the report.
//
// Check's reads happen at different times, so a split or a rebalance
// between the read of a parent and of its children (the background
// rebalancer's, for one, even when no client writes) shows as fences that
// disagree. Such a mix does not last: Check walks the tree again, up to
// checkAttempts times, and reports the problems only if every walk finds
// some. Damage that stays is found every time; run Check on a tree nobody
// is changing for a report that cannot be a mix of moments.
func (t *Tree) Check(ctx context.Context) (*CheckReport, error) {
	for attempt := 0; ; attempt++ {
		rep, err := t.checkOnce(ctx)
		if err != nil || rep.OK() || attempt == checkAttempts-1 {
			return rep, err
		}
		// Long enough for a structural transaction in flight to commit.
		select {
		case <-ctx.Done():
			return rep, nil
		case <-time.After(checkRetryWait):
		}
	}
}

// checkAttempts bounds Check's walks of a tree whose walks find problems;
// checkRetryWait is the pause between them.
const (
	checkAttempts  = 3
	checkRetryWait = 200 * time.Millisecond
)

func (t *Tree) checkOnce(ctx context.Context) (*CheckReport, error) {
	rep := &CheckReport{Extents: map[uint64]int{}}
	type expect struct {
		ref    PageRef
		lo, hi []byte
		hiInf  bool
	}
	root, err := t.checkRead(ctx, t.root)
	if err != nil {
		return nil, err
	}
	if !root.isTree() {
		rep.problem("root %v is not a tree page (kind %d)", t.root, root.kind)
		return rep, nil
	}
	rep.Height = root.height
	rep.Pages = make([]int, root.height+1)
	level := []expect{{ref: t.root, lo: []byte{}, hiInf: true}}
	seen := map[PageRef]bool{}
	// used[block header ref] = pages of the block the tree uses.
	used := map[PageRef][]int{}
	for h := root.height; h >= 0; h-- {
		var next []expect
		var refs []PageRef
		var pages []*page
		for _, e := range level {
			if seen[e.ref] {
				rep.problem("page %v reachable twice", e.ref)
				continue
			}
			seen[e.ref] = true
			p, err := t.checkRead(ctx, e.ref)
			if err != nil {
				return nil, err
			}
			if p == nil {
				rep.problem("page %v (height %d, [%q, %s)) is stale or does not decode", e.ref, h, e.lo, hiString(e.hi, e.hiInf))
				continue
			}
			if !p.isTree() || p.height != h {
				rep.problem("page %v: kind %d height %d, want a tree page of height %d", e.ref, p.kind, p.height, h)
				continue
			}
			if !bytes.Equal(p.lo, e.lo) || p.hiInf != e.hiInf || !bytes.Equal(p.hi, e.hi) {
				rep.problem("page %v owns [%q, %s), its parent gives it [%q, %s)", e.ref, p.lo, hiString(p.hi, p.hiInf), e.lo, hiString(e.hi, e.hiInf))
			}
			g, err := t.geometry(ctx, e.ref.Extent)
			if err != nil {
				return nil, err
			}
			hdr := e.ref
			hdr.Page = g.BlockOf(e.ref.Page)
			used[hdr] = append(used[hdr], int(e.ref.Page-hdr.Page))
			rep.Pages[h]++
			rep.Extents[e.ref.Extent]++
			if h == 0 {
				rep.Keys += int64(len(p.keys))
				rep.LeafBytes += int64(p.size())
				rep.LeafCapacity += int64(g.PageBytes)
			} else {
				rep.InnerBytes += int64(p.size())
				rep.InnerCapacity += int64(g.PageBytes)
				for i, kid := range p.kids {
					hi, hiInf := p.childHi(i)
					next = append(next, expect{ref: kid, lo: p.keys[i], hi: hi, hiInf: hiInf})
				}
			}
			refs = append(refs, e.ref)
			pages = append(pages, p)
		}
		checkLevel(rep, h, refs, pages)
		rep.SplitRuns += t.splitRuns(ctx, refs)
		level = next
	}
	rep.Blocks = len(used)
	for hdr, pagesUsed := range used {
		t.checkBlock(ctx, rep, hdr, pagesUsed)
	}
	return rep, nil
}

// checkLevel verifies that one level's pages tile the key space and are
// chained by their right links in order.
func checkLevel(rep *CheckReport, h int, refs []PageRef, pages []*page) {
	if len(pages) == 0 {
		rep.problem("level %d has no pages", h)
		return
	}
	if len(pages[0].lo) != 0 {
		rep.problem("level %d starts at %q, not at the empty key", h, pages[0].lo)
	}
	for i, p := range pages {
		if i+1 < len(pages) {
			if p.hiInf || !bytes.Equal(p.hi, pages[i+1].lo) {
				rep.problem("level %d: page %v ends at %s but the next begins at %q", h, refs[i], hiString(p.hi, p.hiInf), pages[i+1].lo)
			}
			if p.next != refs[i+1] {
				rep.problem("level %d: page %v links to %v, the next page is %v", h, refs[i], p.next, refs[i+1])
			}
		} else {
			if !p.hiInf {
				rep.problem("level %d ends at %q, not at +infinity", h, p.hi)
			}
			if !p.next.IsZero() {
				rep.problem("level %d: last page %v links to %v", h, refs[i], p.next)
			}
		}
	}
}

// splitRuns counts the blocks whose pages, in one level's key order, do
// not form a single run.
func (t *Tree) splitRuns(ctx context.Context, refs []PageRef) int {
	runs := map[PageRef]int{}
	var last PageRef
	for _, r := range refs {
		g, err := t.geometry(ctx, r.Extent)
		if err != nil {
			return 0
		}
		b := PageRef{Extent: r.Extent, Page: g.BlockOf(r.Page)}
		if b != last {
			runs[b]++
		}
		last = b
	}
	n := 0
	for _, c := range runs {
		if c > 1 {
			n++
		}
	}
	return n
}

// checkBlock verifies a block header against the tree pages in the block.
func (t *Tree) checkBlock(ctx context.Context, rep *CheckReport, hdrRef PageRef, pagesUsed []int) {
	h, err := t.checkRead(ctx, hdrRef)
	if err != nil || h == nil || h.kind != kindBlockHeader {
		rep.problem("block %v has no readable header (%v)", hdrRef, err)
		return
	}
	slices.Sort(pagesUsed)
	for _, i := range pagesUsed {
		if i == 0 || i >= len(h.used) || !h.used[i] {
			rep.problem("block %v: tree page %d not marked used in the header", hdrRef, i)
		}
	}
	for i, u := range h.used {
		if i > 0 && u && !slices.Contains(pagesUsed, i) {
			rep.problem("block %v: page %d marked used but not in the tree (leaked)", hdrRef, i)
		}
	}
}

// checkRead reads and decodes a page, retrying an unavailable store. A page
// that does not decode, or a stale pointer, is returned as nil with no
// error: that is a problem of the tree, not a failure to read it.
func (t *Tree) checkRead(ctx context.Context, ref PageRef) (*page, error) {
	var last error
	for attempt := 0; attempt < t.cfg.MaxAttempts; attempt++ {
		data, _, err := t.readRaw(ctx, ref)
		if errors.Is(err, ErrStale) {
			return nil, nil
		}
		if err == nil {
			p, derr := decodePage(data)
			if derr != nil {
				return nil, nil
			}
			return p, nil
		}
		if !transient(err) {
			return nil, fmt.Errorf("check: reading %v: %w", ref, err)
		}
		last = err
		if berr := t.backoff(ctx, attempt); berr != nil {
			return nil, fmt.Errorf("check: reading %v: %w (last: %w)", ref, berr, err)
		}
	}
	return nil, fmt.Errorf("check: reading %v: %w", ref, last)
}

func hiString(hi []byte, inf bool) string {
	if inf {
		return "+inf"
	}
	return fmt.Sprintf("%q", hi)
}

// invariantCheckTimeout bounds the whole-tree checks that the invariants
// build runs after a commit; invariantChecks is how many reports in a row
// must name the same problems before they count as damage.
const (
	invariantCheckTimeout = 30 * time.Second
	invariantChecks       = 3
)

// checkInvariants runs Check after a commit in the invariants build
// (internal/invariants) and panics on damage. It checks through a client
// of its own (no cache, its own metrics), so the tree's caches and counters
// see nothing of it. Under concurrent writers every walk can meet a
// different mix of moments (see Check), so problems count only when
// invariantChecks reports in a row name the same ones: damage stays the
// same, a mix does not. A Check that cannot read the tree (a faulty or
// unavailable store) proves nothing and is ignored.
func (t *Tree) checkInvariants() {
	ctx, cancel := context.WithTimeout(context.Background(), invariantCheckTimeout)
	defer cancel()
	cfg := t.cfg
	cfg.MaxCachedPages, cfg.LeafCacheBytes, cfg.RebalanceQueue, cfg.Logger = -1, 0, -1, nil
	c, err := Open(ctx, cfg)
	if err != nil {
		return
	}
	defer c.Close()
	var last []string
	for i := 0; i < invariantChecks; i++ {
		rep, err := c.Check(ctx)
		if err != nil || rep.OK() || (i > 0 && !slices.Equal(rep.Problems, last)) {
			return
		}
		last = rep.Problems
	}
	panic(fmt.Sprintf("btree: invariant violated after a commit: %s", strings.Join(last, "; ")))
}
