package btree

import (
	"context"
	"errors"
	"fmt"
)

// PageRef is a tagged pointer to one page (FSS §3, block ownership): the
// extent and page number say where the page is, the generation and tenant
// say whose it must be. The store checks the ownership part against the
// page's block on every access, so a pointer kept past a free (in a cache,
// in an old copy of a parent) fails with ErrStale instead of reaching a page
// that now belongs to someone else. The zero PageRef is "no page".
type PageRef struct {
	Extent     uint64
	Page       uint64
	Generation uint64
	Tenant     uint64
}

// IsZero reports whether r is the null pointer.
func (r PageRef) IsZero() bool { return r == PageRef{} }

// PageRefBytes is the size of an encoded PageRef.
const PageRefBytes = refBytes

// AppendBinary appends r's fixed-size encoding (extent, page, generation,
// tenant, big-endian), the one tree pages use, for callers that store
// pointers (the tree's root in the directory, a data block in a value).
func (r PageRef) AppendBinary(b []byte) []byte {
	var enc [refBytes]byte
	putRef(enc[:], r)
	return append(b, enc[:]...)
}

// DecodePageRef decodes what AppendBinary wrote; it refuses anything but
// PageRefBytes bytes.
func DecodePageRef(b []byte) (PageRef, error) {
	if len(b) != refBytes {
		return PageRef{}, fmt.Errorf("btree: page pointer of %d bytes, want %d", len(b), refBytes)
	}
	return getRef(b), nil
}

func (r PageRef) String() string {
	return fmt.Sprintf("e%d/p%d/g%d/t%d", r.Extent, r.Page, r.Generation, r.Tenant)
}

// Geometry is an extent's fixed shape (DESIGN.md §2.4).
type Geometry struct {
	PageBytes     int
	PagesPerBlock int
	Blocks        int
}

// BlockOf returns the first page of the block holding page.
func (g Geometry) BlockOf(page uint64) uint64 {
	return page - page%uint64(g.PagesPerBlock)
}

// FreeBlock is a block the store reports free, with the generation it has
// now; AllocBlock names it to take it.
type FreeBlock struct {
	Extent     uint64
	Page       uint64 // first page of the block
	Generation uint64
}

// OpKind says what one element of a commit does.
type OpKind int

const (
	// OpWrite replaces a page's contents if its slot is still Slot (and its
	// block's ownership still matches Ref).
	OpWrite OpKind = iota + 1
	// OpCheck changes nothing but fails the commit unless the page's slot
	// is still Slot: a read in the transaction's read set.
	OpCheck
	// OpWriteFresh writes a page of a block allocated earlier in the same
	// commit; there is no earlier read, so there is no slot to check.
	OpWriteFresh
	// OpAllocBlock takes the free block Ref.Page (its first page) whose
	// generation is now Slot, giving it generation Ref.Generation (which
	// must be Slot+1) and tenant Ref.Tenant. Its pages start empty.
	OpAllocBlock
	// OpFreeBlock frees the block Ref.Page, whose ownership must match Ref;
	// its generation moves on, so every pointer into it goes stale.
	OpFreeBlock
)

