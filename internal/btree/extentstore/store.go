// Package extentstore adapts the extent store's client (internal/extent,
// DESIGN.md §2.4) to btree.PageStore, the interface the B-tree consumes
// (DESIGN.md §2.5). It is a translation and nothing more: tagged pointers,
// MPSC elements, geometries and error kinds map one to one, and nothing is
// retried here (the store never retries; the B-tree decides).
//
// Mapping:
//
//   - btree.OpWrite and OpCheck are extent.Write and extent.Check at the
//     slot read; OpWriteFresh is extent.Write at slot 0, which the extent
//     store takes for a page of a block allocated earlier in the same MPSC.
//   - btree.OpAllocBlock is extent.AllocateBlock of the named free block at
//     its listed generation; the extent store gives the block generation+1,
//     which is what the B-tree put in the pointers it wrote in the same
//     commit. The result is checked: a different generation would be a
//     contract violation and is reported as such.
//   - btree.OpFreeBlock is extent.Free.
//   - Resolve is Client.Recover of the transaction an ErrPrepared named.
//   - Errors: ErrConflict and ErrAborted (a cross-extent transaction that
//     lost, nothing applied) become btree.ErrConflict; ErrStale,
//     ErrNoSpace, ErrUnavailable and ErrAmbiguous keep their meaning;
//     ErrInvalid, ErrNotFound and ErrPermissionDenied (a refused
//     credential: nothing ran) become btree.ErrInvalid; ErrPrepared with
//     its holder becomes a *btree.PreparedError. The extent error stays
//     wrapped for its details.
//
// Pointers: the B-tree's PageRef has no read-only bit; the B-tree only
// uses read-write blocks, so it maps to ReadOnly false.
//
// Page deltas (issue 11; internal/extent delta.go): the adapter keeps the
// bytes of the pages it read and wrote, at their slots, in a byte-bounded
// LRU (Config.DeltaCacheBytes; basecache.go). An OpWrite whose Slot is the
// cached slot of its page goes as an edit script against those bytes
// (extent.WriteDelta) when the script is at most half the page, which a
// B-tree insert's is by far. If the extent refuses the commit as
// ErrInvalid while it carried deltas (ErrDeltaMismatch: a script did not
// rebuild its page; or a replica that predates deltas), nothing changed:
// the adapter forgets the bases it used and sends the same commit once
// more with full images. That resend is the one retry here, and it is not
// a retry of what the caller decides: the first attempt was refused
// before it changed anything. Counters: Metrics, exported as
// arbor_btree_page_write*_total and arbor_btree_delta_*.
package extentstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/extent"
)

// Client is what the adapter uses of *extent.Client.
type Client interface {
	ReadPage(ctx context.Context, p extent.Pointer) (extent.Page, error)
	Commit(ctx context.Context, elems []extent.Element) ([]extent.Result, error)
	Check(ctx context.Context, elems []extent.Element) error
	FreeBlocks(ctx context.Context, ext, near uint64, n int) ([]extent.FreeBlock, error)
	Geometry(ctx context.Context, ext uint64) (extent.Geometry, error)
	Recover(ctx context.Context, ref extent.TxnRef) (extent.Outcome, error)
}

// DefaultDeltaCacheBytes is the default bound of the page bytes the
// adapter keeps to encode deltas against: a metadata server's working set
// of leaves (its leaf cache is as large) with room to spare.
const DefaultDeltaCacheBytes = 64 << 20

// Config configures a Store.
type Config struct {
	// DeltaCacheBytes bounds the page bytes kept as delta bases (0:
	// DefaultDeltaCacheBytes; negative: none, every write a full image).
	DeltaCacheBytes int64
}

// Store is a btree.PageStore over the extent store.
type Store struct {
	c       Client
	bases   *baseCache
	metrics counters
}

var _ btree.PageStore = (*Store)(nil)

// New returns the adapter over c with the default configuration.
func New(c Client) *Store { return NewWithConfig(c, Config{}) }

// NewWithConfig returns the adapter over c.
func NewWithConfig(c Client, cfg Config) *Store {
	if cfg.DeltaCacheBytes == 0 {
		cfg.DeltaCacheBytes = DefaultDeltaCacheBytes
	}
	return &Store{c: c, bases: newBaseCache(cfg.DeltaCacheBytes)}
}

