package raftengine

import (
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Quiescence. A node hosts hundreds of groups, most of them idle at any
// moment; ticking and heartbeating all of them would cost CPU and network
// for nothing. An idle group is put to sleep by its leader:
//
//  1. The leader sees, after processing, that nothing is in flight: every
//     live replica has the whole log (match == last index), everything is
//     committed and applied, no proposals, reads, snapshots or transfers are
//     pending, and the group has been idle for an election timeout.
//  2. It sends each replica a heartbeat marked Quiesce and stops ticking.
//  3. A follower that receives it, and agrees on leader, term and commit,
//     stops ticking too. Its election timer no longer runs, so it will not
//     campaign against a healthy, sleeping leader.
//
// Anything that needs the group wakes it: a proposal, a read, a transfer, or
// any raft message other than a heartbeat response. A woken leader
// heartbeats, which wakes its followers.
//
// The danger is a sleeping follower whose leader has died: nothing would
// wake it. Engines therefore exchange node-level keepalives (an empty batch
// every few ticks to every peer node), and a sleeping follower whose
// leader's node has been silent for LivenessTimeout wakes up and, after an
// election timeout, campaigns. A replica that fell behind while asleep
// (because its node was down) never quiesces on a commit it does not have,
// and its own messages wake the leader when it returns.

// unquiesce makes the group tick again.
func (g *group) unquiesce() {
	if g.quiesced.Swap(false) {
		g.idleTicks = 0
	}
}

func (g *group) maybeQuiesce() {
	if g.quiesced.Load() || !g.isLeader() || g.idleTicks < g.e.cfg.ElectionTicks {
		return
	}
	if len(g.proposals) > 0 || len(g.reads) > 0 || len(g.snapshotsOut) > 0 || g.rn.HasReady() {
		return
	}
	st := g.rn.BasicStatus()
	last := g.store.lastIndex
	if st.LeadTransferee != 0 || st.HardState.GetCommit() != last || g.applied != last {
		return
	}
	ok := true
	type peer struct{ id, commit uint64 }
	var peers []peer
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == g.e.cfg.NodeID {
			return
		}
		if pr.Match != last && g.e.isLive(id) {
			ok = false
		}
		if pr.State == tracker.StateSnapshot {
			ok = false
		}
		peers = append(peers, peer{id: id, commit: min(pr.Match, last)})
	})
	if !ok {
		return
	}
	term := st.HardState.GetTerm()
	for _, p := range peers {
		g.e.cfg.Transport.Send(p.id, []Envelope{{
			GroupID: g.id,
			Quiesce: true,
			Message: &raftpb.Message{
				Type:   raftpb.MessageType_MsgHeartbeat.Enum(),
				To:     proto.Uint64(p.id),
				From:   proto.Uint64(g.e.cfg.NodeID),
				Term:   proto.Uint64(term),
				Commit: proto.Uint64(p.commit),
			},
		}})
	}
	g.quiesced.Store(true)
}

// maybeTruncateLog removes applied entries once the log outgrows its
// retention limits. A leader keeps what live followers still need (so they
// catch up from the log rather than a snapshot) unless the log has grown
// past four times the limit, and never truncates past a snapshot in flight.
//
// Applied state is written without sync; the truncation is synced, and
// since pebble's WAL is ordered, it makes every earlier apply durable
// before the entries they came from disappear.
func (g *group) maybeTruncateLog() error {
	s := g.store
	cfg := &g.e.cfg
	if s.lastIndex-s.truncIndex <= uint64(cfg.LogRetainEntries) && s.logBytes <= uint64(cfg.LogRetainBytes) {
		return nil
	}
	keep := uint64(cfg.LogRetainEntries / 4)
	if g.applied <= keep {
		return nil
	}
	target := g.applied - keep
	overgrown := s.lastIndex-s.truncIndex > 4*uint64(cfg.LogRetainEntries) || s.logBytes > 4*uint64(cfg.LogRetainBytes)
	if g.isLeader() && !overgrown {
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id != cfg.NodeID && g.e.isLive(id) && pr.Match < target {
				target = pr.Match
			}
		})
	}
	for _, idx := range g.snapshotsOut {
		target = min(target, idx)
	}
	if target <= s.truncIndex+keep/2 {
		return nil
	}
	b := g.e.db.NewBatch()
	defer b.Close()
	if err := s.truncate(b, target); err != nil {
		return err
	}
	g.e.metrics.syncedWrites.Add(1)
	return b.Commit(pebble.Sync)
}
