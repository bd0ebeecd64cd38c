package raftengine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func TestProposeReplicatesToAllReplicas(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	want := map[string]string{}
	for i := range 50 {
		k, v := fmt.Sprintf("k%02d", i), fmt.Sprintf("v%d", i)
		res := c.propose(1, setCmd(k, v))
		if idx, ok := res.(uint64); !ok || idx <= initialIndex {
			t.Fatalf("result of a set should be its entry index, got %v", res)
		}
		want[k] = v
	}
	c.waitConverged(1, c.ids, want)
}

func TestFollowerRefusesProposalWithLeaderHint(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	lead := c.leader(1)
	follower := lead%3 + 1
	_, err := c.engines[follower].Propose(context.Background(), 1, setCmd("a", "b"))
	nl, ok := IsNotLeader(err)
	if !ok {
		t.Fatalf("proposal on follower: got %v, want NotLeaderError", err)
	}
	if nl.Leader != lead {
		t.Fatalf("leader hint %d, want %d", nl.Leader, lead)
	}
	if _, has := c.sm(follower, 1).get("a"); has {
		t.Fatal("refused proposal changed state")
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxCommandBytes = 1024 })
	c.createGroup(1, 1)
	c.leader(1)
	e := c.engines[1]
	if _, err := e.Propose(context.Background(), 1, make([]byte, 1025)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize command: got %v, want ErrTooLarge", err)
	}
	if _, err := e.Propose(context.Background(), 99, setCmd("a", "b")); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("unknown group: got %v, want ErrGroupNotFound", err)
	}
	if err := e.CreateGroup(context.Background(), GroupDescriptor{GroupID: 1, Kind: "kv"}, []uint64{1}); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("duplicate group: got %v, want ErrGroupExists", err)
	}
	if err := e.CreateGroup(context.Background(), GroupDescriptor{GroupID: 2, Kind: "kv"}, []uint64{2, 3}); err == nil {
		t.Fatal("bootstrapping a group this node is not a voter of should fail")
	}
	if err := e.CreateGroup(context.Background(), GroupDescriptor{GroupID: 0, Kind: "kv"}, nil); err == nil {
		t.Fatal("group id 0 should be refused")
	}
	if got := e.Groups(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("groups after refused creations: %v", got)
	}
	if len(c.sm(1, 1).snapshot()) != 0 {
		t.Fatal("refused proposals changed state")
	}
}

func TestLeaderCrashElectsNewLeaderAndRestartedNodeCatchesUp(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	want := map[string]string{}
	for i := range 20 {
		k := fmt.Sprintf("a%d", i)
		c.propose(1, setCmd(k, "x"))
		want[k] = "x"
	}
	old := c.leader(1)
	c.crash(old)
	start := time.Now()
	var lead uint64
	for lead == 0 || lead == old {
		lead = c.leader(1)
	}
	t.Logf("new leader %d after %v", lead, time.Since(start))
	for i := range 20 {
		k := fmt.Sprintf("b%d", i)
		c.propose(1, setCmd(k, "y"))
		want[k] = "y"
	}
	c.start(old)
	c.waitConverged(1, c.ids, want)
}

