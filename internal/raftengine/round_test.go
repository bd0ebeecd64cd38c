package raftengine

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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
// many groups: right before a round's batch is committed or right after
// (its messages, answers and applies not yet done). After a restart from the disk images every write
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
