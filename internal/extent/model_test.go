package extent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// The model: accounts. Each group is modelPages pages spread over three
// extents (two in the first, one in each other), each holding a balance
// and the unique id of the write that stored it. Operations are reads of
// one page and transfers (MPSCs over two or three pages, within one extent
// or across two or three), conditioned on the slots their reads returned.
// Groups share no page, so the history is checked group by group.
const (
	modelGroups       = 6
	modelPages        = 4
	modelInitBalance  = 100
	modelWorkers      = 12
	defaultModelOps   = 30_000
	modelCheckTimeout = 3 * time.Minute
)

// Where each page of a group lives: extent index, page within the group's
// block of that extent.
var modelLayout = [modelPages]struct{ extent, page int }{{0, 0}, {0, 1}, {1, 0}, {2, 0}}

// The transfers workers choose from (pages of a group): within extent 0,
// across two extents, across three.
var modelTransfers = [][]int{{0, 1}, {0, 2}, {1, 3}, {0, 2, 3}, {1, 2, 3}}

type pageVal struct {
	bal int64
	id  uint64
}

func (v pageVal) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(v.bal))
	return binary.BigEndian.AppendUint64(b, v.id)
}

func decodePageVal(b []byte) (pageVal, error) {
	if len(b) != 16 {
		return pageVal{}, fmt.Errorf("page of %d bytes", len(b))
	}
	return pageVal{bal: int64(binary.BigEndian.Uint64(b)), id: binary.BigEndian.Uint64(b[8:])}, nil
}

type modelState [modelPages]pageVal

type modelInput struct {
	group  int
	read   bool
	pages  []int
	expect []pageVal
	write  []pageVal
}

type outcome int

const (
	outOK       outcome = iota
	outConflict         // a slot had moved: some page differs from what was read
	outNoEffect         // refused for another reason: nothing changed
)

type modelOutput struct {
	val pageVal // read
	out outcome
	err string // why a transfer failed, for the visualization
}

var accountsModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := make([][]porcupine.Operation, modelGroups)
		for _, op := range history {
			g := op.Input.(modelInput).group
			by[g] = append(by[g], op)
		}
		return by
	},
	Init: func() any {
		var s modelState
		for i := range s {
			s[i] = pageVal{bal: modelInitBalance}
		}
		return s
	},
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(modelState), input.(modelInput), output.(modelOutput)
		if in.read {
			return out.val == s[in.pages[0]], s
		}
		match := true
		for i, p := range in.pages {
			if s[p] != in.expect[i] {
				match = false
			}
		}
		switch out.out {
		case outOK:
			if !match {
				return false, s
			}
			for i, p := range in.pages {
				s[p] = in.write[i]
			}
			return true, s
		case outConflict:
			return !match, s
		}
		return true, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(modelInput), output.(modelOutput)
		if in.read {
			return fmt.Sprintf("g%d read p%d -> %v", in.group, in.pages[0], out.val)
		}
		return fmt.Sprintf("g%d transfer %v %v -> %v: %d %s", in.group, in.pages, in.expect, in.write, out.out, out.err)
	},
}

// modelRun is the shared state of one run.
type modelRun struct {
	t       *testing.T
	c       *testCluster
	extents [3]uint64
	blocks  [modelGroups][3]Pointer
	start   time.Time
	nextID  atomic.Uint64

	mu      sync.Mutex
	history []porcupine.Operation
	// ambiguous transfers, resolved after the run by what reads observed.
	ambiguous []porcupine.Operation
	observed  map[uint64]bool
	count     atomic.Int64
}

func (r *modelRun) now() int64 { return int64(time.Since(r.start)) }

func (r *modelRun) ptr(g, p int) Pointer {
	l := modelLayout[p]
	return r.blocks[g][l.extent].WithPage(r.blocks[g][l.extent].Page + uint64(l.page))
}

func (r *modelRun) record(op porcupine.Operation, ambiguous bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ambiguous {
		r.ambiguous = append(r.ambiguous, op)
	} else {
		r.history = append(r.history, op)
	}
	if in := op.Input.(modelInput); in.read {
		r.observed[op.Output.(modelOutput).val.id] = true
	}
	r.count.Add(1)
}

