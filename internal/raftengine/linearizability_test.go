package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// counterInput is one operation on a counter key: an increment (which
// returns the new value) or a linearizable read.
type counterInput struct {
	key string
	inc bool
}

type counterOutput struct {
	value   uint64
	unknown bool // the increment timed out: it may or may not have happened
}

// counterModel is the contract: each key is a counter starting at 0; an
// increment adds one and returns the new value; a read returns the value.
// An increment with an unknown outcome may or may not have taken effect.
var counterModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(counterInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{uint64(0)} },
	Step: func(state, input, output any) []any {
		v := state.(uint64)
		in, out := input.(counterInput), output.(counterOutput)
		switch {
		case in.inc && out.unknown:
			return []any{v, v + 1}
		case in.inc && out.value == v+1:
			return []any{v + 1}
		case !in.inc && out.value == v:
			return []any{v}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(counterInput), output.(counterOutput)
		if in.inc {
			if out.unknown {
				return fmt.Sprintf("inc(%s) -> ?", in.key)
			}
			return fmt.Sprintf("inc(%s) -> %d", in.key, out.value)
		}
		return fmt.Sprintf("read(%s) -> %d", in.key, out.value)
	},
}

// TestLinearizableUnderFaults runs concurrent increments and reads against
// two groups while the network drops, duplicates and delays messages, and a
// nemesis partitions nodes, crashes and restarts them and moves leadership;
// leaders answering from their leases are paused now and then, and nodes'
// rounds stall.
// The history must be linearizable and the replicas must converge.
func TestLinearizableUnderFaults(t *testing.T) {
	seed := testseed.Seed(t)
	const (
		clients   = 6
		minOps    = 1200
		groups    = 2
		keysEach  = 3
		opTimeout = 2 * time.Second
		// minFaults makes sure the nemesis acted several times whatever
		// the speed of the machine.
		minFaults = 12
	)
	c := &testCluster{}
	// A leader that finds its lease valid is sometimes paused before it
	// answers, longer than an election timeout, as a stopped process
	// would be.
	var pauses atomic.Int64
	var pauseMu sync.Mutex
	pauseRng := rand.New(rand.NewPCG(seed, 7))
	pause := func() {
		pauseMu.Lock()
		d := time.Duration(0)
		if pauseRng.IntN(40) == 0 {
			d = time.Duration(50+pauseRng.IntN(300)) * time.Millisecond
		}
		pauseMu.Unlock()
		if d > 0 {
			pauses.Add(1)
			time.Sleep(d)
		}
	}
	c = newTestClusterHooked(t, 3, func(cfg *Config) { cfg.LogRetainEntries = 64 }, &pause)
	c.net.SetFaults(0.05, 0.05, 5*time.Millisecond)
	var leaseReads atomic.Uint64
	countLeaseReads := func(e *Engine) {
		if e != nil {
			leaseReads.Add(e.Metrics().LeaseReads)
		}
	}
	for gid := uint64(1); gid <= groups; gid++ {
		c.createGroup(gid, 1, 2, 3)
	}

	var (
		mu      sync.Mutex
		history []porcupine.Operation
		done    atomic.Bool
		count   atomic.Int64
		engMu   sync.Mutex // guards c.engines against the nemesis
	)
	engine := func(id uint64) *Engine {
		engMu.Lock()
		defer engMu.Unlock()
		return c.engines[id]
	}
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var wg sync.WaitGroup
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			target := uint64(1 + cl%3)
			for !done.Load() {
				gid := uint64(1 + rng.IntN(groups))
				key := fmt.Sprintf("g%d/k%d", gid, rng.IntN(keysEach))
				inc := rng.IntN(2) == 0
				in := counterInput{key: key, inc: inc}
				call := now()
				out, ok := runCounterOp(engine, &target, gid, key, inc, opTimeout)
				if !ok {
					continue // a read that failed, or an increment refused: no effect
				}
				ret := now()
				if out.unknown {
					ret = math.MaxInt64
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
				count.Add(1)
			}
		}()
	}

	nemesis := rand.New(rand.NewPCG(seed, 99))
	faults := 0
	for count.Load() < minOps || faults < minFaults {
		faults++
		time.Sleep(time.Duration(100+nemesis.IntN(200)) * time.Millisecond)
		victim := uint64(1 + nemesis.IntN(3))
		switch nemesis.IntN(5) {
		case 0:
			c.net.Isolate(victim, c.ids...)
			time.Sleep(300 * time.Millisecond)
			c.net.Heal()
		case 1:
			engMu.Lock()
			countLeaseReads(c.engines[victim])
			c.crash(victim)
			engMu.Unlock()
			time.Sleep(200 * time.Millisecond)
			engMu.Lock()
			c.start(victim)
			engMu.Unlock()
		case 2:
			if e := engine(victim); e != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				_ = e.TransferLeadership(ctx, 1, uint64(1+nemesis.IntN(3)))
				cancel()
			}
		case 3:
			// quiet period
		case 4:
			// A stalled node (a disk that stops answering): its rounds
			// stop, so it neither steps down nor hears of a new leader,
			// while reads still reach it.
			stall := time.Duration(200+nemesis.IntN(300)) * time.Millisecond
			if e := engine(victim); e != nil {
				var once sync.Once
				hook := func(bool) { once.Do(func() { time.Sleep(stall) }) }
				e.roundHook.Store(&hook)
			}
			time.Sleep(stall)
		}
	}
	done.Store(true)
	wg.Wait()
	c.net.Heal()
	c.net.SetFaults(0, 0, 0)

	res, info := porcupine.CheckOperationsVerbose(counterModel.ToModel(), history, time.Minute)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		if f, err := os.Create(path); err == nil {
			_ = porcupine.Visualize(counterModel.ToModel(), info, f)
			_ = f.Close()
		}
		t.Fatalf("history of %d operations is not linearizable (%v); visualization at %s", len(history), res, path)
	}
	unknown := 0
	for _, op := range history {
		if op.Output.(counterOutput).unknown {
			unknown++
		}
	}
	for _, e := range c.engines {
		countLeaseReads(e)
	}
	t.Logf("%d operations linearizable (%d with unknown outcome) under %d nemesis actions; %d reads from leases, %d leaders paused after their lease check",
		len(history), unknown, faults, leaseReads.Load(), pauses.Load())
	if leaseReads.Load() == 0 {
		t.Error("no read was answered from a lease")
	}

	// Every replica converges on the same counters.
	for gid := uint64(1); gid <= groups; gid++ {
		lead := c.leader(gid)
		want := c.sm(lead, gid).snapshot()
		c.propose(gid, setCmd("final", "x")) // flush through every replica
		want["final"] = "x"
		c.waitConverged(gid, c.ids, want)
	}
}

