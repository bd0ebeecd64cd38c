package tract_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/testseed"
	"github.com/arbor-storage/arbor/internal/tract"
)

// startECCluster starts a dev cluster whose TLT rows have 7 slots (room
// for ec:5+2 stripes), 5 directory voters and 5-replica metadata extents
// (any 2 nodes may die).
func startECCluster(t *testing.T, nodes int) *harness {
	t.Helper()
	return startClusterWith(t, devcluster.Options{Nodes: nodes, DirectoryVoters: 5, MetadataReplicas: 5, ServerArgs: serverArgs,
		Env: []string{clusterTractEnv() + ",replication=7"}})
}

// putEC stores a file as an ec:5+2 blob with the CLI and checks its stat.
func (h *harness) putEC(size int64) (id, path string) {
	h.t.Helper()
	path = writeFile(h.t, size)
	start := time.Now()
	id = strings.TrimSpace(h.arbor(false, "blob", "put", path, "--layout", "ec:5+2", "--progress=never"))
	h.t.Logf("ec:5+2 blob %s: %d MiB put in %v", id, size>>20, time.Since(start).Round(time.Millisecond))
	var st struct {
		Layout    string `json:"layout"`
		Bytes     int64  `json:"bytes"`
		Placement []struct {
			Servers []string `json:"servers"`
		} `json:"placement"`
	}
	if err := json.Unmarshal([]byte(h.arbor(false, "blob", "stat", id, "--json")), &st); err != nil {
		h.t.Fatal(err)
	}
	if st.Layout != "ec:5+2" || st.Bytes != size || len(st.Placement) == 0 {
		h.t.Fatalf("blob stat: layout %q, %d bytes, %d tracts placed", st.Layout, st.Bytes, len(st.Placement))
	}
	for i, p := range st.Placement {
		nodes := map[string]bool{}
		for _, s := range p.Servers {
			nodes[strings.Split(s, "/")[0]] = true
		}
		if len(p.Servers) != 7 || len(nodes) != 7 {
			h.t.Fatalf("tract %d: shards on %v, want 7 distinct nodes", i, p.Servers)
		}
	}
	text := h.arbor(false, "blob", "stat", id)
	if !strings.Contains(text, "layout:      ec:5+2") || !strings.Contains(text, "shards 0..6 on") {
		h.t.Fatalf("blob stat:\n%s", text)
	}
	h.checkBlob(id, path)
	return id, path
}

// liveRowsInSync reports whether every running node has every row in sync
// (dead members that no server can replace stay in the rows, so the whole
// table never is).
func (h *harness) liveRowsInSync() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range h.c.Nodes() {
		if !n.Running {
			continue
		}
		st, err := h.client.NodeStatus(ctx, n.ID, false)
		if err != nil {
			return false, fmt.Sprintf("node %d: %v", n.ID, err)
		}
		for _, d := range st.Disks {
			if d.RowsCatchingUp > 0 {
				return false, fmt.Sprintf("node %d: %d rows catching up", n.ID, d.RowsCatchingUp)
			}
		}
	}
	return true, ""
}

