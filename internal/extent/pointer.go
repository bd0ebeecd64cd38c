package extent

import (
	"encoding/binary"
	"errors"
	"fmt"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// Pointer is a tagged pointer to a page (FSS §3, block ownership): the
// extent and page say where the page is; the generation, tenant and
// read-only bit say whose its block must be. Every access compares them with
// the block's ownership, atomically with the access, so a pointer kept past
// a free (in a cache, in an old copy of a B-tree page) fails with ErrStale
// instead of reaching data that now belongs to someone else. A block's
// pointer is the tagged pointer to its first page.
type Pointer struct {
	Extent     uint64
	Page       uint64
	Generation uint64
	Tenant     uint64
	ReadOnly   bool
}

// PointerBytes is the size of an encoded Pointer (AppendBinary).
const PointerBytes = 33

// WithPage returns the pointer to another page of the same block (same
// ownership tag). The caller keeps page inside the block: a page of another
// block fails the ownership check.
func (p Pointer) WithPage(page uint64) Pointer {
	p.Page = page
	return p
}

// IsZero reports whether p is the null pointer.
func (p Pointer) IsZero() bool { return p == Pointer{} }

func (p Pointer) String() string {
	ro := ""
	if p.ReadOnly {
		ro = "/ro"
	}
	return fmt.Sprintf("e%d/p%d/g%d/t%d%s", p.Extent, p.Page, p.Generation, p.Tenant, ro)
}

// AppendBinary appends the fixed-size encoding of p (PointerBytes bytes:
// extent, page, generation, tenant big-endian, then a flags byte), for
// callers that store pointers in pages.
func (p Pointer) AppendBinary(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, p.Extent)
	b = binary.BigEndian.AppendUint64(b, p.Page)
	b = binary.BigEndian.AppendUint64(b, p.Generation)
	b = binary.BigEndian.AppendUint64(b, p.Tenant)
	var flags byte
	if p.ReadOnly {
		flags = 1
	}
	return append(b, flags)
}

var errPointerEncoding = errors.New("extent: malformed pointer encoding")

// DecodePointer decodes what AppendBinary wrote. It refuses anything but
// exactly PointerBytes bytes with a known flags byte.
func DecodePointer(b []byte) (Pointer, error) {
	if len(b) != PointerBytes {
		return Pointer{}, fmt.Errorf("%w: %d bytes, want %d", errPointerEncoding, len(b), PointerBytes)
	}
	if b[32] > 1 {
		return Pointer{}, fmt.Errorf("%w: flags %#x", errPointerEncoding, b[32])
	}
	return Pointer{
		Extent:     binary.BigEndian.Uint64(b[0:]),
		Page:       binary.BigEndian.Uint64(b[8:]),
		Generation: binary.BigEndian.Uint64(b[16:]),
		Tenant:     binary.BigEndian.Uint64(b[24:]),
		ReadOnly:   b[32] == 1,
	}, nil
}

func (p Pointer) toProto() *pb.Pointer {
	return &pb.Pointer{ExtentId: p.Extent, Page: p.Page, Generation: p.Generation, Tenant: p.Tenant, ReadOnly: p.ReadOnly}
}

func pointerFromProto(p *pb.Pointer) Pointer {
	return Pointer{Extent: p.GetExtentId(), Page: p.GetPage(), Generation: p.GetGeneration(), Tenant: p.GetTenant(), ReadOnly: p.GetReadOnly()}
}

// Page is what a read returns: the page's contents and its slot, the raft
// index of the entry that last wrote it. A page never written (or whose
// block was freed since) is empty, standing for zeros, with slot 0.
type Page struct {
	Data []byte
	Slot uint64
}

// ElementKind says what one element of an MPSC does.
type ElementKind int

// Element kinds.
const (
	// KindWrite replaces a page if its slot is still Slot and its block's
	// ownership matches Ptr.
	KindWrite ElementKind = iota + 1
	// KindCheck changes nothing, but fails the MPSC unless the page's slot
	// is still Slot: a read in the transaction's read set.
	KindCheck
	// KindAllocate takes a free block for Tenant and returns its pointer
	// (with a new generation). With AnyBlock it takes the extent's lowest
	// free block; else the block whose first page is Ptr.Page, which must
	// be free at generation Ptr.Generation (as FreeBlocks listed it).
	KindAllocate
	// KindFree frees the block Ptr points to (its first page), whose
	// ownership must match; its generation moves on, so every pointer into
	// it goes stale, and its pages become empty.
	KindFree
)

