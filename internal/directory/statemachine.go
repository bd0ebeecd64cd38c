package directory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// StateMachine is the directory's replicated state (raftengine kind
// "directory"). The engine drives Apply and Load from the group's worker;
// any goroutine may read through the exported getters, which see the state
// as of the last applied command (linearizable only after a ReadIndex).
type StateMachine struct {
	mu sync.RWMutex
	st state
	// requestsPruned: every request index key below it is deleted
	// (rememberRequest). Only Apply and Load touch it. Scanning from it
	// instead of the prefix keeps each apply from walking the tombstones
	// of every request pruned since the last compaction.
	requestsPruned uint64
}

var _ raftengine.StateMachine = (*StateMachine)(nil)

// NewStateMachine returns an empty directory state machine. The engine's
// factory returns it for GroupDescriptor.Kind == Kind; the Service reads the
// same instance.
func NewStateMachine() *StateMachine {
	sm := &StateMachine{}
	sm.st.reset()
	return sm
}

// state is the in-memory mirror of the key space. Its messages are never
// modified once stored: a change replaces the pointer, so getters can clone
// outside the write path's critical section without tearing.
type state struct {
	cluster     *pb.ClusterInfo
	clockUnixMs int64
	counters    *pb.Counters
	nodes       map[uint64]*pb.Node
	stats       map[uint64]*pb.MemberStats
	// tlt holds the header (no rows); tltRows the rows. Both nil/empty
	// until InstallTLT.
	tlt         *pb.TLT
	tltRows     []*pb.TLTRow
	extents     map[uint64]*pb.Extent
	delegations map[uint64]*pb.Delegation
	fileSystems map[uint64]*pb.FileSystem
	leases      map[string]*pb.Lease
	config      map[string]*pb.ConfigEntry
}

func (s *state) reset() {
	*s = state{
		counters:    &pb.Counters{},
		nodes:       map[uint64]*pb.Node{},
		stats:       map[uint64]*pb.MemberStats{},
		extents:     map[uint64]*pb.Extent{},
		delegations: map[uint64]*pb.Delegation{},
		fileSystems: map[uint64]*pb.FileSystem{},
		leases:      map[string]*pb.Lease{},
		config:      map[string]*pb.ConfigEntry{},
	}
}

// Load rebuilds the mirror from the key space.
func (sm *StateMachine) Load(r raftengine.Reader) error {
	sm.requestsPruned = 0
	var st state
	st.reset()
	if err := loadState(r, &st); err != nil {
		return fmt.Errorf("directory: load: %w", err)
	}
	if err := st.checkInvariants(); err != nil {
		return fmt.Errorf("directory: load: %w", err)
	}
	sm.mu.Lock()
	sm.st = st
	sm.mu.Unlock()
	return nil
}