func pointer(r btree.PageRef) extent.Pointer {
	return extent.Pointer{Extent: r.Extent, Page: r.Page, Generation: r.Generation, Tenant: r.Tenant}
}

// Geometry implements btree.PageStore.
func (s *Store) Geometry(ctx context.Context, ext uint64) (btree.Geometry, error) {
	g, err := s.c.Geometry(ctx, ext)
	if err != nil {
		return btree.Geometry{}, mapError(err, btree.PageRef{Extent: ext}, false)
	}
	if g.PageSizeBytes == 0 || g.BlockSizeBytes < g.PageSizeBytes || g.BlockSizeBytes%g.PageSizeBytes != 0 {
		return btree.Geometry{}, fmt.Errorf("%w: extent %d has geometry %+v", btree.ErrInvalid, ext, g)
	}
	return btree.Geometry{
		PageBytes:     int(g.PageSizeBytes),
		PagesPerBlock: int(g.BlockSizeBytes / g.PageSizeBytes),
		Blocks:        int(g.ExtentSizeBytes / uint64(g.BlockSizeBytes)),
	}, nil
}

// Read implements btree.PageStore.
func (s *Store) Read(ctx context.Context, ref btree.PageRef) ([]byte, uint64, error) {
	p, err := s.c.ReadPage(ctx, pointer(ref))
	if err != nil {
		return nil, 0, mapError(err, ref, false)
	}
	s.bases.put(ref, p.Slot, p.Data)
	return p.Data, p.Slot, nil
}

// Commit implements btree.PageStore.
func (s *Store) Commit(ctx context.Context, ops []btree.Op) ([]uint64, error) {
	elems, deltas, err := s.elements(ops, true)
	if err != nil {
		return nil, err
	}
	var ref btree.PageRef
	if len(ops) > 0 {
		ref = ops[0].Ref
	}
	if onlyChecks(ops) {
		// A read-only transaction's validation: answered by the extents'
		// leaders from linearizable reads, no raft entry, no outcome to
		// lose.
		if err := s.c.Check(ctx, elems); err != nil {
			return nil, mapError(err, ref, false)
		}
		return make([]uint64, len(ops)), nil
	}
	s.countSent(elems, ops)
	res, err := s.c.Commit(ctx, elems)
	if err != nil && deltas > 0 && errors.Is(err, extent.ErrDeltaMismatch) {
		// Refused before anything changed: a delta that did not rebuild
		// its page (a base that is not the page at its slot). Full
		// images, once.
		s.metrics.fallbacks.Add(1)
		for i, e := range elems {
			if e.Delta != nil {
				s.bases.drop(ops[i].Ref, ops[i].Slot)
			}
		}
		if elems, _, err = s.elements(ops, false); err != nil {
			return nil, err
		}
		s.countSent(elems, ops)
		res, err = s.c.Commit(ctx, elems)
	}
	if err != nil {
		return nil, mapError(err, ref, true)
	}
	slots := make([]uint64, len(ops))
	for i, op := range ops {
		if i >= len(res) {
			break
		}
		if op.Kind == btree.OpWrite || op.Kind == btree.OpWriteFresh {
			slots[i] = res[i].Slot
			s.bases.put(op.Ref, slots[i], op.Data)
		}
		if op.Kind != btree.OpAllocBlock {
			continue
		}
		// A zero pointer means the result was not reported (the reply
		// that carried it was lost after the commit, or a cross-extent
		// commit does not return it); the allocation is as asked, the
		// commit having checked the generation.
		if got := res[i].Block; !got.IsZero() && (got.Generation != op.Ref.Generation || got.Tenant != op.Ref.Tenant || got.Page != op.Ref.Page) {
			return nil, fmt.Errorf("extentstore: block %v allocated as %v, not as asked: the extent store broke the allocation contract", op.Ref, got)
		}
	}
	return slots, nil
}

