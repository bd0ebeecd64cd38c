package raftengine

import "encoding/binary"

// Key layout of the engine in the node's pebble DB. Every group owns two
// disjoint spans:
//
//	'r' gid 'h'            raft HardState
//	'r' gid 'l' index      raft log entry at index
//	'r' gid 't'            TruncatedState: the last index removed from the log
//	'r' gid 'T'            tombstone: highest term seen by a removed replica
//	'g' gid                GroupDescriptor
//	's' gid 0x00           AppliedState (index, term, conf state)
//	's' gid 0x01 key       state-machine data
//
// The applied state and the state machine's data share the 's' gid span on
// purpose: a snapshot replaces that whole span in one atomic ingest, so the
// data and the index it reflects can never disagree, even across a crash in
// the middle of an install. The raft log lives in the separate 'r' span and
// is never wiped by a snapshot (see snapshot.go for why that matters).
//
// Integers are big-endian so that keys sort numerically.
const (
	prefixRaft       = 'r'
	prefixDescriptor = 'g'
	prefixState      = 's'

	suffixHardState = 'h'
	suffixLog       = 'l'
	suffixTruncated = 't'
	suffixTombstone = 'T'

	stateApplied = 0x00
	stateData    = 0x01
)

func groupKey(prefix byte, gid uint64, extra int) []byte {
	k := make([]byte, 9, 9+extra)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], gid)
	return k
}

func hardStateKey(gid uint64) []byte { return append(groupKey(prefixRaft, gid, 1), suffixHardState) }
func truncatedKey(gid uint64) []byte { return append(groupKey(prefixRaft, gid, 1), suffixTruncated) }
func tombstoneKey(gid uint64) []byte { return append(groupKey(prefixRaft, gid, 1), suffixTombstone) }
func descriptorKey(gid uint64) []byte {
	return groupKey(prefixDescriptor, gid, 0)
}

func logKey(gid, index uint64) []byte {
	k := append(groupKey(prefixRaft, gid, 9), suffixLog)
	return binary.BigEndian.AppendUint64(k, index)
}

// logSpan is [first, end) of the log keys of gid.
func logSpan(gid uint64) (start, end []byte) {
	return append(groupKey(prefixRaft, gid, 1), suffixLog), append(groupKey(prefixRaft, gid, 1), suffixLog+1)
}

// raftSpan covers every 'r' key of gid.
func raftSpan(gid uint64) (start, end []byte) {
	return groupKey(prefixRaft, gid, 0), groupKey(prefixRaft, gid+1, 0)
}

func appliedKey(gid uint64) []byte { return append(groupKey(prefixState, gid, 1), stateApplied) }

// stateSpan covers the applied state and the data of gid: what a snapshot
// replaces.
func stateSpan(gid uint64) (start, end []byte) {
	return groupKey(prefixState, gid, 0), groupKey(prefixState, gid+1, 0)
}

// dataPrefix is the prefix of gid's state-machine keys.
func dataPrefix(gid uint64) []byte { return append(groupKey(prefixState, gid, 1), stateData) }

// prefixEnd returns the smallest key greater than every key with prefix p, or
// nil if there is none.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
