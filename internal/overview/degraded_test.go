package overview

import (
	"slices"
	"strings"
	"testing"

	"github.com/arbor-storage/arbor/internal/meta"
)

// sick is a cluster of five nodes, one dead and one suspect, with a TLT
// row on the dead node's disk being caught up, an extent that lost a
// replica and one with no leader, and two tables: one ownerless, one
// owned by the dead node.
func sick() Overview {
	return Overview{
		Directory: Directory{Leader: 1, Voters: []uint64{1, 2, 3}, AnsweredBy: 1},
		Nodes: []Node{
			{ID: 1, Address: "a:1", State: StateAlive},
			{ID: 2, Address: "a:2", State: StateAlive},
			{ID: 3, Address: "a:3", State: StateAlive},
			{ID: 4, Address: "a:4", State: StateSuspect},
			{ID: 5, Address: "a:5", State: StateDead, StateChangedUnixMs: 1_790_000_000_000},
		},
		TLT: TLTSection{TLTView: TLTView{
			Servers: []ServerView{{Server: "1/0", State: StateAlive}, {Server: "2/0", State: StateAlive},
				{Server: "3/0", State: StateAlive}, {Server: "5/0", State: StateDead, Error: "connection refused"}},
			// Row 1 lost a replica with node 5; row 2's replacement on 3/0
			// is copying.
			Rows: []RowView{
				{Row: 0, Slots: []string{"1/0", "2/0"}},
				{Row: 1, Slots: []string{"2/0", "5/0"}, Behind: []string{"5/0 (no status)"}},
				{Row: 2, Slots: []string{"1/0", "3/0"}, Behind: []string{"3/0 (2 tracts, 8.0 MiB copied)"}},
			},
			RowsCatchingUp: 2, RecoveredBytes: 3 << 20,
		}},
		Extents: ExtentSection{Extents: []ExtentView{
			{ID: 1000, Replicas: []uint64{1, 2, 3}, Replication: 3, Leader: 1},
			{ID: 1001, Replicas: []uint64{2, 3, 5}, Replication: 3, Leader: 2},
			{ID: 1002, Replicas: []uint64{1, 2, 4}, Replication: 3},
		}},
		Tables: TableSection{TableList: TableList{Tables: []meta.TableInfo{
			{Table: 1, FileSystem: 1, Lo: "0x0", Hi: "0x100", Owner: 2},
			{Table: 2, FileSystem: 1, Lo: "0x100", Hi: "0x200"},
			{Table: 3, FileSystem: 1, Lo: "0x200", Hi: "end", Owner: 5},
		}}},
	}
}

func kinds(ps []Problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Kind+" "+p.Subject)
	}
	return out
}

func TestDegradedFindsEveryProblem(t *testing.T) {
	got := kinds(ComputeDegraded(sick()))
	want := []string{
		"node_suspect node 4",
		"node_dead node 5",
		"tracts_under_replicated tlt",
		"recovery_in_progress tlt",
		"extent_under_replicated extent 1001",
		"extent_no_leader extent 1002",
		"table_without_owner table 2",
		"table_without_owner table 3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ps := ComputeDegraded(sick())
	if m := ps[1].Message; !strings.Contains(m, "dead since 2026-") || !strings.Contains(m, "a:5") {
		t.Errorf("dead node message %q lacks the time or address", m)
	}
	if m := ps[2].Message; !strings.HasPrefix(m, "1 of 3 rows") || !strings.Contains(m, "5/0") {
		t.Errorf("tract message %q", m)
	}
	if m := ps[3].Message; !strings.HasPrefix(m, "1 of 3 rows catching up, 3.0 MiB copied") {
		t.Errorf("recovery message %q", m)
	}
	if m := ps[4].Message; !strings.HasPrefix(m, "2 of 3 replicas live") {
		t.Errorf("extent message %q", m)
	}
}

func TestDegradedHealthyIsEmpty(t *testing.T) {
	o := sick()
	for i := range o.Nodes {
		o.Nodes[i].State = StateAlive
	}
	o.TLT.Servers[3].State = StateAlive
	o.TLT.Rows[1].Behind, o.TLT.Rows[2].Behind = nil, nil
	o.TLT.RowsCatchingUp = 0
	o.Extents.Extents[2].Leader = 4
	o.Tables.Tables = o.Tables.Tables[:1]
	if got := ComputeDegraded(o); got == nil || len(got) != 0 {
		t.Fatalf("healthy cluster: %v (want an empty, non-nil list)", got)
	}
	// A decommissioned node is not a problem, but its replicas do not count.
	o.Nodes[2].State = StateDecommissioned
	if got := kinds(ComputeDegraded(o)); !slices.Equal(got, []string{"extent_under_replicated extent 1000", "extent_under_replicated extent 1001"}) {
		t.Fatalf("decommissioned node 3: %v", got)
	}
}

func TestDegradedUnreadableSectionsAndNoLeader(t *testing.T) {
	o := Overview{
		Directory: Directory{Voters: []uint64{1, 2, 3}, AnsweredBy: 2, Stale: true},
		TLT:       TLTSection{Error: "read the TLT: context deadline exceeded"},
		Extents:   ExtentSection{Error: "list extents: unavailable"},
	}
	ps := ComputeDegraded(o)
	if got := kinds(ps); !slices.Equal(got, []string{"unavailable tlt", "unavailable extents", "no_directory_leader directory"}) {
		t.Fatalf("problems: %v", got)
	}
	if !strings.Contains(ps[0].Message, "context deadline exceeded") || !strings.Contains(ps[2].Message, "node 2") {
		t.Fatalf("messages: %+v", ps)
	}
	// With the directory unreadable, there is no leader to miss: only the
	// directory's error is reported.
	o = Overview{Directory: Directory{Error: "directory status: connection refused"}}
	if got := kinds(ComputeDegraded(o)); !slices.Equal(got, []string{"unavailable directory"}) {
		t.Fatalf("problems: %v", got)
	}
}

func TestRecovery(t *testing.T) {
	r := ComputeRecovery(sick())
	want := Recovery{InProgress: true, Rows: 3, RowsCatchingUp: 2, RowsRecovering: 1, RecoveredBytes: 3 << 20, ExtentsUnderReplicated: 1}
	if r != want {
		t.Fatalf("recovery = %+v, want %+v", r, want)
	}
	// A row behind only on a dead server is short of a replica, not
	// recovering: nothing copies until the server is replaced.
	o := sick()
	o.TLT.Rows = o.TLT.Rows[:2]
	if r := ComputeRecovery(o); r.InProgress || r.RowsRecovering != 0 {
		t.Fatalf("recovery with only a dead member behind = %+v", r)
	}
}
