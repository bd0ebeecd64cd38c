package raftengine

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// maxTailEntries bounds the in-memory copy of the newest log entries, which
// serves most of raft's Entries and Term calls without touching pebble.
const maxTailEntries = 1024

// logStore is one group's raft.Storage over the node's pebble DB. It is used
// only from the group's worker (raft calls it from inside RawNode methods),
// so it needs no locking.
//
// Invariant: entries (truncIndex, lastIndex] are present in pebble; the tail
// cache holds a contiguous suffix of them.
type logStore struct {
	gid uint64
	db  *pebble.DB

	hardState  *raftpb.HardState
	confState  *raftpb.ConfState // as of the applied index
	truncIndex uint64
	truncTerm  uint64
	lastIndex  uint64
	lastTerm   uint64
	// logBytes estimates the encoded size of the entries in the log.
	logBytes uint64

	tail []*raftpb.Entry // tail[i].Index == tail[0].Index + i; last is lastIndex
}

var _ raft.Storage = (*logStore)(nil)

// loadLogStore reads a group's raft state, repairing the one inconsistency a
// crash can leave: a snapshot ingested (applied state ahead of the log) but
// the log not yet reset to it. The repair is exactly what the interrupted
// step would have done, so no acknowledged entry is lost: the snapshot covers
// every entry up to its index.
func loadLogStore(db *pebble.DB, gid uint64, applied *enginepb.AppliedState) (*logStore, error) {
	s := &logStore{gid: gid, db: db, hardState: &raftpb.HardState{}}
	if err := getProto(db, hardStateKey(gid), s.hardState); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("load hard state: %w", err)
	}
	var trunc enginepb.TruncatedState
	if err := getProto(db, truncatedKey(gid), &trunc); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("load truncated state: %w", err)
	}
	s.truncIndex, s.truncTerm = trunc.GetIndex(), trunc.GetTerm()
	s.lastIndex, s.lastTerm = s.truncIndex, s.truncTerm

	start, end := logSpan(gid)
	iter, err := db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return nil, err
	}
	if iter.Last() {
		var e raftpb.Entry
		if err := proto.Unmarshal(iter.Value(), &e); err != nil {
			_ = iter.Close()
			return nil, fmt.Errorf("decode last log entry: %w", err)
		}
		s.lastIndex, s.lastTerm = e.GetIndex(), e.GetTerm()
		// Rough size estimate; refined as the log turns over.
		s.logBytes = (s.lastIndex - s.truncIndex) * uint64(len(iter.Value()))
	}
	if err := iter.Close(); err != nil {
		return nil, err
	}

	s.confState = &raftpb.ConfState{}
	if len(applied.GetConfState()) > 0 {
		if err := proto.Unmarshal(applied.GetConfState(), s.confState); err != nil {
			return nil, fmt.Errorf("decode conf state: %w", err)
		}
	}

	if a := applied.GetIndex(); a > s.truncIndex {
		t, err := s.Term(a)
		if err != nil || t != applied.GetTerm() {
			b := db.NewBatch()
			defer b.Close()
			s.resetTo(b, a, applied.GetTerm())
			if err := b.Commit(pebble.Sync); err != nil {
				return nil, fmt.Errorf("finish interrupted snapshot: %w", err)
			}
		}
	}
	return s, nil
}

// InitialState implements raft.Storage.
func (s *logStore) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	return proto.CloneOf(s.hardState), proto.CloneOf(s.confState), nil
}

// FirstIndex implements raft.Storage.
func (s *logStore) FirstIndex() (uint64, error) { return s.truncIndex + 1, nil }

// LastIndex implements raft.Storage.
func (s *logStore) LastIndex() (uint64, error) { return s.lastIndex, nil }

// Term implements raft.Storage.
func (s *logStore) Term(i uint64) (uint64, error) {
	switch {
	case i == s.truncIndex:
		return s.truncTerm, nil
	case i < s.truncIndex:
		return 0, raft.ErrCompacted
	case i > s.lastIndex:
		return 0, raft.ErrUnavailable
	case i == s.lastIndex:
		return s.lastTerm, nil
	}
	if e := s.tailEntry(i); e != nil {
		return e.GetTerm(), nil
	}
	var e raftpb.Entry
	if err := getProto(s.db, logKey(s.gid, i), &e); err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return 0, raft.ErrUnavailable
		}
		return 0, err
	}
	return e.GetTerm(), nil
}

// Entries implements raft.Storage: the entries in [lo, hi), at most maxSize
// bytes but at least one. The returned slice is freshly allocated; the
// entries are shared and must not be mutated (raft's contract).
func (s *logStore) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	if lo <= s.truncIndex {
		return nil, raft.ErrCompacted
	}
	if hi > s.lastIndex+1 {
		return nil, fmt.Errorf("raftengine: entries [%d, %d) beyond last index %d", lo, hi, s.lastIndex)
	}
	if lo >= hi {
		return nil, nil
	}
	var out []*raftpb.Entry
	var size uint64
	add := func(e *raftpb.Entry) bool {
		sz := uint64(proto.Size(e))
		if len(out) > 0 && size+sz > maxSize {
			return false
		}
		out = append(out, e)
		size += sz
		return true
	}
	if len(s.tail) > 0 && lo >= s.tail[0].GetIndex() {
		for i := lo; i < hi; i++ {
			if !add(s.tail[i-s.tail[0].GetIndex()]) {
				break
			}
		}
		return out, nil
	}
	iter, err := s.db.NewIter(&pebble.IterOptions{LowerBound: logKey(s.gid, lo), UpperBound: logKey(s.gid, hi)})
	if err != nil {
		return nil, err
	}
	defer iter.Close()
	want := lo
	for valid := iter.First(); valid && want < hi; valid = iter.Next() {
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(iter.Value(), e); err != nil {
			return nil, fmt.Errorf("decode log entry: %w", err)
		}
		if e.GetIndex() != want {
			return nil, raft.ErrUnavailable
		}
		if !add(e) {
			return out, nil
		}
		want++
	}
	if err := iter.Error(); err != nil {
		return nil, err
	}
	if want != hi {
		return nil, raft.ErrUnavailable
	}
	return out, nil
}