// elements translates ops; with deltas, an OpWrite whose base is cached at
// its slot goes as a page delta when that pays (deltas counts them).
func (s *Store) elements(ops []btree.Op, deltas bool) (elems []extent.Element, n int, err error) {
	elems = make([]extent.Element, len(ops))
	for i, op := range ops {
		switch op.Kind {
		case btree.OpWrite:
			elems[i] = extent.Write(pointer(op.Ref), op.Slot, op.Data)
			if !deltas {
				break
			}
			if op.Slot == 0 {
				break // an empty page: nothing to copy from
			}
			base, ok := s.bases.get(op.Ref, op.Slot)
			if !ok {
				s.metrics.noBase.Add(1)
				break
			}
			d, ok := extent.EncodeDelta(base, op.Data)
			if !ok {
				s.metrics.notWorth.Add(1)
				break
			}
			elems[i] = extent.WriteDelta(pointer(op.Ref), op.Slot, d)
			n++
		case btree.OpCheck:
			elems[i] = extent.Check(pointer(op.Ref), op.Slot)
		case btree.OpWriteFresh:
			elems[i] = extent.Write(pointer(op.Ref), 0, op.Data)
		case btree.OpAllocBlock:
			if op.Ref.Generation != op.Slot+1 {
				return nil, 0, fmt.Errorf("%w: op %d: allocation must take generation %d to %d", btree.ErrInvalid, i, op.Slot, op.Slot+1)
			}
			elems[i] = extent.AllocateBlock(extent.FreeBlock{Extent: op.Ref.Extent, Page: op.Ref.Page, Generation: op.Slot}, op.Ref.Tenant)
		case btree.OpFreeBlock:
			elems[i] = extent.Free(pointer(op.Ref))
		default:
			return nil, 0, fmt.Errorf("%w: op %d: unknown kind %v", btree.ErrInvalid, i, op.Kind)
		}
	}
	return elems, n, nil
}

// FreeBlocks implements btree.PageStore.
func (s *Store) FreeBlocks(ctx context.Context, ext, near uint64, n int) ([]btree.FreeBlock, error) {
	fbs, err := s.c.FreeBlocks(ctx, ext, near, n)
	if err != nil {
		return nil, mapError(err, btree.PageRef{Extent: ext}, false)
	}
	out := make([]btree.FreeBlock, len(fbs))
	for i, fb := range fbs {
		out[i] = btree.FreeBlock{Extent: fb.Extent, Page: fb.Page, Generation: fb.Generation}
	}
	return out, nil
}

// Resolve implements btree.PageStore.
func (s *Store) Resolve(ctx context.Context, txn btree.PreparedTxn) error {
	if _, err := s.c.Recover(ctx, extent.TxnRef{ID: txn.ID, Extent: txn.Extent}); err != nil {
		return mapError(err, btree.PageRef{Extent: txn.Extent}, false)
	}
	return nil
}

func onlyChecks(ops []btree.Op) bool {
	for _, op := range ops {
		if op.Kind != btree.OpCheck {
			return false
		}
	}
	return len(ops) > 0
}

// mapError turns an extent client error into the B-tree's kinds. A context
// error that escaped the client's own typing means the call may have been
// sent: unknown outcome for a write, unavailable for a read.
func mapError(err error, ref btree.PageRef, write bool) error {
	var ee *extent.Error
	switch {
	case errors.Is(err, extent.ErrPrepared):
		if errors.As(err, &ee) && ee.Holder != nil {
			return &btree.PreparedError{Txn: btree.PreparedTxn{ID: ee.Holder.ID, Extent: ee.Holder.Extent}, Ref: ref}
		}
		// No holder named: nothing to resolve here; the background
		// recovery of the extent's leader will.
		return fmt.Errorf("%w: %w", btree.ErrUnavailable, err)
	case errors.Is(err, extent.ErrConflict), errors.Is(err, extent.ErrAborted):
		return fmt.Errorf("%w: %w", btree.ErrConflict, err)
	case errors.Is(err, extent.ErrStale):
		return fmt.Errorf("%w: %w", btree.ErrStale, err)
	case errors.Is(err, extent.ErrNoSpace):
		return fmt.Errorf("%w: %w", btree.ErrNoSpace, err)
	case errors.Is(err, extent.ErrInvalid), errors.Is(err, extent.ErrNotFound), errors.Is(err, extent.ErrPermissionDenied):
		return fmt.Errorf("%w: %w", btree.ErrInvalid, err)
	case errors.Is(err, extent.ErrUnavailable):
		return fmt.Errorf("%w: %w", btree.ErrUnavailable, err)
	case errors.Is(err, extent.ErrAmbiguous):
		return fmt.Errorf("%w: %w", btree.ErrAmbiguous, err)
	case write:
		return fmt.Errorf("%w: %w", btree.ErrAmbiguous, err)
	}
	return fmt.Errorf("%w: %w", btree.ErrUnavailable, err)
}
