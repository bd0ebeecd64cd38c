package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/arbor-storage/arbor/internal/overview"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// checkGolden compares got with testdata/name, or rewrites it with -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test -update and review the diff)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// fiveNodes is an unsorted view with every state and a leader.
var fiveNodes = ClusterView{
	Leader: 2,
	Voters: []uint64{3, 1, 2},
	Nodes: []NodeView{
		{ID: 4, Address: "127.0.0.1:40007", Domain: "dev-4", State: NodeSuspect, Roles: []string{"storage"}},
		{ID: 1, Address: "127.0.0.1:40001", Domain: "dev-1", State: NodeAlive, Roles: []string{"directory", "storage"}},
		{ID: 3, Address: "127.0.0.1:40005", Domain: "dev-3", State: NodeDead, Roles: []string{"directory", "storage"}},
		{ID: 2, Address: "127.0.0.1:40003", Domain: "dev-2", State: NodeAlive, Roles: []string{"directory", "storage"}},
		{ID: 10, Address: "10.0.0.10:7080", Domain: "rack-2", State: NodeDecommissioned, Roles: nil},
	},
	Degraded: []overview.Problem{
		{Kind: overview.KindNodeDead, Subject: "node 3", Message: "dead since 2026-11-26T07:00:00Z (127.0.0.1:40005); its data is re-replicated elsewhere"},
		{Kind: overview.KindNodeSuspect, Subject: "node 4", Message: "suspect since 2026-11-26T07:00:01Z (127.0.0.1:40007): its heartbeats are late"},
		{Kind: overview.KindSectionUnavailable, Subject: "tlt", Message: "could not be read: context deadline exceeded"},
	},
	Gateways: []overview.Gateway{
		{Address: "10.0.0.2:2049", Node: 2, State: overview.GatewayDown, Error: "connection refused"},
		{Address: "10.0.0.1:2049", Node: 1, State: overview.GatewayUp},
	},
}

// noLeader is a cluster whose directory has no leader and knows no nodes;
// nothing is degraded apart from that (the printers print what they are
// given: the no-leader problem comes from internal/overview).
var noLeader = ClusterView{Voters: []uint64{1, 2, 3}}

func TestStatusGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		view ClusterView
	}{{"status_five", fiveNodes}, {"status_no_leader", noLeader}} {
		t.Run(tc.name, func(t *testing.T) {
			var text, js bytes.Buffer
			if err := writeStatus(&text, tc.view); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name+".txt", text.Bytes())
			if err := writeStatusJSON(&js, tc.view); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name+".json", js.Bytes())
		})
	}
}

func TestNodesGolden(t *testing.T) {
	var text, js bytes.Buffer
	if err := writeNodes(&text, fiveNodes); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "nodes_five.txt", text.Bytes())
	if err := writeNodesJSON(&js, fiveNodes); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "nodes_five.json", js.Bytes())
}

// TestStatusJSONContract checks the JSON shape scripts rely on, apart from
// the golden bytes: the documented keys, ids sorted, states from the set.
func TestStatusJSONContract(t *testing.T) {
	var buf bytes.Buffer
	if err := writeStatusJSON(&buf, fiveNodes); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Leader uint64   `json:"leader"`
		Voters []uint64 `json:"voters"`
		Nodes  []struct {
			ID      uint64   `json:"id"`
			Address string   `json:"address"`
			Domain  string   `json:"domain"`
			State   string   `json:"state"`
			Roles   []string `json:"roles"`
		} `json:"nodes"`
		Degraded []struct {
			Kind    string `json:"kind"`
			Subject string `json:"subject"`
			Message string `json:"message"`
		} `json:"degraded"`
		Gateways []struct {
			Address string `json:"address"`
			Node    uint64 `json:"node"`
			State   string `json:"state"`
			Error   string `json:"error"`
		} `json:"gateways"`
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Leader != 2 || len(got.Voters) != 3 || got.Voters[0] != 1 || got.Voters[2] != 3 {
		t.Fatalf("leader/voters = %d %v", got.Leader, got.Voters)
	}
	if len(got.Degraded) != 3 || got.Degraded[0].Kind != "node_dead" || got.Degraded[0].Subject != "node 3" {
		t.Fatalf("degraded = %+v", got.Degraded)
	}
	if len(got.Gateways) != 2 || got.Gateways[0].Address != "10.0.0.1:2049" || got.Gateways[1].State != "down" {
		t.Fatalf("gateways = %+v", got.Gateways)
	}
	states := map[string]bool{"alive": true, "suspect": true, "dead": true, "decommissioned": true}
	for i, n := range got.Nodes {
		if i > 0 && got.Nodes[i-1].ID >= n.ID {
			t.Fatalf("nodes not sorted by id: %v", got.Nodes)
		}
		if !states[n.State] || n.Roles == nil {
			t.Fatalf("node %+v: bad state or null roles", n)
		}
	}
	// The printers must not reorder the caller's view.
	if fiveNodes.Nodes[0].ID != 4 || fiveNodes.Voters[0] != 3 {
		t.Fatal("printing sorted the caller's slices")
	}
}

// TestStatusDegradedLines checks the degraded part of `arbor status`: one
// line "degraded: none" when all is well, else one problem a line after
// the summary and before the node table.
func TestStatusDegradedLines(t *testing.T) {
	var healthy bytes.Buffer
	if err := writeStatus(&healthy, ClusterView{Leader: 1, Voters: []uint64{1}, Nodes: []NodeView{{ID: 1, State: NodeAlive}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(healthy.String(), "\ndegraded: none\n\nID") {
		t.Fatalf("healthy status:\n%s", healthy.String())
	}
	var sick bytes.Buffer
	if err := writeStatus(&sick, fiveNodes); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(sick.String(), "\n")
	i := slices.Index(lines, "degraded:")
	if i != 3 || len(lines) < i+5 || lines[i+1] != "  node 3: "+fiveNodes.Degraded[0].Message || lines[i+4] != "" {
		t.Fatalf("degraded status:\n%s", sick.String())
	}
}
