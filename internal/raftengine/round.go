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
//     steps raft, takes its Ready, and writes the Ready's entries, hard
//     state and (for an installed snapshot) log reset into its worker's
//     batch: one batch for the Readies raft needs synced (MustSync: new
//     entries, a new term or vote), another for the rest. It then sends
//     the messages that do not depend on that state being durable
//     (sendsBeforeSync): above all a leader's MsgApp, so that followers
//     write to their disks while the leader writes to its own. Last, it
//     applies the Ready's committed entries, through a batch of the
//     group's own that joins the same batch with the new applied state.
//  2. Persist: the workers' no-sync batches are merged and committed
//     without a sync, then the sync batches are merged and committed with
//     one sync. That one fsync covers every Ready of the round that needed
//     one, and (the WAL being ordered) the no-sync batch as well.
//  3. Finish (in parallel): each group sends the rest of its messages
//     (MsgAppResp, MsgVoteResp, MsgPreVoteResp), hands the applied
//     entries' results to their proposers, completes reads, and calls
//     Advance. A group that has another Ready goes into the next round.
//     The groups whose Ready needed no sync finish while the synced
//     commit runs: a leader's Ready that only commits and applies, or a
//     follower's that only learns a new commit index, never waits for an
//     fsync that other groups needed.
//
// So every group that makes progress in a round shares one fsync, instead
// of one fsync per group (merged only as far as concurrent workers happened
// to meet in pebble's commit pipeline).
//
// If a commit fails, every group whose Ready it carried (for the first
// commit, every group of the round) stops (group.fail): none of those
// Readies is finished, so nothing that depended on them is sent,
// acknowledged or told to raft.

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

	// Phase 1: begin. Each worker has two batches: Readies that need a sync
	// and Readies that do not.
	workers := min(e.cfg.Workers, len(groups))
	var batches [2][]*pebble.Batch // [0]: no sync needed, [1]: sync needed
	batches[0], batches[1] = make([]*pebble.Batch, workers), make([]*pebble.Batch, workers)
	defer func() {
		for _, bs := range batches {
			for _, b := range bs {
				if b != nil {
					_ = b.Close()
				}
			}
		}
	}()
	pending := make([]readyKind, len(groups))
	var size atomic.Int64
	forEachParallel(workers, len(groups), func(w, i int) {
		g := groups[i]
		if size.Load() >= roundMaxBytes {
			e.sched.enqueue(g.id) // the next round takes it
			return
		}
		var grown int
		ready, sync := g.beginRound(func(sync bool) *pebble.Batch {
			k := 0
			if sync {
				k = 1
			}
			b := batches[k][w]
			if b == nil {
				b = e.db.NewBatch()
				batches[k][w] = b
			}
			grown = -b.Len()
			return b
		})
		switch {
		case !ready:
			return
		case sync:
			pending[i] = readySync
			grown += batches[1][w].Len()
		default:
			pending[i] = readyNoSync
			grown += batches[0][w].Len()
		}
		size.Add(int64(grown))
	})
	var counts [3]int
	for _, k := range pending {
		counts[k]++
	}
	if counts[readyNoSync]+counts[readySync] == 0 {
		return
	}
	finish := func(kind readyKind) {
		forEachParallel(workers, len(groups), func(_, i int) {
			if pending[i] == kind {
				groups[i].finishRound()
			}
		})
	}
	failAll := func(kind readyKind, err error) {
		for i, g := range groups {
			if pending[i] == kind {
				g.fail(err)
			}
		}
	}

	// Phase 2 and 3: persist and finish. The Readies that need no sync are
	// committed first, without one, and finished while the others' synced
	// commit runs: none of them waits for an fsync it does not need. The
	// synced commit comes later in the WAL, so it makes them durable too.
	e.metrics.rounds.Add(1)
	hook := e.roundHook.Load()
	if hook != nil {
		(*hook)(false)
	}
	if counts[readyNoSync] > 0 {
		if err := e.commitBatches(batches[0], false); err != nil {
			failAll(readyNoSync, err)
			failAll(readySync, err)
			return
		}
	}
	if counts[readySync] > 0 {
		var err error
		if counts[readyNoSync] > 0 {
			synced := make(chan error, 1)
			go func() { synced <- e.commitBatches(batches[1], true) }()
			finish(readyNoSync)
			err = <-synced
		} else {
			err = e.commitBatches(batches[1], true)
		}
		if err != nil {
			failAll(readySync, err)
			return
		}
	}
	if hook != nil {
		(*hook)(true)
	}
	if counts[readySync] > 0 {
		finish(readySync)
	} else {
		finish(readyNoSync)
	}
}

// readyKind is what a group of a round has to finish.
type readyKind uint8

const (
	readyNone   readyKind = iota
	readyNoSync           // a Ready whose batch needs no sync
	readySync             // a Ready whose batch must be synced
)

// commitBatches merges the workers' batches into the first and commits it,
// synced if sync.
func (e *Engine) commitBatches(batches []*pebble.Batch, sync bool) error {
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
