package ui

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// node is a real Prometheus registry with the RPC metrics a node exports
// (the names and buckets of internal/server/rpcmetrics.go), served over
// HTTP like a node's /metrics.
type node struct {
	srv     *httptest.Server
	handled *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHandled, Help: "h"}, []string{"method", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricSeconds, Help: "s", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}, []string{"method"}),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(n.handled, n.seconds)
	n.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) addr() string { return strings.TrimPrefix(n.srv.URL, "http://") }

// serve records calls the way the server's interceptor does.
func (n *node) serve(method, code string, calls int, latency time.Duration) {
	for range calls {
		n.handled.WithLabelValues(method, code).Inc()
		n.seconds.WithLabelValues(method).Observe(latency.Seconds())
	}
}

func newTestSampler(t *testing.T, opts SamplerOptions) *Sampler {
	t.Helper()
	s, err := NewSampler(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestSamplerSumsNodes(t *testing.T) {
	a, b := newNode(t), newNode(t)
	s := newTestSampler(t, SamplerOptions{
		Targets: func(context.Context) ([]string, error) { return []string{a.addr(), b.addr()}, nil },
		Step:    time.Second,
	})
	ctx := context.Background()
	a.serve("/x.X/Get", "OK", 5, time.Millisecond) // before the first scrape: not counted
	start := time.Now()
	s.sample(ctx, time.Now())
	if h := s.History(); len(h.Points) != 0 {
		t.Fatalf("first scrape made points %+v; there is nothing to take a rate against", h.Points)
	}
	// 10% errors on both nodes, every call 3 ms.
	a.serve("/x.X/Get", "OK", 90, 3*time.Millisecond)
	a.serve("/x.X/Get", "NotFound", 10, 3*time.Millisecond)
	b.serve("/x.X/Put", "OK", 180, 3*time.Millisecond)
	b.serve("/x.X/Put", "Unavailable", 20, 3*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	s.sample(ctx, time.Now())
	elapsed := time.Since(start).Seconds()

	h := s.History()
	if len(h.Points) != 1 {
		t.Fatalf("got %d points, want 1: %+v", len(h.Points), h)
	}
	p := h.Points[0]
	// 300 calls over a little less than elapsed (the scrapes bracket them).
	if p.Ops < 300/elapsed || p.Ops > 300/0.2 {
		t.Errorf("ops/s = %v, want between %v and %v", p.Ops, 300/elapsed, 300/0.2)
	}
	if r := p.Errors / p.Ops; math.Abs(r-0.1) > 0.01 {
		t.Errorf("errors/ops = %v, want 0.1", r)
	}
	if p.Nodes != 2 || p.Failed != 0 || h.Error != "" {
		t.Errorf("nodes %d failed %d error %q, want 2, 0, none", p.Nodes, p.Failed, h.Error)
	}
	// 3 ms falls in the bucket (1.6 ms, 3.2 ms].
	if len(p.LatencyMs) != len(Quantiles) {
		t.Fatalf("latency %v: want %d quantiles", p.LatencyMs, len(Quantiles))
	}
	for i, v := range p.LatencyMs {
		if v == nil {
			t.Errorf("p%v missing", Quantiles[i]*100)
		} else if *v <= 1.6 || *v > 3.2 {
			t.Errorf("p%v = %v ms, want in (1.6, 3.2]", Quantiles[i]*100, *v)
		}
	}
}

func TestSamplerReportsDeadNode(t *testing.T) {
	a, dead := newNode(t), newNode(t)
	dead.srv.Close()
	s := newTestSampler(t, SamplerOptions{
		Targets: func(context.Context) ([]string, error) { return []string{a.addr(), dead.addr()}, nil },
	})
	ctx := context.Background()
	s.sample(ctx, time.Now())
	s.sample(ctx, time.Now())
	h := s.History()
	if len(h.Points) == 0 {
		t.Fatal("no point although one node answered")
	}
	p := h.Points[len(h.Points)-1]
	if p.Nodes != 1 || p.Failed != 1 {
		t.Errorf("nodes %d failed %d, want 1 and 1", p.Nodes, p.Failed)
	}
	if !strings.Contains(h.Error, "1 of 2 nodes did not answer") || !strings.Contains(h.Error, dead.addr()) {
		t.Errorf("error %q does not name the dead node %s", h.Error, dead.addr())
	}
	// No call ended: the quantiles are unknown, not zero.
	for _, v := range p.LatencyMs {
		if v != nil {
			t.Errorf("latency %v with no calls, want null", *v)
		}
	}
}

// TestSamplerRunsOnlyWhileWatched checks invariants 1 and 2 of the
// package doc: sampling starts on Touch, stops by itself when nobody
// asks, and keeps at most Window/Step points.
func TestSamplerRunsOnlyWhileWatched(t *testing.T) {
	a := newNode(t)
	s := newTestSampler(t, SamplerOptions{
		Targets:  func(context.Context) ([]string, error) { return []string{a.addr()}, nil },
		Step:     20 * time.Millisecond,
		Window:   100 * time.Millisecond,
		IdleStop: 300 * time.Millisecond,
	})
	if s.History().Sampling {
		t.Fatal("sampling before anyone looked")
	}
	s.Touch()
	deadline := time.Now().Add(5 * time.Second)
	maxPoints := 0
	for s.History().Sampling {
		if time.Now().After(deadline) {
			t.Fatal("sampling did not stop after IdleStop without a Touch")
		}
		a.serve("/x.X/Get", "OK", 1, time.Millisecond)
		maxPoints = max(maxPoints, len(s.History().Points))
		time.Sleep(5 * time.Millisecond)
	}
	if maxPoints == 0 || maxPoints > 5 {
		t.Errorf("history held up to %d points, want 1 to Window/Step = 5", maxPoints)
	}
	n := len(s.History().Points)
	time.Sleep(100 * time.Millisecond)
	if got := len(s.History().Points); got > n {
		t.Errorf("points grew from %d to %d after sampling stopped", n, got)
	}
	s.Touch()
	if !s.History().Sampling {
		t.Error("Touch did not restart sampling")
	}
}

// TestQuantileWithinTrueBucket checks the histogram estimate against the
// exact quantile of the raw observations: it must lie in the bucket that
// holds the exact one (that is all a histogram knows).
func TestQuantileWithinTrueBucket(t *testing.T) {
	bounds := prometheus.ExponentialBuckets(0.00005, 2, 18)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + rng.IntN(500)
		obs := make([]float64, n)
		for i := range obs {
			obs[i] = math.Exp(rng.NormFloat64()*2 - 7) // log-normal around 1 ms
		}
		slices.Sort(obs)
		var buckets []bucket
		for _, le := range append(slices.Clone(bounds), math.Inf(1)) {
			c := 0
			for _, o := range obs {
				if o <= le {
					c++
				}
			}
			buckets = append(buckets, bucket{le, float64(c)})
		}
		for _, q := range Quantiles {
			exact := obs[max(0, int(math.Ceil(q*float64(n)))-1)]
			got, ok := quantile(q, buckets)
			if !ok {
				t.Fatalf("trial %d: no estimate from %d observations", trial, n)
			}
			lo, hi := 0.0, math.Inf(1)
			for _, le := range bounds {
				if exact <= le {
					hi = le
					break
				}
				lo = le
			}
			if math.IsInf(hi, 1) {
				hi = lo // beyond the last bound the estimate is that bound
			}
			if got < lo || got > hi {
				t.Errorf("trial %d q%v: estimate %v outside the exact value's bucket [%v, %v] (exact %v)", trial, q, got, lo, hi, exact)
			}
		}
	}
	if _, ok := quantile(0.5, []bucket{{1, 0}, {math.Inf(1), 0}}); ok {
		t.Error("an estimate from an empty histogram")
	}
}

func TestNewSamplerValidates(t *testing.T) {
	targets := func(context.Context) ([]string, error) { return nil, nil }
	for _, o := range []SamplerOptions{
		{},
		{Targets: targets, Step: time.Minute, Window: time.Second},
		{Targets: targets, Step: -time.Second},
	} {
		if _, err := NewSampler(o); err == nil {
			t.Errorf("NewSampler(%+v) accepted", o)
		}
	}
}