// Snapshot implements raft.Storage. The engine never sends the snapshot raft
// builds from this: it intercepts MsgSnap and streams the state machine's
// key span at its current applied index instead (snapshot.go), which is
// always at or past the truncation point returned here.
func (s *logStore) Snapshot() (*raftpb.Snapshot, error) {
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index:     proto.Uint64(s.truncIndex),
		Term:      proto.Uint64(s.truncTerm),
		ConfState: proto.CloneOf(s.confState),
	}}, nil
}

func (s *logStore) tailEntry(i uint64) *raftpb.Entry {
	if len(s.tail) == 0 || i < s.tail[0].GetIndex() || i > s.lastIndex {
		return nil
	}
	return s.tail[i-s.tail[0].GetIndex()]
}

// append writes entries to b, deleting any entries past the new end that a
// new leader has overwritten. Call commitAppend after b is committed. b may
// be shared with other groups (a round's batch): append encodes every entry
// before writing any, so that an error leaves nothing of this group in b.
func (s *logStore) append(b *pebble.Batch, entries []*raftpb.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	vals := make([][]byte, len(entries))
	var size uint64
	for i, e := range entries {
		v, err := proto.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode log entry: %w", err)
		}
		vals[i] = v
		size += uint64(len(v))
	}
	newLast := entries[len(entries)-1].GetIndex()
	if newLast < s.lastIndex {
		if err := b.DeleteRange(logKey(s.gid, newLast+1), logKey(s.gid, s.lastIndex+1), nil); err != nil {
			return err
		}
	}
	for i, e := range entries {
		if err := b.Set(logKey(s.gid, e.GetIndex()), vals[i], nil); err != nil {
			return err
		}
	}
	s.logBytes += size
	return nil
}

// commitAppend updates the in-memory view after append's batch is durable.
func (s *logStore) commitAppend(entries []*raftpb.Entry) {
	if len(entries) == 0 {
		return
	}
	first := entries[0].GetIndex()
	last := entries[len(entries)-1]
	s.lastIndex, s.lastTerm = last.GetIndex(), last.GetTerm()
	if len(s.tail) > 0 && first > s.tail[0].GetIndex() && first <= s.tail[len(s.tail)-1].GetIndex()+1 {
		s.tail = append(s.tail[:first-s.tail[0].GetIndex()], entries...)
	} else {
		s.tail = append([]*raftpb.Entry(nil), entries...)
	}
	if n := len(s.tail); n > maxTailEntries {
		s.tail = append([]*raftpb.Entry(nil), s.tail[n-maxTailEntries:]...)
	}
}

func (s *logStore) setHardState(b *pebble.Batch, hs *raftpb.HardState) error {
	v, err := proto.Marshal(hs)
	if err != nil {
		return err
	}
	if err := b.Set(hardStateKey(s.gid), v, nil); err != nil {
		return err
	}
	s.hardState = proto.CloneOf(hs)
	return nil
}

// truncate removes entries up to and including index from the log.
func (s *logStore) truncate(b *pebble.Batch, index uint64) error {
	if index <= s.truncIndex || index > s.lastIndex {
		return nil
	}
	term, err := s.Term(index)
	if err != nil {
		return err
	}
	start, _ := logSpan(s.gid)
	if err := b.DeleteRange(start, logKey(s.gid, index+1), nil); err != nil {
		return err
	}
	if err := setProto(b, truncatedKey(s.gid), &enginepb.TruncatedState{Index: index, Term: term}); err != nil {
		return err
	}
	if n := s.lastIndex - s.truncIndex; n > 0 {
		s.logBytes = s.logBytes * (s.lastIndex - index) / n
	}
	s.truncIndex, s.truncTerm = index, term
	for len(s.tail) > 0 && s.tail[0].GetIndex() <= index {
		s.tail = s.tail[1:]
	}
	return nil
}

// resetTo makes the log empty, starting after (index, term): what installing
// a snapshot at that position does to the log.
func (s *logStore) resetTo(b *pebble.Batch, index, term uint64) {
	start, end := logSpan(s.gid)
	_ = b.DeleteRange(start, end, nil)
	_ = setProto(b, truncatedKey(s.gid), &enginepb.TruncatedState{Index: index, Term: term})
	if s.hardState.GetCommit() < index {
		hs := proto.CloneOf(s.hardState)
		hs.Commit = proto.Uint64(index)
		if hs.GetTerm() < term {
			hs.Term = proto.Uint64(term)
		}
		_ = s.setHardState(b, hs)
	}
	s.truncIndex, s.truncTerm = index, term
	s.lastIndex, s.lastTerm = index, term
	s.logBytes = 0
	s.tail = nil
}

// getter is what pebble's DB, Batch and Snapshot have in common for reads.
type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

func getProto(r getter, key []byte, m proto.Message) error {
	v, closer, err := r.Get(key)
	if err != nil {
		return err
	}
	defer closer.Close()
	return proto.Unmarshal(v, m)
}

func setProto(b *pebble.Batch, key []byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Set(key, v, nil)
}
