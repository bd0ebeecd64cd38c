package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
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
}

// noLeader is a cluster whose directory has no leader and knows no nodes.
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
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Leader != 2 || len(got.Voters) != 3 || got.Voters[0] != 1 || got.Voters[2] != 3 {
		t.Fatalf("leader/voters = %d %v", got.Leader, got.Voters)
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
