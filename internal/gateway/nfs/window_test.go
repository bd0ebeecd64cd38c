package nfs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// TestMetrics checks that the gateway's figures register and read.
func TestMetrics(t *testing.T) {
	_, srv := startLocal(t)
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")
	if st, _ := getattr(c, root); st != OK {
		t.Fatal(st)
	}
	reg := prometheus.NewRegistry()
	if err := srv.Gateway().RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if m.GetGauge() != nil {
			got[mf.GetName()] = m.GetGauge().GetValue()
		} else {
			got[mf.GetName()] = m.GetCounter().GetValue()
		}
	}
	if len(got) != 6 || got["arbor_nfs_window_size"] < 32 || got["arbor_nfs_calls_admitted_total"] < 1 {
		t.Fatalf("metrics: %v", got)
	}
}
