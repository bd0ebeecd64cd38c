package directory

import "time"

// Identity of the directory group in the replication engine.
const (
	// GroupID is the Raft group id of the directory. Ids below
	// firstExtentID are reserved for such system groups.
	GroupID uint64 = 1
	// Kind is the state machine kind of the directory group
	// (raftengine.GroupDescriptor.Kind).
	Kind = "directory"
)

// DefaultTractSizeBytes is the tract size a cluster gets when its creator
// names none (DESIGN.md §2.3).
const DefaultTractSizeBytes = 4 << 20

// Limits on the directory's state. Every command is validated against them
// before it changes anything; a command that would break one is refused with
// INVALID_ARGUMENT (a field) or LIMIT_EXCEEDED (a table).
const (
	// maxCommandBytes bounds an encoded command; DecodeCommand refuses more.
	// It covers an InstallTLT of maxTLTRows rows.
	maxCommandBytes = 8 << 20

	maxClusterIDBytes = 64
	minTractSizeBytes = 64 << 10
	maxTractSizeBytes = 64 << 20

	maxNodes              = 4096
	maxAddressBytes       = 256
	maxFailureDomainBytes = 128
	maxDisksPerNode       = 64
	maxDiskPathBytes      = 1024
	maxRolesPerNode       = 16
	maxRoleBytes          = 32

	// maxReplication bounds the TLT's k (FDS §3.3).
	maxReplication = 8
	// maxTLTRows bounds the table: all pairs of 362 disks fit.
	maxTLTRows = 1 << 16
	// maxRowUpdates bounds the rows one UpdateTLTRows changes.
	maxRowUpdates = 4096

	maxExtents         = 1 << 20
	minPageSizeBytes   = 512
	maxPageSizeBytes   = 1 << 20
	maxBlockSizeBytes  = 64 << 20
	maxExtentSizeBytes = 1 << 40
	// maxExtentReplicas bounds an extent's Raft group.
	maxExtentReplicas = 7
	// firstExtentID is the first extent id; extent ids are also Raft group
	// ids, and the ones below are reserved (GroupID).
	firstExtentID = 1000

	maxDelegations = 1 << 16
	// maxRenewals bounds the leases one RenewDelegations renews.
	maxRenewals      = 4096
	maxTableKeyBytes = 1024

	maxFileSystems            = 4096
	maxSnapshotsPerFileSystem = 1024
	maxSnapshotNameBytes      = 255

	maxLeases         = 1 << 14
	maxLeaseNameBytes = 256
	minLeaseDuration  = 100 * time.Millisecond
	maxLeaseDuration  = 10 * time.Minute

	maxConfigEntries    = 1 << 14
	maxConfigKeyBytes   = 512
	maxConfigValueBytes = 64 << 10

	// maxListEntries and maxListResponseBytes bound one page of a list
	// RPC (gRPC's default message limit is 4 MiB).
	maxListEntries       = 1000
	maxListResponseBytes = 2 << 20
)

// LeaseSafetyMargin is the least a lease holder subtracts from a lease's
// duration before it stops acting on it, to cover clock drift and scheduling
// delays between its clock and the directory's (see the package doc).
const LeaseSafetyMargin = 500 * time.Millisecond

// HolderDeadline is when a holder must stop acting on a lease granted or
// renewed for durationMs by a request it sent at sent (on its own clock).
func HolderDeadline(sent time.Time, durationMs int64) time.Time {
	return sent.Add(time.Duration(durationMs)*time.Millisecond - LeaseSafetyMargin)
}

// MaxFileSystemNameBytes bounds a file system's name (the metadata service
// checks names against it before they reach the directory).
const MaxFileSystemNameBytes = 255

// maxDataLayoutBytes bounds a file system's data layout ("ec:5+2",
// "replicas:3"; the metadata service parses it).
const maxDataLayoutBytes = 32
