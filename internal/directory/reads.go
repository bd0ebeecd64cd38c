package directory

import (
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Getters return copies of the local replica's state as of its last applied
// command. On the leader after a ReadIndex they are linearizable; elsewhere
// they may be stale.

func clone[M proto.Message](m M) M { return proto.Clone(m).(M) }

// Cluster returns the cluster identity, or nil before InitCluster.
func (sm *StateMachine) Cluster() *pb.ClusterInfo {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	if sm.st.cluster == nil {
		return nil
	}
	return clone(sm.st.cluster)
}

// ClockUnixMs is the time of the last applied command.
func (sm *StateMachine) ClockUnixMs() int64 {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.st.clockUnixMs
}

// Nodes returns every registered node, by id.
func (sm *StateMachine) Nodes() []*pb.Node {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make([]*pb.Node, 0, len(sm.st.nodes))
	for _, id := range sortedKeys(sm.st.nodes) {
		out = append(out, clone(sm.st.nodes[id]))
	}
	return out
}

// Node returns one node.
func (sm *StateMachine) Node(id uint64) (*pb.Node, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	n, ok := sm.st.nodes[id]
	if !ok {
		return nil, false
	}
	return clone(n), true
}

// MemberStats returns the last statistics recorded for each node, by id.
func (sm *StateMachine) MemberStats() []*pb.MemberStats {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make([]*pb.MemberStats, 0, len(sm.st.stats))
	for _, id := range sortedKeys(sm.st.stats) {
		out = append(out, clone(sm.st.stats[id]))
	}
	return out
}

// TLT returns the whole tract locator table, or nil if none is installed.
func (sm *StateMachine) TLT() *pb.TLT {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	if sm.st.tlt == nil {
		return nil
	}
	t := clone(sm.st.tlt)
	t.Rows = make([]*pb.TLTRow, len(sm.st.tltRows))
	for i, r := range sm.st.tltRows {
		t.Rows[i] = clone(r)
	}
	return t
}

// TLTVersion returns the table's version (0: none installed).
func (sm *StateMachine) TLTVersion() uint64 {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	if sm.st.tlt == nil {
		return 0
	}
	return sm.st.tlt.Version
}

// Extent returns one extent.
func (sm *StateMachine) Extent(id uint64) (*pb.Extent, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	e, ok := sm.st.extents[id]
	if !ok {
		return nil, false
	}
	return clone(e), true
}

// Extents returns up to limit extents with ids above startAfter, by id, and
// whether more follow.
func (sm *StateMachine) Extents(startAfter uint64, limit int) ([]*pb.Extent, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	ids := sortedKeys(sm.st.extents)
	i := sort.Search(len(ids), func(i int) bool { return ids[i] > startAfter })
	var out []*pb.Extent
	for ; i < len(ids) && len(out) < limit; i++ {
		out = append(out, clone(sm.st.extents[ids[i]]))
	}
	return out, i < len(ids)
}

// DelegationMap returns the tables of one file system (0: all), by table id.
func (sm *StateMachine) DelegationMap(fileSystem uint64) *pb.DelegationMap {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	m := &pb.DelegationMap{Version: sm.st.counters.DelegationMapVersion}
	for _, id := range sortedKeys(sm.st.delegations) {
		if d := sm.st.delegations[id]; fileSystem == 0 || d.FileSystem == fileSystem {
			m.Delegations = append(m.Delegations, clone(d))
		}
	}
	return m
}

// FileSystem returns a file system by number.
func (sm *StateMachine) FileSystem(number uint64) (*pb.FileSystem, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	f, ok := sm.st.fileSystems[number]
	if !ok {
		return nil, false
	}
	return clone(f), true
}

// FileSystemByName returns a file system by name.
func (sm *StateMachine) FileSystemByName(name string) (*pb.FileSystem, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	for _, f := range sm.st.fileSystems {
		if f.Name == name {
			return clone(f), true
		}
	}
	return nil, false
}

// FileSystems returns every file system, by number.
func (sm *StateMachine) FileSystems() []*pb.FileSystem {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make([]*pb.FileSystem, 0, len(sm.st.fileSystems))
	for _, n := range sortedKeys(sm.st.fileSystems) {
		out = append(out, clone(sm.st.fileSystems[n]))
	}
	return out
}

// Lease returns the record of a lease (held or not; see Lease in the proto).
func (sm *StateMachine) Lease(name string) (*pb.Lease, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	l, ok := sm.st.leases[name]
	if !ok {
		return nil, false
	}
	return clone(l), true
}

// Config returns one configuration entry.
func (sm *StateMachine) Config(key string) (*pb.ConfigEntry, bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	e, ok := sm.st.config[key]
	if !ok {
		return nil, false
	}
	return clone(e), true
}

// ListConfig returns, in key order, the entries whose key starts with prefix
// and sorts after startAfter: at most limit of them and at most
// maxListResponseBytes of keys and values. more is set when some were left
// out.
func (sm *StateMachine) ListConfig(prefix, startAfter string, limit int) (entries []*pb.ConfigEntry, more bool) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	var keys []string
	for k := range sm.st.config {
		if strings.HasPrefix(k, prefix) && k > startAfter {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	size := 0
	for i, k := range keys {
		e := sm.st.config[k]
		size += len(e.Key) + len(e.Value)
		if len(entries) >= limit || (len(entries) > 0 && size > maxListResponseBytes) {
			return entries, i < len(keys)
		}
		entries = append(entries, clone(e))
	}
	return entries, false
}