func (k ElementKind) String() string {
	switch k {
	case KindWrite:
		return "write"
	case KindCheck:
		return "check"
	case KindAllocate:
		return "allocate"
	case KindFree:
		return "free"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Element is one element of a multi-page store-conditional. Build them
// with Write, Check, Allocate, AllocateBlock and Free.
type Element struct {
	Kind ElementKind
	Ptr  Pointer
	Slot uint64
	Data []byte
	// Delta, when set, is a write's new page as an edit script against the
	// page at Slot, and Data is unused (WriteDelta).
	Delta *PageDelta
	// Allocate only.
	Tenant   uint64
	AnyBlock bool
}

// Write replaces page p, read at slot, with data (at most the page size;
// a shorter page reads back as written). A page of a block allocated
// earlier in the same MPSC is written with slot 0.
func Write(p Pointer, slot uint64, data []byte) Element {
	return Element{Kind: KindWrite, Ptr: p, Slot: slot, Data: data}
}

// WriteDelta is Write with the new page given as an edit script against
// the page's bytes at slot (EncodeDelta). The extent rebuilds the page and
// refuses the MPSC with ErrDeltaMismatch, changing nothing, if it does not
// come out as d promises; the writer then sends the full image.
func WriteDelta(p Pointer, slot uint64, d PageDelta) Element {
	return Element{Kind: KindWrite, Ptr: p, Slot: slot, Delta: &d}
}

// Check requires page p to still be at slot.
func Check(p Pointer, slot uint64) Element { return Element{Kind: KindCheck, Ptr: p, Slot: slot} }

// Allocate takes the lowest free block of extent for tenant.
func Allocate(extent, tenant uint64) Element {
	return Element{Kind: KindAllocate, Ptr: Pointer{Extent: extent}, Tenant: tenant, AnyBlock: true}
}

// AllocateBlock takes block (a FreeBlock: extent, first page, current
// generation) for tenant.
func AllocateBlock(block FreeBlock, tenant uint64) Element {
	return Element{Kind: KindAllocate, Ptr: Pointer{Extent: block.Extent, Page: block.Page, Generation: block.Generation}, Tenant: tenant}
}

// Free frees the block that block points to.
func Free(block Pointer) Element { return Element{Kind: KindFree, Ptr: block} }

// extentOf is the extent an element acts on.
func (e Element) extentOf() uint64 { return e.Ptr.Extent }

func (e Element) toProto() *pb.Element {
	switch e.Kind {
	case KindWrite:
		if d := e.Delta; d != nil {
			return &pb.Element{Op: &pb.Element_WriteDelta{WriteDelta: &pb.DeltaWriteOp{
				Page: e.Ptr.toProto(), ExpectedSlot: e.Slot, Script: d.Script, Length: d.Length, Crc32C: d.CRC}}}
		}
		return &pb.Element{Op: &pb.Element_Write{Write: &pb.WriteOp{Page: e.Ptr.toProto(), ExpectedSlot: e.Slot, Data: e.Data}}}
	case KindCheck:
		return &pb.Element{Op: &pb.Element_Check{Check: &pb.CheckOp{Page: e.Ptr.toProto(), ExpectedSlot: e.Slot}}}
	case KindAllocate:
		op := &pb.AllocateOp{ExtentId: e.Ptr.Extent, Tenant: e.Tenant, AnyBlock: e.AnyBlock}
		if !e.AnyBlock {
			op.Block = e.Ptr.toProto()
		}
		return &pb.Element{Op: &pb.Element_Allocate{Allocate: op}}
	case KindFree:
		return &pb.Element{Op: &pb.Element_Free{Free: &pb.FreeOp{Block: e.Ptr.toProto()}}}
	}
	return &pb.Element{}
}

// FreeBlock is a block an extent reported free, with its current
// generation; AllocateBlock names it to take it.
type FreeBlock struct {
	Extent     uint64
	Page       uint64 // first page of the block
	Generation uint64
}

// Result is what one element of a successful MPSC produced.
type Result struct {
	// Slot is a written page's new slot. 0 means the reply that would have
	// carried it was lost after the commit (the commit did happen): read
	// the page to learn it.
	Slot uint64
	// Block is an allocated block's pointer.
	Block Pointer
}

func resultsFromProto(rs []*pb.ElementResult) []Result {
	out := make([]Result, len(rs))
	for i, r := range rs {
		out[i] = Result{Slot: r.GetSlot()}
		if r.GetBlock() != nil {
			out[i].Block = pointerFromProto(r.GetBlock())
		}
	}
	return out
}
