package raftengine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// Recovery of a group that lost its quorum (issue 13).
//
// Raft needs a majority of a group's voters to elect a leader and commit;
// a group that lost a majority for good (disks gone, nodes never coming
// back) can do neither, whatever the survivors hold. RecoverAlone is the
// operator's way out, like etcd's --force-new-cluster: it makes one
// surviving replica the only voter of its group. It rewrites that replica's
// raft state, without touching its state machine's data:
//
//   - every entry in its log is kept and becomes committed (its hard
//     state's commit moves to its last index), so an entry that a quorum
//     had acknowledged survives even if this replica never learnt that it
//     committed; an entry it holds that never committed may now commit
//     too (to a client it was an unknown outcome, which stays allowed);
//   - membership changes among the entries it has not applied yet become
//     empty entries, and its conf state (as of its applied index) becomes
//     {voters: this node}, so nothing brings the lost voters back;
//   - its term moves past every term it has seen, with its vote for itself.
//
// Restarted from that state, the replica applies its whole log, elects
// itself (a one-voter group needs no one else) and takes proposals; the
// layer above adds new replicas by the usual membership changes.
//
// What it cannot keep: the entries that only the lost replicas held.
// Those were committed only if a majority without this replica had them,
// that is only if the lost replicas formed a majority, which is exactly
// the case in which recovery is needed. So the caller must pick the most
// up-to-date surviving replica (highest last term, then last index: raft's
// own election rule), and must know that the lost replicas will not come
// back with their old state: a lost majority that returned would still
// form a quorum of the old membership and could elect a leader of its own.
// The layers above guard against that by removing the replicas of a group
// from nodes that no longer hold it in their maps (extent's orphan
// collection), but it is the operator's warning to give.

// RecoveryReport says what RecoverAlone did.
type RecoveryReport struct {
	Group uint64
	// Removed are the voters and learners the group had besides this node.
	Removed []uint64
	// PreviousCommit is the commit index this replica knew; LastIndex its
	// last log entry, now committed; Term the replica's new term.
	PreviousCommit, LastIndex, Term uint64
	// Neutralised counts membership changes in the unapplied log that were
	// replaced by empty entries.
	Neutralised int
}

// RecoverAlone makes this node's replica of gid the only voter of its
// group, keeping every entry it holds (see above). It stops the replica,
// rewrites its raft state in one synced batch and starts it again; calls
// in flight on it fail with ErrStopped (their outcome is unknown).
func (e *Engine) RecoverAlone(ctx context.Context, gid uint64) (RecoveryReport, error) {
	if e.stopped.Load() {
		return RecoveryReport{}, ErrStopped
	}
	e.mu.Lock()
	g := e.groups[gid]
	if g == nil {
		e.mu.Unlock()
		return RecoveryReport{}, fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
	}
	delete(e.groups, gid)
	e.mu.Unlock()
	g.stopped.Store(true)
	if e.sched != nil {
		e.sched.waitIdle(gid)
	}
	g.failInbox(g.takeInbox(), ErrStopped)
	for _, p := range g.proposals {
		p.finish(nil, ErrStopped)
	}
	rep, rerr := rewriteAlone(e.db, e.cfg.NodeID, gid)
	ng, err := e.openGroup(g.desc)
	if err != nil {
		return rep, errors.Join(rerr, fmt.Errorf("reopen group %d after recovery: %w (restart the node)", gid, err))
	}
	e.mu.Lock()
	e.groups[gid] = ng
	e.mu.Unlock()
	if e.sched != nil {
		e.sched.enqueue(gid)
	}
	if rerr != nil {
		return rep, rerr
	}
	e.log.Warn("group recovered alone: this replica is now its only voter", "group", gid,
		"removed", rep.Removed, "previous_commit", rep.PreviousCommit, "last_index", rep.LastIndex, "term", rep.Term)
	return rep, nil
}

// RecoverAloneOffline is RecoverAlone on the store of a stopped node (no
// engine has it open): the way to recover the directory group, which the
// node cannot serve while it has no quorum. The node's next start runs
// the replica alone.
func RecoverAloneOffline(st *Store, nodeID, gid uint64) (RecoveryReport, error) {
	if nodeID == 0 {
		return RecoveryReport{}, errors.New("raftengine: recover: node id 0")
	}
	if _, err := loadDescriptor(st.DB, gid); err != nil {
		return RecoveryReport{}, err
	}
	return rewriteAlone(st.DB, nodeID, gid)
}