func (k OpKind) String() string {
	switch k {
	case OpWrite:
		return "write"
	case OpCheck:
		return "check"
	case OpWriteFresh:
		return "write-fresh"
	case OpAllocBlock:
		return "alloc-block"
	case OpFreeBlock:
		return "free-block"
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// Op is one element of a multi-page store-conditional.
type Op struct {
	Kind OpKind
	Ref  PageRef
	// Slot is the slot the page was read at (OpWrite, OpCheck), or the
	// current generation of a free block (OpAllocBlock).
	Slot uint64
	// Data is the new contents (OpWrite, OpWriteFresh), at most the
	// extent's page size.
	Data []byte
}

// MaxOpsPerCommit is MPSC's bound on the elements of one commit (FSS §3): 15
// pages, block allocations and frees in all.
const MaxOpsPerCommit = 15

// PageStore is what the B-tree needs from the extent store (DESIGN.md §2.4,
// FSS §3 and §6). It is owned by this package; the extent store's client is
// adapted to it, and MemStore is its in-memory twin.
//
// Contract:
//
//   - Read returns a page's contents and slot, linearizably. A page never
//     written reads as empty data with slot 0. The returned slice belongs
//     to the caller.
//   - Commit applies all of ops atomically or none of them. Ops apply in
//     order, so an OpWriteFresh may follow the OpAllocBlock of its block. It
//     succeeds only if every OpWrite/OpCheck page still has its Slot, every
//     Ref's ownership matches, no two ops name the same page, and there are
//     at most MaxOpsPerCommit ops. On success it returns one slot per op:
//     the new slot of a page an OpWrite or OpWriteFresh wrote, or 0 when
//     the store cannot tell (a lost reply, a cross-extent commit) and for
//     the other kinds. A commit over pages of several extents
//     is a cross-extent two-phase commit (FSS §6); this interface does not
//     show it, except through ErrPrepared.
//   - FreeBlocks lists up to n free blocks of an extent, those nearest to
//     near first. It is a hint: the OpAllocBlock that takes one is what
//     decides.
//   - The store never retries. Every error is one of the kinds below
//     (errors.Is), wrapped with context; the caller decides what to do.
type PageStore interface {
	Geometry(ctx context.Context, extent uint64) (Geometry, error)
	Read(ctx context.Context, ref PageRef) (data []byte, slot uint64, err error)
	Commit(ctx context.Context, ops []Op) (slots []uint64, err error)
	FreeBlocks(ctx context.Context, extent uint64, near uint64, n int) ([]FreeBlock, error)
	// Resolve finishes or aborts the cross-extent transaction that holds a
	// page prepared (FSS §6 prefix/suffix rule), so the page can be used.
	Resolve(ctx context.Context, txn PreparedTxn) error
}

// Error kinds a PageStore returns. All but ErrAmbiguous mean the commit
// changed nothing.
var (
	// ErrConflict: a page's slot moved since it was read (or a free block's
	// generation since it was listed).
	ErrConflict = errors.New("page store: slot conflict")
	// ErrStale: a tagged pointer's ownership no longer matches its block
	// (freed, reallocated, other tenant), or the block is not allocated.
	ErrStale = errors.New("page store: stale pointer")
	// ErrPrepared: a page is held by a prepared cross-extent transaction;
	// the error is a *PreparedError naming it, for Resolve.
	ErrPrepared = errors.New("page store: page held by a prepared transaction")
	// ErrUnavailable: the store could not serve the call (no leader, node
	// down, injected fault) and did nothing.
	ErrUnavailable = errors.New("page store: unavailable")
	// ErrAmbiguous: the commit may or may not have been applied (the reply
	// was lost, the context expired after sending). The B-tree returns it
	// too, wrapped, when it cannot learn a transaction's outcome.
	ErrAmbiguous = errors.New("page store: outcome unknown")
	// ErrInvalid: the request is malformed (too many ops, page too large,
	// a page twice, a bad allocation); nothing was changed.
	ErrInvalid = errors.New("page store: invalid request")
	// ErrNoSpace: the extent has no free block.
	ErrNoSpace = errors.New("page store: no free block")
)

// PreparedTxn names a prepared cross-extent transaction.
type PreparedTxn struct {
	ID uint64
	// Extent is where the prepared record that was found lives.
	Extent uint64
}

// PreparedError is returned (wrapping ErrPrepared) when a page is held by a
// prepared transaction.
type PreparedError struct {
	Txn PreparedTxn
	Ref PageRef
}

func (e *PreparedError) Error() string {
	return fmt.Sprintf("page %v held by prepared transaction %d (extent %d)", e.Ref, e.Txn.ID, e.Txn.Extent)
}

// Unwrap makes errors.Is(err, ErrPrepared) true.
func (e *PreparedError) Unwrap() error { return ErrPrepared }
