package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

var someExtents = []ExtentView{
	{ID: 1002, Replicas: []uint64{4, 5, 2}, Replication: 3, Leader: 4, Epoch: 2},
	{ID: 1000, Replicas: []uint64{1, 2, 3}, Replication: 3, Leader: 2, Epoch: 1},
	{ID: 1001, Replicas: nil, Replication: 1, Leader: 0, Epoch: 7},
}

func TestExtentsGolden(t *testing.T) {
	var text, js bytes.Buffer
	if err := writeExtents(&text, someExtents); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "extents.txt", text.Bytes())
	if err := writeExtentsJSON(&js, someExtents); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "extents.json", js.Bytes())
}

// TestExtentsJSONContract: `arbor extent list --json` is a list of
// {"id", "replicas": [node ids], "replication", "leader", "epoch"}, in id
// order, never null.
func TestExtentsJSONContract(t *testing.T) {
	for _, views := range [][]ExtentView{nil, someExtents} {
		var js bytes.Buffer
		if err := writeExtentsJSON(&js, views); err != nil {
			t.Fatal(err)
		}
		var got []map[string]any
		if err := json.Unmarshal(js.Bytes(), &got); err != nil || got == nil {
			t.Fatalf("%s: %v", js.Bytes(), err)
		}
		for i, e := range got {
			var keys []string
			for k := range e {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, []string{"epoch", "id", "leader", "replicas", "replication"}) {
				t.Fatalf("element %d has keys %v", i, keys)
			}
			if _, ok := e["replicas"].([]any); !ok {
				t.Fatalf("element %d: replicas %v is not a list", i, e["replicas"])
			}
			if i > 0 && e["id"].(float64) <= got[i-1]["id"].(float64) {
				t.Fatalf("not in id order: %s", js.Bytes())
			}
		}
	}
}

func TestExtentDetailGolden(t *testing.T) {
	d := ExtentDetail{
		ExtentView:    ExtentView{ID: 1000, Replicas: []uint64{3, 1, 2}, Replication: 3, Leader: 2, Epoch: 4},
		PageSizeBytes: 8192, BlockSizeBytes: 262144, ExtentSizeBytes: 1 << 30,
		Term: 7, Voters: []uint64{3, 2, 1}, AppliedIndex: 1234, PagesUsed: 17, BlocksAllocated: 3, PendingTxns: 1,
		Pending: []PendingTxn{{ID: "00000000000000ab", State: "prepared", Prev: 0, Next: 1001, Expiry: "2026-01-02T03:04:05Z"}},
	}
	var text, js bytes.Buffer
	if err := writeExtentDetail(&text, d); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "extent_show.txt", text.Bytes())
	if err := writeJSON(&js, d.sorted()); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "extent_show.json", js.Bytes())
	text.Reset()
	if err := writeExtentDetail(&text, ExtentDetail{ExtentView: ExtentView{ID: 1001, Replicas: []uint64{1}, Replication: 1, Epoch: 1},
		Error: "extent: info (extent 1001): extent: unavailable"}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "extent_show_unavailable.txt", text.Bytes())
}
