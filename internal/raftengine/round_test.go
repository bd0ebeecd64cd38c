package raftengine

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestRoundSharesOneSyncAcrossGroups: groups that have work at the same
// time persist their Readies in one round, with one synced write between
// them, not one each.
func TestRoundSharesOneSyncAcrossGroups(t *testing.T) {
	const groups = 32
	c := newTestCluster(t, 1, nil)
	for gid := uint64(1); gid <= groups; gid++ {
		c.createGroup(gid, 1)
	}
	for gid := uint64(1); gid <= groups; gid++ {
		c.leader(gid)
	}
	e := c.engines[1]
	gids := e.Groups()
	before := e.Metrics()
	// Queue one proposal in every group's inbox before scheduling any of
	// them, as if they had all arrived during the previous round.
	ps := make([]*proposal, len(gids))
	for i, gid := range gids {
		p := &proposal{id: e.nextID.Add(1), cmd: setCmd("k", fmt.Sprint(gid)), done: make(chan proposalResult, 1)}
		g := e.group(gid)
		g.mu.Lock()
		g.in.proposals = append(g.in.proposals, p)
		g.mu.Unlock()
		ps[i] = p
	}
	e.sched.enqueueAll(gids)
	for i, p := range ps {
		select {
		case r := <-p.done:
			if r.err != nil {
				t.Fatalf("proposal to group %d: %v", gids[i], r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("proposal to group %d not applied", gids[i])
		}
	}
	after := e.Metrics()
	readies := after.SyncedReadies - before.SyncedReadies
	syncs := after.SyncedWrites - before.SyncedWrites
	t.Logf("%d groups: %d Readies needing a sync, %d synced writes, %d rounds", groups, readies, syncs, after.Rounds-before.Rounds)
	if readies < groups {
		t.Fatalf("%d Readies needed a sync; each of the %d groups' appends needs one", readies, groups)
	}
	// Every group's append arrives in one round, or two if a tick round
	// was under way; allow twice that.
	if syncs == 0 || syncs*8 > readies {
		t.Fatalf("%d synced writes for %d Readies that needed one: the groups did not share their syncs", syncs, readies)
	}
	for _, gid := range gids {
		if v, _ := c.sm(1, gid).get("k"); v != fmt.Sprint(gid) {
			t.Fatalf("group %d: k = %q", gid, v)
		}
	}
}

// TestPowerLossAroundRoundLosesNoAcknowledgedWrite cuts the power of the
// whole cluster at a round boundary of one node, in the middle of traffic to
// many groups: right before a round's batch is committed (its leaders have
// already sent their appends) or right after (its messages, answers and
// applies not yet done). After a restart from the disk images every write
// acknowledged before the cut is there.
func TestPowerLossAroundRoundLosesNoAcknowledgedWrite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		committed bool
	}{{"before-commit", false}, {"after-commit", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const groups, writers = 6, 12
			c := newTestCluster(t, 3, nil)
			for gid := uint64(1); gid <= groups; gid++ {
				c.createGroup(gid, 1, 2, 3)
			}
			for gid := uint64(1); gid <= groups; gid++ {
				c.leader(gid)
			}

			var ackMu sync.Mutex
			acked := map[uint64]map[string]string{}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					gid := uint64(1 + w%groups)
					for i := 0; ctx.Err() == nil; i++ {
						k := fmt.Sprintf("w%d-%d", w, i)
						if _, err := c.tryPropose(ctx, gid, setCmd(k, k)); err != nil {
							return
						}
						ackMu.Lock()
						if acked[gid] == nil {
							acked[gid] = map[string]string{}
						}
						acked[gid][k] = k
						ackMu.Unlock()
					}
				}()
			}
			time.Sleep(100 * time.Millisecond)

			// Arm node 1's hook: at its next round boundary of the chosen
			// kind, image every node's disk as a power cut would leave it.
			cut := make(chan map[uint64]*vfs.MemFS, 1)
			var fired atomic.Bool
			var want map[uint64]map[string]string
			hook := func(committed bool) {
				if committed != tc.committed || fired.Swap(true) {
					return
				}
				ackMu.Lock()
				defer ackMu.Unlock()
				want = map[uint64]map[string]string{}
				for gid, kv := range acked {
					want[gid] = maps.Clone(kv)
				}
				images := map[uint64]*vfs.MemFS{}
				for _, id := range c.ids {
					images[id] = c.fs[id].CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
				}
				cut <- images
			}
			c.engines[1].roundHook.Store(&hook)
			var images map[uint64]*vfs.MemFS
			select {
			case images = <-cut:
			case <-time.After(10 * time.Second):
				t.Fatal("node 1 ran no round with Readies")
			}
			stop()
			wg.Wait()
			var m Metrics
			for _, e := range c.engines {
				mm := e.Metrics()
				m.SyncedReadies += mm.SyncedReadies
				m.RoundSyncs += mm.RoundSyncs
			}
			c.powerLoss(images)

			n := 0
			for _, kv := range want {
				n += len(kv)
			}
			if n == 0 {
				t.Fatal("no write was acknowledged before the cut")
			}
			for _, id := range c.ids {
				c.start(id)
			}
			for gid := uint64(1); gid <= groups; gid++ {
				c.leader(gid)
				c.waitContains(gid, c.ids, want[gid])
			}
			t.Logf("%d acknowledged writes survived the cut; before it, %d Readies needing a sync shared %d round syncs",
				n, m.SyncedReadies, m.RoundSyncs)
		})
	}
}

