package raftengine

import (
	"errors"
	"fmt"
)

var (
	// ErrGroupNotFound means this node holds no replica of the group.
	ErrGroupNotFound = errors.New("raftengine: group not found on this node")
	// ErrGroupExists is returned when creating a replica that already exists.
	ErrGroupExists = errors.New("raftengine: group already exists on this node")
	// ErrProposalDropped means the proposal was not committed and never will
	// be: raft dropped it, or another leader overwrote its log position. The
	// caller may retry.
	ErrProposalDropped = errors.New("raftengine: proposal dropped")
	// ErrStopped is returned once the engine or the group has shut down.
	ErrStopped = errors.New("raftengine: stopped")
	// ErrTooLarge is returned for a command above MaxCommandBytes.
	ErrTooLarge = errors.New("raftengine: command too large")
)

// NotLeaderError is returned by calls that only the leader serves (Propose,
// ReadIndex, membership changes) when this replica is not the leader. Leader
// is the replica's best guess of the current leader, or 0 if it knows none.
type NotLeaderError struct {
	GroupID uint64
	Leader  uint64
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return fmt.Sprintf("raftengine: group %d: not leader, leader unknown", e.GroupID)
	}
	return fmt.Sprintf("raftengine: group %d: not leader, leader is node %d", e.GroupID, e.Leader)
}

// IsNotLeader reports whether err is a NotLeaderError, and returns it.
func IsNotLeader(err error) (*NotLeaderError, bool) {
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		return nl, true
	}
	return nil, false
}
