package raftengine

import (
	"context"

	"go.etcd.io/raft/v3/raftpb"
)

// Transport moves raft traffic between the engines of different nodes. Two
// implementations exist: GRPCTransport for real processes and LocalNetwork
// for tests in one process.
//
// Delivery is best effort, as raft expects: messages may be lost, delayed or
// duplicated, never corrupted.
type Transport interface {
	// Listen installs the handler for incoming traffic. The engine calls it
	// once, before any Send.
	Listen(h Handler)
	// Send queues envs for node to and returns at once; it never blocks on
	// the network. If the queue to that node is full the messages are
	// dropped and raft retransmits. An empty envs is a keepalive: it tells
	// the peer this node is up, which keeps quiesced groups asleep.
	Send(to uint64, envs []Envelope)
	// SendSnapshot streams a snapshot to node to and reports whether the
	// receiver installed it.
	SendSnapshot(ctx context.Context, to uint64, snap OutgoingSnapshot) (applied bool, err error)
}

// Handler receives incoming traffic; the Engine implements it.
type Handler interface {
	// HandleMessages delivers messages from node from. It must not block.
	HandleMessages(from uint64, envs []Envelope)
	// HandleSnapshot receives a snapshot; next returns successive chunks of
	// pairs and io.EOF after the last.
	HandleSnapshot(ctx context.Context, header SnapshotHeader, next func() ([]KV, error)) (applied bool, err error)
}

// Envelope is one raft message of one group.
type Envelope struct {
	GroupID uint64
	Message *raftpb.Message
	// Quiesce marks the heartbeat with which a leader puts an idle group to
	// sleep (see quiesce.go).
	Quiesce bool
}

// KV is one state-machine pair in a snapshot; keys are group-relative.
type KV struct {
	Key, Value []byte
}

// SnapshotHeader describes a snapshot: the state of a group's state machine
// as of applied index Index.
type SnapshotHeader struct {
	GroupID uint64
	From    uint64
	To      uint64
	// Index and Term identify the last entry the snapshot reflects.
	Index, Term uint64
	// MessageTerm is the sender's raft term when it captured the snapshot.
	MessageTerm uint64
	ConfState   *raftpb.ConfState
	Descriptor  GroupDescriptor
}

// OutgoingSnapshot is a snapshot being sent.
type OutgoingSnapshot interface {
	Header() SnapshotHeader
	// Next returns the next chunk of pairs, and io.EOF after the last.
	Next() ([]KV, error)
	// Close releases the snapshot; it is safe to call more than once.
	Close() error
}
