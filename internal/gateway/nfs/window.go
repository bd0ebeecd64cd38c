package nfs

import (
	"context"
	"fmt"
	"sync"
)

// Window is the gateway's congestion window (FSS §8): how many NFS calls
// it runs against the cluster at once. Like TCP's, it grows by one per
// window of successes (additive increase) and halves on a call that
// imputes congestion: a conflict the store gave up on, an overloaded or
// unreachable server, a deadline passed (multiplicative decrease). A call
// waits for a place until its deadline; one that finds none answers
// NFS3ERR_JUKEBOX, which makes the client wait and retry: an overloaded
// cluster slows clients down instead of failing them. Errors that are the
// answer (ENOENT, EEXIST, ...) do not impute congestion.
//
// Invariants: Min <= size <= Max at all times; inFlight <= floor(size)
// when a call is admitted (a shrink lets the calls running finish).
type Window struct {
	cfg WindowConfig

	mu       sync.Mutex
	size     float64
	inFlight int
	waiters  []chan struct{}
	stats    WindowStats
}

// WindowConfig bounds the window.
type WindowConfig struct {
	// Min, Max and Initial are call counts (zero: 4, 256 and 32).
	Min, Max, Initial int
}

// WindowStats counts what the window did (fields only grow but Size and
// InFlight).
type WindowStats struct {
	Size              float64
	InFlight          int
	Admitted, Refused int64
	Grows, Shrinks    int64
}

// NewWindow returns a window.
func NewWindow(cfg WindowConfig) (*Window, error) {
	if cfg.Min == 0 {
		cfg.Min = 4
	}
	if cfg.Max == 0 {
		cfg.Max = 256
	}
	if cfg.Initial == 0 {
		cfg.Initial = min(32, cfg.Max)
	}
	if cfg.Min < 1 || cfg.Max < cfg.Min || cfg.Initial < cfg.Min || cfg.Initial > cfg.Max {
		return nil, fmt.Errorf("nfs: congestion window %d..%d starting at %d: need 1 <= min <= initial <= max", cfg.Min, cfg.Max, cfg.Initial)
	}
	return &Window{cfg: cfg, size: float64(cfg.Initial)}, nil
}

// Acquire waits for a place in the window until ctx ends.
func (w *Window) Acquire(ctx context.Context) error {
	w.mu.Lock()
	if w.inFlight < int(w.size) && len(w.waiters) == 0 {
		w.inFlight++
		w.stats.Admitted++
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.waiters = append(w.waiters, ch)
	w.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, c := range w.waiters {
			if c == ch {
				w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
				w.stats.Refused++
				return fmt.Errorf("nfs: no place in the congestion window: %w", ctx.Err())
			}
		}
		// Admitted meanwhile: take it.
		return nil
	}
}

// Release ends a call; congested says whether its outcome imputes
// congestion.
func (w *Window) Release(congested bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inFlight--
	if congested {
		w.size = max(float64(w.cfg.Min), w.size/2)
		w.stats.Shrinks++
	} else if w.size < float64(w.cfg.Max) {
		w.size = min(float64(w.cfg.Max), w.size+1/w.size)
		w.stats.Grows++
	}
	for len(w.waiters) > 0 && w.inFlight < int(w.size) {
		ch := w.waiters[0]
		w.waiters = w.waiters[1:]
		w.inFlight++
		w.stats.Admitted++
		close(ch)
	}
}

// Stats returns the window's figures.
func (w *Window) Stats() WindowStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Size, s.InFlight = w.size, w.inFlight
	return s
}
