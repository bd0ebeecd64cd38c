package nfs

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWindow checks the congestion window against its contract: AIMD
// within its bounds, callers past it wait, and a caller that waits past
// its deadline is refused and leaves no place taken.
func TestWindow(t *testing.T) {
	if _, err := NewWindow(WindowConfig{Min: 8, Max: 4}); err == nil {
		t.Fatal("a window with min > max was accepted")
	}
	w, err := NewWindow(WindowConfig{Min: 2, Max: 8, Initial: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 4 {
		if err := w.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Full: a fifth caller waits until its deadline, then is refused.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire past a full window: %v", err)
	}
	// A waiter is admitted when a call ends.
	got := make(chan error, 1)
	go func() { got <- w.Acquire(ctx) }()
	time.Sleep(10 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("admitted past a full window")
	default:
	}
	w.Release(false) // success: grows to 4.25, admits the waiter
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); s.InFlight != 4 || s.Size <= 4 || s.Refused != 1 {
		t.Fatalf("after a success: %+v", s)
	}
	// Congestion halves, never below Min.
	for range 4 {
		w.Release(true)
	}
	if s := w.Stats(); s.Size != 2 || s.InFlight != 0 || s.Shrinks != 4 {
		t.Fatalf("after four congested calls: %+v", s)
	}
	// Successes grow it by about one per window, never above Max.
	for range 1000 {
		if err := w.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		w.Release(false)
	}
	if s := w.Stats(); s.Size != 8 {
		t.Fatalf("after 1000 successes: %+v", s)
	}
}