func TestPartitionedLeaderCannotCommitAndRejoins(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	c.propose(1, setCmd("before", "1"))
	old := c.leader(1)
	c.net.Isolate(old, c.ids...)

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := c.engines[old].Propose(ctx, 1, setCmd("minority", "lost"))
	cancel()
	if err == nil {
		t.Fatal("a leader cut off from its quorum committed a proposal")
	}

	// The majority elects a new leader and carries on.
	var lead uint64
	deadline := time.Now().Add(10 * time.Second)
	for (lead == 0 || lead == old) && time.Now().Before(deadline) {
		for _, id := range c.ids {
			if st, _ := c.engines[id].Status(1); id != old && st.IsLeader() {
				lead = id
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lead == 0 || lead == old {
		t.Fatal("majority did not elect a new leader")
	}
	if _, err := c.engines[lead].Propose(context.Background(), 1, setCmd("majority", "2")); err != nil {
		t.Fatalf("majority proposal: %v", err)
	}
	c.net.Heal()
	c.waitConverged(1, c.ids, map[string]string{"before": "1", "majority": "2"})
}

func TestWholeClusterCrashLosesNoAcknowledgedWrite(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	c.createGroup(2, 1, 2, 3)
	want := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				k := fmt.Sprintf("w%d-%d", w, i)
				c.propose(uint64(1+w%2), setCmd(k, k))
				mu.Lock()
				want[fmt.Sprintf("%d/%s", 1+w%2, k)] = k
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, id := range c.ids {
		c.crash(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	for gid := uint64(1); gid <= 2; gid++ {
		c.leader(gid)
		sub := map[string]string{}
		for k, v := range want {
			if k[0] == byte('0'+gid) {
				sub[k[2:]] = v
			}
		}
		c.waitConverged(gid, c.ids, sub)
	}
}

func TestLaggingReplicaCatchesUpBySnapshot(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.LogRetainEntries = 16 })
	c.createGroup(1, 1, 2, 3)
	lead := c.leader(1)
	lagger := lead%3 + 1
	c.net.Isolate(lagger, c.ids...)
	want := map[string]string{}
	for i := range 200 {
		k := fmt.Sprintf("k%03d", i)
		c.propose(1, setCmd(k, k))
		want[k] = k
	}
	// The leader truncates its log after handling a Ready; propose until
	// it has dropped entries the lagger needs, so that healing must send
	// a snapshot rather than the log.
	behind, err := c.engines[lagger].Status(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		st, err := c.engines[lead].Status(1)
		if err != nil {
			t.Fatal(err)
		}
		if st.LogStart > behind.Applied+1 {
			break
		}
		if i == 100 {
			t.Fatalf("the leader's log still starts at %d after %d more proposals; the lagger applied %d", st.LogStart, i, behind.Applied)
		}
		k := fmt.Sprintf("more%03d", i)
		c.propose(1, setCmd(k, k))
		want[k] = k
	}
	c.net.Heal()
	c.waitConverged(1, c.ids, want)
	var sent, applied uint64
	for _, e := range c.engines {
		m := e.Metrics()
		sent += m.SnapshotsSent
		applied += m.SnapshotsApplied
	}
	if applied == 0 {
		t.Fatalf("lagging replica should have caught up by snapshot (sent %d, applied %d)", sent, applied)
	}
	// The installed snapshot survives a restart, and the replica keeps
	// applying after it.
	c.crash(lagger)
	c.start(lagger)
	c.propose(1, setCmd("after", "snapshot"))
	want["after"] = "snapshot"
	c.waitConverged(1, c.ids, want)
}

func TestMembershipChangeReplacesReplica(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.LogRetainEntries = 16 })
	c.createGroup(1, 1, 2, 3)
	want := map[string]string{}
	for i := range 60 {
		k := fmt.Sprintf("k%02d", i)
		c.propose(1, setCmd(k, k))
		want[k] = k
	}
	c.addNode(4)
	if err := c.engines[4].CreateGroup(context.Background(), GroupDescriptor{GroupID: 1, Kind: "kv"}, nil); err != nil {
		t.Fatal(err)
	}
	lead := c.leader(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.engines[lead].AddLearner(ctx, 1, 4); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	c.waitConverged(1, []uint64{4}, want)
	if err := c.engines[lead].AddVoter(ctx, 1, 4); err != nil {
		t.Fatalf("promote learner: %v", err)
	}
	// Remove a replica that is not the leader.
	victim := uint64(1)
	if victim == lead {
		victim = 2
	}
	if err := c.engines[lead].RemoveReplica(ctx, 1, victim); err != nil {
		t.Fatalf("remove replica: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.engines[victim].Status(1); errors.Is(err, ErrGroupNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("removed replica did not destroy itself")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, _ := c.engines[lead].Status(1)
	if len(st.Voters) != 3 {
		t.Fatalf("voters after replacement: %v", st.Voters)
	}
	c.propose(1, setCmd("new", "config"))
	want["new"] = "config"
	var members []uint64
	for _, id := range c.ids {
		if id != victim {
			members = append(members, id)
		}
	}
	c.waitConverged(1, members, want)
}

func TestTransferLeadership(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	lead := c.leader(1)
	to := lead%3 + 1
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.engines[lead].TransferLeadership(ctx, 1, to); err != nil {
		t.Fatal(err)
	}
	if got := c.leader(1); got != to {
		t.Fatalf("leader %d after transfer to %d", got, to)
	}
}

func TestReadIndexSeesEveryAcknowledgedWrite(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		c.propose(1, setCmd(k, "v"))
		lead := c.leader(1)
		if err := c.engines[lead].ReadIndex(context.Background(), 1); err != nil {
			t.Fatalf("read index: %v", err)
		}
		if _, ok := c.sm(lead, 1).get(k); !ok {
			t.Fatalf("read after ReadIndex misses acknowledged write %q", k)
		}
	}
	lead := c.leader(1)
	follower := lead%3 + 1
	if _, ok := IsNotLeader(c.engines[follower].ReadIndex(context.Background(), 1)); !ok {
		t.Fatal("ReadIndex on a follower should return NotLeaderError")
	}
}

func TestManyGroupsQuiesceWhenIdle(t *testing.T) {
	const groups = 100
	c := newTestCluster(t, 3, nil)
	for gid := uint64(1); gid <= groups; gid++ {
		c.createGroup(gid, 1, 2, 3)
	}
	var wg sync.WaitGroup
	for gid := uint64(1); gid <= groups; gid++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.propose(gid, setCmd("k", fmt.Sprint(gid)))
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q := 0
		for _, e := range c.engines {
			q += e.Metrics().Quiesced
		}
		if q == 3*groups {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d replicas quiesced", q, 3*groups)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A quiesced group wakes for a proposal.
	c.propose(7, setCmd("k", "again"))
	c.waitConverged(7, c.ids, map[string]string{"k": "again"})
}

func TestQuiescedFollowersElectNewLeaderWhenLeaderDies(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	c.propose(1, setCmd("k", "v"))
	deadline := time.Now().Add(10 * time.Second)
	for c.engines[1].Metrics().Quiesced == 0 || c.engines[2].Metrics().Quiesced == 0 || c.engines[3].Metrics().Quiesced == 0 {
		if time.Now().After(deadline) {
			t.Fatal("group did not quiesce")
		}
		time.Sleep(10 * time.Millisecond)
	}
	old := c.leader(1)
	c.crash(old)
	var lead uint64
	for lead == 0 || lead == old {
		lead = c.leader(1)
	}
	c.propose(1, setCmd("k2", "v2"))
}

// TestDemotedLeaderRefusesProposalOfTheSameRound: a leader that steps down
// on a message processed in the same round as a proposal must refuse the
// proposal (NotLeaderError), not hand it to raft, which would forward it to
// the new leader where it could commit while this replica reported it
// dropped.
func TestDemotedLeaderRefusesProposalOfTheSameRound(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.createGroup(1, 1, 2, 3)
	lead := c.leader(1)
	other := lead%3 + 1
	g := c.engines[lead].group(1)
	st, _ := c.engines[lead].Status(1)
	p := &proposal{id: c.engines[lead].nextID.Add(1), cmd: setCmd("x", "y"), done: make(chan proposalResult, 1)}
	higher := &raftpb.Message{
		Type: raftpb.MessageType_MsgHeartbeat.Enum(),
		From: proto.Uint64(other), To: proto.Uint64(lead),
		Term: proto.Uint64(st.Term + 1), Commit: proto.Uint64(0),
	}
	g.enqueue(func(in *inbox) {
		in.msgs = append(in.msgs, Envelope{GroupID: 1, Message: higher})
		in.proposals = append(in.proposals, p)
	})
	r := <-p.done
	if _, ok := IsNotLeader(r.err); !ok {
		t.Fatalf("proposal to a leader demoted in the same round: got (%v, %v), want NotLeaderError", r.result, r.err)
	}
}
