package fs

import "math/bits"

// Block layout (FSS §4, multiple block sizes): the first blocks of a file
// are small and they grow with the offset, so a small file wastes little
// and a large one has few block map pairs. Blocks are aligned and their
// boundaries depend on the offset only:
//
//	[0, 4·min)            blocks of min (16 KiB)
//	[2^k, 2^(k+1)), 2^k >= 4·min: blocks of 2^(k-2), at most the tract size
//
// so a block at offset o is at most a quarter of o (and of any file that
// reaches it): with the tract store's short tracts costing only their
// length, a block's unused tail costs nothing anyway.

// blockAt returns the start and size of the block holding offset off, for
// a data store whose largest power-of-two tract size is maxBlock.
func blockAt(off, maxBlock uint64) (start, size uint64) {
	if off < 4*minBlockBytes {
		size = minBlockBytes
	} else {
		k := 63 - bits.LeadingZeros64(off)
		size = min(uint64(1)<<(k-2), maxBlock)
	}
	return off &^ (size - 1), size
}

// pow2Floor returns the largest power of two not above n (n >= 1).
func pow2Floor(n uint64) uint64 { return 1 << (63 - bits.LeadingZeros64(n)) }

// blocksIn returns the starts and sizes of the blocks overlapping
// [off, off+n).
func blocksIn(off, n, maxBlock uint64) (starts, sizes []uint64) {
	end := off + n
	for o := off; o < end; {
		s, sz := blockAt(o, maxBlock)
		starts = append(starts, s)
		sizes = append(sizes, sz)
		o = s + sz
	}
	return starts, sizes
}
