package extent

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Kind is the raftengine group kind of an extent (GroupDescriptor.Kind).
const Kind = "extent"

// Extent ids are raft group ids. The directory hands them out from
// FirstExtentID up; ids below are system groups (1 is the directory).
const (
	FirstExtentID uint64 = 1000
	// MaxExtentID keeps ids clear of the top of the uint64 range, so that
	// "id+1" never wraps in key spans.
	MaxExtentID uint64 = 1 << 62
)

// Geometry limits (FSS §3, Figure 4). Every geometry is validated against
// them when an extent is created and when its replica opens.
const (
	// MaxElements bounds the elements of one MPSC: FSS's 15 pages (block
	// allocations and frees count as elements too).
	MaxElements = 15
	// minPageSizeBytes and maxPageSizeBytes bound a page. The upper bound
	// keeps an MPSC of MaxElements full pages (plus framing) well inside the
	// replication engine's DefaultMaxCommandBytes (8 MiB): one MPSC is one
	// raft entry.
	minPageSizeBytes = 512
	maxPageSizeBytes = 256 << 10
	// maxBlockSizeBytes bounds a block, the unit of allocation.
	maxBlockSizeBytes = 64 << 20
	// maxExtentSizeBytes bounds an extent (pages are allocated lazily, so
	// this is an address space, not a reservation).
	maxExtentSizeBytes = 1 << 40
	// MaxReplication bounds an extent's raft group.
	MaxReplication = 7
)

// Default geometry of the extents a new cluster creates for itself.
const (
	DefaultPageSizeBytes   = 8 << 10
	DefaultBlockSizeBytes  = 256 << 10
	DefaultExtentSizeBytes = 1 << 30
	DefaultReplication     = 3
)

// Geometry is an extent's fixed shape: its page size, block size, extent
// size and replication factor. It never changes after creation.
type Geometry struct {
	PageSizeBytes   uint32
	BlockSizeBytes  uint32
	ExtentSizeBytes uint64
	Replication     uint32
}

// DefaultGeometry is 8 KiB pages in 256 KiB blocks, 1 GiB extents, 3
// replicas.
func DefaultGeometry() Geometry {
	return Geometry{
		PageSizeBytes:   DefaultPageSizeBytes,
		BlockSizeBytes:  DefaultBlockSizeBytes,
		ExtentSizeBytes: DefaultExtentSizeBytes,
		Replication:     DefaultReplication,
	}
}

// Validate checks g against the limits.
func (g Geometry) Validate() error {
	p, b, e := uint64(g.PageSizeBytes), uint64(g.BlockSizeBytes), g.ExtentSizeBytes
	switch {
	case p < minPageSizeBytes || p > maxPageSizeBytes || p&(p-1) != 0:
		return fmt.Errorf("page size %d: must be a power of two in [%d, %d]", p, minPageSizeBytes, maxPageSizeBytes)
	case b < p || b > maxBlockSizeBytes || b%p != 0:
		return fmt.Errorf("block size %d: must be a multiple of the page size %d, at most %d", b, p, maxBlockSizeBytes)
	case e < b || e > maxExtentSizeBytes || e%b != 0:
		return fmt.Errorf("extent size %d: must be a multiple of the block size %d, at most %d", e, b, uint64(maxExtentSizeBytes))
	case g.Replication < 1 || g.Replication > MaxReplication:
		return fmt.Errorf("replication %d: must be in [1, %d]", g.Replication, MaxReplication)
	}
	return nil
}

// PagesPerBlock is the number of pages in a block.
func (g Geometry) PagesPerBlock() uint64 { return uint64(g.BlockSizeBytes / g.PageSizeBytes) }

// Blocks is the number of blocks in the extent.
func (g Geometry) Blocks() uint64 { return g.ExtentSizeBytes / uint64(g.BlockSizeBytes) }

// Pages is the number of pages in the extent.
func (g Geometry) Pages() uint64 { return g.ExtentSizeBytes / uint64(g.PageSizeBytes) }

// BlockOf returns the block holding page.
func (g Geometry) BlockOf(page uint64) uint64 { return page / g.PagesPerBlock() }

// FirstPage returns the first page of block.
func (g Geometry) FirstPage(block uint64) uint64 { return block * g.PagesPerBlock() }

func (g Geometry) String() string {
	return fmt.Sprintf("%dB pages, %dB blocks, %dB extent, %d replicas", g.PageSizeBytes, g.BlockSizeBytes, g.ExtentSizeBytes, g.Replication)
}

func (g Geometry) toProto() *pb.Geometry {
	return &pb.Geometry{
		PageSizeBytes:   g.PageSizeBytes,
		BlockSizeBytes:  g.BlockSizeBytes,
		ExtentSizeBytes: g.ExtentSizeBytes,
		Replication:     g.Replication,
	}
}

func geometryFromProto(p *pb.Geometry) Geometry {
	return Geometry{
		PageSizeBytes:   p.GetPageSizeBytes(),
		BlockSizeBytes:  p.GetBlockSizeBytes(),
		ExtentSizeBytes: p.GetExtentSizeBytes(),
		Replication:     p.GetReplication(),
	}
}

// GroupDescriptor returns the raftengine descriptor of extent id with
// geometry g.
func GroupDescriptor(id uint64, g Geometry) (raftengine.GroupDescriptor, error) {
	if err := checkExtentID(id); err != nil {
		return raftengine.GroupDescriptor{}, err
	}
	if err := g.Validate(); err != nil {
		return raftengine.GroupDescriptor{}, err
	}
	params, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pb.GroupParams{Geometry: g.toProto()})
	if err != nil {
		return raftengine.GroupDescriptor{}, err
	}
	return raftengine.GroupDescriptor{GroupID: id, Kind: Kind, Params: params}, nil
}

// geometryOfDescriptor decodes and validates an extent group's descriptor.
func geometryOfDescriptor(desc raftengine.GroupDescriptor) (Geometry, error) {
	if desc.Kind != Kind {
		return Geometry{}, fmt.Errorf("extent: group %d has kind %q, not %q", desc.GroupID, desc.Kind, Kind)
	}
	if err := checkExtentID(desc.GroupID); err != nil {
		return Geometry{}, err
	}
	var p pb.GroupParams
	if err := proto.Unmarshal(desc.Params, &p); err != nil {
		return Geometry{}, fmt.Errorf("extent %d: decode params: %w", desc.GroupID, err)
	}
	if p.Geometry == nil {
		return Geometry{}, fmt.Errorf("extent %d: params carry no geometry", desc.GroupID)
	}
	g := geometryFromProto(p.Geometry)
	if err := g.Validate(); err != nil {
		return Geometry{}, fmt.Errorf("extent %d: %w", desc.GroupID, err)
	}
	return g, nil
}

func checkExtentID(id uint64) error {
	if id < FirstExtentID || id >= MaxExtentID {
		return fmt.Errorf("extent id %d: must be in [%d, %d)", id, FirstExtentID, MaxExtentID)
	}
	return nil
}

var errNoReader = errors.New("extent: replica not loaded yet")
