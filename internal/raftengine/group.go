package raftengine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// entryHeaderLen is the size of the header the engine puts in front of every
// proposed command: a format byte, the proposing node and the proposal id. It
// lets the proposer recognise its own entry when it is applied (and notice
// when another leader overwrote it).
const entryHeaderLen = 17

const entryFormatV1 = 1

// ErrConfChangeInProgress is returned when a membership change is proposed
// while an earlier one is not yet applied; retry once it is.
var ErrConfChangeInProgress = errors.New("raftengine: a membership change is already in progress")

func encodeEntry(node, id uint64, payload []byte) []byte {
	b := make([]byte, entryHeaderLen, entryHeaderLen+len(payload))
	b[0] = entryFormatV1
	binary.BigEndian.PutUint64(b[1:], node)
	binary.BigEndian.PutUint64(b[9:], id)
	return append(b, payload...)
}

func decodeEntry(data []byte) (node, id uint64, payload []byte, err error) {
	if len(data) < entryHeaderLen || data[0] != entryFormatV1 {
		return 0, 0, nil, fmt.Errorf("raftengine: malformed entry header (%d bytes)", len(data))
	}
	return binary.BigEndian.Uint64(data[1:]), binary.BigEndian.Uint64(data[9:]), data[entryHeaderLen:], nil
}

type proposalResult struct {
	result any
	err    error
}

// proposal is a command or membership change waiting to be applied.
type proposal struct {
	id    uint64
	cmd   []byte
	cc    *raftpb.ConfChangeV2
	done  chan proposalResult // buffered; receives exactly one result
	index uint64              // log index, once raft appended it
}

func (p *proposal) finish(result any, err error) {
	select {
	case p.done <- proposalResult{result: result, err: err}:
	default:
	}
}

type readRequest struct {
	ctx   []byte
	index uint64 // 0 until raft confirmed leadership
	done  chan error
	// issued is when the request entered raft (the engine's clock) and
	// leaseGen the group's lease generation then: its completion extends
	// the lease from issued if nothing ended the lease since.
	issued   time.Duration
	leaseGen uint64
}

// snapshotOffer asks whether a snapshot is worth receiving.
type snapshotOffer struct {
	header SnapshotHeader
	reply  chan bool
}

// snapshotInstall installs a fully received snapshot.
type snapshotInstall struct {
	header SnapshotHeader
	paths  []string
	reply  chan error
}

type snapshotReport struct {
	to     uint64
	failed bool
}

// inbox holds what happened to a group since its last processing. It is the
// only part of a group touched outside its worker.
type inbox struct {
	msgs        []Envelope
	proposals   []*proposal
	reads       []*readRequest
	ticks       int
	snapReports []snapshotReport
	offers      []*snapshotOffer
	installs    []*snapshotInstall
	transfers   []uint64
	progress    []chan GroupStatus
	canceled    []uint64 // proposal ids whose callers gave up
	wake        bool
}

// group is one local replica of a raft group.
type group struct {
	e    *Engine
	id   uint64
	desc GroupDescriptor
	sm   StateMachine

	mu sync.Mutex
	in inbox

	quiesced atomic.Bool
	stopped  atomic.Bool
	status   atomic.Pointer[GroupStatus]
	// leaseUntil is when the leader's read lease ends (the engine's clock,
	// nanoseconds; 0: no lease); renewing is set while a renewal round
	// runs (lease.go).
	leaseUntil atomic.Int64
	renewing   atomic.Bool

	// Everything below is owned by the worker processing the group.
	rn          *raft.RawNode
	store       *logStore
	applied     uint64
	appliedTerm uint64
	confState   *raftpb.ConfState
	leader      uint64
	term        uint64
	proposals   map[uint64]*proposal // accepted by raft, awaiting apply
	unmatched   []*proposal          // accepted in this round, not yet seen in a Ready
	reads       []*readRequest
	// pendingConfIndex is the log index below which a new membership change
	// must wait (raft would silently drop it otherwise).
	pendingConfIndex uint64
	// snapshotsOut maps a peer to the index of the snapshot being sent to it;
	// the log is not truncated past it.
	snapshotsOut map[uint64]uint64
	idleTicks    int
	removed      bool
	// ready is the Ready taken in the current round's first phase, to be
	// finished in its last (round.go); results are its applied entries'
	// results, handed to their proposers once the round's batch is
	// committed.
	ready   raft.Ready
	results []appliedResult
	// leaseGen counts the ends of the lease; leaseBarredTerm is a term in
	// which a leadership transfer started, so no lease is granted in it.
	leaseGen        uint64
	leaseBarredTerm uint64
}

