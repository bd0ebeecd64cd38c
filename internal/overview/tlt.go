package overview

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// tractStatusTimeout bounds the question to one tractserver about its
// rows, so a dead node costs the TLT section this long at most.
const tractStatusTimeout = 3 * time.Second

// TLTView is the tract locator table and the state of every tractserver
// (what `arbor tlt` prints).
type TLTView struct {
	Version     uint64       `json:"version"`
	Replication int          `json:"replication"`
	TractSize   int          `json:"tract_size"`
	Servers     []ServerView `json:"servers"`
	Rows        []RowView    `json:"rows"`
	// RowsCatchingUp counts rows with a member or pending entry not in
	// sync (or whose state could not be read).
	RowsCatchingUp int `json:"rows_catching_up"`
	// RecoveredBytes is the total copied by catch-ups on the nodes that
	// answered, since they started.
	RecoveredBytes uint64 `json:"recovered_bytes"`
	// RowsWaiting counts rows the TLT manager leaves alone until a dead
	// member returns: no live member holds a complete copy.
	RowsWaiting int `json:"rows_waiting"`
}

// ServerView is one tractserver (one disk of a node).
type ServerView struct {
	Server     string `json:"server"`
	Address    string `json:"address"`
	Domain     string `json:"domain"`
	State      string `json:"state"`
	Slots      int    `json:"slots"`
	Primary    int    `json:"primary"`
	Pending    int    `json:"pending"`
	Tracts     uint64 `json:"tracts"`
	Bytes      uint64 `json:"bytes"`
	CatchingUp int    `json:"catching_up"`
	// OnlyCopyRows are the rows whose only complete copies may be on this
	// server's node (tract.RowsWaiting with the node dead): giving the
	// node up would repair them from an incomplete copy.
	OnlyCopyRows []int  `json:"only_copy_rows,omitempty"`
	Error        string `json:"error,omitempty"`
}

// RowView is one row of the table.
type RowView struct {
	Row     int      `json:"row"`
	Version uint64   `json:"version"`
	Slots   []string `json:"slots"`
	Pending []string `json:"pending"`
	// Behind lists members not in sync, with their catch-up progress.
	Behind []string `json:"behind"`
	// WaitingFor lists the dead members one of which holds the row's only
	// complete copy (tract.RowsWaiting); empty unless the row waits.
	WaitingFor []string `json:"waiting_for,omitempty"`
}

// FetchTLT reads the current table from the directory and asks every
// tractserver in it, in parallel, for its rows' state.
func FetchTLT(ctx context.Context, dir *directory.Client, tc *tract.Client) (TLTView, error) {
	t, err := tc.RefreshTLT(ctx)
	if err != nil {
		return TLTView{}, fmt.Errorf("read the TLT: %w", err)
	}
	nodes, err := dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return TLTView{}, fmt.Errorf("list nodes: %w", err)
	}
	byID := map[uint64]*dpb.Node{}
	for _, n := range nodes.Nodes {
		byID[n.Id] = n
	}
	statuses := map[uint64]*tpb.StatusResponse{}
	errs := map[uint64]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Only this loop reads asked; the goroutines write statuses under mu.
	asked := map[uint64]bool{}
	for _, s := range t.Servers() {
		if asked[s.Node] {
			continue
		}
		asked[s.Node] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, tractStatusTimeout)
			st, err := tc.NodeStatus(sctx, s.Node, true)
			cancel()
			mu.Lock()
			statuses[s.Node], errs[s.Node] = st, err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return BuildTLT(t, byID, statuses, errs), nil
}

