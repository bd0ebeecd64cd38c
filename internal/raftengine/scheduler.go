package raftengine

import "sync"

// scheduler runs the groups that have work on a fixed pool of workers. It is
// the engine's one ready loop: whatever happens to a group (a message, a
// proposal, a tick) enqueues the group, and a worker drains its inbox and
// handles its raft Ready.
//
// Invariant: a group is processed by at most one worker at a time, so
// everything a group touches while processing (its RawNode, its log store,
// its state machine) needs no lock. A group enqueued while being processed
// is requeued when its worker finishes, so no event is ever left unhandled.
type scheduler struct {
	mu      sync.Mutex
	cond    *sync.Cond // signals work in the queue
	idle    *sync.Cond // broadcast when a group's processing ends
	queue   []uint64
	state   map[uint64]schedState
	stopped bool
	process func(gid uint64)
	wg      sync.WaitGroup
}

type schedState uint8

const (
	schedQueued schedState = 1 << iota
	schedProcessing
	schedRequeue
)

func newScheduler(workers int, process func(gid uint64)) *scheduler {
	s := &scheduler{state: map[uint64]schedState{}, process: process}
	s.cond = sync.NewCond(&s.mu)
	s.idle = sync.NewCond(&s.mu)
	for range workers {
		s.wg.Add(1)
		go s.worker()
	}
	return s
}

// enqueue marks gid as having work.
func (s *scheduler) enqueue(gid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[gid]
	switch {
	case st&schedProcessing != 0:
		s.state[gid] = st | schedRequeue
	case st&schedQueued != 0:
	default:
		s.state[gid] = schedQueued
		s.queue = append(s.queue, gid)
		s.cond.Signal()
	}
}

// enqueueAll marks every group in gids as having work, under one lock.
func (s *scheduler) enqueueAll(gids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gid := range gids {
		st := s.state[gid]
		switch {
		case st&schedProcessing != 0:
			s.state[gid] = st | schedRequeue
		case st&schedQueued != 0:
		default:
			s.state[gid] = schedQueued
			s.queue = append(s.queue, gid)
		}
	}
	s.cond.Broadcast()
}

func (s *scheduler) worker() {
	defer s.wg.Done()
	s.mu.Lock()
	for {
		for len(s.queue) == 0 && !s.stopped {
			s.cond.Wait()
		}
		if s.stopped {
			s.mu.Unlock()
			return
		}
		gid := s.queue[0]
		s.queue = s.queue[1:]
		s.state[gid] = schedProcessing
		s.mu.Unlock()

		s.process(gid)

		s.mu.Lock()
		if s.state[gid]&schedRequeue != 0 {
			s.state[gid] = schedQueued
			s.queue = append(s.queue, gid)
			s.cond.Signal()
		} else {
			delete(s.state, gid)
		}
		s.idle.Broadcast()
	}
}

// waitIdle returns once no worker is processing gid.
func (s *scheduler) waitIdle(gid uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.state[gid]&schedProcessing != 0 && !s.stopped {
		s.idle.Wait()
	}
}

// stop makes the workers exit after their current group and waits for them.
func (s *scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
}
