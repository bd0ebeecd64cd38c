package tract

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// servers returns n single-disk servers, each in its own failure domain
// unless perDomain > 1 (then perDomain consecutive servers share one).
func testServers(n, perDomain int) []ServerInfo {
	out := make([]ServerInfo, n)
	for i := range out {
		out[i] = ServerInfo{ID: ServerID{Node: uint64(i + 1)}, Domain: fmt.Sprintf("d%d", i/max(perDomain, 1)), Weight: 1}
	}
	return out
}

func tableOf(rows []Row, k int) *Table {
	t := &Table{Version: 1, TractSize: DefaultTractSizeBytes, Replication: k, Rows: rows}
	for i := range t.Rows {
		t.Rows[i].Version = 1
	}
	return t
}

// checkTable asserts the layout invariants: k distinct members per row, no
// two in one failure domain (unless allowed), every pending entry names a
// slot and a server not in the row.
func checkTable(t *testing.T, tab *Table, servers []ServerInfo, sharedOK bool) {
	t.Helper()
	domain := map[ServerID]string{}
	for _, s := range servers {
		domain[s.ID] = s.Domain
	}
	for ri, r := range tab.Rows {
		if len(r.Slots) != tab.Replication {
			t.Fatalf("row %d has %d slots, want %d", ri, len(r.Slots), tab.Replication)
		}
		seen := map[ServerID]bool{}
		doms := map[string]bool{}
		members := append(append([]ServerID(nil), r.Slots...), pendingServers(r)...)
		for _, s := range members {
			if seen[s] {
				t.Fatalf("row %d (%s): %s appears twice", ri, r, s)
			}
			seen[s] = true
			if doms[domain[s]] && !sharedOK {
				t.Fatalf("row %d (%s): two members in domain %s", ri, r, domain[s])
			}
			doms[domain[s]] = true
		}
		for _, p := range r.Pending {
			if p.Slot < 0 || p.Slot >= tab.Replication {
				t.Fatalf("row %d: pending entry for slot %d", ri, p.Slot)
			}
		}
	}
}

func TestLocate(t *testing.T) {
	g := GUID{1, 2, 3}
	const rows = 37
	base := Locate(g, 0, rows)
	for i := int64(0); i < 3*rows; i++ {
		if got, want := Locate(g, i, rows), (base+int(i))%rows; got != want {
			t.Fatalf("Locate(tract %d) = %d, want %d (consecutive tracts walk consecutive rows)", i, got, want)
		}
	}
	if got, want := Locate(g, MetadataTract, rows), (base+rows-1)%rows; got != want {
		t.Fatalf("metadata tract in row %d, want %d (the row before tract 0)", got, want)
	}
	// Different blobs start at (pseudo-random) different rows.
	starts := map[int]bool{}
	for i := range 200 {
		starts[Locate(GUID{byte(i), byte(i >> 8)}, 0, rows)] = true
	}
	if len(starts) < rows*3/4 {
		t.Fatalf("200 blobs start in only %d of %d rows", len(starts), rows)
	}
}

func TestParseGUID(t *testing.T) {
	g := NewGUID()
	back, err := ParseGUID(g.String())
	if err != nil || back != g {
		t.Fatalf("round trip of %s: %s, %v", g, back, err)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("g", 32), strings.Repeat("0", 31), strings.Repeat("0", 34)} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("ParseGUID(%q) succeeded", bad)
		}
	}
}

