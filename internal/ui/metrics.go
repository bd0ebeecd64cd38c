package ui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The metrics the sampler reads: every node's server-side RPC counter and
// latency histogram (internal/server/rpcmetrics.go).
const (
	metricHandled = "arbor_rpc_server_handled_total"
	metricSeconds = "arbor_rpc_server_seconds"
)

// Bounds of the sampler.
const (
	// maxTargets bounds the nodes scraped per sample (and so the previous
	// scrapes remembered).
	maxTargets = 1000
	// maxScrapeBytes bounds the body read from one node's /metrics.
	maxScrapeBytes = 8 << 20
	// scrapeParallel bounds the scrapes in flight at once.
	scrapeParallel = 16
	// targetRefresh is how long a list of targets is used before it is
	// asked for again: node membership changes slowly, samples come often.
	targetRefresh = 10 * time.Second
)

// Defaults of SamplerOptions.
const (
	DefaultStep     = 2 * time.Second
	DefaultWindow   = 5 * time.Minute
	DefaultIdleStop = time.Minute
)

// Quantiles are the latency quantiles each Point carries.
var Quantiles = []float64{0.5, 0.9, 0.99}

// SamplerOptions configure a Sampler.
type SamplerOptions struct {
	// Targets returns the HTTP host:port of every node to scrape (for a
	// node, those of the live nodes in the directory's node table).
	Targets func(ctx context.Context) ([]string, error)
	// Client makes the scrapes; nil means a client without keep-alive
	// limits whose calls are bounded by Step.
	Client *http.Client
	// Step is the time between samples (DefaultStep if 0), Window the age
	// of the oldest point kept (DefaultWindow if 0), IdleStop how long
	// sampling goes on after the last Touch (DefaultIdleStop if 0).
	Step, Window, IdleStop time.Duration
	Logger                 *slog.Logger
}

// Point is the cluster's traffic over one step: the sum over the scraped
// nodes of the RPCs they served, and latency quantiles of the unary ones.
type Point struct {
	// UnixMs is when the step ended.
	UnixMs int64 `json:"t"`
	// Ops is RPCs served per second; Errors those that ended with a status
	// other than OK.
	Ops    float64 `json:"ops"`
	Errors float64 `json:"errors"`
	// LatencyMs holds the Quantiles of unary call latency in milliseconds,
	// in order; an entry is nil when no call ended in the step.
	LatencyMs []*float64 `json:"latency_ms"`
	// Nodes is how many nodes were scraped, Failed how many did not answer.
	Nodes  int `json:"nodes"`
	Failed int `json:"failed"`
}

// History is what GET /ui/api/metrics returns.
type History struct {
	StepMs    int64     `json:"step_ms"`
	WindowMs  int64     `json:"window_ms"`
	Quantiles []float64 `json:"quantiles"`
	Points    []Point   `json:"points"`
	// Sampling tells whether the sampler is running (it starts on the
	// first request, so the first answers have no points yet).
	Sampling bool `json:"sampling"`
	// Error is the last sample's problem, if any (for example a node
	// that did not answer), for the page to show.
	Error string `json:"error,omitempty"`
}

// Sampler keeps a short history of cluster-wide throughput and latency,
// scraping every node's /metrics each Step, but only while someone looks
// (see Touch). It is safe for concurrent use.
type Sampler struct {
	opts   SamplerOptions
	log    *slog.Logger
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	running  bool
	lastSeen time.Time
	points   []Point // oldest first, at most Window/Step
	prev     map[string]nodeScrape
	lastErr  string
	targets  []string
	targetAt time.Time
}

// NewSampler returns a sampler that is idle until the first Touch.
func NewSampler(opts SamplerOptions) (*Sampler, error) {
	if opts.Targets == nil {
		return nil, errors.New("ui: sampler needs a Targets function")
	}
	if opts.Step == 0 {
		opts.Step = DefaultStep
	}
	if opts.Window == 0 {
		opts.Window = DefaultWindow
	}
	if opts.IdleStop == 0 {
		opts.IdleStop = DefaultIdleStop
	}
	if opts.Step < 0 || opts.Window < opts.Step || opts.IdleStop < 0 {
		return nil, fmt.Errorf("ui: sampler step %v, window %v, idle stop %v: need 0 < step <= window and idle stop >= 0",
			opts.Step, opts.Window, opts.IdleStop)
	}
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Sampler{
		opts: opts, log: opts.Logger.With("component", "ui-sampler"),
		ctx: ctx, cancel: cancel, prev: map[string]nodeScrape{},
	}, nil
}

// Touch records that someone looked at the dashboard and starts sampling
// if it is not running.
func (s *Sampler) Touch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastSeen = time.Now()
	if s.running || s.ctx.Err() != nil {
		return
	}
	s.running = true
	// Scrapes from before a pause are too old to take a rate against.
	clear(s.prev)
	s.wg.Add(1)
	go s.run()
}

