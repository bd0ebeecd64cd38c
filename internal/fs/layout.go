package fs

import (
	"errors"
	"fmt"
	"math/bits"
)

// Layout is the child-closest assignment of directory ids (Ursa Minor
// §3.3), fixed per file system when it is formatted.
//
// A directory id D is 64 bits. Its top 2 bits name a region:
//
//	00 primary    Levels directory slots of SlotBits bits each, most
//	              significant first. The root is all zeros; a child copies
//	              its parent's slots and sets the next empty one to a
//	              value from its parent's counter (1, 2, ...).
//	01 too-deep   a directory that would be below the last level, or whose
//	              parent has used every slot value, becomes a new "root":
//	              slot 1 is a counter from the superblock, and its
//	              children grow below it as in the primary region.
//	10 too-wide   file ids for directories that ran out of them (below).
//	11 catch-all  everything else, numbered sequentially, when the regions
//	              above run out.
//
// So a directory's subtree (as created, before any rename) is the
// contiguous range SubtreeRange(D), and with the key schema (FSS §4:
// everything of an object is keyed under F, 1, D) it is a contiguous key
// range of the B-tree.
//
// Files are numbered within a directory id: the file segment C is a
// counter (1, 2, ...) in the directory's inode, below 2^FileBits. When a
// directory runs out, it takes over its next sibling's id if that sibling
// does not exist yet (its parent's counter has not reached it), keeping
// its files next to its own range; otherwise it gets an id of the too-wide
// region, where C may go up to 2^(FileBits+tooWideExtraBits); failing
// that, one of the catch-all region, where C is unbounded.
type Layout struct {
	SlotBits int
	Levels   int
	FileBits int
}

// DefaultLayout: 6 levels of 10-bit slots (1023 subdirectories per
// directory, 6 levels below the root before the too-deep region) and up
// to 2^24 files per directory id.
var DefaultLayout = Layout{SlotBits: 10, Levels: 6, FileBits: 24}

const (
	regionShift      = 62
	regionPrimary    = 0
	regionTooDeep    = 1
	regionTooWide    = 2
	regionCatchAll   = 3
	tooWideExtraBits = 16
	regionMask       = 1<<regionShift - 1
)

var errIDSpace = errors.New("fs: directory ids exhausted")

func (l Layout) validate() error {
	if l.SlotBits < 1 || l.Levels < 1 || l.SlotBits*l.Levels > regionShift {
		return fmt.Errorf("layout: %d levels of %d bits do not fit %d bits", l.Levels, l.SlotBits, regionShift)
	}
	if l.FileBits < 1 || l.FileBits+tooWideExtraBits > 62 {
		return fmt.Errorf("layout: %d file bits outside [1, %d]", l.FileBits, 62-tooWideExtraBits)
	}
	return nil
}

// Region returns the region of directory id d.
func Region(d uint64) int { return int(d >> regionShift) }

func (l Layout) slotShift(level int) int { return regionShift - level*l.SlotBits }

func (l Layout) slotMax() uint64 { return 1<<l.SlotBits - 1 }

// level is the number of slots d uses (0 for the primary root) in a
// hierarchical region.
func (l Layout) level(d uint64) int {
	low := d & regionMask
	if low == 0 {
		return 0
	}
	used := (regionShift - bits.TrailingZeros64(low) + l.SlotBits - 1) / l.SlotBits
	return min(used, l.Levels)
}

// slot returns d's value at level (1-based).
func (l Layout) slot(d uint64, level int) uint64 {
	return (d >> l.slotShift(level)) & l.slotMax()
}

// hierarchical reports whether d's region assigns children below it.
func hierarchical(d uint64) bool {
	r := Region(d)
	return r == regionPrimary || r == regionTooDeep
}

// SubtreeRange returns [lo, hi) holding the ids of every directory
// created below d in its region, d included (hi = 0 means 2^64).
func (l Layout) SubtreeRange(d uint64) (lo, hi uint64) {
	if !hierarchical(d) {
		return d, d + 1
	}
	lv := l.level(d)
	if lv >= l.Levels {
		return d, d + 1
	}
	span := uint64(1) << l.slotShift(lv)
	return d, d + span
}

// childDir returns the id of the directory that takes slot value v under
// parent, or ok=false if it must go to an overflow region (parent too
// deep, or v past the slot's range).
func (l Layout) childDir(parent uint64, v uint64) (uint64, bool) {
	if !hierarchical(parent) || v == 0 || v > l.slotMax() {
		return 0, false
	}
	lv := l.level(parent)
	if lv >= l.Levels {
		return 0, false
	}
	return parent | v<<l.slotShift(lv+1), true
}

// tooDeepRoot is the k-th root of the too-deep region (k >= 1).
func (l Layout) tooDeepRoot(k uint64) (uint64, bool) {
	if k == 0 || k > l.slotMax() {
		return 0, false
	}
	return regionTooDeep<<regionShift | k<<l.slotShift(1), true
}

func tooWideID(k uint64) (uint64, bool) {
	if k == 0 || k > regionMask {
		return 0, false
	}
	return regionTooWide<<regionShift | k, true
}

func catchAllID(k uint64) (uint64, bool) {
	if k == 0 || k > regionMask {
		return 0, false
	}
	return regionCatchAll<<regionShift | k, true
}

// fileLimit is one more than the largest file id C under directory id d.
func (l Layout) fileLimit(d uint64) uint64 {
	switch Region(d) {
	case regionTooWide:
		return 1 << (l.FileBits + tooWideExtraBits)
	case regionCatchAll:
		return 1 << 62
	default:
		return 1 << l.FileBits
	}
}

// sibling returns the id of d's next sibling (slot value + 1 at d's
// level), the one a full directory takes over if it is still unused.
func (l Layout) sibling(d uint64) (next uint64, value uint64, ok bool) {
	if !hierarchical(d) {
		return 0, 0, false
	}
	lv := l.level(d)
	if lv == 0 {
		return 0, 0, false
	}
	v := l.slot(d, lv)
	if v >= l.slotMax() {
		return 0, 0, false
	}
	shift := l.slotShift(lv)
	return d&^(l.slotMax()<<shift) | (v+1)<<shift, v + 1, true
}