func TestBuildTableInvariants(t *testing.T) {
	for _, tc := range []struct {
		n, perDomain, k, minRows int
	}{
		{3, 1, 3, 0}, {5, 1, 3, 0}, {5, 1, 2, 0}, {6, 1, 3, 0}, {8, 2, 3, 0}, {12, 3, 3, 0},
		{20, 1, 3, 0}, {20, 1, 4, 0}, {7, 1, 1, 0}, {5, 1, 3, 100}, {30, 2, 5, 0},
	} {
		t.Run(fmt.Sprintf("n=%d/perdomain=%d/k=%d/minrows=%d", tc.n, tc.perDomain, tc.k, tc.minRows), func(t *testing.T) {
			servers := testServers(tc.n, tc.perDomain)
			opts := LayoutOptions{Seed: 42, MinRows: tc.minRows}
			rows, err := BuildTable(servers, tc.k, opts)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := BuildTable(servers, tc.k, opts)
			if fmt.Sprint(rows) != fmt.Sprint(again) {
				t.Fatal("BuildTable is not deterministic for a seed")
			}
			tab := tableOf(rows, tc.k)
			checkTable(t, tab, servers, false)
			if len(rows) < tc.minRows {
				t.Fatalf("%d rows, want at least %d", len(rows), tc.minRows)
			}
			b := TableBalance(tab, servers)
			if tc.k >= 2 && b.MissingPairs != 0 {
				t.Fatalf("%d pairs of servers in distinct domains share no row", b.MissingPairs)
			}
			// Each server's share of the slots is as even as whole rows allow:
			// within one appearance of the mean.
			counts := tab.Appearances()
			mean := float64(len(rows)*tc.k) / float64(tc.n)
			for _, s := range servers {
				if c := float64(counts[s.ID]); c > mean+1 || c < mean-1 {
					t.Fatalf("%s appears %v times, mean %.2f: %v", s.ID, c, mean, counts)
				}
			}
			if tc.k >= 2 && b.PrimaryMaxOverMean > 1.5 {
				t.Fatalf("primaries unbalanced: max/mean %.2f", b.PrimaryMaxOverMean)
			}
		})
	}
}