// read reads one page of group g, recording the read; a page held by a
// prepared transaction is waited for briefly, then recovered (as a B-tree
// reader would).
func (r *modelRun) read(ctx context.Context, cl *Client, g, p int, rng *rand.Rand) (pageVal, uint64, bool) {
	for attempt := 0; attempt < 3; attempt++ {
		call := r.now()
		page, err := cl.ReadPage(ctx, r.ptr(g, p))
		if ref, ok := PreparedTxn(err); ok {
			if attempt == 0 {
				time.Sleep(time.Duration(5+rng.IntN(15)) * time.Millisecond)
			} else {
				_, _ = cl.Recover(ctx, ref)
			}
			continue
		}
		if err != nil {
			return pageVal{}, 0, false
		}
		v, err := decodePageVal(page.Data)
		if err != nil {
			r.t.Errorf("group %d page %d: %v", g, p, err)
			return pageVal{}, 0, false
		}
		r.record(porcupine.Operation{ClientId: 0, Input: modelInput{group: g, read: true, pages: []int{p}}, Call: call,
			Output: modelOutput{val: v}, Return: r.now()}, false)
		return v, page.Slot, true
	}
	return pageVal{}, 0, false
}

// transfer moves an amount along pages of group g in one MPSC. With
// crashAt > 0 the coordinator crashes before that step.
func (r *modelRun) transfer(ctx context.Context, cl *Client, crash *atomic.Int64, g int, pages []int, rng *rand.Rand) {
	expect := make([]pageVal, len(pages))
	slots := make([]uint64, len(pages))
	for i, p := range pages {
		v, slot, ok := r.read(ctx, cl, g, p, rng)
		if !ok {
			return
		}
		expect[i], slots[i] = v, slot
	}
	write := make([]pageVal, len(pages))
	amount := int64(1 + rng.IntN(10))
	for i := range pages {
		bal := expect[i].bal
		if i == 0 {
			bal -= amount
		}
		if i == len(pages)-1 {
			bal += amount
		}
		write[i] = pageVal{bal: bal, id: r.nextID.Add(1)}
	}
	elems := make([]Element, len(pages))
	for i, p := range pages {
		elems[i] = Write(r.ptr(g, p), slots[i], write[i].encode())
		if rng.IntN(2) == 0 {
			// Half the writes as page deltas against the page read (its
			// encoding is canonical), so every commit path applies them:
			// a delta the extent refused would be an unexpected error.
			d, ok := encodeDelta(expect[i].encode(), write[i].encode(), maxPageSizeBytes)
			if !ok {
				r.t.Errorf("no delta between %v and %v", expect[i], write[i])
				return
			}
			elems[i] = WriteDelta(r.ptr(g, p), slots[i], d)
		}
	}
	extents := map[uint64]bool{}
	for _, e := range elems {
		extents[e.Ptr.Extent] = true
	}
	if len(extents) > 1 && rng.IntN(20) == 0 {
		crash.Store(int64(1 + rng.IntN(2*len(extents))))
	}
	in := modelInput{group: g, pages: pages, expect: expect, write: write}
	call := r.now()
	_, err := cl.Commit(ctx, elems)
	crash.Store(0)
	ret := r.now()
	op := porcupine.Operation{Input: in, Call: call, Return: ret}
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	switch {
	case err == nil:
		op.Output = modelOutput{out: outOK}
	case errors.Is(err, ErrAmbiguous) || errors.Is(err, errCoordinatorCrashed):
		op.Output = modelOutput{out: outOK}
		r.record(op, true)
		return
	case errors.Is(err, ErrConflict):
		op.Output = modelOutput{out: outConflict, err: errText}
	case errors.Is(err, ErrPrepared), errors.Is(err, ErrAborted), errors.Is(err, ErrUnavailable):
		op.Output = modelOutput{out: outNoEffect, err: errText}
	default:
		r.t.Errorf("transfer %v of group %d: unexpected error %v", pages, g, err)
		return
	}
	r.record(op, false)
}

// snapshot reads every page of group g and validates the reads with a
// check-only MPSC (a transaction across all three extents): if it
// commits, the reads were one consistent state.
func (r *modelRun) snapshot(ctx context.Context, cl *Client, g int, rng *rand.Rand) (modelState, bool) {
	var s modelState
	elems := make([]Element, modelPages)
	for p := range modelPages {
		v, slot, ok := r.read(ctx, cl, g, p, rng)
		if !ok {
			return s, false
		}
		s[p] = v
		elems[p] = Check(r.ptr(g, p), slot)
	}
	_, err := cl.Commit(ctx, elems)
	return s, err == nil
}