func loadState(r raftengine.Reader, st *state) error {
	getMsg := func(key []byte, m proto.Message) (bool, error) {
		v, err := r.Get(key)
		if errors.Is(err, raftengine.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("get %q: %w", key, err)
		}
		if err := proto.Unmarshal(v, m); err != nil {
			return false, fmt.Errorf("decode %q: %w", key, err)
		}
		return true, nil
	}
	var cluster pb.ClusterInfo
	if ok, err := getMsg(keyCluster, &cluster); err != nil {
		return err
	} else if ok {
		st.cluster = &cluster
	}
	if ok, err := getMsg(keyCounters, st.counters); err != nil {
		return err
	} else if !ok {
		st.counters = &pb.Counters{}
	}
	switch v, err := r.Get(keyClock); {
	case errors.Is(err, raftengine.ErrNotFound):
	case err != nil:
		return fmt.Errorf("get clock: %w", err)
	case len(v) != 8:
		return fmt.Errorf("clock: %d bytes", len(v))
	default:
		st.clockUnixMs = int64(binary.BigEndian.Uint64(v))
	}
	var header pb.TLT
	if ok, err := getMsg(keyTLTHeader, &header); err != nil {
		return err
	} else if ok {
		st.tlt = &header
	}

	scan := func(prefix []byte, newMsg func() proto.Message, add func(key []byte, m proto.Message) error) error {
		return r.Scan(prefix, prefixEnd(prefix), func(key, value []byte) error {
			m := newMsg()
			if err := proto.Unmarshal(value, m); err != nil {
				return fmt.Errorf("decode %q: %w", key, err)
			}
			return add(key[len(prefix):], m)
		})
	}
	idOf := func(suffix []byte) (uint64, error) {
		if len(suffix) != 8 {
			return 0, fmt.Errorf("bad id suffix %x", suffix)
		}
		return binary.BigEndian.Uint64(suffix), nil
	}
	checkID := func(suffix []byte, id uint64) error {
		got, err := idOf(suffix)
		if err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("key id %d holds record %d", got, id)
		}
		return nil
	}
	if err := scan(prefixNode, func() proto.Message { return &pb.Node{} }, func(k []byte, m proto.Message) error {
		n := m.(*pb.Node)
		st.nodes[n.Id] = n
		return checkID(k, n.Id)
	}); err != nil {
		return err
	}
	if err := scan(prefixStats, func() proto.Message { return &pb.MemberStats{} }, func(k []byte, m proto.Message) error {
		s := m.(*pb.MemberStats)
		st.stats[s.NodeId] = s
		return checkID(k, s.NodeId)
	}); err != nil {
		return err
	}
	if err := scan(prefixTLTRow, func() proto.Message { return &pb.TLTRow{} }, func(k []byte, m proto.Message) error {
		if len(k) != 4 || binary.BigEndian.Uint32(k) != uint32(len(st.tltRows)) {
			return fmt.Errorf("TLT row key %x out of sequence at row %d", k, len(st.tltRows))
		}
		st.tltRows = append(st.tltRows, m.(*pb.TLTRow))
		return nil
	}); err != nil {
		return err
	}
	if err := scan(prefixExtent, func() proto.Message { return &pb.Extent{} }, func(k []byte, m proto.Message) error {
		e := m.(*pb.Extent)
		st.extents[e.ExtentId] = e
		return checkID(k, e.ExtentId)
	}); err != nil {
		return err
	}
	if err := scan(prefixDelegation, func() proto.Message { return &pb.Delegation{} }, func(k []byte, m proto.Message) error {
		d := m.(*pb.Delegation)
		st.delegations[d.TableId] = d
		return checkID(k, d.TableId)
	}); err != nil {
		return err
	}
	if err := scan(prefixFileSystem, func() proto.Message { return &pb.FileSystem{} }, func(k []byte, m proto.Message) error {
		f := m.(*pb.FileSystem)
		st.fileSystems[f.Number] = f
		return checkID(k, f.Number)
	}); err != nil {
		return err
	}
	if err := scan(prefixLease, func() proto.Message { return &pb.Lease{} }, func(k []byte, m proto.Message) error {
		l := m.(*pb.Lease)
		if string(k) != l.Name {
			return fmt.Errorf("lease key %q holds lease %q", k, l.Name)
		}
		st.leases[l.Name] = l
		return nil
	}); err != nil {
		return err
	}
	return scan(prefixConfig, func() proto.Message { return &pb.ConfigEntry{} }, func(k []byte, m proto.Message) error {
		e := m.(*pb.ConfigEntry)
		if string(k) != e.Key {
			return fmt.Errorf("config key %q holds entry %q", k, e.Key)
		}
		st.config[e.Key] = e
		return nil
	})
}

