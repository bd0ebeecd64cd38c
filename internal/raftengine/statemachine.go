package raftengine

import "errors"

// ErrNotFound is returned by Reader.Get when the key has no value.
var ErrNotFound = errors.New("raftengine: key not found")

// StateMachine is the replicated state of one group. The engine calls its
// methods only from the group's worker, one call at a time, so an
// implementation needs locking only for state it also exposes to other
// goroutines (for example to serve reads).
//
// All durable state of a state machine lives in the key space the engine gives
// it (see Reader and Writer). That is what makes a replica restartable from
// disk and transferable by snapshot without the state machine's help: the
// engine persists the applied index in the same batch as the writes of the
// commands up to it, and a snapshot is a copy of that key space at one applied
// index.
type StateMachine interface {
	// Apply applies the command committed at index. Its writes go to w and
	// become durable atomically with the applied index. Apply must be
	// deterministic: the same state and command give the same writes and the
	// same result on every replica.
	//
	// The result is handed to the proposer if the proposal came from this
	// node; outcomes that are part of the contract (a stale epoch, a failed
	// condition) are results, not errors. A non-nil error means the replica
	// cannot continue (corruption); the engine stops the group.
	Apply(w Writer, index uint64, cmd []byte) (result any, err error)

	// Load (re)builds any in-memory state from r. It is called once when the
	// replica opens and again after a snapshot has replaced the key space.
	//
	// r reads the live key space and stays valid for the replica's life, so
	// a state machine may keep it to serve reads outside Apply (after
	// ReadIndex, for linearizable ones). Such reads see whole apply batches
	// and whole snapshot installs, never part of one.
	Load(r Reader) error
}

// Reader reads a state machine's key space. Keys are relative to the group;
// the engine adds and strips the group's prefix.
type Reader interface {
	// Get returns a copy of the value of key, or ErrNotFound.
	Get(key []byte) ([]byte, error)
	// Scan calls fn for each key in [start, end) in order; a nil end means
	// the end of the key space. The slices passed to fn are valid only during
	// the call. Scan stops at the first error fn returns and returns it.
	Scan(start, end []byte, fn func(key, value []byte) error) error
}

// Writer is the write side of Apply. Reads through a Writer see the writes
// made earlier in the same apply batch.
type Writer interface {
	Reader
	Set(key, value []byte) error
	Delete(key []byte) error
	// DeleteRange deletes the keys in [start, end); a nil end means the end
	// of the key space.
	DeleteRange(start, end []byte) error
}

// Factory builds the state machine of a group from its descriptor. It is
// called when a replica is created or reopened at start-up.
type Factory func(desc GroupDescriptor) (StateMachine, error)

// GroupDescriptor names a group and the kind of state machine it runs. It is
// fixed when the replica is created.
type GroupDescriptor struct {
	GroupID uint64
	// Kind selects the state machine, for example "directory" or "extent".
	Kind string
	// Params are kind-specific creation parameters (for example an
	// extent's geometry), opaque to the engine.
	Params []byte
}