func (g *group) enqueue(f func(in *inbox)) bool {
	g.mu.Lock()
	f(&g.in)
	g.mu.Unlock()
	if g.stopped.Load() {
		return false
	}
	g.e.sched.enqueue(g.id)
	return true
}

func (g *group) takeInbox() inbox {
	g.mu.Lock()
	defer g.mu.Unlock()
	in := g.in
	g.in = inbox{}
	return in
}

// beginRound is the group's first phase of a scheduler round (round.go):
// it drains the inbox, steps raft and, if raft has a Ready, writes it to
// batchFor(sync) (see writeReady). It reports whether the group has a Ready
// for finishRound, and whether that Ready's batch must be synced first.
func (g *group) beginRound(batchFor func(sync bool) *pebble.Batch) (ready, sync bool) {
	in := g.takeInbox()
	if g.stopped.Load() {
		g.failInbox(in, ErrStopped)
		return false, false
	}
	if err := g.processInbox(in); err != nil {
		g.fail(err)
		return false, false
	}
	if !g.rn.HasReady() {
		g.endRound()
		return false, false
	}
	rd, sync, err := g.writeReady(batchFor)
	if err != nil {
		g.fail(err)
		return false, false
	}
	g.ready = rd
	return true, sync
}

// finishRound is the group's last phase of a round, once its Ready's batch
// is committed (and synced if beginRound asked for it).
func (g *group) finishRound() {
	rd := g.ready
	g.ready = raft.Ready{}
	g.finishReady(rd)
	g.endRound()
}

// endRound ends the group's part in a round, whether or not it had a Ready.
func (g *group) endRound() {
	for _, p := range g.unmatched {
		// Raft accepted the proposal but did not append it (it can replace
		// a membership change it refuses by an empty entry): it will never
		// commit.
		delete(g.proposals, p.id)
		p.finish(nil, ErrProposalDropped)
		g.e.metrics.proposalsDropped.Add(1)
	}
	g.unmatched = g.unmatched[:0]
	if err := g.maybeTruncateLog(); err != nil {
		g.fail(err)
		return
	}
	g.maybeQuiesce()
	g.publishStatus()
	if g.removed {
		g.e.destroyAsync(g.id)
		return
	}
	if g.rn.HasReady() {
		// Advancing can produce more (a leader's own acknowledgement may
		// commit entries): the next round handles it.
		g.e.sched.enqueue(g.id)
	}
}

func (g *group) processInbox(in inbox) error {
	if in.wake || len(in.proposals) > 0 || len(in.reads) > 0 || len(in.transfers) > 0 {
		g.unquiesce()
	}
	for _, id := range in.canceled {
		if p := g.proposals[id]; p != nil && p.index == 0 {
			delete(g.proposals, id)
		}
	}
	for range in.ticks {
		if !g.quiesced.Load() {
			g.rn.Tick()
			g.idleTicks++
		}
	}
	for _, env := range in.msgs {
		g.step(env)
	}
	for _, r := range in.snapReports {
		delete(g.snapshotsOut, r.to)
		status := raft.SnapshotFinish
		if r.failed {
			status = raft.SnapshotFailure
		}
		g.rn.ReportSnapshot(r.to, status)
	}
	for _, o := range in.offers {
		o.reply <- g.snapshotAcceptable(o.header)
	}
	for _, inst := range in.installs {
		err := g.installSnapshot(inst)
		inst.reply <- err
		if err != nil && !errors.Is(err, errSnapshotDeclined) {
			return err
		}
	}
	for _, p := range in.proposals {
		g.propose(p)
	}
	for _, r := range in.reads {
		if !g.raftIsLeader() {
			r.done <- &NotLeaderError{GroupID: g.id, Leader: g.rn.BasicStatus().Lead}
			continue
		}
		r.issued, r.leaseGen = g.e.now(), g.leaseGen
		g.rn.ReadIndex(r.ctx)
		g.reads = append(g.reads, r)
	}
	for _, to := range in.transfers {
		g.rn.TransferLeader(to)
	}
	g.checkTransfer()
	for _, ch := range in.progress {
		ch <- g.fullStatus()
	}
	return nil
}