// checkInvariant: every group's balances sum to what they started with,
// on a validated snapshot (the invariant spans the three extents).
func (r *modelRun) checkInvariant(cl *Client, rng *rand.Rand, when string) {
	for g := range modelGroups {
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s, ok := r.snapshot(ctx, cl, g, rng)
			cancel()
			if ok {
				var sum int64
				for _, v := range s {
					sum += v.bal
				}
				if sum != modelPages*modelInitBalance {
					r.dumpGroup(g)
					r.t.Fatalf("%s: group %d sums to %d, want %d: %v", when, g, sum, modelPages*modelInitBalance, s)
				}
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("%s: no consistent snapshot of group %d within 30s", when, g)
			}
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
	}
}

// TestModelCheckedWorkload is the extent store's model check: concurrent
// random MPSCs (single-extent and across two or three extents) by
// modelWorkers clients, under injected RPC faults (lost requests and
// replies, duplicates, delays) between clients and nodes and between nodes,
// coordinator crashes in the middle of two-phase commits, and extent
// leaders killed (power loss) and restarted. The history (at least
// defaultModelOps operations) must be linearizable against the accounts
// model, and the total of every group, whose pages span three extents,
// must hold after every fault. ARBOR_EXTENT_MODEL_OPS sets a longer run;
// ARBOR_SEED replays one.
func TestModelCheckedWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: run without -short")
	}
	target := defaultModelOps
	if s := os.Getenv("ARBOR_EXTENT_MODEL_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ARBOR_EXTENT_MODEL_OPS=%q", s)
		}
		target = n
	}
	seed := testseed.Seed(t)

	clientFaults, err := faults.New(faults.Options{Config: faults.Config{Seed: seed}})
	if err != nil {
		t.Fatal(err)
	}
	nodeFaults, err := faults.New(faults.Options{Config: faults.Config{Seed: seed + 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := newTestCluster(t, 0, seed)
	c.nodeFaults = nodeFaults
	for id := uint64(1); id <= 3; id++ {
		c.addNode(id)
	}
	r := &modelRun{t: t, c: c, observed: map[uint64]bool{}}
	setup := c.client(nil)
	for i := range r.extents {
		r.extents[i] = c.createExtent(smallGeometry(), 1, 2, 3)
	}
	for g := range modelGroups {
		for e := range 3 {
			r.blocks[g][e] = allocate(t, setup, r.extents[e], uint64(1+g))
		}
		for p := range modelPages {
			v := pageVal{bal: modelInitBalance}
			retry(t, "initial write", 10*time.Second, func(ctx context.Context) ([]Result, error) {
				return setup.Commit(ctx, []Element{Write(r.ptr(g, p), 0, v.encode())})
			})
		}
	}

	faulty := faults.Config{FailRate: 0.02, DupRate: 0.02, DelayRate: 0.05, DelayMin: 0, DelayMax: 5 * time.Millisecond}
	if err := clientFaults.SetConfig(withSeed(faulty, seed)); err != nil {
		t.Fatal(err)
	}
	if err := nodeFaults.SetConfig(withSeed(faults.Config{FailRate: 0.01, DupRate: 0.01}, seed+1)); err != nil {
		t.Fatal(err)
	}
	r.start = time.Now()
	// paused holds the workers off while the nemesis checks the invariant:
	// its snapshot validates four pages across three extents, which the
	// workers' transfers kept invalidating for 30 s on a loaded machine.
	var done, paused atomic.Bool
	defer done.Store(true) // a failed check must not leave workers paused for good
	var wg sync.WaitGroup
	for w := range modelWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)+100))
			var crash atomic.Int64
			cl := c.client(clientFaults)
			cl.hooks.beforeStep = func(step int, _ pb.StepKind) bool { return int64(step) == crash.Load() }
			for !done.Load() && r.count.Load() < int64(target) {
				if paused.Load() {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				g := rng.IntN(modelGroups)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if rng.IntN(10) < 3 {
					r.read(ctx, cl, g, rng.IntN(modelPages), rng)
				} else {
					r.transfer(ctx, cl, &crash, g, modelTransfers[rng.IntN(len(modelTransfers))], rng)
				}
				cancel()
			}
		}()
	}

	// The nemesis: kill a node (every extent it led elects a new leader),
	// bring it back, and check the invariant after each fault.
	checker := c.client(nil)
	rng := rand.New(rand.NewPCG(seed, 7))
	kills := 0
	for r.count.Load() < int64(target) && !t.Failed() {
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		victim := c.leader(r.extents[rng.IntN(len(r.extents))])
		c.crash(victim)
		kills++
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
		c.start(victim)
		paused.Store(true)
		r.checkInvariant(checker, rng, fmt.Sprintf("after kill %d (node %d)", kills, victim))
		paused.Store(false)
	}
	done.Store(true)
	wg.Wait()

	// Quiesce: no more faults, resolve what is left, read the final state.
	_ = clientFaults.SetConfig(faults.Config{})
	_ = nodeFaults.SetConfig(faults.Config{})
	for _, e := range r.extents {
		info := retry(t, "info", 20*time.Second, func(ctx context.Context) (*pb.InfoResponse, error) { return checker.Info(ctx, e) })
		for _, rec := range info.Pending {
			retry(t, "recover", 20*time.Second, func(ctx context.Context) (Outcome, error) {
				return checker.Recover(ctx, TxnRef{ID: rec.TxnId, Extent: e})
			})
		}
	}
	r.checkInvariant(checker, rng, "at the end")
	for g := range modelGroups {
		for p := range modelPages {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, _, ok := r.read(ctx, checker, g, p, rng)
				cancel()
				if ok {
					break
				}
			}
		}
	}

	// An ambiguous transfer took effect if and only if some read saw one
	// of its writes: whoever overwrote them read them first (slots), and
	// what nobody overwrote is in the final reads. Those that took effect
	// may have done so any time after their call.
	r.mu.Lock()
	history := r.history
	var tookEffect, noEffect int
	for _, op := range r.ambiguous {
		in := op.Input.(modelInput)
		if r.observed[in.write[0].id] {
			op.Return = math.MaxInt64 / 2
			history = append(history, op)
			tookEffect++
		} else {
			noEffect++
		}
	}
	r.mu.Unlock()
	var reads, oks, conflicts, refused int
	for _, op := range history {
		in, out := op.Input.(modelInput), op.Output.(modelOutput)
		switch {
		case in.read:
			reads++
		case out.out == outOK:
			oks++
		case out.out == outConflict:
			conflicts++
		default:
			refused++
		}
	}
	cnt := clientFaults.Counts()
	t.Logf("%d operations (%d reads, %d committed transfers, %d conflicts, %d refused, %d ambiguous: %d took effect), %d node kills; "+
		"client faults: %+v", len(history)+noEffect, reads, oks, conflicts, refused, tookEffect+noEffect, tookEffect, kills, cnt)
	if len(history)+noEffect < target {
		t.Fatalf("only %d operations", len(history)+noEffect)
	}
	if oks == 0 || conflicts == 0 || tookEffect+noEffect == 0 {
		t.Fatalf("the workload exercised too little: %d committed, %d conflicts, %d ambiguous", oks, conflicts, tookEffect+noEffect)
	}
	res, info := porcupine.CheckOperationsVerbose(accountsModel, history, modelCheckTimeout)
	if res != porcupine.Ok {
		// Not t.TempDir: the visualization must outlive the failed test.
		if f, err := os.CreateTemp("", "extent-model-history-*.html"); err == nil {
			if err := porcupine.Visualize(accountsModel, info, f); err == nil {
				t.Logf("visualization: %s", f.Name())
			}
			f.Close()
		}
		t.Fatalf("history is not linearizable: %v", res)
	}
}

// dumpGroup logs group g's transfers, for diagnosing a failure.
func (r *modelRun) dumpGroup(g int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, set := range []struct {
		name string
		ops  []porcupine.Operation
	}{{"", r.history}, {"ambiguous ", r.ambiguous}} {
		for _, op := range set.ops {
			in := op.Input.(modelInput)
			if in.group != g || in.read {
				continue
			}
			r.t.Logf("%s[%d,%d] %s", set.name, op.Call/1000, op.Return/1000, accountsModel.DescribeOperation(op.Input, op.Output))
		}
	}
}

func withSeed(c faults.Config, seed uint64) faults.Config {
	c.Seed = seed
	return c
}
