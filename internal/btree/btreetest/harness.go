package btreetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/arbor-storage/arbor/internal/btree"
)

// Options configure a model run.
type Options struct {
	Seed uint64
	// Open returns a new client of the tree under test, with its own
	// cache. The harness closes the clients it opens.
	Open func(t testing.TB) *btree.Tree
	// Chaos, if set, starts the faults of the run (store faults, node
	// kills, outages) and returns a function that stops them all and
	// returns once the system is healthy again.
	Chaos func() (stop func())
	// Clients run concurrently (RunConcurrent); each runs OpsPerClient
	// operations over Keys keys.
	Clients, OpsPerClient, Keys int
	// RestartOneIn makes a client restart cold (a killed client: its cache
	// and queued rebalances are lost) before an operation with probability
	// 1/RestartOneIn; 0 never.
	RestartOneIn int
	// OpTimeout, if set, bounds each operation.
	OpTimeout time.Duration
	// CheckTimeout bounds the linearizability check (default 60 s).
	CheckTimeout time.Duration
	// Initial is the tree's content when the run starts (a previous
	// round's Report.Final); nil is empty.
	Initial map[string]string
}

// Report is what a run did.
type Report struct {
	// Ops counts the operations in the history; Ambiguous those whose
	// outcome was unknown; GaveUp those that failed without effect.
	Ops, Ambiguous, GaveUp int
	// Final is the tree's content at the end.
	Final map[string]string
	// Check is the final structural check.
	Check *btree.CheckReport
	// Clients sums the metrics of the clients that ran the operations
	// (RunConcurrent; the final check's client is not counted), to show
	// which structural changes the run went through.
	Clients btree.Metrics
}

// addMetrics adds m's counters to sum (CachedPages excepted).
func addMetrics(sum *btree.Metrics, m btree.Metrics) {
	sum.Txns += m.Txns
	sum.Commits += m.Commits
	sum.Retries += m.Retries
	sum.Conflicts += m.Conflicts
	sum.Ambiguous += m.Ambiguous
	sum.PageReads += m.PageReads
	sum.Resolves += m.Resolves
	sum.CacheHits += m.CacheHits
	sum.CacheMisses += m.CacheMisses
	sum.Splits += m.Splits
	sum.RootSplits += m.RootSplits
	sum.Merges += m.Merges
	sum.Redistributions += m.Redistributions
	sum.RootCollapses += m.RootCollapses
	sum.BlocksAllocated += m.BlocksAllocated
	sum.BlocksFreed += m.BlocksFreed
	sum.BlockSplits += m.BlockSplits
	sum.RebalanceDropped += m.RebalanceDropped
}

func (o *Options) opContext() (context.Context, context.CancelFunc) {
	if o.OpTimeout > 0 {
		return context.WithTimeout(context.Background(), o.OpTimeout)
	}
	return context.WithCancel(context.Background())
}

// failedWithoutEffect reports whether err means the operation did nothing:
// the transaction gave up on retryable failures, or never committed.
func failedWithoutEffect(err error) bool {
	return errors.Is(err, btree.ErrGaveUp) || errors.Is(err, context.DeadlineExceeded)
}

// RunSequential runs one client's random programs on tr, checking each
// result against the map model. An ambiguous program is settled by reading
// its keys back: they must show all of it or none of it (atomicity). At the
// end the tree must hold exactly the model and check clean.
func RunSequential(t *testing.T, tr *btree.Tree, o Options) Report {
	t.Helper()
	stop := func() {}
	if o.Chaos != nil {
		stop = o.Chaos()
	}
	g := NewGenerator(o.Seed, 0, o.Keys)
	model := State{}
	for k, v := range o.Initial {
		model[k] = v
	}
	var rep Report
	for i := range o.OpsPerClient {
		p := g.Next()
		ctx, cancel := o.opContext()
		got, err := Run(ctx, tr, p)
		cancel()
		after, want := model.apply(p)
		rep.Ops++
		switch {
		case err == nil:
			if !resultsEqual(got, want) {
				stop()
				t.Fatalf("op %d %v: got %+v, want %+v", i, p, got, want)
			}
			model = after
		case errors.Is(err, btree.ErrAmbiguous):
			rep.Ambiguous++
			model = settle(t, tr, p, model, after)
		case failedWithoutEffect(err):
			rep.GaveUp++
		default:
			stop()
			t.Fatalf("op %d %v: %v", i, p, err)
		}
	}
	stop()
	rep.Final = ScanAll(t, tr)
	if err := equalStates(rep.Final, model); err != nil {
		t.Fatalf("final state: %v", err)
	}
	if _, err := tr.RebalanceAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep.Check = MustCheck(t, tr)
	if err := equalStates(ScanAll(t, tr), model); err != nil {
		t.Fatalf("final state after rebalancing: %v", err)
	}
	return rep
}

