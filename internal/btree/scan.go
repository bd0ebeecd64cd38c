package btree

import (
	"bytes"
	"context"
	"fmt"
)

// Scan calls fn with every pair whose key is in [from, to), in key order; a
// nil to means no upper bound. It reads one leaf at a time, following the
// leaves' right links and falling back to the cache and the tree when a
// link went stale. Each leaf is read linearizably and the leaves' ranges
// tile [from, to) exactly, so every key appears once; but the scan as a
// whole is not atomic: a key changed while the scan runs may be seen
// before or after the change (a key left alone is seen with its value).
// Use Txn.Scan for an atomic scan of a few pages. fn's slices are its own.
// An error from fn stops the scan and is returned.
func (t *Tree) Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error {
	if to != nil && bytes.Compare(from, to) > 0 {
		return fmt.Errorf("%w: from %q is after to %q", ErrBadRange, from, to)
	}
	resume := bytes.Clone(from)
	if resume == nil {
		resume = []byte{}
	}
	var hint PageRef
	for {
		loc, err := t.scanPage(ctx, resume, hint)
		if err != nil {
			return err
		}
		i, _ := loc.p.search(resume)
		for ; i < len(loc.p.keys); i++ {
			if to != nil && bytes.Compare(loc.p.keys[i], to) >= 0 {
				return nil
			}
			if err := fn(loc.p.keys[i], loc.p.vals[i]); err != nil {
				return err
			}
		}
		t.maybeRebalance(loc.ref, loc.p)
		if loc.p.hiInf || (to != nil && bytes.Compare(loc.p.hi, to) >= 0) {
			return nil
		}
		resume, hint = loc.p.hi, loc.p.next
	}
}

// scanPage reads the leaf owning k, trying the right link hint first.
func (t *Tree) scanPage(ctx context.Context, k []byte, hint PageRef) (located, error) {
	var last error
	for attempt := 0; attempt < t.cfg.MaxAttempts; attempt++ {
		if !hint.IsZero() {
			p, slot, err := t.readPage(ctx, hint)
			if err == nil && p.kind == kindLeaf && p.owns(k) {
				t.cache.put(0, p, hint)
				return located{hint, p, slot}, nil
			}
			hint = PageRef{}
		}
		loc, err := t.locate(ctx, k, 0)
		if err == nil {
			return loc, nil
		}
		if !transient(err) {
			return located{}, err
		}
		last = err
		if berr := t.backoff(ctx, attempt); berr != nil {
			return located{}, fmt.Errorf("%w: scan at %q: %w (last: %w)", ErrGaveUp, k, berr, err)
		}
	}
	return located{}, fmt.Errorf("%w: scan at %q after %d attempts: %w", ErrGaveUp, k, t.cfg.MaxAttempts, last)
}