func (g *group) step(env Envelope) {
	m := env.Message
	if !env.Quiesce && m.GetType() != raftpb.MessageType_MsgHeartbeatResp {
		g.unquiesce()
	}
	if g.refusesVote(m) {
		return
	}
	if err := g.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		g.e.log.Debug("step failed", "group", g.id, "type", m.GetType().String(), "err", err)
	}
	if env.Quiesce {
		st := g.rn.BasicStatus()
		if st.RaftState == raft.StateFollower && st.Lead == m.GetFrom() && st.HardState.GetTerm() == m.GetTerm() &&
			st.HardState.GetCommit() == m.GetCommit() && g.store.lastIndex == m.GetCommit() {
			g.quiesced.Store(true)
		}
	}
}

func (g *group) isLeader() bool { return g.leader == g.e.cfg.NodeID }

// raftIsLeader asks raft itself. g.leader lags raft by up to one step: a
// message stepped in this round may have just demoted the replica, and its
// new soft state only reaches g.leader with the next Ready.
func (g *group) raftIsLeader() bool { return g.rn.BasicStatus().RaftState == raft.StateLeader }

func (g *group) propose(p *proposal) {
	if !g.raftIsLeader() {
		p.finish(nil, &NotLeaderError{GroupID: g.id, Leader: g.rn.BasicStatus().Lead})
		return
	}
	var err error
	if p.cc != nil {
		if g.applied < g.pendingConfIndex {
			p.finish(nil, ErrConfChangeInProgress)
			return
		}
		cc := proto.CloneOf(p.cc)
		cc.Context = encodeEntry(g.e.cfg.NodeID, p.id, nil)
		err = g.rn.ProposeConfChange(cc)
	} else {
		err = g.rn.Propose(encodeEntry(g.e.cfg.NodeID, p.id, p.cmd))
	}
	if err != nil {
		p.finish(nil, ErrProposalDropped)
		g.e.metrics.proposalsDropped.Add(1)
		return
	}
	g.proposals[p.id] = p
	g.unmatched = append(g.unmatched, p)
	g.e.metrics.proposals.Add(1)
}

// entryProposal returns the proposer and proposal id recorded in an entry,
// if any.
func entryProposal(e *raftpb.Entry) (node, id uint64, ok bool) {
	var ctx []byte
	switch e.GetType() {
	case raftpb.EntryType_EntryNormal:
		ctx = e.GetData()
	case raftpb.EntryType_EntryConfChange:
		var cc raftpb.ConfChange
		if proto.Unmarshal(e.GetData(), &cc) != nil {
			return 0, 0, false
		}
		ctx = cc.GetContext()
	case raftpb.EntryType_EntryConfChangeV2:
		var cc raftpb.ConfChangeV2
		if proto.Unmarshal(e.GetData(), &cc) != nil {
			return 0, 0, false
		}
		ctx = cc.GetContext()
	}
	node, id, _, err := decodeEntry(ctx)
	return node, id, err == nil
}

// writeReady takes raft's Ready and writes it to the batch batchFor(sync)
// returns, sync telling whether the Ready must be durable before it is
// finished (raft's MustSync, or a snapshot): the log reset of an installed
// snapshot, the new entries, the hard state. It then sends the Ready's
// messages that may leave before that state is durable (sendsBeforeSync),
// and applies the committed entries into the same batch. The caller
// commits the batch, synced if sync, and then calls finishReady; nothing
// else may touch the RawNode in between.
func (g *group) writeReady(batchFor func(sync bool) *pebble.Batch) (rd raft.Ready, sync bool, err error) {
	rd = g.rn.Ready()
	g.e.metrics.readyBatches.Add(1)
	if rd.SoftState != nil {
		g.onSoftState(rd.SoftState)
	}
	if hs := rd.HardState; hs != nil && hs.GetTerm() > g.term {
		g.term = hs.GetTerm()
	}
	snapshot := !raft.IsEmptySnap(rd.Snapshot)
	sync = rd.MustSync || snapshot
	if sync {
		g.e.metrics.syncedReadies.Add(1)
	}
	b := batchFor(sync)
	if snapshot {
		md := rd.Snapshot.GetMetadata()
		g.store.resetTo(b, md.GetIndex(), md.GetTerm())
	}
	if err := g.store.append(b, rd.Entries); err != nil {
		return rd, false, err
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := g.store.setHardState(b, rd.HardState); err != nil {
			return rd, false, err
		}
	}
	g.send(rd.Messages, true)
	if err := g.apply(b, rd.CommittedEntries); err != nil {
		return rd, false, err
	}
	return rd, sync, nil
}

