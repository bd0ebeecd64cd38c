package raftengine

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Lease reads. A ReadIndex costs a heartbeat round to a quorum before the
// leader may answer. Raft's CheckQuorum makes a cheaper proof possible:
// a follower that heard from its leader less than an election timeout
// ago refuses to vote for anyone else (raft's inLease check on MsgVote and
// MsgPreVote). So once a quorum has acknowledged a heartbeat the leader
// sent at time T, no other leader can be elected before those followers'
// election timers run out, which is no earlier than T plus a lease
// duration, measured on the leader's clock:
//
//	lease = (ElectionTicks - 3) × TickInterval × (1 - MaxClockDrift) / (1 + MaxClockDrift)
//
// Three ticks are taken off because ticks that fired before a follower
// stepped the heartbeat may be counted after it: its worker steps an
// inbox's ticks before its messages, a tick may be held up in the tick
// loop, and the next one waits in the ticker's channel. The drift factor
// covers a leader clock running slow and a follower clock running fast by
// up to MaxClockDrift each (rates, not offsets: every duration is
// measured on one node's monotonic clock). A clock that stops (a host
// suspended, a VM frozen while CLOCK_MONOTONIC does not advance) is a
// drift far beyond the bound: where that can happen, turn leases off.
//
// Within its lease the leader answers ReadIndex without a round: every
// write acknowledged before the call was applied here (only this leader
// can have committed it, and it answers a proposer only after applying
// its entry and committing the round's batch), and the lease is first
// granted only once a ReadIndex of the leader's own term has completed,
// so everything committed by earlier leaders is applied too. Every
// completed ReadIndex round extends the lease from the time its request
// entered raft; a lease read that finds less than half the lease left
// starts one in the background, so a steadily read group keeps its lease
// without a reader ever waiting.
//
// What would break the proof, and what the engine does about it:
//   - A leadership transfer: raft's MsgTimeoutNow makes the transferee
//     campaign with a flag that overrides the followers' lease. The lease
//     ends when the leader starts a transfer (before its MsgTimeoutNow
//     can leave) and is not granted again in that term, even if the
//     transfer is abandoned (the message may still arrive).
//   - A membership change: a new configuration's quorum may not have
//     acknowledged anything. Applying one ends the lease.
//   - A follower that restarts: it forgets whom it heard from and would
//     vote at once, though it may have acknowledged the lease just
//     before it went down. An engine refuses (drops) vote and pre-vote
//     requests for an election timeout (ElectionTicks × TickInterval,
//     longer than any lease even with its clock fast) after it starts.
//     Elections are hardly slowed: a candidate waits at least an
//     election timeout before campaigning.
//   - Clock rate drift beyond MaxClockDrift: stated, not detectable by a
//     node alone. Config.DisableLeaseReads turns lease reads off.
//   - A leader paused (or partitioned) after its lease check: the read
//     is answered later from a state that was current at the check, which
//     lies within the read's own interval: still linearizable.

// DefaultMaxClockDrift is the assumed bound on how much faster or slower
// than real time any node's clock runs (10%: far above what NTP-disciplined
// or even free-running server clocks show).
const DefaultMaxClockDrift = 0.1

// leaseDuration is how long after the send of a heartbeat a quorum
// acknowledged no other leader can exist (0: lease reads off).
func (c *Config) leaseDuration() time.Duration {
	if c.leaseOverride != 0 {
		return c.leaseOverride
	}
	return c.safeLease()
}

// safeLease is the lease the proof above allows.
func (c *Config) safeLease() time.Duration {
	if c.DisableLeaseReads || c.ElectionTicks < 4 {
		return 0
	}
	base := time.Duration(c.ElectionTicks-3) * c.TickInterval
	return time.Duration(float64(base) * (1 - c.MaxClockDrift) / (1 + c.MaxClockDrift))
}

// voteQuiet is how long a starting engine refuses votes: an election
// timeout by its own clock, which outlasts any lease granted with a
// follower's acknowledgement from before the restart, even with the
// clocks drifting by MaxClockDrift.
func (c *Config) voteQuiet() time.Duration {
	if c.safeLease() == 0 {
		return 0
	}
	return time.Duration(c.ElectionTicks) * c.TickInterval
}

// now is the engine's monotonic clock, for leases.
func (e *Engine) now() time.Duration { return time.Since(e.start) }

// leaseRead answers a read from the lease if it is valid, starting a
// renewal when less than half of it is left. It reports whether it did.
func (e *Engine) leaseRead(g *group) bool {
	until := time.Duration(g.leaseUntil.Load())
	if until == 0 {
		return false
	}
	now := e.now()
	if now >= until {
		return false
	}
	if h := e.leaseHook.Load(); h != nil {
		(*h)()
	}
	e.metrics.leaseReads.Add(1)
	if until-now < e.lease/2 && g.renewing.CompareAndSwap(false, true) {
		go func() {
			defer g.renewing.Store(false)
			ctx, cancel := context.WithTimeout(e.ctx, e.lease)
			defer cancel()
			_ = e.readIndexRound(ctx, g)
		}()
	}
	return true
}

// endLease ends the group's lease; reads go through rounds until a new
// round completes. Called from the group's worker.
func (g *group) endLease() {
	g.leaseGen++
	g.leaseUntil.Store(0)
}

// extendLease extends the lease after read r's round completed, unless
// something that voids the proof happened since r was issued.
func (g *group) extendLease(r *readRequest) {
	if g.e.lease == 0 || r.leaseGen != g.leaseGen {
		return
	}
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || st.GetTerm() == g.leaseBarredTerm {
		return
	}
	until := int64(r.issued + g.e.lease)
	if until > g.leaseUntil.Load() {
		g.leaseUntil.Store(until)
	}
}

// checkTransfer ends the lease, for the rest of the leader's term, once
// raft is transferring leadership: a MsgTimeoutNow may reach the
// transferee however late, and its campaign overrides the followers'
// leases, so no later heartbeat round proves anything in this term.
func (g *group) checkTransfer() {
	st := g.rn.BasicStatus()
	if st.RaftState == raft.StateLeader && st.LeadTransferee != raft.None && g.leaseBarredTerm != st.GetTerm() {
		g.endLease()
		g.leaseBarredTerm = st.GetTerm()
	}
}

// refusesVote reports whether m is a vote request this replica must drop
// because its engine started less than a lease ago (see above).
func (g *group) refusesVote(m *raftpb.Message) bool {
	switch m.GetType() {
	case raftpb.MessageType_MsgVote, raftpb.MessageType_MsgPreVote:
	default:
		return false
	}
	if g.e.voteQuiet == 0 || string(m.GetContext()) == campaignTransfer {
		return false
	}
	return g.e.now() < g.e.voteQuiet
}

// campaignTransfer is the context raft puts on the vote requests of a
// transferee's campaign (raft.campaignTransfer): they override leases.
const campaignTransfer = "CampaignTransfer"