// settle reads back the keys an ambiguous program wrote and checks they
// show all of its writes or none.
func settle(t *testing.T, tr *btree.Tree, p Program, before, after State) State {
	t.Helper()
	matchBefore, matchAfter := true, true
	for _, st := range p {
		if st.kind != StepPut && st.kind != StepDel {
			continue
		}
		var v []byte
		var ok bool
		var err error
		for try := 0; ; try++ {
			if v, ok, err = tr.Get(context.Background(), []byte(st.key)); err == nil {
				break
			}
			if try > 100 {
				t.Fatalf("reading %q back: %v", st.key, err)
			}
		}
		bv, bok := before[st.key]
		av, aok := after[st.key]
		matchBefore = matchBefore && ok == bok && string(v) == bv
		matchAfter = matchAfter && ok == aok && string(v) == av
	}
	switch {
	case matchAfter:
		return after
	case matchBefore:
		return before
	}
	t.Fatalf("ambiguous %v left a state that is neither all of it nor none of it", p)
	return nil
}

// RunConcurrent runs o.Clients clients at once, each with its own tree
// client, under o.Chaos and client restarts. The history, ended by a full
// read once everything has settled, must linearize against the map model,
// and the tree must check clean.
func RunConcurrent(t *testing.T, o Options) Report {
	t.Helper()
	var clock atomic.Int64
	now := func() int64 { return clock.Add(1) }
	stop := func() {}
	if o.Chaos != nil {
		stop = o.Chaos()
	}
	var mu sync.Mutex
	var history []porcupine.Operation
	var ambiguous []int
	var rep Report
	var failed atomic.Bool
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := NewGenerator(o.Seed, c, o.Keys)
			tr := o.Open(t)
			closeTree := func() {
				tr.Close()
				mu.Lock()
				addMetrics(&rep.Clients, tr.Metrics())
				mu.Unlock()
			}
			defer func() { closeTree() }()
			for i := range o.OpsPerClient {
				if failed.Load() {
					return
				}
				if i > 0 && o.RestartOneIn > 0 && g.r.IntN(o.RestartOneIn) == 0 {
					closeTree()
					tr = o.Open(t)
				}
				p := g.Next()
				ctx, cancel := o.opContext()
				call := now()
				res, err := Run(ctx, tr, p)
				ret := now()
				cancel()
				op := porcupine.Operation{ClientId: c, Input: p, Call: call, Return: ret}
				switch {
				case err == nil:
					op.Output = Output{Results: res}
				case errors.Is(err, btree.ErrAmbiguous):
					op.Output = Output{Unknown: true}
				case failedWithoutEffect(err):
					mu.Lock()
					rep.GaveUp++
					mu.Unlock()
					continue
				default:
					failed.Store(true)
					t.Errorf("client %d op %v: %v", c, p, err)
					return
				}
				mu.Lock()
				if op.Output.(Output).Unknown {
					ambiguous = append(ambiguous, len(history))
				}
				history = append(history, op)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	stop()
	if t.Failed() {
		t.FailNow()
	}
	// A first full read (and a rebalance) resolves whatever prepared
	// transactions are left, so every ambiguous operation has settled
	// before the final read: they must linearize before it.
	tr := o.Open(t)
	defer tr.Close()
	ScanAll(t, tr)
	if _, err := tr.RebalanceAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep.Check = MustCheck(t, tr)
	rep.Final = ScanAll(t, tr)
	finalCall := now()
	for _, i := range ambiguous {
		history[i].Return = finalCall - 1
	}
	var pairs []btree.KV
	for _, k := range sortedKeys(rep.Final) {
		pairs = append(pairs, btree.KV{Key: []byte(k), Value: []byte(rep.Final[k])})
	}
	history = append(history, porcupine.Operation{
		ClientId: o.Clients, Input: Program{{kind: StepScan, key: ""}},
		Call: finalCall, Output: Output{Results: []StepResult{{pairs: pairs}}}, Return: now(),
	})
	rep.Ops, rep.Ambiguous = len(history), len(ambiguous)
	timeout := o.CheckTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	initial := State{}
	for k, v := range o.Initial {
		initial[k] = v
	}
	model := NewModel(initial)
	res, info := porcupine.CheckOperationsVerbose(model.ToModel(), history, timeout)
	if res != porcupine.Ok {
		name := "(not written)"
		if f, err := os.CreateTemp("", "btree-model-*.html"); err == nil {
			_ = porcupine.Visualize(model.ToModel(), info, f)
			f.Close()
			name = f.Name()
		}
		t.Fatalf("history of %d operations (%d ambiguous) is not linearizable (%v); visualization in %s", len(history), len(ambiguous), res, name)
	}
	return rep
}

// ScanAll returns the whole tree by a streaming scan, checking its order.
func ScanAll(t testing.TB, tr *btree.Tree) map[string]string {
	t.Helper()
	out := map[string]string{}
	var prev []byte
	err := tr.Scan(context.Background(), nil, nil, func(k, v []byte) error {
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("scan out of order: %q then %q", prev, k)
		}
		prev = bytes.Clone(k)
		out[string(k)] = string(v)
		return nil
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

// MustCheck runs Check and fails the test on any problem.
func MustCheck(t testing.TB, tr *btree.Tree) *btree.CheckReport {
	t.Helper()
	rep, err := tr.Check(context.Background())
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if !rep.OK() {
		t.Fatalf("check found problems:\n%s", strings.Join(rep.Problems, "\n"))
	}
	return rep
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func equalStates(a map[string]string, b State) error {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return fmt.Errorf("key %q: tree has %q, model %q (present %v)", k, v, w, ok)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			return fmt.Errorf("key %q=%q is in the model, not in the tree", k, v)
		}
	}
	return nil
}