// waitContains waits until every replica of gid in members holds at least
// the pairs of want (it may hold more: writes whose outcome was unknown).
func (c *testCluster) waitContains(gid uint64, members []uint64, want map[string]string) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var missing string
		for _, id := range members {
			got := c.sm(id, gid).snapshot()
			for k, v := range want {
				if got[k] != v {
					missing = fmt.Sprintf("node %d lacks %q=%q (has %q)", id, k, v, got[k])
					break
				}
			}
			if missing != "" {
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("group %d lost an acknowledged write: %s", gid, missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncGate is an errorfs injector that, while closed, holds every sync of a
// WAL file until it opens.
type syncGate struct {
	mu      sync.Mutex
	closed  bool
	opened  chan struct{}
	blocked atomic.Int64 // syncs that waited
}

func (g *syncGate) String() string { return "syncGate" }

func (g *syncGate) MaybeError(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	if !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	g.mu.Lock()
	closed, opened := g.closed, g.opened
	g.mu.Unlock()
	if closed {
		g.blocked.Add(1)
		<-opened
	}
	return nil
}

func (g *syncGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed, g.opened = true, make(chan struct{})
	}
}

func (g *syncGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.opened)
	}
}

// TestLeaderSendsAppendsBeforeItsOwnSync: while the leader's WAL sync is
// held, both followers receive and persist the new entry (the leader wrote
// to its disk in parallel with replicating, raft thesis §10.2.1), but the
// proposal is not acknowledged: the leader's round has not finished.
func TestLeaderSendsAppendsBeforeItsOwnSync(t *testing.T) {
	gates := map[uint64]*syncGate{1: {}, 2: {}, 3: {}}
	c := newTestClusterFS(t, 3, nil, func(id uint64, fs vfs.FS) vfs.FS { return errorfs.Wrap(fs, gates[id]) })
	t.Cleanup(func() {
		for _, g := range gates {
			g.open()
		}
	})
	c.createGroup(1, 1, 2, 3)
	c.propose(1, setCmd("a", "1"))
	lead := c.leader(1)
	var followers []uint64
	for _, id := range c.ids {
		if id != lead {
			followers = append(followers, id)
		}
	}
	leaderLast := func() uint64 {
		st, err := c.engines[lead].Status(1)
		if err != nil {
			t.Fatal(err)
		}
		return st.LastIndex
	}
	followerLast := func(id uint64) uint64 {
		st, err := c.engines[id].Status(1)
		if err != nil {
			t.Fatal(err)
		}
		return st.LastIndex
	}
	// Let the followers catch up with the leader's log first.
	last := leaderLast()
	for deadline := time.Now().Add(5 * time.Second); followerLast(followers[0]) < last || followerLast(followers[1]) < last; {
		if time.Now().After(deadline) {
			t.Fatal("followers did not catch up")
		}
		time.Sleep(5 * time.Millisecond)
	}

	gates[lead].close()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.engines[lead].Propose(ctx, 1, setCmd("b", "2"))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for gates[lead].blocked.Load() == 0 || followerLast(followers[0]) <= last || followerLast(followers[1]) <= last {
		if time.Now().After(deadline) {
			t.Fatalf("followers' logs end at %d and %d, leader's was %d: the leader did not replicate while its own sync was held (%d syncs held)",
				followerLast(followers[0]), followerLast(followers[1]), last, gates[lead].blocked.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("proposal finished (err %v) before the leader's round was durable", err)
	default:
	}
	if got := leaderLast(); got != last {
		t.Fatalf("leader's status shows last index %d before its sync returned (was %d)", got, last)
	}
	gates[lead].open()
	if err := <-done; err != nil {
		t.Fatalf("proposal after the leader's sync returned: %v", err)
	}
	c.waitConverged(1, c.ids, map[string]string{"a": "1", "b": "2"})
}

// TestSendsBeforeSyncAgreesWithRaft checks sendsBeforeSync against raft's
// own split. With AsyncStorageWrites raft hands out, in Ready.Messages,
// the messages that may leave at once, and attaches those that must wait
// for the local append to the MsgStorageAppend as its responses. Three such
// nodes are driven through elections, proposals and a leadership transfer,
// and every message to a peer is checked against sendsBeforeSync.
func TestSendsBeforeSyncAgreesWithRaft(t *testing.T) {
	ids := []uint64{1, 2, 3}
	nodes := map[uint64]*raft.RawNode{}
	stores := map[uint64]*raft.MemoryStorage{}
	for _, id := range ids {
		s := raft.NewMemoryStorage()
		if err := s.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
			Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: &raftpb.ConfState{Voters: ids},
		}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{
			ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: s,
			MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, PreVote: true, CheckQuorum: true,
			AsyncStorageWrites: true, Logger: raftLogger{slog.New(slog.DiscardHandler)},
		})
		if err != nil {
			t.Fatal(err)
		}
		nodes[id], stores[id] = rn, s
	}
	inbox := map[uint64][]*raftpb.Message{}
	counts := map[bool]map[raftpb.MessageType]int{true: {}, false: {}}
	check := func(m *raftpb.Message, early bool) {
		if got := sendsBeforeSync(m.GetType()); got != early {
			t.Fatalf("%s: sendsBeforeSync says %v, raft sends it %s", m.GetType(), got, map[bool]string{true: "at once", false: "after the append"}[early])
		}
		counts[early][m.GetType()]++
	}
	deliver := func(m *raftpb.Message) { inbox[m.GetTo()] = append(inbox[m.GetTo()], m) }
	stabilize := func() {
		for progress := true; progress; {
			progress = false
			for _, id := range ids {
				rn := nodes[id]
				for _, m := range inbox[id] {
					_ = rn.Step(m)
				}
				inbox[id] = nil
				if !rn.HasReady() {
					continue
				}
				progress = true
				rd := rn.Ready()
				for _, m := range rd.Messages {
					switch m.GetTo() {
					case raft.LocalAppendThread:
						s := stores[id]
						if snap := m.GetSnapshot(); snap != nil && !raft.IsEmptySnap(snap) {
							_ = s.ApplySnapshot(snap)
						}
						if hs := (&raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); !raft.IsEmptyHardState(hs) {
							_ = s.SetHardState(hs)
						}
						if err := s.Append(m.GetEntries()); err != nil {
							t.Fatal(err)
						}
						for _, r := range m.GetResponses() {
							if r.GetTo() != id && r.GetTo() != raft.LocalAppendThread {
								check(r, false)
							}
							deliver(r)
						}
					case raft.LocalApplyThread:
						for _, r := range m.GetResponses() {
							deliver(r)
						}
					default:
						check(m, true)
						deliver(m)
					}
				}
			}
		}
	}
	_ = nodes[1].Campaign()
	stabilize()
	for i := range 5 {
		_ = nodes[1].Propose([]byte(fmt.Sprint(i)))
		stabilize()
	}
	nodes[1].TransferLeader(2)
	stabilize()
	for range 20 {
		for _, id := range ids {
			nodes[id].Tick()
		}
		stabilize()
	}
	_ = nodes[2].Propose([]byte("after"))
	stabilize()
	// A node that falls behind and comes back is probed and rejected.
	_ = nodes[3].Campaign()
	stabilize()

	for _, tc := range []struct {
		early bool
		types []raftpb.MessageType
	}{
		{true, []raftpb.MessageType{raftpb.MessageType_MsgApp, raftpb.MessageType_MsgHeartbeat, raftpb.MessageType_MsgHeartbeatResp, raftpb.MessageType_MsgPreVote, raftpb.MessageType_MsgVote, raftpb.MessageType_MsgTimeoutNow}},
		{false, []raftpb.MessageType{raftpb.MessageType_MsgAppResp, raftpb.MessageType_MsgPreVoteResp, raftpb.MessageType_MsgVoteResp}},
	} {
		for _, mt := range tc.types {
			if counts[tc.early][mt] == 0 {
				t.Errorf("the scenario produced no %s sent %v; seen: %v", mt, tc.early, counts)
			}
		}
	}
}
