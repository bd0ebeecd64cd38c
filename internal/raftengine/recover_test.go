package raftengine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestRecoverAloneAfterLosingQuorum: a three-voter group loses two voters
// for good. The survivor cannot commit; RecoverAlone makes it the only
// voter, after which it elects itself, keeps every write the group had
// acknowledged, takes new writes, and grows again by membership changes.
// The offline form does the same on a stopped node's store, and a restart
// keeps the recovered membership.
func TestRecoverAloneAfterLosingQuorum(t *testing.T) {
	c := newTestCluster(t, 4, nil)
	c.createGroup(1, 1, 2, 3)
	want := map[string]string{}
	for i := range 30 {
		k := fmt.Sprintf("k%02d", i)
		c.propose(1, setCmd(k, k))
		want[k] = k
	}
	c.waitConverged(1, []uint64{1, 2, 3}, want)
	survivor := c.leader(1)
	var lost []uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != survivor {
			lost = append(lost, id)
			c.crash(id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	if _, err := c.engines[survivor].Propose(ctx, 1, setCmd("x", "x")); err == nil {
		t.Fatal("a lone replica of three committed")
	}
	cancel()

	rep, err := c.engines[survivor].RecoverAlone(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Removed, lost) || rep.LastIndex < rep.PreviousCommit {
		t.Fatalf("report %+v, want removed %v", rep, lost)
	}
	c.ids = []uint64{survivor, 4}
	c.propose(1, setCmd("after", "recovery"))
	want["after"] = "recovery"
	// The pending "x" may or may not have committed: its outcome was
	// unknown to its proposer. Either is allowed; nothing else may change.
	if v, ok := c.sm(survivor, 1).get("x"); ok {
		want["x"] = v
	}
	c.waitConverged(1, []uint64{survivor}, want)
	st, err := c.engines[survivor].Status(1)
	if err != nil || !slices.Equal(st.Voters, []uint64{survivor}) || !st.IsLeader() {
		t.Fatalf("status after recovery: %+v %v, want the survivor leading alone", st, err)
	}

	// It grows again: node 4 joins by snapshot and votes.
	if err := c.engines[4].CreateGroup(context.Background(), GroupDescriptor{GroupID: 1, Kind: "kv"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.engines[survivor].AddLearner(context.Background(), 1, 4); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(1, []uint64{survivor, 4}, want)
	if err := c.engines[survivor].AddVoter(context.Background(), 1, 4); err != nil {
		t.Fatal(err)
	}
	c.propose(1, setCmd("two", "voters"))
	want["two"] = "voters"
	c.waitConverged(1, []uint64{survivor, 4}, want)

	// Offline: stop both, recover node 4's replica on its store, start it
	// alone: it leads alone with everything.
	c.stop(survivor)
	c.stop(4)
	st4, err := OpenStore("/db", c.fs[4], c.logger)
	if err != nil {
		t.Fatal(err)
	}
	before, err := InspectOffline(st4, 4, 1)
	if err != nil || !slices.Equal(before.Voters, []uint64{survivor, 4}) || before.LastIndex < before.Commit || before.LastTerm == 0 || before.Kind != "kv" {
		t.Fatalf("offline inspection: %+v %v, want voters [%d 4] and a log", before, err, survivor)
	}
	if _, err := InspectOffline(st4, 4, 99); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("offline inspection of an unknown group: %v, want ErrGroupNotFound", err)
	}
	rep, err = RecoverAloneOffline(st4, 4, 1)
	if err != nil || !slices.Equal(rep.Removed, []uint64{survivor}) {
		t.Fatalf("offline recovery: %+v %v, want node %d removed", rep, err, survivor)
	}
	if _, err := RecoverAloneOffline(st4, 4, 99); !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("offline recovery of an unknown group: %v, want ErrGroupNotFound", err)
	}
	after, err := InspectOffline(st4, 4, 1)
	if err != nil || !slices.Equal(after.Voters, []uint64{4}) || after.Commit != before.LastIndex || after.Term <= before.Term {
		t.Fatalf("inspection after offline recovery: %+v %v, want voters [4], commit %d, a term past %d", after, err, before.LastIndex, before.Term)
	}
	if err := st4.Close(); err != nil {
		t.Fatal(err)
	}
	c.start(4)
	c.ids = []uint64{4}
	c.propose(1, setCmd("offline", "ok"))
	want["offline"] = "ok"
	c.waitConverged(1, []uint64{4}, want)
	if st, _ := c.engines[4].Status(1); !slices.Equal(st.Voters, []uint64{4}) {
		t.Fatalf("voters after offline recovery %v, want [4]", st.Voters)
	}
}
