package fs

import "time"

// Limits. Each is checked before anything is written; input past one is
// refused with the errno POSIX names for it and changes nothing.
const (
	// MaxNameBytes bounds one name (NAME_MAX): ENAMETOOLONG past it.
	MaxNameBytes = 255
	// maxFileBytes bounds a file's size: writes and truncates past it get
	// EFBIG. 2^44 bytes (16 TiB) keeps offsets far from overflow and
	// block maps within what one file's blob can hold.
	maxFileBytes = 1 << 44
	// MaxFileBytes is maxFileBytes for clients, which check writes
	// before they buffer them.
	MaxFileBytes = maxFileBytes
	// maxSymlinkBytes bounds a symlink's target (PATH_MAX - 1).
	maxSymlinkBytes = 4095
	// maxInlineSymlinkBytes is the longest target kept in the inode; a
	// longer one is kept in symlinkChunkBytes chunks (B-tree values are at
	// most 4 KiB).
	maxInlineSymlinkBytes = 1024
	symlinkChunkBytes     = 2048
	// maxXattrsPerObject, maxXattrNameBytes and maxXattrValueBytes bound
	// extended attributes (a value must fit one B-tree value).
	maxXattrsPerObject = 128
	maxXattrNameBytes  = 255
	maxXattrValueBytes = 3 << 10
	// MaxInlineBytes bounds a file kept inline: a regular file no larger
	// keeps its bytes in the metadata, next to its inode, instead of a
	// tract (doc.go, Data). In linux-source-6.1, 48% of the files are at
	// most 3.5 KiB, 68% at most 8 KiB and 82% at most 16 KiB. Measured
	// (BENCHMARKS.md, small files inline up to 16 KiB): 8 KiB takes a
	// third of the tract-store calls off an untar at the cluster CPU of
	// 3.5 KiB; 16 KiB takes half of them off but costs 10% more CPU, its
	// bytes written again and again as 8 KiB page images of the metadata's
	// leaves (0.57 leaf splits per entry). So 8 KiB, three B-tree values;
	// the layout takes up to 16 KiB (five values, the first block),
	// worth raising to once commits carry key deltas instead of pages.
	MaxInlineBytes = 8 << 10
	// InlineChunkBytes is the most inline data one B-tree value holds
	// (a value holds 4 KiB with its key and version): the block pair
	// holds the first InlineChunkBytes, chunks (kindInline) the rest.
	InlineChunkBytes = 3584
	// maxInlineChunks is the most chunks an inline file has besides its
	// block pair.
	maxInlineChunks = (MaxInlineBytes - 1) / InlineChunkBytes
	// maxSnapshotNameBytes bounds a snapshot's name (as the directory).
	maxSnapshotNameBytes = 255
	// maxTractBytes bounds the data store's tract size (as the tract
	// store); minBlockBytes is the smallest block (FSS §4: small blocks
	// first). A cluster's tract size must be at least minBlockBytes.
	maxTractBytes = 32 << 20
	minBlockBytes = 16 << 10

	// blocksPerTxn bounds the block map pairs one transaction writes, so
	// that with the superblock, the inode, the record of tracts to free
	// and a metadata server's reply record it stays inside MaxTxnValues
	// (and inside a table owner's bound, MaxTxnValues less three).
	blocksPerTxn = 8
	// MaxTxnValues is the metadata store's bound on values per
	// transaction (FSS §5); the file system's transactions stay within it.
	MaxTxnValues = 15

	// maxRefreshes bounds how often one operation refreshes its cached
	// snapshot set because a snapshot was taken or deleted meanwhile.
	maxRefreshes = 32
	// maxTruncateAttempts bounds how often a truncate starts again after
	// another writer changed the boundary block.
	maxTruncateAttempts = 8
	// maxReadDirEntries bounds the entries one ReadDir call returns.
	maxReadDirEntries = 4096
	// maxScanBatch bounds the pairs held at once by walks over many keys.
	maxScanBatch = 512

	// SessionExpiry is how long a session record (a mount's, renewed by
	// RenewSession) stays valid without renewal; orphans held by an
	// expired session are reclaimed by any other.
	SessionExpiry = 2 * time.Minute
	// maxParallelTracts bounds the tract writes one call has in flight.
	maxParallelTracts = 16
)

// File type bits of a mode (stat(2)).
const (
	sIFMT   = 0o170000
	sIFSOCK = 0o140000
	sIFLNK  = 0o120000
	sIFREG  = 0o100000
	sIFBLK  = 0o060000
	sIFDIR  = 0o040000
	sIFCHR  = 0o020000
	sIFIFO  = 0o010000
	// permBits are the bits chmod may set.
	permBits = 0o7777
)