// finishReady does the rest of a Ready once writeReady's batch is
// committed: the messages that waited for it, the proposers' results, the
// reads, and raft's Advance.
func (g *group) finishReady(rd raft.Ready) {
	g.store.commitAppend(rd.Entries)
	if len(rd.Entries) > 0 && g.isLeader() {
		g.matchProposals(rd.Entries)
	}
	g.send(rd.Messages, false)
	g.answerApplied()
	for _, rs := range rd.ReadStates {
		for _, r := range g.reads {
			if r.index == 0 && bytes.Equal(r.ctx, rs.RequestCtx) {
				r.index = max(rs.Index, 1)
			}
		}
	}
	g.completeReads()
	g.rn.Advance(rd)
}

// handleReadyNow handles one Ready outside a round, with a batch of its
// own: for the steps that must be durable before the worker goes on
// (installing a snapshot).
func (g *group) handleReadyNow() error {
	b := g.e.db.NewBatch()
	defer b.Close()
	rd, sync, err := g.writeReady(func(bool) *pebble.Batch { return b })
	if err != nil {
		return err
	}
	if !b.Empty() {
		opts := pebble.NoSync
		if sync {
			opts = pebble.Sync
			g.e.metrics.syncedWrites.Add(1)
		}
		if err := b.Commit(opts); err != nil {
			return fmt.Errorf("persist raft state: %w", err)
		}
	}
	g.finishReady(rd)
	return nil
}

func (g *group) matchProposals(entries []*raftpb.Entry) {
	for _, e := range entries {
		if e.GetType() != raftpb.EntryType_EntryNormal && e.GetIndex() > g.pendingConfIndex {
			g.pendingConfIndex = e.GetIndex()
		}
		node, id, ok := entryProposal(e)
		if !ok || node != g.e.cfg.NodeID {
			continue
		}
		if p := g.proposals[id]; p != nil {
			p.index = e.GetIndex()
		}
	}
	if len(g.unmatched) > 0 {
		kept := g.unmatched[:0]
		for _, p := range g.unmatched {
			if p.index == 0 {
				kept = append(kept, p)
			}
		}
		g.unmatched = kept
	}
}

func (g *group) onSoftState(ss *raft.SoftState) {
	wasLeader := g.isLeader()
	if ss.Lead != g.leader {
		g.endLease()
		g.leader = ss.Lead
		g.e.metrics.leaderChanges.Add(1)
		if g.isLeader() {
			// Raft refuses membership changes until the new leader has
			// applied everything up to its first entry.
			g.pendingConfIndex = g.store.lastIndex
		}
		if cb := g.e.cfg.OnLeaderChange; cb != nil {
			cb(g.id, ss.Lead, g.rn.BasicStatus().HardState.GetTerm())
		}
	}
	if wasLeader && !g.isLeader() {
		for _, r := range g.reads {
			r.done <- &NotLeaderError{GroupID: g.id, Leader: g.leader}
		}
		g.reads = nil
	}
}

// sendsBeforeSync reports whether a message of type t may be sent before
// the Ready that carries it is durable. Raft itself sorts its messages this
// way (raft.send): MsgAppResp, MsgVoteResp and MsgPreVoteResp vouch for
// the sender's log or vote, and it queues them apart (msgsAfterAppend) to
// be sent only once all the unstable state they rest on is durable; with
// AsyncStorageWrites they ride on MsgStorageAppend as its responses.
// Everything else (a leader's MsgApp, heartbeats and their responses, vote
// requests, MsgSnap, MsgTimeoutNow) raft sends at once in that mode, before
// the local append. A leader counts its own log towards the commit quorum
// only through its self-addressed MsgAppResp, which raft steps on Advance,
// after the sync; a candidate counts its own vote the same way. See doc.go,
// rule 1.
func sendsBeforeSync(t raftpb.MessageType) bool {
	switch t {
	case raftpb.MessageType_MsgAppResp, raftpb.MessageType_MsgVoteResp, raftpb.MessageType_MsgPreVoteResp:
		return false
	}
	return true
}

