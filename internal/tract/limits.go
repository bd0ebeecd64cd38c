package tract

import "time"

// Limits of the tract store. Every request is checked against them before
// it changes anything; one that breaks a limit is refused with
// INVALID_ARGUMENT.
const (
	// minTractSizeBytes and maxTractSizeBytes bound the cluster's tract
	// size (DESIGN §2.3: 64 KiB minimum). The upper bound keeps a whole
	// tract, with its header, inside one gRPC message (64 MiB).
	minTractSizeBytes = 64 << 10
	maxTractSizeBytes = 32 << 20
	// DefaultTractSizeBytes is the tract size of a cluster whose creator
	// names none (DESIGN §2.3).
	DefaultTractSizeBytes = 4 << 20

	// maxReplication bounds the TLT's slots per row and a blob's
	// replication (the directory's limit).
	maxReplication = 8
	// DefaultReplication is the TLT's k when none is configured.
	DefaultReplication = 3
	// DefaultMinRows is the least number of rows the manager builds: the
	// all-pairs rows are repeated (each time in a new order) up to it, so
	// that a small cluster's slots divide evenly, growth moves data in
	// small steps and a failure is recovered by many rows in parallel.
	DefaultMinRows = 64
	// maxTLTRows bounds the table (the directory's limit).
	maxTLTRows = 1 << 16
	// maxRowUpdates bounds one UpdateTLTRows (the directory's limit).
	maxRowUpdates = 4096

	// maxBlobTracts bounds a blob's length.
	maxBlobTracts = 1 << 40
	// maxExtendTracts bounds one extend.
	maxExtendTracts = 1 << 30
	// maxBlobMetas bounds the blobs of one BlobMetas call.
	maxBlobMetas = 4096
	// maxRequestIDBytes bounds a blob operation's request id.
	maxRequestIDBytes = 32
	// recentRequests is how many mutations a blob remembers for retries.
	recentRequests = 16

	// maxListEntries bounds one page of ListRow and ListBlobs.
	maxListEntries = 4096
	// maxSimultaneous bounds the simultaneous limit a client reports.
	maxSimultaneous = 256
)

// Timing defaults (each can be changed in Config or ClientConfig).
const (
	// defaultTLTPoll is how often a tractserver fetches the TLT.
	defaultTLTPoll = 500 * time.Millisecond
	// defaultTLTValidity is how long a tractserver acts on a TLT after the
	// fetch that returned it was sent; past it, it refuses requests until
	// it reaches the directory again. It must be shorter than the
	// directory's dead timeout, so a server cut off from the directory stops
	// serving before it can be replaced.
	defaultTLTValidity = 5 * time.Second
	// defaultRPCTimeout bounds one call between tractservers.
	defaultRPCTimeout = 30 * time.Second
	// defaultSyncParallelism is how many rows a tractserver catches up at
	// once, and defaultFetchParallelism how many tracts per row it copies
	// at once.
	defaultSyncParallelism  = 8
	defaultFetchParallelism = 4
	// defaultDropGrace is how long a tractserver keeps the tracts of a row
	// it was removed from while serving (a commit of growth); the data is
	// useless once clients have the new table.
	defaultDropGrace = 10 * time.Second
	// defaultReturnGrace is how long it keeps the tracts of rows it finds
	// itself out of after a restart or an absence: the TLT manager may give
	// those rows back, and then only the missed writes are copied.
	defaultReturnGrace = 5 * time.Minute
	// defaultScrubInterval is how often the scrubber reclaims garbage, and
	// defaultVerifyInterval how often it also re-reads every tract to check
	// its checksum.
	defaultScrubInterval  = time.Minute
	defaultVerifyInterval = time.Hour
	// defaultOrphanGrace is how old a tract of a deleted (or never
	// created) blob must be before the scrubber reclaims it.
	defaultOrphanGrace = 10 * time.Second
	// defaultTornStripeGrace is twice the client's attempt timeout: a
	// stripe write in progress rewrites every shard within one attempt.
	defaultTornStripeGrace = 2 * defaultAttemptTimeout
)

// DefaultEmbedBytes is the largest tract kept in the database with its
// record rather than in a file (Config.EmbedBytes): most files of a source
// tree fit, and one synced database write costs less than creating and
// syncing a file and then its record.
const DefaultEmbedBytes = 64 << 10
