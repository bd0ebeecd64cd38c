package faults

import (
	"math"
	"testing"
	"time"
)

func mustInjector(t *testing.T, node uint64, spec string) *Injector {
	t.Helper()
	c, err := Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	in, err := New(Options{NodeID: node, Config: c})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

const testMethod = "/arbor.test.v1.Service/Method"

func decisions(in *Injector, n int) []decision {
	out := make([]decision, n)
	for i := range out {
		out[i], _ = in.decide(testMethod)
	}
	return out
}

func TestDecisionsReplayFromSeed(t *testing.T) {
	const spec = "fail=0.2,delay=0.3:1ms-9ms,dup=0.2,seed=42"
	a := decisions(mustInjector(t, 1, spec), 2000)
	b := decisions(mustInjector(t, 2, spec), 2000)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("decision %d differs between two injectors with seed 42: %+v vs %+v", i, a[i], b[i])
		}
	}
	c := decisions(mustInjector(t, 1, "fail=0.2,delay=0.3:1ms-9ms,dup=0.2,seed=43"), 2000)
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("seeds 42 and 43 gave identical decisions")
	}

	// Resetting the configuration replays from the start.
	in := mustInjector(t, 1, spec)
	first := decisions(in, 10)
	cfg := in.Config()
	if err := in.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for i, d := range decisions(in, 10) {
		if d != first[i] {
			t.Fatalf("after SetConfig with the same seed decision %d = %+v, want %+v", i, d, first[i])
		}
	}
}

func TestRandomSeedIsReported(t *testing.T) {
	in := mustInjector(t, 1, "fail=0.5")
	seed := in.Config().Seed
	if seed == 0 {
		t.Fatal("effective seed is 0")
	}
	replay := mustInjector(t, 1, in.Config().String())
	if got := replay.Config().Seed; got != seed {
		t.Fatalf("replayed seed = %d, want %d", got, seed)
	}
	a, b := decisions(in, 100), decisions(replay, 100)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("replay from reported config differs at %d", i)
		}
	}
}

func TestDecisionRates(t *testing.T) {
	const n = 20000
	in := mustInjector(t, 1, "fail=0.1,delay=0.3:2ms-4ms,dup=0.2,seed=9")
	var fail, replyLost, delayed, dup int
	for _, d := range decisions(in, n) {
		if d.fail {
			fail++
			if d.replyLost {
				replyLost++
			}
			if d.dup {
				t.Fatal("a failed call is also duplicated")
			}
		}
		if d.delay != 0 {
			delayed++
			if d.delay < 2*time.Millisecond || d.delay > 4*time.Millisecond {
				t.Fatalf("delay %v outside [2ms, 4ms]", d.delay)
			}
		}
		if d.dup {
			dup++
		}
	}
	// Binomial standard deviations are below 0.004 here; allow 5 of them.
	check := func(name string, got int, total int, want float64) {
		t.Helper()
		if p := float64(got) / float64(total); math.Abs(p-want) > 0.02 {
			t.Errorf("%s rate = %.4f over %d, want %.2f", name, p, total, want)
		}
	}
	check("fail", fail, n, 0.1)
	check("reply-lost share of failures", replyLost, fail, 0.5)
	check("delay", delayed, n, 0.3)
	check("dup", dup, n-fail, 0.2)
}

func TestMethodsFilterAndAdminExemption(t *testing.T) {
	in := mustInjector(t, 1, "fail=1,methods=Raft")
	if _, ok := in.decide("/arbor.directory.v1.Directory/Heartbeat"); ok {
		t.Error("a method outside the pattern was faulted")
	}
	if d, ok := in.decide("/arbor.raftengine.v1.RaftTransport/Send"); !ok || !d.fail {
		t.Errorf("matching method: decision %+v, ok %v; want a failure", d, ok)
	}
	all := mustInjector(t, 1, "fail=1")
	if _, ok := all.decide(adminMethodPrefix + "SetFaults"); ok {
		t.Error("an Admin call was faulted")
	}
	off := mustInjector(t, 1, "off")
	if _, ok := off.decide(testMethod); ok {
		t.Error("a call was faulted with faults off")
	}
}

func TestBlockedSet(t *testing.T) {
	in := mustInjector(t, 1, "off")
	if err := in.Block(3, 2); err != nil {
		t.Fatal(err)
	}
	if err := in.Block(2, 5); err != nil {
		t.Fatal(err)
	}
	if err := in.Unblock(3, 9); err != nil {
		t.Fatal(err)
	}
	if got := in.Blocked(); len(got) != 2 || got[0] != 2 || got[1] != 5 {
		t.Fatalf("Blocked = %v, want [2 5]", got)
	}
	if !in.IsBlocked(5) || in.IsBlocked(3) || in.IsBlocked(0) {
		t.Fatal("IsBlocked disagrees with the blocked set")
	}
	if err := in.Block(0); err == nil {
		t.Fatal("blocking node 0 succeeded")
	}
	if err := in.SetBlocked(nil); err != nil || len(in.Blocked()) != 0 {
		t.Fatalf("SetBlocked(nil): %v, set %v", err, in.Blocked())
	}
	huge := make([]uint64, maxBlockedPeers+1)
	for i := range huge {
		huge[i] = uint64(i + 1)
	}
	if err := in.SetBlocked(huge); err == nil {
		t.Fatal("blocking more than maxBlockedPeers succeeded")
	}
}

func TestApplyIsAllOrNothing(t *testing.T) {
	in := mustInjector(t, 1, "fail=0.5,seed=4")
	if err := in.Block(7); err != nil {
		t.Fatal(err)
	}
	bad := Config{FailRate: 3}
	if err := in.Apply(Update{Config: &bad, Block: []uint64{8}}); err == nil {
		t.Fatal("Apply with an invalid config succeeded")
	}
	good := Config{DupRate: 1, Seed: 1}
	if err := in.Apply(Update{Config: &good, Block: []uint64{0}}); err == nil {
		t.Fatal("Apply blocking node 0 succeeded")
	}
	if got := in.Config().String(); got != "fail=0.5,seed=4" {
		t.Fatalf("config after failed updates = %q", got)
	}
	if got := in.Blocked(); len(got) != 1 || got[0] != 7 {
		t.Fatalf("blocked after failed updates = %v, want [7]", got)
	}
}