// checkInvariants verifies the invariants of doc.go that can be checked on
// one state. It is cheap enough to run on every Load and, in tests, after
// every Apply.
func (s *state) checkInvariants() error {
	c := s.counters
	for id, n := range s.nodes {
		if id == 0 || n.Epoch == 0 || n.State == pb.NodeState_NODE_STATE_UNSPECIFIED {
			return fmt.Errorf("invariant: node %d: epoch %d state %v", id, n.Epoch, n.State)
		}
	}
	for id := range s.stats {
		if _, ok := s.nodes[id]; !ok {
			return fmt.Errorf("invariant: stats of unknown node %d", id)
		}
	}
	if s.tlt == nil && len(s.tltRows) > 0 {
		return fmt.Errorf("invariant: %d TLT rows without a header", len(s.tltRows))
	}
	if s.tlt != nil {
		if len(s.tltRows) == 0 || s.tlt.Version == 0 {
			return fmt.Errorf("invariant: TLT version %d with %d rows", s.tlt.Version, len(s.tltRows))
		}
		for i, r := range s.tltRows {
			if r.Version == 0 || r.Version > s.tlt.Version || len(r.Slots) != int(s.tlt.Replication) {
				return fmt.Errorf("invariant: TLT row %d: version %d (table %d), %d slots (k=%d)",
					i, r.Version, s.tlt.Version, len(r.Slots), s.tlt.Replication)
			}
		}
	}
	for id, e := range s.extents {
		if id < firstExtentID || id >= c.NextExtentId || e.Epoch == 0 || len(e.Replicas) == 0 {
			return fmt.Errorf("invariant: extent %d: epoch %d, %d replicas, next id %d",
				id, e.Epoch, len(e.Replicas), c.NextExtentId)
		}
	}
	names := map[string]uint64{}
	for id, f := range s.fileSystems {
		if id == 0 || id >= c.NextFileSystem {
			return fmt.Errorf("invariant: file system %d, next %d", id, c.NextFileSystem)
		}
		if other, dup := names[f.Name]; dup {
			return fmt.Errorf("invariant: file systems %d and %d are both named %q", other, id, f.Name)
		}
		names[f.Name] = id
		for _, sn := range f.Snapshots {
			if sn.Number == 0 || sn.Number >= f.NextSnapshot {
				return fmt.Errorf("invariant: file system %d: snapshot %d, next %d", id, sn.Number, f.NextSnapshot)
			}
		}
	}
	for id, d := range s.delegations {
		if id == 0 || id >= c.NextTableId || d.Epoch == 0 {
			return fmt.Errorf("invariant: table %d: epoch %d, next id %d", id, d.Epoch, c.NextTableId)
		}
		if _, ok := s.fileSystems[d.FileSystem]; !ok {
			return fmt.Errorf("invariant: table %d of unknown file system %d", id, d.FileSystem)
		}
	}
	if t1, t2, overlap := findOverlap(s.delegations); overlap {
		return fmt.Errorf("invariant: tables %d and %d overlap", t1, t2)
	}
	for name, l := range s.leases {
		if l.Epoch == 0 {
			return fmt.Errorf("invariant: lease %q has epoch 0", name)
		}
	}
	for key, e := range s.config {
		if e.Version == 0 {
			return fmt.Errorf("invariant: config %q has version 0", key)
		}
	}
	return nil
}

// findOverlap reports two tables of one file system whose key ranges
// overlap, choosing deterministically (lowest start key first).
func findOverlap(ds map[uint64]*pb.Delegation) (uint64, uint64, bool) {
	all := make([]*pb.Delegation, 0, len(ds))
	for _, d := range ds {
		all = append(all, d)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].FileSystem != all[j].FileSystem {
			return all[i].FileSystem < all[j].FileSystem
		}
		if c := strings.Compare(string(all[i].StartKey), string(all[j].StartKey)); c != 0 {
			return c < 0
		}
		return all[i].TableId < all[j].TableId
	})
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.FileSystem == b.FileSystem && rangesOverlap(a.StartKey, a.EndKey, b.StartKey, b.EndKey) {
			return a.TableId, b.TableId, true
		}
	}
	return 0, 0, false
}

// rangesOverlap reports whether [s1, e1) and [s2, e2) intersect; an empty
// end is +infinity.
func rangesOverlap(s1, e1, s2, e2 []byte) bool {
	before := func(end, start []byte) bool { // end <= start
		return len(end) > 0 && string(end) <= string(start)
	}
	return !before(e1, s2) && !before(e2, s1)
}