// runCounterOp runs one operation against whichever node leads gid.
func runCounterOp(engine func(uint64) *Engine, target *uint64, gid uint64, key string, inc bool, timeout time.Duration) (counterOutput, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	proposed := false
	for ctx.Err() == nil {
		e := engine(*target)
		if e == nil {
			*target = *target%3 + 1
			continue
		}
		var err error
		if inc {
			var res any
			res, err = e.Propose(ctx, gid, append([]byte{'i'}, key...))
			if err == nil {
				return counterOutput{value: res.(uint64)}, true
			}
			if !errors.Is(err, ErrProposalDropped) {
				if _, notLeader := IsNotLeader(err); !notLeader {
					proposed = true // it may be in a log somewhere
				}
			}
		} else {
			err = e.ReadIndex(ctx, gid)
			if err == nil {
				sm, serr := e.StateMachine(gid)
				if serr != nil {
					return counterOutput{}, false
				}
				v, _ := sm.(*kvSM).get(key)
				var n uint64
				if len(v) == 8 {
					n = binary.BigEndian.Uint64([]byte(v))
				}
				return counterOutput{value: n}, true
			}
		}
		if nl, ok := IsNotLeader(err); ok && nl.Leader != 0 {
			*target = nl.Leader
		} else {
			*target = *target%3 + 1
			time.Sleep(5 * time.Millisecond)
		}
		if inc && proposed {
			// Retrying an increment whose fate is unknown would double
			// count; report the unknown outcome instead.
			return counterOutput{unknown: true}, true
		}
	}
	if inc && proposed {
		return counterOutput{unknown: true}, true
	}
	return counterOutput{}, false
}