// InspectOffline reads the raft state of gid's replica on the store of a
// stopped node: its membership (as of its applied index), term, commit,
// applied index and last entry, which is what an operator compares between
// survivors before RecoverAloneOffline. Leader and Progress stay empty.
func InspectOffline(st *Store, nodeID, gid uint64) (GroupStatus, error) {
	desc, err := loadDescriptor(st.DB, gid)
	if err != nil {
		return GroupStatus{}, err
	}
	var ap enginepb.AppliedState
	if err := getProto(st.DB, appliedKey(gid), &ap); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return GroupStatus{}, fmt.Errorf("raftengine: inspect group %d: %w", gid, err)
	}
	s, err := loadLogStore(st.DB, gid, &ap)
	if err != nil {
		return GroupStatus{}, fmt.Errorf("raftengine: inspect group %d: %w", gid, err)
	}
	return GroupStatus{
		GroupID: gid, NodeID: nodeID, Kind: desc.Kind,
		Term: s.hardState.GetTerm(), Commit: s.hardState.GetCommit(), Applied: ap.GetIndex(),
		Voters: slices.Clone(s.confState.GetVoters()), Learners: slices.Clone(s.confState.GetLearners()),
		LogStart: s.truncIndex + 1, LastIndex: s.lastIndex, LastTerm: s.lastTerm,
	}, nil
}

// loadDescriptor reads gid's descriptor; ErrGroupNotFound if the store
// holds no replica of it.
func loadDescriptor(db *pebble.DB, gid uint64) (*enginepb.GroupDescriptor, error) {
	var d enginepb.GroupDescriptor
	if err := getProto(db, descriptorKey(gid), &d); err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
		}
		return nil, fmt.Errorf("raftengine: group %d descriptor: %w", gid, err)
	}
	return &d, nil
}

// rewriteAlone rewrites gid's raft state on db as RecoverAlone describes.
// No replica of gid may be running on db.
func rewriteAlone(db *pebble.DB, nodeID, gid uint64) (RecoveryReport, error) {
	rep := RecoveryReport{Group: gid}
	var ap enginepb.AppliedState
	if err := getProto(db, appliedKey(gid), &ap); err != nil {
		if errors.Is(err, pebble.ErrNotFound) {
			return rep, fmt.Errorf("raftengine: recover group %d: the replica has no state (it never applied anything)", gid)
		}
		return rep, fmt.Errorf("raftengine: recover group %d: %w", gid, err)
	}
	s, err := loadLogStore(db, gid, &ap)
	if err != nil {
		return rep, fmt.Errorf("raftengine: recover group %d: %w", gid, err)
	}
	old := s.confState
	for _, set := range [][]uint64{old.GetVoters(), old.GetLearners(), old.GetVotersOutgoing(), old.GetLearnersNext()} {
		for _, id := range set {
			if id != nodeID && !slices.Contains(rep.Removed, id) {
				rep.Removed = append(rep.Removed, id)
			}
		}
	}
	slices.Sort(rep.Removed)
	rep.PreviousCommit, rep.LastIndex = s.hardState.GetCommit(), s.lastIndex

	b := db.NewBatch()
	defer b.Close()
	if s.lastIndex > ap.GetIndex() {
		ents, err := s.Entries(ap.GetIndex()+1, s.lastIndex+1, math.MaxUint64)
		if err != nil {
			return rep, fmt.Errorf("raftengine: recover group %d: read the unapplied log: %w", gid, err)
		}
		for _, ent := range ents {
			if t := ent.GetType(); t != raftpb.EntryType_EntryConfChange && t != raftpb.EntryType_EntryConfChangeV2 {
				continue
			}
			empty := &raftpb.Entry{Type: raftpb.EntryType_EntryNormal.Enum(), Index: proto.Uint64(ent.GetIndex()), Term: proto.Uint64(ent.GetTerm())}
			if err := setProto(b, logKey(gid, ent.GetIndex()), empty); err != nil {
				return rep, err
			}
			rep.Neutralised++
		}
	}
	cs, err := proto.Marshal(&raftpb.ConfState{Voters: []uint64{nodeID}})
	if err != nil {
		return rep, err
	}
	if err := setProto(b, appliedKey(gid), &enginepb.AppliedState{Index: ap.GetIndex(), Term: ap.GetTerm(), ConfState: cs}); err != nil {
		return rep, err
	}
	rep.Term = max(s.hardState.GetTerm(), s.lastTerm) + 1
	hs := &raftpb.HardState{Term: proto.Uint64(rep.Term), Vote: proto.Uint64(nodeID), Commit: proto.Uint64(max(s.lastIndex, s.hardState.GetCommit()))}
	if err := setProto(b, hardStateKey(gid), hs); err != nil {
		return rep, err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return rep, fmt.Errorf("raftengine: recover group %d: %w", gid, err)
	}
	return rep, nil
}
