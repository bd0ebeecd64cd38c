// Package retry is Arbor's one deadline and retry policy (DESIGN.md §1
// and STYLE.md "one deadline policy"; FSS §8 for the storage layer's
// share). Every client library that retries (extent, directory, B-tree,
// fs, kv, tract, FUSE) takes its limits from here, so that the whole
// stack agrees on who waits how long.
//
// # The rule
//
//  1. The caller's context deadline rules. No layer extends it; a layer
//     whose context has no deadline gives it that layer's default (the
//     Default* constants), once, at its entry point.
//  2. Inside that deadline a layer retries only what it knows did not
//     execute, or what it can repeat safely: no leader, a leader that
//     moved, a node that is down (routing around it), a conflict that the
//     layer re-reads for. Everything else is returned at once.
//  3. One attempt at one node takes at most its share of what is left
//     (Attempt): min(the layer's attempt cap, half of the remaining time),
//     so that an unreachable node can never eat the whole deadline and
//     there is always time left to try another.
//  4. Between attempts the layer waits Backoff.Delay(attempt): jittered
//     exponential, from Min doubling to Max, never past the deadline.
//
// # The shares (defaults used when the caller set no deadline)
//
//	layer                      whole call              one attempt
//	FUSE / NFS request         DefaultOperation  60 s  -
//	fs / metadata request      the request's     -     -
//	B-tree transaction         DefaultTransaction 30 s  -
//	extent store call          DefaultStoreCall   1 s  ExtentAttempt 1 s
//	directory call             the caller's      -     DirectoryAttempt 3 s
//
// A FUSE create therefore waits at most DefaultOperation however many
// layers retry below it: each lower layer retries inside the deadline it
// was handed, and a dead leader costs one ExtentAttempt (or less) before
// the call is routed to another replica. Attempt counts (MaxAttempts) are
// a second, optional bound for loops whose attempts are cheap and whose
// failures are not about time (B-tree conflicts).
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Deadlines a layer gives its context when the caller set none, and the
// caps on one attempt at one node.
const (
	// DefaultOperation bounds one user-visible operation: a FUSE or NFS
	// request, or one call of a CLI command that sets no --timeout.
	DefaultOperation = 60 * time.Second
	// DefaultTransaction bounds one B-tree transaction, its retries
	// included.
	DefaultTransaction = 30 * time.Second
	// DefaultStoreCall bounds one extent store call, its retries included
	// (FSS §8: 1 s per MPSC).
	DefaultStoreCall = time.Second
	// ExtentAttempt caps one attempt of an extent call at one node.
	ExtentAttempt = time.Second
	// DirectoryAttempt caps one attempt of a directory call at one
	// replica.
	DirectoryAttempt = 3 * time.Second
)

// Backoff is a jittered exponential wait between attempts.
type Backoff struct {
	// Min is the wait before the second attempt; each later one doubles,
	// up to Max.
	Min, Max time.Duration
}

// Standard backoffs.
var (
	// Fast is for conflicts between clients of the same pages (B-tree,
	// extent): they clear in milliseconds.
	Fast = Backoff{Min: time.Millisecond, Max: 200 * time.Millisecond}
	// Failover is for no leader, a moved leader or a dead node: an
	// election takes a few hundred milliseconds.
	Failover = Backoff{Min: 20 * time.Millisecond, Max: time.Second}
)

// Delay is the wait before attempt number attempt+1 (attempt counts from
// 0 for the first retry): uniformly in [d/2, d] where d = Min·2^attempt,
// capped at Max.
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Min
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d or until ctx ends, whichever comes first, and returns
// ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WithDefault gives ctx the deadline d from now if it has none (rule 1).
// Call cancel when done.
func WithDefault(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// Attempt returns the context of one attempt at one node (rule 3): its
// deadline is at most capDur from now, and at most half of what is left
// of ctx's, but never less than minAttempt (the last attempt takes what is
// left). Call cancel when done.
func Attempt(ctx context.Context, capDur time.Duration) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithTimeout(ctx, capDur)
	}
	left := time.Until(dl)
	share := min(capDur, left/2)
	if share < minAttempt {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, share)
}

// minAttempt is the shortest share Attempt hands out: below it the
// attempt takes the rest of the deadline.
const minAttempt = 50 * time.Millisecond

// Policy says which failures a loop retries and how long it waits.
type Policy struct {
	Backoff Backoff
	// MaxAttempts bounds the attempts (0: only the deadline bounds them).
	MaxAttempts int
	// Retryable reports whether err may succeed if tried again (rule 2).
	Retryable func(err error) bool
}

// ErrExhausted wraps the last error of a loop that used up its attempts
// or its deadline.
var ErrExhausted = errors.New("retry: gave up")

// Do runs fn until it succeeds, returns an error Retryable refuses, uses
// MaxAttempts, or ctx ends, waiting Backoff between attempts. attempt
// counts from 0. The error of a loop that gave up wraps ErrExhausted, the
// context's error if it ended, and fn's last error.
func Do(ctx context.Context, p Policy, fn func(ctx context.Context, attempt int) error) error {
	for attempt := 0; ; attempt++ {
		err := fn(ctx, attempt)
		if err == nil || p.Retryable == nil || !p.Retryable(err) {
			return err
		}
		if p.MaxAttempts > 0 && attempt+1 >= p.MaxAttempts {
			return fmt.Errorf("%w after %d attempts: %w", ErrExhausted, attempt+1, err)
		}
		if cerr := Sleep(ctx, p.Backoff.Delay(attempt)); cerr != nil {
			return fmt.Errorf("%w: %w (last: %w)", ErrExhausted, cerr, err)
		}
	}
}
