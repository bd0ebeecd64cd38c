package meta

import (
	"math"
	"testing"

	"github.com/arbor-storage/arbor/internal/fs"
)

// TestPlacementAlone: a single member keeps everything.
func TestPlacementAlone(t *testing.T) {
	p := computePlacement(1, []memberLoad{{node: 1, inodes: 1e6, creates: 5000}}, defaultPlacement)
	for c, rp := range p.rp {
		if rp != 0 {
			t.Fatalf("RP[%d] = %v alone", c, rp)
		}
	}
}

// TestPlacementBalancedStaysLocal: members with even usage and load keep
// their directories (RP 0 below the root), and AT spreads evenly.
func TestPlacementBalancedStaysLocal(t *testing.T) {
	ms := []memberLoad{{node: 1, inodes: 1e5, creates: 100}, {node: 2, inodes: 1e5, creates: 100}, {node: 3, inodes: 1e5, creates: 100}}
	p := computePlacement(1, ms, defaultPlacement)
	if p.rp[catRoot] != 1 {
		t.Errorf("RP[root] = %v, want 1 (a new top-level directory always goes remote)", p.rp[catRoot])
	}
	for c := 1; c < categories; c++ {
		if p.rp[c] != 0 {
			t.Errorf("RP[%d] = %v with an even load, want 0", c, p.rp[c])
		}
	}
	if math.Abs(p.at[2]-0.5) > 1e-9 || math.Abs(p.at[3]-0.5) > 1e-9 {
		t.Errorf("AT = %v, want 0.5 each", p.at)
	}
}

// TestPlacementHotMemberSheds: a member taking most of a heavy ingest
// gets an RP near its excess share; the emptier member gets the larger
// AT.
func TestPlacementHotMemberSheds(t *testing.T) {
	ms := []memberLoad{
		{node: 1, inodes: 5e6, creates: 2700},
		{node: 2, inodes: 1e6, creates: 150},
		{node: 3, inodes: 3e6, creates: 150},
	}
	p := computePlacement(1, ms, defaultPlacement)
	if p.rp[1] < 0.5 {
		t.Errorf("RP = %v for a member with 90%% of the creates", p.rp[1])
	}
	if p.at[2] <= p.at[3] {
		t.Errorf("AT %v: the emptier member 2 should get more", p.at)
	}
	// The cold members keep their directories.
	q := computePlacement(2, ms, defaultPlacement)
	if q.rp[1] != 0 {
		t.Errorf("RP of a cold member = %v", q.rp[1])
	}
}

// TestPlacementUrgency: a member near full is avoided (1% of its target)
// and sheds its own directories.
func TestPlacementUrgency(t *testing.T) {
	ms := []memberLoad{
		{node: 1, inodes: 99e6, creates: 10},
		{node: 2, inodes: 1e6, creates: 10},
		{node: 3, inodes: 1e6, creates: 10},
	}
	p := computePlacement(2, ms, defaultPlacement)
	if p.at[1] > 0.02 {
		t.Errorf("AT[full member] = %v", p.at[1])
	}
	if q := computePlacement(1, ms, defaultPlacement); q.rp[2] < 0.9 || q.urgency < 0.9 {
		t.Errorf("a full member's RP %v, urgency %v", q.rp[2], q.urgency)
	}
}

// TestRoundRobinFollowsTargets: picks converge to the AT shares.
func TestRoundRobinFollowsTargets(t *testing.T) {
	var r roundRobin
	at := map[uint64]float64{2: 0.75, 3: 0.25}
	n := map[uint64]int{}
	for range 1000 {
		n[r.pick(at)]++
	}
	if n[2] != 750 || n[3] != 250 {
		t.Fatalf("picks %v, want 750 and 250", n)
	}
}

// TestPlacementTableCap: once the members serve maxTablesPerMember tables
// each on average, new directories stay with their parent whatever RP
// says.
func TestPlacementTableCap(t *testing.T) {
	s := &Server{cfg: Config{Node: 1}}
	s.place.tables = placementTables{self: 1, rp: [categories]float64{1, 1, 1, 1}, at: map[uint64]float64{2: 1}}
	s.place.members = []memberLoad{{node: 1, tables: maxTablesPerMember + 1}, {node: 2, tables: maxTablesPerMember - 1}}
	if to, ok := s.placeRemote(nil, fs.RootHandle); ok {
		t.Fatalf("a directory went to member %d with %d tables served", to, 2*maxTablesPerMember)
	}
}

// TestPlacementLightIngestStaysLocal: one client untarring alone makes
// its server take every create, but at a few hundred creates per second
// the tree stays with its parents (a remote directory costs a table and a
// move between servers).
func TestPlacementLightIngestStaysLocal(t *testing.T) {
	ms := []memberLoad{
		{node: 1, inodes: 5e4, creates: 60},
		{node: 2, inodes: 1e3},
		{node: 3, inodes: 1e3},
		{node: 4, inodes: 1e3},
		{node: 5, inodes: 1e3},
	}
	if p := computePlacement(1, ms, defaultPlacement); p.rp[1] > 0.05 || p.rp[catRoot] != 1 {
		t.Errorf("RP %v for a light ingest: want near 0 below the root", p.rp)
	}
}
