package btree

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sort"
)

// maxMovedPages bounds the pages one block split moves. Each moved page
// costs two ops (its copy in the new block, and the free-page marker at its
// old place, which keeps a stale pointer from reading old contents), and
// the split adds the allocation, both block headers, the moved run's left
// neighbour (its right link) and at most two parents (their child
// pointers): 6 + 2*4 = 14 ops, within MPSC's 15. This is the infrequent
// large transaction FSS §5 sizes MPSC for.
const maxMovedPages = 4

// moveBlockTail splits the full block whose header is hdr: the last pages
// of the given height in key order (at most maxMovedPages, at most half)
// move to a new block, so the block keeps a contiguous key range with room
// to grow and the new block takes the range after it (FSS §5 Figure 6:
// each block holds one key range of one level). It does nothing (false,
// nil) when near (the page that needs room) is the block's last page, or
// unless the pages to move form a run on the level, preceded by a page of
// the same block, with at most two parents; the caller then puts its new
// page in a block of its own.
func (t *Tree) moveBlockTail(ctx context.Context, hdr located, near PageRef, height int) (bool, error) {
	var pages []located
	for i, used := range hdr.p.used {
		if i == 0 || !used {
			continue
		}
		ref := hdr.ref
		ref.Page += uint64(i)
		p, slot, err := t.readPage(ctx, ref)
		if err != nil {
			return false, err
		}
		if p.isTree() && p.height == height && ref != t.root {
			pages = append(pages, located{ref, p, slot})
		}
	}
	if len(pages) < 2 {
		return false, nil
	}
	sort.Slice(pages, func(i, j int) bool { return bytes.Compare(pages[i].p.lo, pages[j].p.lo) < 0 })
	if pages[len(pages)-1].ref == near {
		// An append past the block's last page: a new block after this one
		// keeps both ranges contiguous, and this one stays full.
		return false, nil
	}
	k := min(maxMovedPages, len(pages)/2)
	tail := pages[len(pages)-k:]
	prev := pages[len(pages)-k-1]
	if prev.p.next != tail[0].ref {
		return false, nil
	}
	for i := 1; i < k; i++ {
		if tail[i-1].p.next != tail[i].ref {
			return false, nil
		}
	}
	// The parents, each read once; every moved page's entry is repointed.
	type parentEdit struct {
		at   located
		copy *page
	}
	var parents []*parentEdit
	idxs := make([]int, k)
	owner := make([]*parentEdit, k)
	for i, tp := range tail {
		par, idx, err := t.findParent(ctx, tp.p, tp.ref)
		if err != nil {
			return false, err
		}
		var pe *parentEdit
		for _, q := range parents {
			if q.at.ref == par.ref {
				pe = q
			}
		}
		if pe == nil {
			if len(parents) == 2 {
				return false, nil
			}
			pe = &parentEdit{at: par, copy: par.p.clone()}
			parents = append(parents, pe)
		} else if pe.at.slot != par.slot {
			return false, retry("parent changed during a block split", nil)
		}
		idxs[i], owner[i] = idx, pe
	}
	writer := rand.Uint64() | 1
	news, ops, err := t.placeInNewBlock(ctx, hdr.ref, k, writer)
	if err != nil {
		return false, err
	}
	copies := make([]*page, k)
	for i, tp := range tail {
		c := tp.p.clone()
		if i+1 < k {
			c.next = news[i+1].ref
		}
		c.stamp(writer)
		copies[i] = c
		ops = append(ops, news[i].op(c))
		owner[i].copy.kids[idxs[i]] = news[i].ref
	}
	h := hdr.p.clone()
	for _, tp := range tail {
		h.used[tp.ref.Page-hdr.ref.Page] = false
		tomb := freeMarker(tp.p, writer)
		ops = append(ops, Op{Kind: OpWrite, Ref: tp.ref, Slot: tp.slot, Data: tomb.encode()})
	}
	h.stamp(writer)
	pv := prev.p.clone()
	pv.next = news[0].ref
	pv.stamp(writer)
	ops = append(ops,
		Op{Kind: OpWrite, Ref: hdr.ref, Slot: hdr.slot, Data: h.encode()},
		Op{Kind: OpWrite, Ref: prev.ref, Slot: prev.slot, Data: pv.encode()})
	for _, pe := range parents {
		pe.copy.stamp(writer)
		ops = append(ops, Op{Kind: OpWrite, Ref: pe.at.ref, Slot: pe.at.slot, Data: pe.copy.encode()})
	}
	if err := t.structCommit(ctx, ops, prev.ref, writer); err != nil {
		return false, err
	}
	t.metrics.blockSplits.Add(1)
	for i, tp := range tail {
		t.cache.dropRef(tp.ref)
		t.cache.put(height, copies[i], news[i].ref)
	}
	t.cache.put(height, pv, prev.ref)
	for _, pe := range parents {
		t.cache.put(height+1, pe.copy, pe.at.ref)
	}
	return true, nil
}
