package overview

import (
	"slices"
	"testing"
)

// TestRowsOnlyOn: a node may go without loss only if every row it holds
// in sync has another member in sync, and no row waits for it.
func TestRowsOnlyOn(t *testing.T) {
	v := TLTView{Rows: []RowView{
		// Complete elsewhere too.
		{Row: 0, Slots: []string{"1/0", "2/0", "3/0"}},
		// Its only in-sync member is on node 2.
		{Row: 1, Slots: []string{"2/0", "4/0", "5/0"}, Behind: []string{"4/0 (at version 3)", "5/0 (7 tracts, 1.0 MiB copied)"}},
		// Waits for node 2 (or 3) to return.
		{Row: 2, Slots: []string{"1/0", "4/0"}, Behind: []string{"1/0 (no status)"}, WaitingFor: []string{"2/0", "3/0"}},
		// Node 2 is behind here: nothing of its own to lose.
		{Row: 3, Slots: []string{"2/1", "5/0"}, Behind: []string{"2/1 (no status)"}},
		// Node 22 is not node 2.
		{Row: 4, Slots: []string{"22/0", "5/0"}, Behind: []string{"5/0 (no status)"}},
		// A second disk of node 2 is the only in-sync member.
		{Row: 5, Slots: []string{"2/1", "3/0"}, Behind: []string{"3/0 (no status)"}},
	}}
	for _, tc := range []struct {
		node uint64
		want []int
	}{
		{2, []int{1, 2, 5}},
		{3, []int{2}},
		{5, []int{3}},
		{22, []int{4}},
		{9, nil},
	} {
		if got := v.RowsOnlyOn(tc.node); !slices.Equal(got, tc.want) {
			t.Errorf("RowsOnlyOn(%d) = %v, want %v", tc.node, got, tc.want)
		}
	}
}