// Close stops sampling and waits for the sampler to stop.
func (s *Sampler) Close() {
	s.cancel()
	s.wg.Wait()
}

// History returns the points of the last Window.
func (s *Sampler) History() History {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trimLocked(time.Now())
	return History{
		StepMs:    s.opts.Step.Milliseconds(),
		WindowMs:  s.opts.Window.Milliseconds(),
		Quantiles: Quantiles,
		Points:    slices.Clone(s.points),
		Sampling:  s.running,
		Error:     s.lastErr,
	}
}

func (s *Sampler) run() {
	defer s.wg.Done()
	tick := time.NewTicker(s.opts.Step)
	defer tick.Stop()
	for {
		s.sample(s.ctx, time.Now())
		select {
		case <-s.ctx.Done():
			s.setStopped()
			return
		case <-tick.C:
		}
		s.mu.Lock()
		idle := time.Since(s.lastSeen) > s.opts.IdleStop
		if idle {
			s.running = false
		}
		s.mu.Unlock()
		if idle {
			s.log.Debug("dashboard idle; sampling stopped")
			return
		}
	}
}

func (s *Sampler) setStopped() {
	s.mu.Lock()
	s.running = false
	s.mu.Unlock()
}

// sample scrapes every target once and appends a point computed against
// the previous scrape of each node.
func (s *Sampler) sample(ctx context.Context, now time.Time) {
	// A sample never runs into the next one.
	ctx, cancel := context.WithTimeout(ctx, s.opts.Step)
	defer cancel()
	targets, err := s.currentTargets(ctx, now)
	if err != nil {
		s.setError(fmt.Sprintf("listing nodes: %v", err))
		return
	}
	scrapes := make([]nodeScrape, len(targets))
	errs := make([]error, len(targets))
	sem := make(chan struct{}, scrapeParallel)
	var wg sync.WaitGroup
	for i, addr := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			scrapes[i], errs[i] = scrape(ctx, s.opts.Client, addr)
		}()
	}
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		deltas []nodeDelta
		failed []string
	)
	next := make(map[string]nodeScrape, len(targets))
	for i, addr := range targets {
		if errs[i] != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", addr, errs[i]))
			continue
		}
		next[addr] = scrapes[i]
		if p, ok := s.prev[addr]; ok {
			deltas = append(deltas, delta(p, scrapes[i]))
		}
	}
	// Only nodes scraped now are remembered: the map stays as small as the
	// cluster, and a node back from the dead starts afresh.
	s.prev = next
	s.lastErr = ""
	if len(failed) > 0 {
		s.lastErr = fmt.Sprintf("%d of %d nodes did not answer (%s)", len(failed), len(targets), failed[0])
	}
	if len(deltas) == 0 && len(failed) == 0 {
		return // the first scrape of a run: nothing to take a rate against
	}
	pt := sumDeltas(deltas)
	pt.UnixMs = now.UnixMilli()
	pt.Nodes, pt.Failed = len(targets)-len(failed), len(failed)
	s.points = append(s.points, pt)
	s.trimLocked(now)
}

func (s *Sampler) setError(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = msg
}

// trimLocked drops points older than Window, and any beyond Window/Step
// (clock jumps), keeping the newest.
func (s *Sampler) trimLocked(now time.Time) {
	cut := now.Add(-s.opts.Window).UnixMilli()
	i := 0
	for i < len(s.points) && s.points[i].UnixMs < cut {
		i++
	}
	if max := int(s.opts.Window / s.opts.Step); len(s.points)-i > max {
		i = len(s.points) - max
	}
	if i > 0 {
		s.points = slices.Delete(s.points, 0, i)
	}
}

func (s *Sampler) currentTargets(ctx context.Context, now time.Time) ([]string, error) {
	s.mu.Lock()
	if s.targets != nil && now.Sub(s.targetAt) < targetRefresh {
		t := s.targets
		s.mu.Unlock()
		return t, nil
	}
	s.mu.Unlock()
	t, err := s.opts.Targets(ctx)
	if err != nil {
		return nil, err
	}
	t = slices.Compact(slices.Sorted(slices.Values(t)))
	if len(t) > maxTargets {
		t = t[:maxTargets]
	}
	s.mu.Lock()
	s.targets, s.targetAt = t, now
	s.mu.Unlock()
	return t, nil
}

// nodeScrape is what one scrape of one node yields: its RPC totals and its
// latency histogram summed over methods.
type nodeScrape struct {
	at      time.Time
	handled float64
	errors  float64
	// buckets are cumulative counts by upper bound, ascending; the last
	// bound is +Inf.
	buckets []bucket
}

type bucket struct {
	le    float64
	count float64
}

