package raftengine

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// roundMaxBytes bounds the raft state one round writes: once the round's
// batch holds this much, its remaining groups wait for the next round. A
// round can exceed it by at most one Ready per worker.
const roundMaxBytes = 64 << 20

// Rounds.
//
// A scheduler round handles, together, every group that had work when it
// started. It runs in three phases:
//
//  1. Begin (in parallel on the workers): each group drains its inbox,
//     steps raft, takes its Ready, writes the Ready's entries, hard state
//     and (for an installed snapshot) log reset into its worker's batch,
//     sends the messages that do not depend on that state being durable
//     (sendsBeforeSync): above all a leader's MsgApp, so that followers
//     write to their disks while the leader writes to its own. It then
//     applies the Ready's committed entries, through a batch of the
//     group's own that joins the worker's batch with the new applied
//     state.
//  2. Persist: the workers' batches are merged into one and committed with
//     one write, synced if any Ready needed it (raft's MustSync).
//  3. Finish (in parallel): each group sends the rest of its messages
//     (MsgAppResp, MsgVoteResp, MsgPreVoteResp), hands the applied
//     entries' results to their proposers, completes reads, and calls
//     Advance. A group that has another Ready goes into the next round.
//
// So every group that makes progress in a round shares one fsync, instead
// of one fsync per group (merged only as far as concurrent workers happened
// to meet in pebble's commit pipeline).
//
// If the round's commit fails, every group in it stops (group.fail): no
// Ready of the round is finished, so nothing that depended on it is sent,
// applied or acknowledged.

// processRound is the scheduler's round function.
func (e *Engine) processRound(gids []uint64) {
	groups := make([]*group, 0, len(gids))
	e.mu.RLock()
	for _, gid := range gids {
		if g := e.groups[gid]; g != nil {
			groups = append(groups, g)
		}
	}
	e.mu.RUnlock()
	if len(groups) == 0 {
		return
	}

	// Phase 1: begin.
	workers := min(e.cfg.Workers, len(groups))
	batches := make([]*pebble.Batch, workers)
	defer func() {
		for _, b := range batches {
			if b != nil {
				_ = b.Close()
			}
		}
	}()
	pending := make([]bool, len(groups)) // groups[i] has a Ready to finish
	var mustSync atomic.Bool
	var size atomic.Int64
	forEachParallel(workers, len(groups), func(w, i int) {
		g := groups[i]
		if size.Load() >= roundMaxBytes {
			e.sched.enqueue(g.id) // the next round takes it
			return
		}
		b := batches[w]
		if b == nil {
			b = e.db.NewBatch()
			batches[w] = b
		}
		before := b.Len()
		ready, sync := g.beginRound(b)
		pending[i] = ready
		if sync {
			mustSync.Store(true)
		}
		size.Add(int64(b.Len() - before))
	})
	readies := 0
	for _, p := range pending {
		if p {
			readies++
		}
	}
	if readies == 0 {
		return
	}

	// Phase 2: persist.
	e.metrics.rounds.Add(1)
	hook := e.roundHook.Load()
	if hook != nil {
		(*hook)(false)
	}
	if err := e.commitRound(batches, mustSync.Load()); err != nil {
		for i, g := range groups {
			if pending[i] {
				g.fail(err)
			}
		}
		return
	}
	if hook != nil {
		(*hook)(true)
	}

	// Phase 3: finish.
	forEachParallel(workers, len(groups), func(_, i int) {
		if pending[i] {
			groups[i].finishRound()
		}
	})
}

// commitRound merges the workers' batches into the first and commits it.
func (e *Engine) commitRound(batches []*pebble.Batch, sync bool) error {
	var rb *pebble.Batch
	for _, b := range batches {
		switch {
		case b == nil || b.Empty():
		case rb == nil:
			rb = b
		default:
			if err := rb.Apply(b, nil); err != nil {
				return fmt.Errorf("merge raft state of a round: %w", err)
			}
		}
	}
	if rb == nil {
		return nil
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
		e.metrics.syncedWrites.Add(1)
		e.metrics.roundSyncs.Add(1)
	}
	if err := rb.Commit(opts); err != nil {
		return fmt.Errorf("persist raft state: %w", err)
	}
	return nil
}

// minItemsPerHelper is how many groups of a round justify one more
// goroutine: below it, handing work over costs more than it saves.
const minItemsPerHelper = 8

// forEachParallel calls fn(w, i) for every i in [0, n), on the caller's
// goroutine and up to workers-1 helpers (one per minItemsPerHelper items);
// w in [0, workers) names the goroutine, so fn may use per-goroutine state.
// It returns once every call has returned. A helper that starts after the
// items are gone does nothing, and the caller does not wait for it.
func forEachParallel(workers, n int, fn func(w, i int)) {
	helpers := min(workers, (n+minItemsPerHelper-1)/minItemsPerHelper) - 1
	if helpers <= 0 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	var next, done atomic.Int64
	finished := make(chan struct{})
	body := func(w int) {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			fn(w, i)
			if done.Add(1) == int64(n) {
				close(finished)
			}
		}
	}
	for w := 1; w <= helpers; w++ {
		go body(w)
	}
	body(0)
	<-finished
}
