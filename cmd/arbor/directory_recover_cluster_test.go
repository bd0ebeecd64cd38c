package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// TestDirectoryLostQuorumRecoveredByOperator runs a real five-node cluster
// (directory peers 1-3), writes state through every path (a file system,
// keys, a blob), and loses two of the three directory peers for good
// (kill -9, data dirs wiped): the directory cannot answer. On the stopped
// survivor, `arbor directory recover` refuses while the node runs and
// without --yes-lose-unreplicated-writes, then makes it the only voter;
// restarted, it leads the directory alone, the cluster's identity, TLT and
// file systems are intact, the extents that lost their quorum with the
// same kills are recovered by `arbor extent recover`, everything written
// before reads back and new writes work. The lost peers return on empty
// data dirs with --directory-join: the leader adds them back, the directory
// has three voters again, and it survives kill -9 of the recovered node,
// which `arbor tlt forget-member` then gives up.
func TestDirectoryLostQuorumRecoveredByOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5, Binary: bin,
		ServerArgs: []string{"--node-dead-timeout=3s", "--heartbeat-interval=500ms"}})
	if keep := os.Getenv("ARBOR_TEST_KEEP_LOGS"); keep != "" {
		t.Cleanup(func() {
			if t.Failed() {
				_ = exec.Command("cp", "-r", c.Dir(), keep).Run()
			}
		})
	}
	arbor := func(stdin string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return out.String() + errOut.String(), err
		}
		return out.String(), nil
	}
	cli := func(args ...string) (string, error) {
		return arbor("", append(args, "--dir", c.Dir(), "--timeout", "10s")...)
	}
	waitFor := func(what string, within time.Duration, cond func() error) {
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
	dir, err := directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	status := func(timeout time.Duration) (*dpb.StatusResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return dir.Status(ctx, &dpb.StatusRequest{})
	}

	// State through every path, and what the directory says about it.
	blobFile := filepath.Join(t.TempDir(), "blob")
	blobData := bytes.Repeat([]byte("acknowledged blob "), 4096)
	if err := os.WriteFile(blobFile, blobData, 0o600); err != nil {
		t.Fatal(err)
	}
	var blobID string
	waitFor("state written", time.Minute, func() error {
		if out, err := cli("fs", "create", "before"); err != nil && !strings.Contains(out, "exists") {
			return fmt.Errorf("fs create: %v: %s", err, out)
		}
		if out, err := cli("kv", "put", "recover/key", "before"); err != nil {
			return fmt.Errorf("kv put: %v: %s", err, out)
		}
		if blobID == "" {
			out, err := cli("blob", "put", blobFile)
			if err != nil {
				return fmt.Errorf("blob put: %v: %s", err, out)
			}
			blobID = strings.TrimSpace(out)
		}
		return nil
	})
	before, err := status(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tltBefore := tltOf(t, cli)
	extentsBefore := extentsOf(t, cli)
	if len(before.Voters) != 3 || before.Cluster == nil {
		t.Fatalf("status before: %v", before)
	}
	// Keep a voter that does not lead; lose the leader and the other.
	var survivor uint64
	var lost []uint64
	for _, v := range before.Voters {
		if v != before.LeaderId && survivor == 0 {
			survivor = v
		} else {
			lost = append(lost, v)
		}
	}
	survivorNode, _ := c.Node(survivor)
	t.Logf("directory voters %v, leader %d: keeping %d, losing %v for good", before.Voters, before.LeaderId, survivor, lost)

	for _, v := range lost {
		if err := c.Kill(v); err != nil {
			t.Fatal(err)
		}
		n, _ := c.Node(v)
		if err := os.RemoveAll(n.Dir); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := status(3 * time.Second); err == nil {
		t.Fatalf("the directory answered with two of its three peers gone: %v", st)
	}

	// Refused while the node runs, and the replica unchanged.
	out, err := arbor("", "directory", "recover", "--data-dir", survivorNode.Dir, "--yes-lose-unreplicated-writes")
	if err == nil || !strings.Contains(out, "in use") || !strings.Contains(out, "stop the node") {
		t.Fatalf("directory recover on a running node: %v\n%s", err, out)
	}
	if err := c.StopNode(context.Background(), survivor); err != nil {
		t.Logf("stopping node %d without its directory: %v", survivor, err)
	}
	// Without the flag: the replica, the plan and the warning; nothing changes.
	for range 2 {
		out, err = arbor("", "directory", "recover", "--data-dir", survivorNode.Dir)
		if err == nil || !strings.Contains(out, "WARNING") || !strings.Contains(out, "nothing changed") ||
			!strings.Contains(out, fmt.Sprintf("voters %v", before.Voters)) {
			t.Fatalf("directory recover without the flag: %v\n%s", err, out)
		}
	}
	t.Logf("arbor directory recover (no flag):\n%s", out)
	out, err = arbor("", "directory", "recover", "--data-dir", survivorNode.Dir, "--yes-lose-unreplicated-writes")
	if err != nil || !strings.Contains(out, fmt.Sprintf("node %d as its only voter (removed %v)", survivor, lost)) {
		t.Fatalf("directory recover: %v\n%s", err, out)
	}
	t.Logf("arbor directory recover --yes-lose-unreplicated-writes:\n%s", out)

	start := time.Now()
	if err := c.StartNode(context.Background(), survivor); err != nil {
		t.Fatal(err)
	}
	var after *dpb.StatusResponse
	waitFor("the recovered directory serving", time.Minute, func() error {
		var err error
		if after, err = status(3 * time.Second); err != nil {
			return err
		}
		if after.LeaderId != survivor || !slices.Contains(after.Voters, survivor) {
			return fmt.Errorf("leader %d voters %v", after.LeaderId, after.Voters)
		}
		return nil
	})
	t.Logf("directory serves %v after the recovered node started: voters %v learners %v",
		time.Since(start).Round(time.Millisecond), after.Voters, after.Learners)
	if after.Cluster.GetClusterId() != before.Cluster.GetClusterId() || after.Cluster.GetTractSizeBytes() != before.Cluster.GetTractSizeBytes() {
		t.Fatalf("cluster after recovery %v, before %v", after.Cluster, before.Cluster)
	}
	if len(after.Nodes) != len(before.Nodes) {
		t.Fatalf("%d nodes known after recovery, %d before", len(after.Nodes), len(before.Nodes))
	}
	if tlt := tltOf(t, cli); tlt.TractSize != tltBefore.TractSize || len(tlt.Rows) != len(tltBefore.Rows) || tlt.Version < tltBefore.Version {
		t.Fatalf("TLT after recovery: version %d, %d rows of %d bytes; before: version %d, %d rows of %d bytes",
			tlt.Version, len(tlt.Rows), tlt.TractSize, tltBefore.Version, len(tltBefore.Rows), tltBefore.TractSize)
	}
	if out, err := cli("fs", "list"); err != nil || !strings.Contains(out, "before") {
		t.Fatalf("fs list after recovery: %v\n%s", err, out)
	}

	// The extents that had both lost nodes lost their quorum with them:
	// the operator recovers those with `arbor extent recover`.
	for _, e := range extentsBefore {
		if !slices.Contains(e.Replicas, lost[0]) || !slices.Contains(e.Replicas, lost[1]) {
			continue
		}
		waitFor(fmt.Sprintf("extent %d recovered", e.ID), time.Minute, func() error {
			out, err := cli("extent", "recover", strconv.FormatUint(e.ID, 10), "--yes-lose-unreplicated-writes")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		t.Logf("extent %d (replicas %v) lost its quorum too: recovered", e.ID, e.Replicas)
	}

	// `arbor tlt forget-member` refuses a live node, and without its flag
	// only describes a dead one.
	if out, err := cli("tlt", "forget-member", strconv.FormatUint(aliveNonVoter(before, survivor, lost), 10)); err == nil || !strings.Contains(out, "not dead") {
		t.Fatalf("tlt forget-member of a live node: %v\n%s", err, out)
	}
	waitFor(fmt.Sprintf("node %d declared dead", lost[0]), time.Minute, func() error {
		out, err := cli("tlt", "forget-member", strconv.FormatUint(lost[0], 10))
		if err == nil || !strings.Contains(out, "WARNING") || !strings.Contains(out, "nothing changed") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	// Everything written before reads back; new writes work.
	waitFor("the key written before", 2*time.Minute, func() error {
		out, err := cli("kv", "get", "recover/key")
		if err != nil || strings.TrimSpace(out) != "before" {
			return fmt.Errorf("kv get: %v: %q", err, out)
		}
		return nil
	})
	waitFor("the blob written before", 2*time.Minute, func() error {
		out, err := cli("blob", "get", blobID, "-")
		if err != nil || out != string(blobData) {
			return fmt.Errorf("blob get: %v (%d bytes, want %d)", err, len(out), len(blobData))
		}
		return nil
	})
	waitFor("new writes", time.Minute, func() error {
		if out, err := cli("kv", "put", "recover/key2", "after"); err != nil {
			return fmt.Errorf("kv put: %v: %s", err, out)
		}
		if out, err := cli("fs", "create", "after"); err != nil && !strings.Contains(out, "exists") {
			return fmt.Errorf("fs create: %v: %s", err, out)
		}
		if out, err := cli("blob", "put", blobFile); err != nil {
			return fmt.Errorf("blob put: %v: %s", err, out)
		}
		return nil
	})
	t.Logf("old data read back and new writes done %v after the recovered node started", time.Since(start).Round(time.Millisecond))

	// The lost peers return on empty disks and join: three voters again.
	for _, v := range lost {
		if err := c.StartNodeWith(context.Background(), v, "--directory-join"); err != nil {
			t.Fatal(err)
		}
	}
	rejoin := time.Now()
	waitFor("three directory voters again", 2*time.Minute, func() error {
		st, err := status(3 * time.Second)
		if err != nil {
			return err
		}
		if !slices.Equal(st.Voters, before.Voters) || len(st.Learners) != 0 {
			return fmt.Errorf("voters %v learners %v, want %v", st.Voters, st.Learners, before.Voters)
		}
		return nil
	})
	t.Logf("voters %v again %v after the lost peers started", before.Voters, time.Since(rejoin).Round(time.Millisecond))

	// Fault tolerance is back: the directory survives losing the node it
	// was recovered on.
	if err := c.Kill(survivor); err != nil {
		t.Fatal(err)
	}
	waitFor("a directory leader without the recovered node", time.Minute, func() error {
		st, err := status(3 * time.Second)
		if err != nil {
			return err
		}
		if st.LeaderId == survivor || st.LeaderId == 0 {
			return fmt.Errorf("leader %d", st.LeaderId)
		}
		if st.Cluster.GetClusterId() != before.Cluster.GetClusterId() {
			return fmt.Errorf("cluster %v", st.Cluster)
		}
		return nil
	})
	if out, err := cli("fs", "list"); err != nil || !strings.Contains(out, "before") || !strings.Contains(out, "after") {
		t.Fatalf("fs list after losing the recovered node: %v\n%s", err, out)
	}

	// Its disk is gone for good too: once it is declared dead, the operator
	// gives it up (`arbor tlt forget-member`), and it is decommissioned.
	waitFor(fmt.Sprintf("node %d given up", survivor), time.Minute, func() error {
		out, err := cli("tlt", "forget-member", strconv.FormatUint(survivor, 10), "--yes-lose-unreplicated-writes")
		if err != nil || !strings.Contains(out, "given up") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	st, err := status(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.Id == survivor && n.State != dpb.NodeState_NODE_STATE_DECOMMISSIONED {
			t.Fatalf("node %d is %v after forget-member", survivor, n.State)
		}
	}
}

// tltJSON is the part of `arbor tlt --json` the recovery test compares.
type tltJSON struct {
	Version   uint64            `json:"version"`
	TractSize int               `json:"tract_size"`
	Rows      []json.RawMessage `json:"rows"`
}

func tltOf(t *testing.T, cli func(...string) (string, error)) tltJSON {
	t.Helper()
	out, err := cli("tlt", "--json")
	if err != nil {
		t.Fatalf("arbor tlt --json: %v\n%s", err, out)
	}
	var v tltJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("arbor tlt --json: %v\n%s", err, out)
	}
	return v
}

// extentListJSON is one element of `arbor extent list --json`.
type extentListJSON struct {
	ID       uint64   `json:"id"`
	Replicas []uint64 `json:"replicas"`
}

func extentsOf(t *testing.T, cli func(...string) (string, error)) []extentListJSON {
	t.Helper()
	out, err := cli("extent", "list", "--json")
	if err != nil {
		t.Fatalf("arbor extent list --json: %v\n%s", err, out)
	}
	var v []extentListJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("arbor extent list --json: %v\n%s", err, out)
	}
	return v
}

// aliveNonVoter returns a node of st that is neither a directory voter nor
// lost: alive through the whole test.
func aliveNonVoter(st *dpb.StatusResponse, survivor uint64, lost []uint64) uint64 {
	for _, n := range st.Nodes {
		if n.Id != survivor && !slices.Contains(lost, n.Id) && !slices.Contains(st.Voters, n.Id) {
			return n.Id
		}
	}
	return 0
}
