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
	// maxSnapshotNameBytes bounds a snapshot's name (as the directory).
	maxSnapshotNameBytes = 255
	// maxTractBytes bounds the data store's tract size (as the tract
	// store); minBlockBytes is the smallest block (FSS §4: small blocks
	// first). A cluster's tract size must be at least minBlockBytes.
	maxTractBytes = 32 << 20
	minBlockBytes = 16 << 10

	// blocksPerTxn bounds the block map pairs one transaction writes, with
	// the superblock and the inode well inside MaxTxnValues.
	blocksPerTxn = 10
	// MaxTxnValues is the metadata store's bound on values per
	// transaction (FSS §5); the file system's transactions stay within it.
	MaxTxnValues = 15

	// maxRefreshes bounds how often one operation refreshes its cached
	// snapshot set because a snapshot was taken or deleted meanwhile.
	maxRefreshes = 32
	// maxStaleReads bounds how often a read retries after finding a tract
	// that was replaced under it.
	maxStaleReads = 4
	// maxReadDirEntries bounds the entries one ReadDir call returns.
	maxReadDirEntries = 4096
	// maxScanBatch bounds the pairs held at once by walks over many keys.
	maxScanBatch = 512

	// Defaults of Config (see there).
	defaultMaxDirtyBytesPerFile = 64 << 20
	defaultMaxDirtyBytes        = 256 << 20
	defaultTractCacheBytes      = 128 << 20
	defaultSessionInterval      = 20 * time.Second
	// sessionExpiry is how long a mount's session record stays valid
	// without renewal; orphans held by an expired mount are reclaimed by
	// any other.
	sessionExpiry = 2 * time.Minute
	// maxParallelTracts bounds the tract reads or writes one call has in
	// flight.
	maxParallelTracts = 16
	// defaultPrefetchTimeout bounds a read-ahead.
	defaultPrefetchTimeout = 30 * time.Second
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
