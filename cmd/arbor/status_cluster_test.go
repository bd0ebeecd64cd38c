package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/overview"
)

// statusDeadTimeout is the failure detector's dead timeout in the test
// cluster: short, so the test is quick, and the bound within which status
// must report a killed node (plus a margin for the check itself).
const statusDeadTimeout = 5 * time.Second

// TestStatusReportsKilledNode runs real arbor processes, kills one with
// SIGKILL, and checks that `arbor status` (the binary) and overview's
// Gather and Handler report it dead within the failure detector's
// timeout, while every call keeps answering within a few seconds.
func TestStatusReportsKilledNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5, ServerArgs: []string{"--node-dead-timeout=" + statusDeadTimeout.String()}})
	bin := devclustertest.Binary(t)
	flags := []string{"--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", c.AdminCredentialFile()}
	status := func(args ...string) (string, time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		var out, errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, append(append([]string{"status"}, args...), flags...)...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("arbor status %v: %v\n%s%s", args, err, out.String(), errOut.String())
		}
		return out.String(), time.Since(start)
	}
	type statusJSON struct {
		Leader uint64 `json:"leader"`
		Nodes  []struct {
			ID    uint64 `json:"id"`
			State string `json:"state"`
		} `json:"nodes"`
		Degraded []overview.Problem `json:"degraded"`
	}
	parse := func(out string) statusJSON {
		t.Helper()
		var s statusJSON
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		return s
	}
	hasProblem := func(ps []overview.Problem, kind, subject string) bool {
		return slices.ContainsFunc(ps, func(p overview.Problem) bool { return p.Kind == kind && p.Subject == subject })
	}

	// Healthy: every node alive and no node problem. (A fresh cluster may
	// still be creating extents, so other kinds are not asserted.)
	before := parse(func() string { out, _ := status("--json"); return out }())
	if before.Leader == 0 || len(before.Nodes) != 5 || before.Degraded == nil {
		t.Fatalf("healthy status: %+v", before)
	}
	for _, p := range before.Degraded {
		if p.Kind == overview.KindNodeDead || p.Kind == overview.KindNodeSuspect {
			t.Fatalf("healthy cluster reports %+v", p)
		}
	}

	// Wait for the TLT and the first extents (the cluster installs them
	// once the storage nodes have registered), so the sections below have
	// something to show.
	g, err := overview.NewGatherer(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for deadline := time.Now().Add(60 * time.Second); ; {
		o, err := g.Gather(context.Background())
		if err == nil && o.TLT.Error == "" && len(o.TLT.Rows) > 0 && len(o.Extents.Extents) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TLT or extents after a minute: %v %+v", err, o.Degraded)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// Node 5 is a storage node, not a directory voter: the directory keeps
	// its quorum and is the one to notice.
	const victim = 5
	killed := time.Now()
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	var seen statusJSON
	for {
		out, took := status("--json")
		if took > 8*time.Second {
			t.Errorf("status took %v with node %d killed", took, victim)
		}
		seen = parse(out)
		if hasProblem(seen.Degraded, overview.KindNodeDead, "node 5") {
			break
		}
		if time.Since(killed) > statusDeadTimeout+10*time.Second {
			t.Fatalf("%v after the kill, status still does not report node %d dead:\n%s", time.Since(killed), victim, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("status reported node %d dead %v after the kill", victim, time.Since(killed).Round(100*time.Millisecond))
	for _, n := range seen.Nodes {
		if want := "alive"; n.ID != victim && n.State != want {
			t.Errorf("node %d is %s, want %s", n.ID, n.State, want)
		} else if n.ID == victim && n.State != "dead" {
			t.Errorf("node %d is %s in the nodes list, dead in degraded", n.ID, n.State)
		}
	}

	text, _ := status()
	t.Logf("arbor status:\n%s", text)
	if !strings.Contains(text, "\ndegraded:\n") || !strings.Contains(text, "\n  node 5: dead since ") {
		t.Errorf("status text does not list node 5 as degraded:\n%s", text)
	}

	// The library, as the dashboard uses it: the sections that do not need
	// node 5 are still read.
	start := time.Now()
	o, err := g.Gather(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("Gather took %v", took)
	}
	if o.Directory.Error != "" || o.Directory.Leader == 0 || len(o.Nodes) != 5 {
		t.Errorf("directory section: %+v, %d nodes", o.Directory, len(o.Nodes))
	}
	if o.TLT.Error != "" || len(o.TLT.Rows) == 0 {
		t.Errorf("TLT section: error %q, %d rows", o.TLT.Error, len(o.TLT.Rows))
	}
	if o.FileSystems.Error != "" {
		t.Errorf("file systems section: %s", o.FileSystems.Error)
	}
	if !hasProblem(o.Degraded, overview.KindNodeDead, "node 5") {
		t.Errorf("Gather's degraded list lacks node 5: %+v", o.Degraded)
	}
	for _, n := range o.Nodes {
		if n.HTTPAddress == "" && n.State == overview.StateAlive {
			t.Errorf("node %d has no HTTP address", n.ID)
		}
	}
	t.Logf("Gather took %dms; degraded: %+v", o.TookMs, o.Degraded)

	srv := httptest.NewServer(overview.Handler(g))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var served overview.Overview
	if err := json.NewDecoder(resp.Body).Decode(&served); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !hasProblem(served.Degraded, overview.KindNodeDead, "node 5") {
		t.Errorf("handler: %d, degraded %+v", resp.StatusCode, served.Degraded)
	}

	// Kill the directory leader too: status still answers at once (from a
	// member's view while there is no leader), and once a new leader's
	// detector has waited its timeout, reports the old one.
	leader := seen.Leader
	killed = time.Now()
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	subject := "node " + strconv.FormatUint(leader, 10)
	var slowest time.Duration
	for {
		out, took := status("--json")
		if took > 8*time.Second {
			t.Errorf("status took %v with the directory leader killed", took)
		}
		slowest = max(slowest, took)
		s := parse(out)
		if s.Leader != 0 && s.Leader != leader && hasProblem(s.Degraded, overview.KindNodeDead, subject) {
			t.Logf("status reported the old leader, node %d, dead %v after the kill (new leader %d; slowest status %v)",
				leader, time.Since(killed).Round(100*time.Millisecond), s.Leader, slowest.Round(time.Millisecond))
			break
		}
		if time.Since(killed) > 2*statusDeadTimeout+15*time.Second {
			t.Fatalf("%v after killing the directory leader, status does not report it dead:\n%s", time.Since(killed), out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
