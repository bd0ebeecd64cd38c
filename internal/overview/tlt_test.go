package overview

import (
	"slices"
	"testing"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// TestRowsOnlyOn: a node may go without loss only if every row it holds
// a complete copy of has another member holding one (the TLT manager's
// rule: tract.MemberComplete, a readable member or the primary), and no
// row waits for it.
func TestRowsOnlyOn(t *testing.T) {
	sv := func(node uint64, disk uint32) tract.ServerID { return tract.ServerID{Node: node, Disk: disk} }
	// Each row's slots, and which of them hold a complete copy.
	rows := []struct {
		slots    []tract.ServerID
		complete []bool
	}{
		{[]tract.ServerID{sv(1, 0), sv(2, 0), sv(3, 0)}, []bool{true, true, true}},   // complete elsewhere too
		{[]tract.ServerID{sv(2, 0), sv(4, 0), sv(5, 0)}, []bool{true, false, false}}, // only on node 2
		{[]tract.ServerID{sv(1, 0), sv(4, 0)}, []bool{false, true}},                  // only on node 4
		{[]tract.ServerID{sv(5, 0), sv(2, 1)}, []bool{true, false}},                  // node 2 behind: nothing to lose there
		{[]tract.ServerID{sv(22, 0), sv(5, 0)}, []bool{true, false}},                 // node 22 is not node 2
		{[]tract.ServerID{sv(2, 1), sv(3, 0)}, []bool{true, false}},                  // a second disk of node 2
	}
	tab := &tract.Table{Version: 9, Replication: 3}
	statuses := map[uint64]*tpb.StatusResponse{}
	disk := func(s tract.ServerID) *tpb.DiskStatus {
		st := statuses[s.Node]
		if st == nil {
			st = &tpb.StatusResponse{}
			statuses[s.Node] = st
		}
		for _, d := range st.Disks {
			if d.Disk == s.Disk {
				return d
			}
		}
		d := &tpb.DiskStatus{Disk: s.Disk}
		st.Disks = append(st.Disks, d)
		return d
	}
	for ri, r := range rows {
		tab.Rows = append(tab.Rows, tract.Row{Version: 3, Slots: r.slots})
		for j, s := range r.slots {
			// The primary (slot 0) counts as complete whatever it says,
			// so a behind primary reports the replica role here.
			role := tpb.RowRole_ROW_ROLE_REPLICA
			if j == 0 && r.complete[j] {
				role = tpb.RowRole_ROW_ROLE_PRIMARY
			}
			d := disk(s)
			d.Rows = append(d.Rows, &tpb.RowStatus{Row: uint32(ri), Version: 3, Role: role, Readable: r.complete[j], InSync: r.complete[j]})
		}
	}
	nodes := map[uint64]*dpb.Node{}
	for n := range statuses {
		nodes[n] = &dpb.Node{Id: n, State: dpb.NodeState_NODE_STATE_ALIVE}
	}
	v := BuildTLT(tab, nodes, statuses, nil)
	for _, tc := range []struct {
		node uint64
		want []int
	}{
		{2, []int{1, 5}},
		{4, []int{2}},
		{5, []int{3}},
		{22, []int{4}},
		{3, nil},
		{9, nil},
	} {
		if got := v.RowsOnlyOn(tc.node); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("RowsOnlyOn(%d) = %v, want %v", tc.node, got, tc.want)
		}
	}
}
