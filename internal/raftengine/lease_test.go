package raftengine

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// leaseFixture starts three nodes with group 1, writes k=1, and returns the
// leader once a read has given it a lease.
func leaseFixture(t *testing.T, tune func(*Config)) (*testCluster, uint64) {
	t.Helper()
	c := newTestCluster(t, 3, tune)
	c.createGroup(1, 1, 2, 3)
	c.propose(1, setCmd("k", "1"))
	lead := c.leader(1)
	e := c.engines[lead]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.ReadIndex(ctx, 1); err != nil {
		t.Fatalf("first read: %v", err)
	}
	before := e.Metrics().LeaseReads
	if err := e.ReadIndex(ctx, 1); err != nil {
		t.Fatalf("second read: %v", err)
	}
	if e.Metrics().LeaseReads == before {
		t.Fatalf("a read right after a completed round took a round too (lease %v)", e.lease)
	}
	return c, lead
}

// isolateAndOverwrite cuts the leader off, waits for another leader and
// writes k=2 through it.
func isolateAndOverwrite(t *testing.T, c *testCluster, old uint64) {
	t.Helper()
	c.net.Isolate(old, c.ids...)
	overwrite(t, c, old)
}

// overwrite waits for a leader other than old and writes k=2 through it.
func overwrite(t *testing.T, c *testCluster, old uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lead uint64
		for _, id := range c.ids {
			if st, err := c.engines[id].Status(1); id != old && err == nil && st.IsLeader() {
				lead = id
			}
		}
		if lead != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.engines[lead].Propose(ctx, 1, setCmd("k", "2"))
			cancel()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new leader wrote k=2")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeaseReadEndsBeforeAnotherLeader: a leader cut off from its
// followers stops answering reads from its lease before the others can
// elect a leader and commit a write.
func TestLeaseReadEndsBeforeAnotherLeader(t *testing.T) {
	c, old := leaseFixture(t, nil)
	isolateAndOverwrite(t, c, old)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.engines[old].ReadIndex(ctx, 1); err == nil {
		v, _ := c.sm(old, 1).get("k")
		t.Fatalf("the cut-off old leader answered a linearizable read (k=%q) after another leader wrote k=2", v)
	}
}

// TestTooLongLeaseReadsStale shows what the lease bound protects: a lease
// longer than the followers' election timeout (a clock drifting beyond
// the bound) lets the cut-off leader answer with a value another leader
// has overwritten.
func TestTooLongLeaseReadsStale(t *testing.T) {
	c, old := leaseFixture(t, func(cfg *Config) { cfg.leaseOverride = time.Minute })
	isolateAndOverwrite(t, c, old)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.engines[old].ReadIndex(ctx, 1); err != nil {
		t.Fatalf("read under an overlong lease: %v", err)
	}
	if v, _ := c.sm(old, 1).get("k"); v != "1" {
		t.Fatalf("k=%q on the cut-off leader, want the stale 1", v)
	}
}

// TestNoLeaseAfterTransfer: once the leader starts handing leadership
// over, reads go through rounds for the rest of its term.
func TestNoLeaseAfterTransfer(t *testing.T) {
	c, old := leaseFixture(t, nil)
	e := c.engines[old]
	to := old%3 + 1
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.TransferLeadership(ctx, 1, to); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	if e.group(1).leaseUntil.Load() != 0 {
		t.Fatal("the old leader kept its lease after handing leadership over")
	}
	if err := e.ReadIndex(ctx, 1); err == nil {
		t.Fatal("the old leader answered a read after the transfer")
	}
}

// TestRestartedEngineRefusesVotes: a node that just started drops vote
// requests for one lease, unless they come from a leadership transfer,
// and takes them once the lease has passed.
func TestRestartedEngineRefusesVotes(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.TickInterval = 100 * time.Millisecond })
	g := &group{e: c.engines[1]}
	vote := func(typ raftpb.MessageType, ctx string) *raftpb.Message {
		m := &raftpb.Message{Type: typ.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(9)}
		if ctx != "" {
			m.Context = []byte(ctx)
		}
		return m
	}
	if g.e.voteQuiet <= 0 || g.e.now() >= g.e.voteQuiet {
		t.Skipf("engine start took longer than its quiet period %v", g.e.voteQuiet)
	}
	for _, typ := range []raftpb.MessageType{raftpb.MessageType_MsgVote, raftpb.MessageType_MsgPreVote} {
		if !g.refusesVote(vote(typ, "")) {
			t.Errorf("%v taken right after start", typ)
		}
	}
	if g.refusesVote(vote(raftpb.MessageType_MsgVote, campaignTransfer)) {
		t.Error("a transferee's vote request refused")
	}
	if g.refusesVote(vote(raftpb.MessageType_MsgHeartbeat, "")) {
		t.Error("a heartbeat refused")
	}
	time.Sleep(g.e.voteQuiet - g.e.now() + time.Millisecond)
	if g.refusesVote(vote(raftpb.MessageType_MsgVote, "")) {
		t.Error("a vote request refused after the quiet period")
	}
}

// TestStalledLeaderLeaseEnds: a leader whose rounds stall (its disk stops
// answering) neither steps down nor hears of the next leader; only its
// clock ends its lease. With the lease the clocks allow it answers no
// read once another leader has written; with an overlong one it answers
// with the overwritten value.
func TestStalledLeaderLeaseEnds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		override  time.Duration
		wantStale bool
	}{
		{"safe lease", 0, false},
		{"overlong lease", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, old := leaseFixture(t, func(cfg *Config) { cfg.leaseOverride = tc.override })
			release := make(chan struct{})
			var once sync.Once
			hook := func(bool) { once.Do(func() { <-release }) }
			c.engines[old].roundHook.Store(&hook)
			defer close(release)
			// Wake the leader so that a round starts and stalls; the
			// proposal itself cannot finish.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, _ = c.engines[old].Propose(ctx, 1, setCmd("wake", "1"))
			}()
			overwrite(t, c, old)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := c.engines[old].ReadIndex(ctx, 1)
			v, _ := c.sm(old, 1).get("k")
			switch {
			case tc.wantStale && (err != nil || v != "1"):
				t.Fatalf("read under an overlong lease: %v, k=%q; want the stale 1", err, v)
			case !tc.wantStale && err == nil:
				t.Fatalf("the stalled old leader answered a linearizable read (k=%q) after another leader wrote k=2", v)
			}
		})
	}
}