// send sends the messages in msgs that may go before the Ready is durable
// (early) or the others (!early).
func (g *group) send(msgs []*raftpb.Message, early bool) {
	if len(msgs) == 0 {
		return
	}
	var byNode map[uint64][]Envelope
	for _, m := range msgs {
		if sendsBeforeSync(m.GetType()) != early {
			continue
		}
		if m.GetType() == raftpb.MessageType_MsgSnap {
			g.startSnapshot(m)
			continue
		}
		if byNode == nil {
			byNode = make(map[uint64][]Envelope, 4)
		}
		byNode[m.GetTo()] = append(byNode[m.GetTo()], Envelope{GroupID: g.id, Message: m})
	}
	for to, envs := range byNode {
		g.e.cfg.Transport.Send(to, envs)
		g.e.metrics.messagesSent.Add(uint64(len(envs)))
	}
}

type appliedResult struct {
	node, id uint64
	index    uint64
	result   any
}

// apply applies committed entries to the state machine in a batch of their
// own, together with the new applied state, and adds that batch to b: the
// state-machine writes, the applied index and the raft state of the Ready
// become durable in one commit. A state machine that fails leaves nothing
// in b. The proposers learn their results from answerApplied, once b is
// committed.
func (g *group) apply(b *pebble.Batch, entries []*raftpb.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	ab := g.e.db.NewIndexedBatch()
	defer ab.Close()
	w := newPrefixWriter(ab, dataPrefix(g.id))
	results := g.results[:0]
	confChanged := false
	for _, e := range entries {
		idx := e.GetIndex()
		if idx <= g.applied {
			continue
		}
		r := appliedResult{index: idx}
		switch e.GetType() {
		case raftpb.EntryType_EntryNormal:
			if len(e.GetData()) == 0 {
				break // a new leader's empty entry
			}
			node, id, payload, err := decodeEntry(e.GetData())
			if err != nil {
				return fmt.Errorf("entry %d: %w", idx, err)
			}
			res, err := g.sm.Apply(w, idx, payload)
			if err != nil {
				return fmt.Errorf("apply entry %d: %w", idx, err)
			}
			r.node, r.id, r.result = node, id, res
		case raftpb.EntryType_EntryConfChange, raftpb.EntryType_EntryConfChangeV2:
			var cc raftpb.ConfChangeI
			if e.GetType() == raftpb.EntryType_EntryConfChange {
				var v1 raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &v1); err != nil {
					return fmt.Errorf("entry %d: decode conf change: %w", idx, err)
				}
				cc = &v1
			} else {
				var v2 raftpb.ConfChangeV2
				if err := proto.Unmarshal(e.GetData(), &v2); err != nil {
					return fmt.Errorf("entry %d: decode conf change: %w", idx, err)
				}
				cc = &v2
			}
			g.confState = g.rn.ApplyConfChange(cc)
			g.endLease()
			confChanged = true
			r.node, r.id, _ = entryProposal(e)
		}
		g.applied, g.appliedTerm = idx, e.GetTerm()
		g.idleTicks = 0
		results = append(results, r)
	}
	g.results = results
	if err := g.writeAppliedState(ab); err != nil {
		return err
	}
	if err := b.Apply(ab, nil); err != nil {
		return fmt.Errorf("add applied entries to the batch: %w", err)
	}
	g.e.metrics.applied.Add(uint64(len(results)))
	if confChanged {
		g.store.confState = g.confState
		if !g.inConfig(g.e.cfg.NodeID) && g.applied > 0 {
			g.removed = true
		}
	}
	return nil
}

// answerApplied hands the results of the entries apply applied to their
// proposers, once apply's batch is committed.
func (g *group) answerApplied() {
	for i, r := range g.results {
		var mine *proposal
		if r.node == g.e.cfg.NodeID {
			mine = g.proposals[r.id]
		}
		if mine != nil {
			delete(g.proposals, r.id)
			mine.finish(r.result, nil)
		}
		// Any other proposal of ours recorded at this index lost its place
		// to another leader's entry: it will never commit.
		for id, p := range g.proposals {
			if p.index == r.index {
				delete(g.proposals, id)
				p.finish(nil, ErrProposalDropped)
				g.e.metrics.proposalsDropped.Add(1)
			}
		}
		g.results[i] = appliedResult{}
	}
	g.results = g.results[:0]
}