func TestBuildTableErrors(t *testing.T) {
	if _, err := BuildTable(testServers(2, 1), 3, LayoutOptions{}); err == nil {
		t.Fatal("2 servers built a 3-way table")
	}
	if _, err := BuildTable(testServers(6, 3), 3, LayoutOptions{}); err == nil {
		t.Fatal("2 failure domains built a 3-way table without AllowSharedDomains")
	}
	rows, err := BuildTable(testServers(6, 3), 3, LayoutOptions{AllowSharedDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	checkTable(t, tableOf(rows, 3), testServers(6, 3), true)
	dup := append(testServers(3, 1), testServers(1, 1)...)
	if _, err := BuildTable(dup, 2, LayoutOptions{}); err == nil {
		t.Fatal("a server listed twice was accepted")
	}
	if _, err := BuildTable(testServers(3, 1), 0, LayoutOptions{}); err == nil {
		t.Fatal("replication 0 was accepted")
	}
}

func TestBuildTableWeights(t *testing.T) {
	servers := testServers(10, 1)
	servers[0].Weight, servers[1].Weight = 3, 3 // two big disks
	rows, err := BuildTable(servers, 4, LayoutOptions{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	counts := tableOf(rows, 4).Appearances()
	small := counts[servers[5].ID]
	if counts[servers[0].ID] <= small || counts[servers[1].ID] <= small {
		t.Fatalf("weighted servers do not appear more: %v", counts)
	}
}

// simulateBlobs places blobs of random sizes (in tracts) and counts the
// tracts each server stores, replicas included.
func simulateBlobs(tab *Table, totalTracts int, seed uint64, minTracts, maxTracts int) map[ServerID]int {
	rng := rand.New(rand.NewPCG(seed, 1))
	perServer := map[ServerID]int{}
	for placed := 0; placed < totalTracts; {
		n := min(minTracts+rng.IntN(maxTracts-minTracts+1), totalTracts-placed)
		var g GUID
		for i := range g {
			g[i] = byte(rng.Uint32())
		}
		for i := range n {
			r := tab.Rows[tab.Locate(g, int64(i))]
			for _, s := range r.Slots {
				perServer[s]++
			}
		}
		placed += n
	}
	return perServer
}

func maxOverMeanCounts(c map[ServerID]int, servers []ServerInfo) float64 {
	top, total := 0, 0
	for _, s := range servers {
		top = max(top, c[s.ID])
		total += c[s.ID]
	}
	return float64(top) / (float64(total) / float64(len(servers)))
}

// TestTractBalance is the layout half of the must-show "tracts per
// tractserver max/mean at most 1.05 over a few GiB of blobs": blobs of 4
// MiB tracts, 3 replicas, on tables built as the manager builds them. On
// five and six servers, 3 GiB of blobs of 64 MiB to 1 GiB. Larger
// clusters have larger tables, and a blob spreads evenly only over the
// rows it covers (FDS §2.2), so they are checked with more data in larger
// blobs, as a larger cluster would hold.
func TestTractBalance(t *testing.T) {
	for _, tc := range []struct{ n, gib, minTracts, maxTracts int }{
		{5, 3, 16, 256}, {6, 3, 16, 256}, {12, 12, 64, 512}, {24, 32, 256, 1024},
	} {
		servers := testServers(tc.n, 1)
		rows, err := BuildTable(servers, 3, LayoutOptions{Seed: uint64(tc.n), MinRows: DefaultMinRows})
		if err != nil {
			t.Fatal(err)
		}
		tab := tableOf(rows, 3)
		tracts := tc.gib << 30 / DefaultTractSizeBytes
		worst := 0.0
		for seed := range uint64(5) {
			worst = max(worst, maxOverMeanCounts(simulateBlobs(tab, tracts, seed, tc.minTracts, tc.maxTracts), servers))
		}
		t.Logf("%d servers, %d rows, %d GiB in blobs of %d-%d tracts: worst tracts max/mean %.4f", tc.n, len(rows), tc.gib, tc.minTracts, tc.maxTracts, worst)
		if worst > 1.05 {
			t.Errorf("%d servers: tracts per server max/mean %.4f > 1.05", tc.n, worst)
		}
	}
}

// aliveExcept returns a Live function and the eligible servers with dead
// ones removed.
func aliveExcept(servers []ServerInfo, dead ...ServerID) (func(ServerID) bool, []ServerInfo) {
	var eligible []ServerInfo
	for _, s := range servers {
		if !slices.Contains(dead, s.ID) {
			eligible = append(eligible, s)
		}
	}
	return func(s ServerID) bool { return !slices.Contains(dead, s) }, eligible
}

func TestPlanRepair(t *testing.T) {
	servers := testServers(8, 1)
	rows, err := BuildTable(servers, 3, LayoutOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	tab := tableOf(rows, 3)
	dead := ServerID{Node: 4}
	live, eligible := aliveExcept(servers, dead)
	changes := PlanRepair(RepairInput{Table: tab, Live: live, Eligible: eligible}, LayoutOptions{Seed: 1})
	affected := 0
	for _, r := range tab.Rows {
		if r.Has(dead) {
			affected++
		}
	}
	if len(changes) != affected {
		t.Fatalf("%d changes for %d rows with the dead server", len(changes), affected)
	}
	for _, c := range changes {
		old := tab.Rows[c.Row]
		if c.ExpectedVersion != old.Version {
			t.Fatalf("row %d: expected version %d, want %d", c.Row, c.ExpectedVersion, old.Version)
		}
		if slices.Contains(c.Slots, dead) {
			t.Fatalf("row %d still has the dead server: %v", c.Row, c.Slots)
		}
		// Survivors keep their data: every survivor is still in the row, and
		// if the primary died, a survivor (not a newcomer) became primary.
		for _, s := range old.Slots {
			if s != dead && !slices.Contains(c.Slots, s) {
				t.Fatalf("row %d lost survivor %s: %v -> %v", c.Row, s, old.Slots, c.Slots)
			}
		}
		if old.Slots[0] == dead && !slices.Contains(old.Slots, c.Slots[0]) {
			t.Fatalf("row %d: a newcomer %s became primary of a row with survivors", c.Row, c.Slots[0])
		}
		if old.Slots[0] != dead && c.Slots[0] != old.Slots[0] {
			t.Fatalf("row %d: the primary changed though it survived", c.Row)
		}
	}
	repaired := ApplyChanges(tab, changes, 2)
	checkTable(t, repaired, servers, false)
	// The replacements are spread: no survivor takes more than two of the
	// dead server's places.
	took := map[ServerID]int{}
	for _, c := range changes {
		for _, s := range c.Slots {
			if !slices.Contains(tab.Rows[c.Row].Slots, s) {
				took[s]++
			}
		}
	}
	for s, n := range took {
		if n > 2 {
			t.Fatalf("%s took %d of the dead server's %d places: %v", s, n, affected, took)
		}
	}
	// Nothing to do once repaired.
	if again := PlanRepair(RepairInput{Table: repaired, Live: live, Eligible: eligible}, LayoutOptions{Seed: 1}); len(again) != 0 {
		t.Fatalf("repair of a repaired table: %v", again)
	}
	// A second failure during recovery takes the same path.
	dead2 := ServerID{Node: 7}
	live2, eligible2 := aliveExcept(servers, dead, dead2)
	changes2 := PlanRepair(RepairInput{Table: repaired, Live: live2, Eligible: eligible2}, LayoutOptions{Seed: 2})
	final := ApplyChanges(repaired, changes2, 3)
	checkTable(t, final, servers, false)
	for ri, r := range final.Rows {
		if r.Has(dead) || r.Has(dead2) {
			t.Fatalf("row %d still has a dead server: %s", ri, r)
		}
	}
}

func TestPlanRepairPromotesInSync(t *testing.T) {
	a, b, c, x, n := ServerID{Node: 1}, ServerID{Node: 2}, ServerID{Node: 3}, ServerID{Node: 9}, ServerID{Node: 5}
	tab := &Table{Version: 5, Replication: 3, Rows: []Row{{Version: 5, Slots: []ServerID{x, b, c}}}}
	servers := []ServerInfo{{ID: a, Domain: "a"}, {ID: b, Domain: "b"}, {ID: c, Domain: "c"}, {ID: n, Domain: "n"}}
	live := func(s ServerID) bool { return s != x }
	// b (slot 1) is still catching up, c (slot 2) is in sync: c leads.
	inSync := func(_ int, s ServerID) bool { return s == c }
	changes := PlanRepair(RepairInput{Table: tab, Live: live, Eligible: servers, InSync: inSync}, LayoutOptions{})
	if len(changes) != 1 || changes[0].Slots[0] != c || changes[0].Slots[1] != b {
		t.Fatalf("changes %+v: want c promoted to primary and b kept in slot 1", changes)
	}
	// A pending entry of the dead slot takes it over.
	tab.Rows[0] = Row{Version: 5, Slots: []ServerID{b, x, c}, Pending: []Pending{{Slot: 1, Server: n}}}
	changes = PlanRepair(RepairInput{Table: tab, Live: live, Eligible: servers}, LayoutOptions{})
	if len(changes) != 1 || changes[0].Slots[1] != n || len(changes[0].Pending) != 0 {
		t.Fatalf("changes %+v: want the pending entry to take slot 1", changes)
	}
	// A dead pending entry is expunged (FDS §3.4).
	tab.Rows[0] = Row{Version: 5, Slots: []ServerID{a, b, c}, Pending: []Pending{{Slot: 2, Server: x}}}
	changes = PlanRepair(RepairInput{Table: tab, Live: live, Eligible: servers}, LayoutOptions{})
	if len(changes) != 1 || len(changes[0].Pending) != 0 || !slices.Equal(changes[0].Slots, []ServerID{a, b, c}) {
		t.Fatalf("changes %+v: want the pending entry expunged and nothing else", changes)
	}
}

func TestPlanGrowthMovesAShare(t *testing.T) {
	servers := testServers(5, 1)
	rows, err := BuildTable(servers, 3, LayoutOptions{Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	tab := tableOf(rows, 3)
	newcomer := ServerInfo{ID: ServerID{Node: 6}, Domain: "new", Weight: 1}
	all := append(append([]ServerInfo(nil), servers...), newcomer)
	changes := PlanGrowth(GrowthInput{Table: tab, Servers: all, Newcomers: []ServerID{newcomer.ID}}, LayoutOptions{Seed: 1})
	slots := len(tab.Rows) * 3
	if want := slots / 6; len(changes) != want {
		t.Fatalf("the newcomer got %d pending entries, want %d (a sixth of %d slots)", len(changes), want, slots)
	}
	pendingTable := ApplyChanges(tab, changes, 2)
	checkTable(t, pendingTable, all, false)
	committed := ApplyChanges(pendingTable, PlanCommit(pendingTable, func(int, ServerID) bool { return true }), 3)
	checkTable(t, committed, all, false)
	counts := committed.Appearances()
	for _, s := range all {
		if counts[s.ID] != slots/6 {
			t.Fatalf("after growth %s has %d slots, want %d: %v", s.ID, counts[s.ID], slots/6, counts)
		}
	}
	b := TableBalance(committed, all)
	if b.PrimaryMaxOverMean > 1.5 {
		t.Fatalf("primaries after growth: max/mean %.2f", b.PrimaryMaxOverMean)
	}
	// A commit waits for the newcomer to be in sync.
	if c := PlanCommit(pendingTable, func(int, ServerID) bool { return false }); len(c) != 0 {
		t.Fatalf("committed entries that are not in sync: %v", c)
	}
}

func TestPlanGrowthPrefersRowsWithData(t *testing.T) {
	servers := testServers(6, 1)
	rows, err := BuildTable(servers, 3, LayoutOptions{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	tab := tableOf(rows, 3)
	back := ServerID{Node: 3}
	var had []int
	for ri, r := range tab.Rows {
		if r.Has(back) {
			had = append(had, ri)
		}
	}
	live, eligible := aliveExcept(servers, back)
	repaired := ApplyChanges(tab, PlanRepair(RepairInput{Table: tab, Live: live, Eligible: eligible}, LayoutOptions{Seed: 1}), 2)
	// Server 3 returns; it still holds its old rows' data.
	changes := PlanGrowth(GrowthInput{Table: repaired, Servers: servers, Newcomers: []ServerID{back},
		HasData: func(row int, s ServerID) bool { return s == back && slices.Contains(had, row) }}, LayoutOptions{Seed: 2})
	var got []int
	for _, c := range changes {
		got = append(got, c.Row)
	}
	sort.Ints(got)
	if !slices.Equal(got, had) {
		t.Fatalf("the returning server was given rows %v, it holds data of %v", got, had)
	}
}

// TestLayoutScenarios runs the scripts in testdata/layout: a table is
// built, servers die and join, and each step prints the changes and the
// table.
func TestLayoutScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/layout", func(t *testing.T, path string) {
		var servers []ServerInfo
		var tab *Table
		var dead []ServerID
		seed := uint64(0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			seed++
			switch d.Cmd {
			case "servers":
				servers = nil
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					servers = append(servers, parseServerLine(t, line))
				}
				return ""
			case "build":
				var k int
				d.ScanArgs(t, "k", &k)
				rows, err := BuildTable(servers, k, LayoutOptions{Seed: 1})
				if err != nil {
					return "error: " + err.Error()
				}
				tab = tableOf(rows, k)
				return showTable(tab, servers)
			case "kill":
				for _, f := range strings.Fields(d.Input) {
					dead = append(dead, parseServer(t, f))
				}
				live, eligible := aliveExcept(servers, dead...)
				// Every survivor is complete.
				changes := PlanRepair(RepairInput{Table: tab, Live: live, Eligible: eligible,
					InSync: func(int, ServerID) bool { return true }}, LayoutOptions{Seed: seed})
				tab = ApplyChanges(tab, changes, tab.Version+1)
				return showChanges(changes) + showTable(tab, eligible)
			case "add", "grow":
				if d.Cmd == "add" {
					for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
						servers = append(servers, parseServerLine(t, line))
					}
				}
				_, eligible := aliveExcept(servers, dead...)
				changes := PlanGrowth(GrowthInput{Table: tab, Servers: eligible, Newcomers: GrowthCandidates(tab, eligible)}, LayoutOptions{Seed: seed})
				tab = ApplyChanges(tab, changes, tab.Version+1)
				return showChanges(changes) + showTable(tab, eligible)
			case "commit":
				changes := PlanCommit(tab, func(int, ServerID) bool { return true })
				tab = ApplyChanges(tab, changes, tab.Version+1)
				_, eligible := aliveExcept(servers, dead...)
				return showChanges(changes) + showTable(tab, eligible)
			}
			return "unknown command " + d.Cmd
		})
	})
}

func parseServer(t *testing.T, s string) ServerID {
	node, disk, _ := strings.Cut(s, "/")
	n, err1 := strconv.ParseUint(node, 10, 64)
	dk, err2 := strconv.ParseUint(disk, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("bad server %q", s)
	}
	return ServerID{Node: n, Disk: uint32(dk)}
}

// parseServerLine parses "NODE/DISK DOMAIN [WEIGHT]".
func parseServerLine(t *testing.T, line string) ServerInfo {
	f := strings.Fields(line)
	s := ServerInfo{ID: parseServer(t, f[0]), Domain: f[1], Weight: 1}
	if len(f) > 2 {
		w, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			t.Fatalf("bad weight in %q", line)
		}
		s.Weight = w
	}
	return s
}

func showChanges(changes []RowChange) string {
	var b strings.Builder
	for _, c := range changes {
		fmt.Fprintf(&b, "change row %d: %s\n", c.Row, c.Why)
	}
	return b.String()
}

func showTable(tab *Table, servers []ServerInfo) string {
	var b strings.Builder
	for ri, r := range tab.Rows {
		fmt.Fprintf(&b, "row %d v%d: %s\n", ri, r.Version, r)
	}
	counts := tab.Appearances()
	prim := map[ServerID]int{}
	for _, r := range tab.Rows {
		prim[r.Slots[0]]++
	}
	var parts []string
	for _, s := range tab.Servers() {
		parts = append(parts, fmt.Sprintf("%s=%d/%d", s, counts[s], prim[s]))
	}
	bal := TableBalance(tab, servers)
	fmt.Fprintf(&b, "slots/primaries: %s\nmissing pairs: %d\n", strings.Join(parts, " "), bal.MissingPairs)
	return b.String()
}

// TestGrowthSettlesWhenOldHoldersKeepData runs the manager's growth and
// commit rounds after a server dies and returns, with every server that
// ever held a row still holding its data (as during the drop grace). The
// rounds must reach a table they no longer change: a move that gave a row
// to a server holding its data used to make the server it came from a
// candidate holding the same data, which took it back, for ever.
func TestGrowthSettlesWhenOldHoldersKeepData(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		servers := testServers(5, 1)
		rows, err := BuildTable(servers, 3, LayoutOptions{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		tab := tableOf(rows, 3)
		held := map[rowServer]bool{}
		remember := func(tab *Table) {
			for ri, r := range tab.Rows {
				for _, s := range append(append([]ServerID(nil), r.Slots...), pendingServers(r)...) {
					held[rowServer{ri, s}] = true
				}
			}
		}
		remember(tab)
		back := ServerID{Node: 3}
		live, eligible := aliveExcept(servers, back)
		version := uint64(2)
		tab = ApplyChanges(tab, PlanRepair(RepairInput{Table: tab, Live: live, Eligible: eligible}, LayoutOptions{Seed: seed}), version)
		remember(tab)
		everyone := func(int, ServerID) bool { return true }
		settled := false
		for round := 0; round < 200 && !settled; round++ {
			version++
			if changes := PlanCommit(tab, everyone); len(changes) > 0 {
				tab = ApplyChanges(tab, changes, version)
				continue
			}
			changes := PlanGrowth(GrowthInput{Table: tab, Servers: servers, Newcomers: GrowthCandidates(tab, servers),
				HasData: func(row int, s ServerID) bool { return held[rowServer{row, s}] }, InSync: everyone}, LayoutOptions{Seed: seed})
			if len(changes) == 0 {
				settled = true
				break
			}
			tab = ApplyChanges(tab, changes, version)
			remember(tab)
		}
		if !settled {
			t.Fatalf("seed %d: growth and commit still change the table after 200 rounds", seed)
		}
		checkTable(t, tab, servers, false)
	}
}

// TestPlanRepairWaitsForTheOnlyCompleteCopy: a row whose live members are
// all incomplete (new members still catching up) is not repaired while a
// dead member may hold its only complete copy, nor is a row with no live
// member; an incomplete member never becomes primary (issue 13).
func TestPlanRepairWaitsForTheOnlyCompleteCopy(t *testing.T) {
	a, b, c, d, e, n := ServerID{Node: 1}, ServerID{Node: 2}, ServerID{Node: 3}, ServerID{Node: 4}, ServerID{Node: 5}, ServerID{Node: 6}
	servers := []ServerInfo{{ID: a, Domain: "a"}, {ID: b, Domain: "b"}, {ID: c, Domain: "c"}, {ID: d, Domain: "d"}, {ID: e, Domain: "e"}, {ID: n, Domain: "n"}}
	deadSet := map[ServerID]bool{c: true, a: true, b: true}
	live := func(s ServerID) bool { return !deadSet[s] }
	var eligible []ServerInfo
	for _, s := range servers {
		if live(s.ID) {
			eligible = append(eligible, s)
		}
	}
	complete := map[ServerID]bool{}
	inSync := func(_ int, s ServerID) bool { return complete[s] }
	tab := &Table{Version: 6, Replication: 3, Rows: []Row{
		{Version: 6, Slots: []ServerID{c, d, e}},                                           // primary dead, survivors catching up
		{Version: 6, Slots: []ServerID{d, c, e}},                                           // replica dead, live primary incomplete
		{Version: 6, Slots: []ServerID{a, b, c}},                                           // every member dead
		{Version: 6, Slots: []ServerID{c, d, e}, Pending: []Pending{{Slot: 0, Server: n}}}, // pending heir incomplete
	}}
	in := RepairInput{Table: tab, Live: live, Eligible: eligible, InSync: inSync}
	if changes := PlanRepair(in, LayoutOptions{}); len(changes) != 0 {
		t.Fatalf("changes %+v: want every row to wait", changes)
	}
	w := RowsWaiting(in)
	if len(w) != 4 || !slices.Equal(w[0].For, []ServerID{c}) || !slices.Equal(w[2].For, []ServerID{a, b, c}) {
		t.Fatalf("waiting %v", w)
	}
	// Without InSync only the row with no live member waits.
	if w := RowsWaiting(RepairInput{Table: tab, Live: live, Eligible: eligible}); len(w) != 1 || w[0].Row != 2 {
		t.Fatalf("waiting without InSync: %v", w)
	}
	// Once e is complete: e is promoted in rows 0 and 3, and row 1
	// replaces its dead replica under d.
	complete[n], complete[e] = true, true
	changes := PlanRepair(in, LayoutOptions{})
	got := map[int]RowChange{}
	for _, ch := range changes {
		got[ch.Row] = ch
	}
	if len(changes) != 3 || got[0].Slots[0] != e || got[1].Slots[0] != d || got[3].Slots[0] != e {
		t.Fatalf("changes %+v: want e promoted in rows 0 and 3, row 1 repaired under d", changes)
	}
	if _, ok := got[2]; ok {
		t.Fatal("a row with no live member was repaired")
	}
	// Only the primary slot's pending entry is complete: it takes the slot.
	complete = map[ServerID]bool{n: true}
	tab.Rows = []Row{{Version: 6, Slots: []ServerID{c, d, e}, Pending: []Pending{{Slot: 0, Server: n}}}}
	if changes := PlanRepair(in, LayoutOptions{}); len(changes) != 1 || changes[0].Slots[0] != n || len(changes[0].Pending) != 0 {
		t.Fatalf("changes %+v: want the complete pending entry to take the primary slot", changes)
	}
	// A complete slot member but an incomplete one in a lower slot: the
	// complete one is promoted, never the first survivor.
	complete = map[ServerID]bool{e: true}
	tab.Rows = []Row{{Version: 6, Slots: []ServerID{c, d, e}}}
	changes = PlanRepair(in, LayoutOptions{})
	if len(changes) != 1 || changes[0].Slots[0] != e {
		t.Fatalf("changes %+v: want e promoted", changes)
	}
}

// TestPlanRepairGivesUpGoneMembers: a row whose only complete copies were
// on dead members waits for them, unless every one of them is gone for
// good (decommissioned, `arbor tlt forget-member`): then the live member
// holding the most tracts becomes its primary and the gone slots are
// refilled. A row that still has a dead member that may return waits for
// that one alone.
func TestPlanRepairGivesUpGoneMembers(t *testing.T) {
	a, b, c, d, e, n := ServerID{Node: 1}, ServerID{Node: 2}, ServerID{Node: 3}, ServerID{Node: 4}, ServerID{Node: 5}, ServerID{Node: 6}
	dead := map[ServerID]bool{a: true, b: true, c: true}
	gone := map[ServerID]bool{c: true}
	held := map[ServerID]uint64{d: 5, e: 9}
	eligible := []ServerInfo{{ID: d, Domain: "d"}, {ID: e, Domain: "e"}, {ID: n, Domain: "n"}}
	tab := &Table{Version: 6, Replication: 3, Rows: []Row{
		{Version: 6, Slots: []ServerID{c, d, e}}, // gone primary, e holds the most
		{Version: 6, Slots: []ServerID{d, c, e}}, // live primary holding less than e
		{Version: 6, Slots: []ServerID{a, b, c}}, // a and b may return
		{Version: 6, Slots: []ServerID{a, d, c}}, // a may return
		{Version: 6, Slots: []ServerID{e, c, d}}, // live primary holding the most stays
	}}
	in := RepairInput{Table: tab, Live: func(s ServerID) bool { return !dead[s] }, Eligible: eligible,
		InSync: func(int, ServerID) bool { return false },
		Gone:   func(s ServerID) bool { return gone[s] },
		Held:   func(_ int, s ServerID) uint64 { return held[s] }}
	w := RowsWaiting(in)
	if len(w) != 2 || w[0].Row != 2 || !slices.Equal(w[0].For, []ServerID{a, b}) || w[1].Row != 3 || !slices.Equal(w[1].For, []ServerID{a}) {
		t.Fatalf("waiting %v: want row 2 waiting for a and b, row 3 for a", w)
	}
	got := map[int]RowChange{}
	for _, ch := range PlanRepair(in, LayoutOptions{}) {
		got[ch.Row] = ch
	}
	want := map[int][]ServerID{0: {e, d, n}, 1: {e, n, d}, 4: {e, n, d}}
	if len(got) != len(want) {
		t.Fatalf("changes %+v: want rows 0, 1 and 4 repaired", got)
	}
	for r, slots := range want {
		if !slices.Equal(got[r].Slots, slots) {
			t.Fatalf("row %d: slots %v (%s), want %v", r, got[r].Slots, got[r].Why, slots)
		}
	}
	// Without Gone the same rows all wait.
	in.Gone = nil
	if changes := PlanRepair(in, LayoutOptions{}); len(changes) != 0 {
		t.Fatalf("changes %+v without gone members: want every row to wait", changes)
	}
}
