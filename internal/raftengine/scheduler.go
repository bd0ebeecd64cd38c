package raftengine

import "sync"

// maxRoundGroups bounds the groups one scheduler round takes; the rest wait
// for the next round.
const maxRoundGroups = 4096

// roundsInFlight is how many rounds may run at once, over disjoint groups.
// With one, each round takes everything that arrived while the previous
// one was syncing: the disk sees one fsync at a time per engine, each
// carrying as many Readies as there are. Two (one round preparing while
// the other syncs) was measured on the replication benchmark: pebble
// syncs the two rounds' commits one after the other rather than together,
// so there were more, smaller syncs and fewer commits per second.
const roundsInFlight = 1

// scheduler is the engine's ready loop. Whatever happens to a group (a
// message, a proposal, a tick) enqueues the group; the loop runs rounds:
// each round takes every group queued so far and hands them together to
// the round function (Engine.processRound), which persists all their
// Readies in one batch with one sync (round.go). Up to roundsInFlight
// rounds run at once, each on its own goroutine, over disjoint groups.
//
// Invariants:
//
//   - A group is in at most one round at a time, and a round processes
//     each of its groups on one worker at a time: everything a group
//     touches while processing (its RawNode, its log store, its state
//     machine) needs no lock.
//   - A group enqueued while its round runs is queued again when the round
//     ends, so no event is ever left unhandled.
type scheduler struct {
	mu      sync.Mutex
	cond    *sync.Cond // signals work in the queue
	idle    *sync.Cond // broadcast when a round ends
	queue   []uint64
	state   map[uint64]schedState
	stopped bool
	round   func(gids []uint64)
	wg      sync.WaitGroup
}

type schedState uint8

const (
	schedQueued schedState = 1 << iota
	schedProcessing
	schedRequeue
)

func newScheduler(round func(gids []uint64)) *scheduler {
	s := &scheduler{state: map[uint64]schedState{}, round: round}
	s.cond = sync.NewCond(&s.mu)
	s.idle = sync.NewCond(&s.mu)
	for range roundsInFlight {
		s.wg.Add(1)
		go s.run()
	}
	return s
}

// enqueue marks gid as having work.
func (s *scheduler) enqueue(gid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mark(gid) {
		s.cond.Signal()
	}
}

// enqueueAll marks every group in gids as having work, under one lock.
func (s *scheduler) enqueueAll(gids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	queued := false
	for _, gid := range gids {
		queued = s.mark(gid) || queued
	}
	if queued {
		s.cond.Signal()
	}
}

// mark records that gid has work and reports whether it joined the queue.
// Called with s.mu held.
func (s *scheduler) mark(gid uint64) bool {
	st := s.state[gid]
	switch {
	case st&schedProcessing != 0:
		s.state[gid] = st | schedRequeue
	case st&schedQueued != 0:
	default:
		s.state[gid] = schedQueued
		s.queue = append(s.queue, gid)
		return true
	}
	return false
}

// run is one round runner.
func (s *scheduler) run() {
	defer s.wg.Done()
	var round []uint64
	s.mu.Lock()
	for {
		for len(s.queue) == 0 && !s.stopped {
			s.cond.Wait()
		}
		if s.stopped {
			s.mu.Unlock()
			return
		}
		n := min(len(s.queue), maxRoundGroups)
		round = append(round[:0], s.queue[:n]...)
		s.queue = s.queue[:copy(s.queue, s.queue[n:])]
		if len(s.queue) > 0 {
			s.cond.Signal() // for another runner
		}
		for _, gid := range round {
			s.state[gid] = schedProcessing
		}
		s.mu.Unlock()

		s.round(round)

		s.mu.Lock()
		for _, gid := range round {
			if s.state[gid]&schedRequeue != 0 {
				s.state[gid] = schedQueued
				s.queue = append(s.queue, gid)
			} else {
				delete(s.state, gid)
			}
		}
		if len(s.queue) > 0 {
			s.cond.Signal()
		}
		s.idle.Broadcast()
	}
}

// waitIdle returns once no round is processing gid. Every round ends, even
// after stop, so it never waits forever.
func (s *scheduler) waitIdle(gid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.state[gid]&schedProcessing != 0 {
		s.idle.Wait()
	}
}

// stop makes the runners exit after their current rounds and waits for
// them.
func (s *scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
}