// TestClusterErasureCoded: on a 7-node dev cluster (7 failure domains, TLT
// rows of 7), an ec:5+2 blob put with the CLI, and a tree of files written
// through a FUSE mount of an ec:5+2 file system (arbor fs create --data;
// ec:6+2 refused, and replicas:7, which would outlive the metadata),
// read back byte-identical after kill -9 of two nodes drawn among all 7
// (seeded, testseed: the metadata has 5 directory voters and 5-replica
// extents, so any two may die): at once (degraded reads), after the
// directory repaired the TLT (promoted primaries rebuilding their shard
// 0) and once the survivors are in sync. Between the two kills, with one
// node dead and no server to take its slots, stripes keep being written
// (acknowledged with 6 of 7 shards) and read back, and new files are
// written through a mount (their blobs created with the dead member
// missing from every metadata row). The two come back, rebuild what they
// missed (the shards of those writes too), `arbor blob verify` checks
// every stripe's parity and `arbor fsck` the file system.
func TestClusterErasureCoded(t *testing.T) {
	h := startECCluster(t, 7)
	var extents []struct {
		ID       uint64   `json:"id"`
		Replicas []uint64 `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(h.arbor(false, "extent", "list", "--json")), &extents); err != nil {
		t.Fatal(err)
	}
	for _, e := range extents {
		if len(e.Replicas) != 5 {
			t.Fatalf("extent %d has replicas %v; the cluster was made with --metadata-replicas 5", e.ID, e.Replicas)
		}
	}
	if len(extents) == 0 {
		t.Fatal("arbor extent list: no extents")
	}
	size := int64(40 << 20)
	if long() {
		size = 1 << 30
	}
	id, path := h.putEC(size)
	seed := testseed.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 16))
	// The file tree.
	var tree map[string]string
	if why := fuseUsable(); why != "" {
		t.Logf("no file tree: FUSE mounts cannot run here (%s)", why)
	} else {
		before := h.ecStripes()
		h.createECFS("ecfs")
		start := time.Now()
		m := h.mount("ecfs")
		tree = writeECTree(h, m.dir, seed)
		m.stop(h)
		after := h.ecStripes()
		t.Logf("a tree of %d files written on ec:5+2 in %v: %d stripes", len(tree), time.Since(start).Round(time.Millisecond), after-before)
		if least := ecTreeTracts(); after-before < least {
			t.Fatalf("%d new erasure-coded stripes after writing the tree; its files outside the metadata have at least %d tracts", after-before, least)
		}
	}
	// Any two nodes of the 7 (the metadata has 5 replicas).
	a, b := h.killPair(rng)
	// A blob made before the failures, written with one node dead.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	layout, err := tract.ParseLayout("ec:5+2")
	if err != nil {
		t.Fatal(err)
	}
	g2 := tract.NewGUID()
	const degradedTracts = 12
	b2, err := h.client.CreateBlobLayout(ctx, g2, layout, degradedTracts)
	if err != nil {
		t.Fatal(err)
	}
	want2 := make([][]byte, degradedTracts)
	t.Logf("seed %d: killing node %d with SIGKILL, writing, then node %d", seed, a, b)
	tab, err := h.client.RefreshTLT(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := h.recoveredBytes()
	start := time.Now()
	if err := h.c.Kill(a); err != nil {
		t.Fatal(err)
	}
	for i := range want2 {
		want2[i] = make([]byte, 1+rng.IntN(1<<20))
		for j := range want2[i] {
			want2[i][j] = byte(rng.Uint32())
		}
		if err := b2.WriteTract(ctx, uint64(i), want2[i]); err != nil {
			t.Fatalf("write tract %d with node %d dead: %v", i, a, err)
		}
	}
	checkTracts := func(when string) {
		t.Helper()
		for i, w := range want2 {
			got, err := b2.ReadTract(ctx, uint64(i))
			if err != nil || !bytes.Equal(got, w) {
				t.Fatalf("%s: tract %d written with a node dead: %d bytes, %v", when, i, len(got), err)
			}
		}
	}
	checkTracts("one node dead")
	t.Logf("%d stripes written with node %d dead in %v (%d acknowledged with shards missing)", degradedTracts, a, time.Since(start).Round(time.Millisecond), h.client.DegradedWrites())
	if h.client.DegradedWrites() == 0 {
		t.Fatal("no stripe write was acknowledged with a shard missing")
	}
	if tree != nil {
		// New files with the node dead: their blobs are created (once
		// the directory has declared it dead: every metadata row holds
		// it) and written with 6 of 7 shards.
		start := time.Now()
		m := h.mount("ecfs")
		more := writeECTree(h, filepath.Join(m.dir, "one-dead"), seed+1)
		m.stop(h)
		for p, s := range more {
			tree[filepath.Join("one-dead", p)] = s
		}
		t.Logf("%d new files written with node %d dead in %v", len(more), a, time.Since(start).Round(time.Millisecond))
	}
	if err := h.c.Kill(b); err != nil {
		t.Fatal(err)
	}
	h.checkBlob(id, path)
	checkTracts("two nodes dead")
	t.Logf("read back byte-identical with two nodes down in %v", time.Since(start).Round(time.Millisecond))
	if tree != nil {
		h.checkECTree("ecfs", tree, "two nodes dead")
	}
	h.waitFor("the TLT repair", 90*time.Second, func() bool {
		now, err := h.client.RefreshTLT(context.Background())
		return err == nil && now.Version > tab.Version
	})
	h.checkBlob(id, path)
	var why string
	h.waitForWith("the survivors in sync", 3*time.Minute, func() bool {
		var ok bool
		ok, why = h.liveRowsInSync()
		return ok
	}, func() string { return why })
	t.Logf("survivors in sync %v after the kills; %d MiB rebuilt", time.Since(start).Round(time.Millisecond), (h.recoveredBytes()-before)>>20)
	h.checkBlob(id, path)
	checkTracts("survivors in sync")
	// The dead come back: they get their rows back and rebuild the shards
	// of their slots (those of the writes they missed, and those promoted
	// primaries moved).
	sctx, scancel := context.WithTimeout(context.Background(), startupWait)
	defer scancel()
	for _, n := range []uint64{a, b} {
		if err := h.c.StartNode(sctx, n); err != nil {
			t.Fatal(err)
		}
	}
	h.waitInSync(3 * time.Minute)
	var out string
	h.waitForWith("verify to pass (the returned nodes' shards rebuilt)", 2*time.Minute, func() bool {
		var err error
		out, err = h.tryArbor("blob", "verify", "--progress=never")
		return err == nil && strings.Contains(out, "erasure-coded stripes parity-checked")
	}, func() string { return out })
	t.Logf("verify: %s", strings.TrimSpace(out))
	h.checkBlob(id, path)
	checkTracts("after the recovery")
	if tree != nil {
		h.checkECTree("ecfs", tree, "after the recovery")
		t.Logf("fsck: %s", strings.TrimSpace(h.arbor(false, "fsck", "ecfs")))
	}
}

// TestClusterErasureCodedReplace (ARBOR_LONG): on 9 nodes, the two dead
// nodes' slots go to servers in the free failure domains, which rebuild
// every shard in parallel; verify passes with the dead still down.
func TestClusterErasureCodedReplace(t *testing.T) {
	if !long() {
		t.Skip("set " + longEnv + " to run: a 9-node cluster")
	}
	h := startECCluster(t, 9)
	id, path := h.putEC(1 << 30)
	before := h.recoveredBytes()
	start := time.Now()
	for _, n := range []uint64{4, 8} {
		if err := h.c.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	h.checkBlob(id, path)
	h.waitInSync(10 * time.Minute)
	took := time.Since(start)
	moved := h.recoveredBytes() - before
	t.Logf("recovery: %d MiB of shards rebuilt %v after the kills (%.1f MiB/s, including the failure detection)",
		moved>>20, took.Round(time.Millisecond), float64(moved)/(1<<20)/took.Seconds())
	out := h.arbor(false, "blob", "verify", "--progress=never")
	t.Logf("verify: %s", strings.TrimSpace(out))
	h.checkBlob(id, path)
}