func (g *group) writeAppliedState(b *pebble.Batch) error {
	cs, err := proto.Marshal(g.confState)
	if err != nil {
		return err
	}
	return setProto(b, appliedKey(g.id), &enginepb.AppliedState{Index: g.applied, Term: g.appliedTerm, ConfState: cs})
}

func (g *group) inConfig(node uint64) bool {
	cs := g.confState
	for _, set := range [][]uint64{cs.GetVoters(), cs.GetLearners(), cs.GetVotersOutgoing(), cs.GetLearnersNext()} {
		for _, id := range set {
			if id == node {
				return true
			}
		}
	}
	return false
}

func (g *group) completeReads() {
	if len(g.reads) == 0 {
		return
	}
	kept := g.reads[:0]
	for _, r := range g.reads {
		if r.index != 0 && r.index <= g.applied {
			g.extendLease(r)
			r.done <- nil
		} else {
			kept = append(kept, r)
		}
	}
	g.reads = kept
}

// fail stops the group after an error it cannot recover from (a failed
// disk write, a state machine that reports corruption). The replica's disk
// state is left as it is; restarting the node reopens it from there.
func (g *group) fail(err error) {
	g.e.log.Error("group failed; stopping its replica", "group", g.id, "err", err)
	g.stopped.Store(true)
	g.endLease()
	for _, p := range g.proposals {
		p.finish(nil, fmt.Errorf("group %d: %w: %v", g.id, ErrStopped, err))
	}
	g.proposals = map[uint64]*proposal{}
	for _, r := range g.reads {
		r.done <- fmt.Errorf("group %d: %w: %v", g.id, ErrStopped, err)
	}
	g.reads = nil
	g.failInbox(g.takeInbox(), ErrStopped)
}

func (g *group) failInbox(in inbox, err error) {
	for _, p := range in.proposals {
		p.finish(nil, err)
	}
	for _, r := range in.reads {
		r.done <- err
	}
	for _, o := range in.offers {
		o.reply <- false
	}
	for _, inst := range in.installs {
		inst.reply <- err
	}
	for _, ch := range in.progress {
		ch <- GroupStatus{GroupID: g.id, NodeID: g.e.cfg.NodeID}
	}
}

func (g *group) publishStatus() {
	st := g.rn.BasicStatus()
	prev := g.status.Load()
	if prev != nil && prev.Leader == st.Lead && prev.Term == st.HardState.GetTerm() &&
		prev.Commit == st.HardState.GetCommit() && prev.Applied == g.applied &&
		prev.Quiesced == g.quiesced.Load() && prev.confState == g.confState && prev.LogStart == g.store.truncIndex+1 &&
		prev.LastIndex == g.store.lastIndex && prev.LastTerm == g.store.lastTerm {
		return
	}
	g.status.Store(&GroupStatus{
		GroupID:   g.id,
		NodeID:    g.e.cfg.NodeID,
		Kind:      g.desc.Kind,
		Leader:    st.Lead,
		Term:      st.HardState.GetTerm(),
		Commit:    st.HardState.GetCommit(),
		Applied:   g.applied,
		Voters:    append([]uint64(nil), g.confState.GetVoters()...),
		Learners:  append([]uint64(nil), g.confState.GetLearners()...),
		Quiesced:  g.quiesced.Load(),
		LogStart:  g.store.truncIndex + 1,
		LastIndex: g.store.lastIndex,
		LastTerm:  g.store.lastTerm,
		confState: g.confState,
	})
}

func (g *group) fullStatus() GroupStatus {
	g.publishStatus()
	st := *g.status.Load()
	if g.isLeader() {
		st.Progress = map[uint64]ReplicaProgress{}
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			st.Progress[id] = ReplicaProgress{
				Match:        pr.Match,
				RecentActive: pr.RecentActive,
				Snapshot:     pr.State == tracker.StateSnapshot,
			}
		})
	}
	return st
}