// BuildTLT combines the table, the node table and the tractservers'
// statuses (errs says why a node's status is missing).
func BuildTLT(t *tract.Table, nodes map[uint64]*dpb.Node, statuses map[uint64]*tpb.StatusResponse, errs map[uint64]error) TLTView {
	v := TLTView{Version: t.Version, Replication: t.Replication, TractSize: t.TractSize}
	type key struct {
		row int
		s   tract.ServerID
	}
	rowStatus := map[key]*tpb.RowStatus{}
	disk := map[tract.ServerID]*tpb.DiskStatus{}
	for node, st := range statuses {
		if st == nil {
			continue
		}
		for _, d := range st.Disks {
			s := tract.ServerID{Node: node, Disk: d.Disk}
			disk[s] = d
			v.RecoveredBytes += d.RecoveredBytes
			for _, r := range d.Rows {
				rowStatus[key{int(r.Row), s}] = r
			}
		}
	}
	servers := map[tract.ServerID]*ServerView{}
	view := func(s tract.ServerID) *ServerView {
		if sv := servers[s]; sv != nil {
			return sv
		}
		sv := &ServerView{Server: s.String(), State: "unknown"}
		if n := nodes[s.Node]; n != nil {
			sv.Address, sv.Domain, sv.State = n.Address, n.FailureDomain, directory.StateName(n.State)
		}
		if d := disk[s]; d != nil {
			sv.Tracts, sv.Bytes = d.Tracts, d.Bytes
		} else if err := errs[s.Node]; err != nil {
			sv.Error = err.Error()
		}
		servers[s] = sv
		return sv
	}
	inSync := func(ri int, s tract.ServerID) (bool, string) {
		st := rowStatus[key{ri, s}]
		switch {
		case st == nil:
			return false, s.String() + " (no status)"
		case st.Version != t.Rows[ri].Version:
			return false, fmt.Sprintf("%s (at version %d)", s, st.Version)
		case !st.InSync:
			return false, fmt.Sprintf("%s (%d tracts, %s copied)", s, st.CopiedTracts, HumanBytes(int64(st.CopiedBytes)))
		}
		return true, ""
	}
	for ri, r := range t.Rows {
		rv := RowView{Row: ri, Version: r.Version, Slots: []string{}, Pending: []string{}, Behind: []string{}}
		for j, s := range r.Slots {
			rv.Slots = append(rv.Slots, s.String())
			sv := view(s)
			sv.Slots++
			if j == 0 {
				sv.Primary++
			}
			if ok, why := inSync(ri, s); !ok {
				rv.Behind = append(rv.Behind, why)
				sv.CatchingUp++
			}
		}
		for _, p := range r.Pending {
			rv.Pending = append(rv.Pending, fmt.Sprintf("%d:%s", p.Slot, p.Server))
			sv := view(p.Server)
			sv.Pending++
			if ok, why := inSync(ri, p.Server); !ok {
				rv.Behind = append(rv.Behind, why)
				sv.CatchingUp++
			}
		}
		if len(rv.Behind) > 0 {
			v.RowsCatchingUp++
		}
		v.Rows = append(v.Rows, rv)
	}
	live := func(s tract.ServerID) bool {
		n := nodes[s.Node]
		return n != nil && (n.State == dpb.NodeState_NODE_STATE_ALIVE || n.State == dpb.NodeState_NODE_STATE_SUSPECT)
	}
	complete := func(ri int, s tract.ServerID) bool { return tract.MemberComplete(t.Rows[ri], rowStatus[key{ri, s}]) }
	gone := func(s tract.ServerID) bool {
		n := nodes[s.Node]
		return n != nil && n.State == dpb.NodeState_NODE_STATE_DECOMMISSIONED
	}
	for _, w := range tract.RowsWaiting(tract.RepairInput{Table: t, Live: live, InSync: complete, Gone: gone}) {
		for _, s := range w.For {
			v.Rows[w.Row].WaitingFor = append(v.Rows[w.Row].WaitingFor, s.String())
		}
		v.RowsWaiting++
	}
	// What giving each node up would cost, by the manager's own rule: the
	// rows that would wait for it if it were dead are those whose only
	// complete copies it may hold.
	onlyOn := map[uint64][]int{}
	for s := range servers {
		if _, done := onlyOn[s.Node]; done {
			continue
		}
		rows := []int{}
		without := func(x tract.ServerID) bool { return x.Node != s.Node && live(x) }
		for _, w := range tract.RowsWaiting(tract.RepairInput{Table: t, Live: without, InSync: complete, Gone: gone}) {
			if slices.ContainsFunc(w.For, func(x tract.ServerID) bool { return x.Node == s.Node }) {
				rows = append(rows, w.Row)
			}
		}
		onlyOn[s.Node] = rows
	}
	for s, sv := range servers {
		sv.OnlyCopyRows = onlyOn[s.Node]
	}
	ids := make([]tract.ServerID, 0, len(servers))
	for s := range servers {
		ids = append(ids, s)
	}
	sort.Slice(ids, func(i, j int) bool {
		return ids[i].Node < ids[j].Node || ids[i].Node == ids[j].Node && ids[i].Disk < ids[j].Disk
	})
	v.Servers = []ServerView{}
	for _, s := range ids {
		v.Servers = append(v.Servers, *servers[s])
	}
	return v
}

// HumanBytes prints n bytes with a binary unit: "512 B", "1.5 MiB".
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// RowsOnlyOn lists the rows whose only complete copies may be on node's
// disks (ServerView.OnlyCopyRows): decommissioning it makes the TLT
// manager repair them from an incomplete copy, losing what only node
// held; a node whose rows all have complete copies elsewhere can go
// without loss.
func (v TLTView) RowsOnlyOn(node uint64) []int {
	prefix := strconv.FormatUint(node, 10) + "/"
	for _, sv := range v.Servers {
		if strings.HasPrefix(sv.Server, prefix) {
			return sv.OnlyCopyRows
		}
	}
	return nil
}
