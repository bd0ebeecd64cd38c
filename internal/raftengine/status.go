package raftengine

import "go.etcd.io/raft/v3/raftpb"

// GroupStatus is a point-in-time view of one local replica.
type GroupStatus struct {
	GroupID uint64
	NodeID  uint64
	Kind    string
	// Leader is the node this replica believes leads the group (0: none).
	Leader   uint64
	Term     uint64
	Commit   uint64
	Applied  uint64
	Voters   []uint64
	Learners []uint64
	// Quiesced is true while the group is idle and not ticking.
	Quiesced bool
	// LogStart is the first index still in this replica's log; a replica
	// that needs an earlier one is sent a snapshot. LastIndex is the last
	// index in it, persisted, and LastTerm that entry's term: with it, how
	// up to date the replica is (raft's election rule; RecoverAlone).
	LogStart, LastIndex, LastTerm uint64
	// Progress is the leader's view of each replica's match index; empty
	// on followers.
	Progress map[uint64]ReplicaProgress

	confState *raftpb.ConfState // to notice membership changes cheaply
}

// ReplicaProgress is the leader's view of one replica.
type ReplicaProgress struct {
	Match        uint64
	RecentActive bool
	// Snapshot is true while the replica is being sent a snapshot.
	Snapshot bool
}

// IsLeader reports whether the local replica is the leader.
func (s GroupStatus) IsLeader() bool { return s.Leader != 0 && s.Leader == s.NodeID }

// Metrics is a snapshot of engine-wide counters, exported at the edge (the
// server turns it into Prometheus metrics).
type Metrics struct {
	// Groups is the number of local replicas; Leaders how many of them lead.
	Groups, Leaders, Quiesced int
	// Proposals counts proposals accepted by local leaders; Applied counts
	// committed entries applied by local replicas.
	Proposals, ProposalsDropped, Applied uint64
	// ReadyBatches counts processed raft Ready structs, and SyncedReadies
	// those that had to be durable before their messages went out (new
	// entries, a new term or vote, a snapshot).
	ReadyBatches, SyncedReadies uint64
	// SyncedWrites counts synced pebble commits of raft state: one per
	// scheduler round that needed one (RoundSyncs), plus the few made
	// outside rounds (log truncations, installed snapshots).
	// SyncedReadies / RoundSyncs is how many Readies share one fsync.
	SyncedWrites, RoundSyncs uint64
	// Rounds counts scheduler rounds that persisted at least one Ready.
	Rounds uint64
	// MessagesSent and MessagesReceived count raft messages through the
	// transport; MessagesDropped those the transport could not queue.
	MessagesSent, MessagesReceived, MessagesDropped uint64
	// SnapshotsSent and SnapshotsApplied count snapshot transfers;
	// SnapshotBytesSent their payload.
	SnapshotsSent, SnapshotsApplied, SnapshotBytesSent uint64
	// LeaderChanges counts leader changes observed by local replicas.
	LeaderChanges uint64
	// LeaseReads counts reads answered from a leader's lease, ReadRounds
	// those that took (or renewed the lease with) a heartbeat round.
	LeaseReads, ReadRounds uint64
}