// nodeDelta is one node's traffic between two scrapes.
type nodeDelta struct {
	seconds float64
	handled float64
	errors  float64
	buckets []bucket // cumulative counts that ended in the interval
}

func scrape(ctx context.Context, client *http.Client, addr string) (nodeScrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nodeScrape{}, fmt.Errorf("scrape %s: %w", addr, err)
	}
	// The text format: the parser for it is the one that needs no
	// negotiation, and the nodes serve it by default.
	req.Header.Set("Accept", "text/plain")
	resp, err := client.Do(req)
	if err != nil {
		return nodeScrape{}, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nodeScrape{}, fmt.Errorf("scrape: HTTP %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return nodeScrape{}, fmt.Errorf("scrape: parse metrics: %w", err)
	}
	return fromFamilies(fams, time.Now()), nil
}

// fromFamilies sums the RPC metrics of one node over methods.
func fromFamilies(fams map[string]*dto.MetricFamily, at time.Time) nodeScrape {
	ns := nodeScrape{at: at}
	if f := fams[metricHandled]; f != nil {
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue()
			ns.handled += v
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() != "OK" {
					ns.errors += v
				}
			}
		}
	}
	byLe := map[float64]float64{}
	if f := fams[metricSeconds]; f != nil {
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			for _, b := range h.GetBucket() {
				// The text format lists +Inf as a bucket; the sample
				// count below is the same figure, present either way.
				if !math.IsInf(b.GetUpperBound(), 1) {
					byLe[b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
			}
			byLe[math.Inf(1)] += float64(h.GetSampleCount())
		}
	}
	for le, c := range byLe {
		ns.buckets = append(ns.buckets, bucket{le, c})
	}
	sort.Slice(ns.buckets, func(i, j int) bool { return ns.buckets[i].le < ns.buckets[j].le })
	return ns
}

// delta is the traffic between two scrapes of a node. A counter that went
// down means the node restarted: its whole count is from after the
// restart, which is the best estimate there is.
func delta(prev, cur nodeScrape) nodeDelta {
	sub := func(a, b float64) float64 {
		if b < a {
			return b
		}
		return b - a
	}
	d := nodeDelta{seconds: cur.at.Sub(prev.at).Seconds(), handled: sub(prev.handled, cur.handled), errors: sub(prev.errors, cur.errors)}
	before := map[float64]float64{}
	for _, b := range prev.buckets {
		before[b.le] = b.count
	}
	reset := cur.handled < prev.handled
	for _, b := range cur.buckets {
		c := b.count
		if !reset {
			c = sub(before[b.le], b.count)
		}
		d.buckets = append(d.buckets, bucket{b.le, c})
	}
	return d
}

// sumDeltas adds the nodes' rates and histograms into one point.
func sumDeltas(ds []nodeDelta) Point {
	var pt Point
	byLe := map[float64]float64{}
	for _, d := range ds {
		if d.seconds <= 0 {
			continue
		}
		pt.Ops += d.handled / d.seconds
		pt.Errors += d.errors / d.seconds
		for _, b := range d.buckets {
			byLe[b.le] += b.count
		}
	}
	buckets := make([]bucket, 0, len(byLe))
	for le, c := range byLe {
		buckets = append(buckets, bucket{le, c})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	for _, q := range Quantiles {
		v, ok := quantile(q, buckets)
		if !ok {
			pt.LatencyMs = append(pt.LatencyMs, nil)
			continue
		}
		ms := round3(v * 1000)
		pt.LatencyMs = append(pt.LatencyMs, &ms)
	}
	pt.Ops, pt.Errors = round3(pt.Ops), round3(pt.Errors)
	return pt
}

// quantile estimates the q-quantile of cumulative buckets (ascending, the
// last +Inf) the way Prometheus's histogram_quantile does: linear
// interpolation inside the bucket the rank falls in, the lowest bucket
// starting at 0, and the highest finite bound for a rank in the +Inf
// bucket. ok is false when the buckets hold no observation.
func quantile(q float64, buckets []bucket) (v float64, ok bool) {
	if len(buckets) == 0 {
		return 0, false
	}
	total := buckets[len(buckets)-1].count
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	lowerLe, lowerCount := 0.0, 0.0
	for _, b := range buckets {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lowerLe, true
			}
			in := b.count - lowerCount
			if in <= 0 {
				return b.le, true
			}
			// min: rounding must not carry the estimate past the bucket.
			return min(b.le, lowerLe+(b.le-lowerLe)*(rank-lowerCount)/in), true
		}
		lowerLe, lowerCount = b.le, b.count
	}
	return lowerLe, true
}

// round3 keeps three decimals: the page shows fewer, and the JSON stays
// short.
func round3(v float64) float64 {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', 3, 64), 64)
	return r
}
