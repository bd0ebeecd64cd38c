package extent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
)

// extentJSON is one element of `arbor extent list --json`.
type extentJSON struct {
	ID          uint64   `json:"id"`
	Replicas    []uint64 `json:"replicas"`
	Replication uint32   `json:"replication"`
	Leader      uint64   `json:"leader"`
	Epoch       uint64   `json:"epoch"`
}

// listExtents runs `arbor extent list --json` against the cluster.
func listExtents(t *testing.T, bin, dir string) ([]extentJSON, error) {
	t.Helper()
	out, err := exec.Command(bin, "extent", "list", "--dir", dir, "--json", "--timeout", "10s").Output()
	if err != nil {
		return nil, fmt.Errorf("arbor extent list: %w: %s", err, out)
	}
	// The contract: a list of objects with exactly these keys.
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("arbor extent list --json printed %q: %w", out, err)
	}
	for _, m := range raw {
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"epoch", "id", "leader", "replicas", "replication"}) {
			t.Fatalf("arbor extent list --json element has keys %v", keys)
		}
	}
	var views []extentJSON
	return views, json.Unmarshal(out, &views)
}

// waitFor polls cond until it returns nil or within passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s within %v: %v", what, within, err)
}

// fullyReplicated checks that every extent has replication replicas, none
// on an excluded node, that each replica's raft group has exactly those
// voters, and that all of them have applied the same index.
func fullyReplicated(ctx context.Context, cl *extent.Client, views []extentJSON, exclude []uint64) error {
	for _, v := range views {
		if len(v.Replicas) != int(v.Replication) {
			return fmt.Errorf("extent %d has replicas %v for replication %d", v.ID, v.Replicas, v.Replication)
		}
		if v.Leader == 0 {
			return fmt.Errorf("extent %d has no leader", v.ID)
		}
		var applied []uint64
		for _, r := range v.Replicas {
			if slices.Contains(exclude, r) {
				return fmt.Errorf("extent %d still lists dead node %d", v.ID, r)
			}
			st, err := cl.ReplicaStatus(ctx, r, v.ID, false)
			if err != nil {
				return fmt.Errorf("extent %d replica %d: %w", v.ID, r, err)
			}
			voters := slices.Sorted(slices.Values(st.Voters))
			if !st.Exists || !slices.Equal(voters, slices.Sorted(slices.Values(v.Replicas))) || len(st.Learners) != 0 {
				return fmt.Errorf("extent %d replica %d: exists %v, voters %v learners %v, want voters %v", v.ID, r, st.Exists, st.Voters, st.Learners, v.Replicas)
			}
			applied = append(applied, st.Applied)
		}
		if slices.Min(applied) != slices.Max(applied) {
			return fmt.Errorf("extent %d replicas applied %v", v.ID, applied)
		}
	}
	return nil
}

// TestKilledNodeIsReReplicated runs a real five-node cluster: it creates
// its first extents by itself (so `arbor extent list` is never empty), data
// is written to every extent, and a node holding extent replicas is killed
// with SIGKILL. The directory declares it dead, and the extent manager
// gives every extent it held a new replica elsewhere until each is fully
// replicated again (three voters caught up, extent map at a new epoch).
// Then a second replica holder is killed: the data, read through the
// repaired groups, is intact.
func TestKilledNodeIsReReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5, Binary: bin,
		ServerArgs: []string{"--node-dead-timeout=3s", "--heartbeat-interval=500ms"}})
	dir, err := directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cl, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: c.DialOptions(), CallTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var views []extentJSON
	waitFor(t, "the first extents, fully replicated", time.Minute, func() error {
		var err error
		if views, err = listExtents(t, bin, c.Dir()); err != nil {
			return err
		}
		if len(views) < extent.DefaultInitialExtents {
			return fmt.Errorf("%d extents", len(views))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return fullyReplicated(ctx, cl, views, nil)
	})
	t.Logf("extents: %+v", views)

	// Data in every extent: a block and a page.
	pages := map[uint64]extent.Pointer{}
	for _, v := range views {
		waitFor(t, fmt.Sprintf("write to extent %d", v.ID), 30*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			p, ok := pages[v.ID]
			if !ok {
				rs, err := cl.Commit(ctx, []extent.Element{extent.Allocate(v.ID, 42)})
				if err != nil {
					return err
				}
				p = rs[0].Block
				pages[v.ID] = p
			}
			_, err := cl.Commit(ctx, []extent.Element{extent.Write(p, 0, []byte(fmt.Sprintf("extent %d", v.ID)))})
			return err
		})
	}
	checkData := func() error {
		for id, p := range pages {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			pg, err := cl.ReadPage(ctx, p)
			cancel()
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("extent %d", id); string(pg.Data) != want {
				return fmt.Errorf("extent %d reads %q, want %q", id, pg.Data, want)
			}
		}
		return nil
	}

	var killed []uint64
	for round := 1; round <= 2; round++ {
		victim := pickVictim(t, dir, views, killed)
		held := 0
		for _, v := range views {
			if slices.Contains(v.Replicas, victim) {
				held++
			}
		}
		t.Logf("round %d: kill -9 node %d, which holds %d extent replicas", round, victim, held)
		if err := c.Kill(victim); err != nil {
			t.Fatal(err)
		}
		killed = append(killed, victim)
		start := time.Now()
		waitFor(t, fmt.Sprintf("round %d: every extent of node %d fully replicated elsewhere", round, victim), 2*time.Minute, func() error {
			var err error
			if views, err = listExtents(t, bin, c.Dir()); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return fullyReplicated(ctx, cl, views, killed)
		})
		t.Logf("round %d: re-replicated in %v: %+v", round, time.Since(start).Round(time.Millisecond), views)
		waitFor(t, "data intact", 30*time.Second, checkData)
	}

	// `arbor extent show` names the replicas, leader, epoch, pages used and
	// pending transactions.
	out, err := exec.Command(bin, "extent", "show", strconv.FormatUint(views[0].ID, 10), "--dir", c.Dir()).CombinedOutput()
	if err != nil {
		t.Fatalf("arbor extent show: %v: %s", err, out)
	}
	for _, want := range []string{"replicas:", "leader:", "epoch", "pages used:", "pending transactions:"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Fatalf("arbor extent show prints no %q:\n%s", want, out)
		}
	}
	t.Logf("arbor extent show:\n%s", out)
}

// pickVictim picks a live node that holds extent replicas and does not
// lead the directory (so the failure detector keeps running), preferring
// storage-only nodes.
func pickVictim(t *testing.T, dir *directory.Client, views []extentJSON, killed []uint64) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := dir.Status(ctx, &dpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	load := map[uint64]int{}
	for _, v := range views {
		for _, r := range v.Replicas {
			load[r]++
		}
	}
	var best uint64
	bestScore := -1
	for _, n := range st.Nodes {
		if n.Id == st.LeaderId || slices.Contains(killed, n.Id) || load[n.Id] == 0 {
			continue
		}
		score := load[n.Id]
		if !slices.Contains(st.Voters, n.Id) {
			score += 100
		}
		if score > bestScore {
			best, bestScore = n.Id, score
		}
	}
	if best == 0 {
		t.Fatalf("no node to kill among %v (leader %d)", strings.Fields(fmt.Sprint(st.Nodes)), st.LeaderId)
	}
	return best
}
