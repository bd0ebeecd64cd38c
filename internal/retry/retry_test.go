package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDelayGrowsJitteredAndCapped(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for attempt, want := range []time.Duration{10, 20, 40, 80, 80, 80} {
		want *= time.Millisecond
		for range 50 {
			d := b.Delay(attempt)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: delay %v outside [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	if d := (Backoff{}).Delay(3); d != 0 {
		t.Fatalf("zero backoff waits %v", d)
	}
}

func TestWithDefaultKeepsTheCallersDeadline(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ctx, c2 := WithDefault(parent, time.Second)
	defer c2()
	pd, _ := parent.Deadline()
	if d, _ := ctx.Deadline(); !d.Equal(pd) {
		t.Fatalf("deadline %v, want the caller's %v", d, pd)
	}
	ctx, c3 := WithDefault(context.Background(), time.Second)
	defer c3()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > time.Second {
		t.Fatalf("no-deadline context got %v %v, want at most 1s", d, ok)
	}
}

func TestAttemptTakesItsShare(t *testing.T) {
	// Plenty left: the cap.
	parent, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, c := Attempt(parent, time.Second)
	d, _ := ctx.Deadline()
	c()
	if left := time.Until(d); left > time.Second || left < 900*time.Millisecond {
		t.Fatalf("attempt with a minute left got %v, want the 1s cap", left)
	}
	// Little left: half of it.
	parent2, cancel2 := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel2()
	ctx, c = Attempt(parent2, time.Second)
	d, _ = ctx.Deadline()
	c()
	if left := time.Until(d); left > 300*time.Millisecond {
		t.Fatalf("attempt with 600ms left got %v, want at most half", left)
	}
	// Almost nothing left: all of it.
	parent3, cancel3 := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel3()
	ctx, c = Attempt(parent3, time.Second)
	defer c()
	p3, _ := parent3.Deadline()
	if d, _ := ctx.Deadline(); !d.Equal(p3) {
		t.Fatalf("last attempt got %v, want the caller's deadline %v", d, p3)
	}
}

var errFlaky = errors.New("flaky")

func TestDoRetriesOnlyWhatItMay(t *testing.T) {
	p := Policy{Backoff: Backoff{Min: time.Microsecond, Max: time.Millisecond}, Retryable: func(err error) bool { return errors.Is(err, errFlaky) }}
	n := 0
	err := Do(context.Background(), p, func(_ context.Context, attempt int) error {
		if attempt != n {
			t.Fatalf("attempt %d, want %d", attempt, n)
		}
		n++
		if n < 5 {
			return errFlaky
		}
		return nil
	})
	if err != nil || n != 5 {
		t.Fatalf("Do = %v after %d attempts, want success after 5", err, n)
	}
	fatal := errors.New("fatal")
	n = 0
	err = Do(context.Background(), p, func(context.Context, int) error { n++; return fatal })
	if !errors.Is(err, fatal) || errors.Is(err, ErrExhausted) || n != 1 {
		t.Fatalf("non-retryable error: %v after %d attempts, want it at once", err, n)
	}
	p.MaxAttempts = 3
	n = 0
	err = Do(context.Background(), p, func(context.Context, int) error { n++; return errFlaky })
	if !errors.Is(err, ErrExhausted) || !errors.Is(err, errFlaky) || n != 3 {
		t.Fatalf("bounded attempts: %v after %d attempts, want ErrExhausted wrapping errFlaky after 3", err, n)
	}
}

func TestDoStopsAtTheDeadline(t *testing.T) {
	p := Policy{Backoff: Backoff{Min: 10 * time.Millisecond, Max: 10 * time.Millisecond}, Retryable: func(error) bool { return true }}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Do(ctx, p, func(context.Context, int) error { return errFlaky })
	if !errors.Is(err, ErrExhausted) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errFlaky) {
		t.Fatalf("Do = %v, want ErrExhausted, the deadline and the last error", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Do ran %v past a 100ms deadline", el)
	}
}
