package meta

import (
	"math"
	"slices"
)

// Placement of new directories (FlexGroup §3.5, DESIGN.md §2.6). Every
// metadata server (a member) refreshes once a second what every other one
// reports of its tables (inodes, cached pages, recent creates) and
// computes, from these alone, two tables:
//
//   - RP[c], the remote preference of allocation category c (the depth of
//     the new directory's parent): the probability that a new directory
//     goes to another member;
//   - AT[m], the allocation target of each other member m: the share of
//     remote allocations it should get.
//
// A new directory stays with its parent unless a random draw falls under
// RP[c]; then it goes to the member furthest behind its AT share (a
// weighted round robin), as a new table of its own (moves.go,
// remoteDirectory). Files always stay with their directory.
//
// Urgency (0..1) grows as a member's usage or ingest load nears its high
// threshold; Tolerance (how much disparity is acceptable) shrinks as the
// members fill up. A member's excess share of the ingest counts in
// proportion to its creates per second (in full from loadLow): a light
// ingest, however lopsided, stays local. The computation is deterministic and has no clock: it
// is tested step by step (placement_test.go).

// memberLoad is what the refresh gathers about one metadata server.
type memberLoad struct {
	node uint64
	// inodes and bytes of its tables (what it caches: a lower bound),
	// creates per second recently.
	inodes, bytes, creates float64
	// ops per second recently (all operations; placement uses creates).
	ops float64
	// tables it serves (of every file system).
	tables int
}

// placementConfig holds the heuristics' constants.
type placementConfig struct {
	// A member's usage is the larger of inodes/inodeCapacity and
	// bytes/byteCapacity.
	inodeCapacity, byteCapacity float64
	// Urgency rises from 0 to 1 as usage goes from usageLow to usageHigh,
	// or as the creates per second go from loadLow to loadHigh.
	usageLow, usageHigh, loadLow, loadHigh float64
	// maxTolerance is the Tolerance of an empty cluster (a share of all
	// allocations a member may exceed its target by before RP rises).
	maxTolerance float64
}

var defaultPlacement = placementConfig{
	inodeCapacity: 100e6, byteCapacity: 64 << 30,
	usageLow: 0.7, usageHigh: 0.95,
	loadLow: 2000, loadHigh: 10000,
	maxTolerance: 0.2,
}

// Allocation categories: the depth of the new directory's parent.
const (
	catRoot    = 0 // a new directory in the root: always remote (FlexGroup)
	categories = 4 // 0, 1, 2, deeper
)

// placementTables are the heuristics' output for one member.
type placementTables struct {
	self               uint64
	rp                 [categories]float64
	at                 map[uint64]float64
	urgency, tolerance float64
}

func clamp01(x float64) float64 { return math.Max(0, math.Min(1, x)) }

// computePlacement computes self's tables from every member's load.
func computePlacement(self uint64, members []memberLoad, cfg placementConfig) placementTables {
	t := placementTables{self: self, at: map[uint64]float64{}}
	if len(members) < 2 {
		return t // alone: everything is local
	}
	usage := map[uint64]float64{}
	urgency := map[uint64]float64{}
	maxUsage, totalCreates := 0.0, 0.0
	for _, m := range members {
		u := math.Max(m.inodes/cfg.inodeCapacity, m.bytes/cfg.byteCapacity)
		usage[m.node] = u
		maxUsage = math.Max(maxUsage, u)
		urgency[m.node] = math.Max(clamp01((u-cfg.usageLow)/(cfg.usageHigh-cfg.usageLow)),
			clamp01((m.creates-cfg.loadLow)/(cfg.loadHigh-cfg.loadLow)))
		t.urgency = math.Max(t.urgency, urgency[m.node])
		totalCreates += m.creates
	}
	t.tolerance = cfg.maxTolerance * clamp01(1-maxUsage)
	// Targets: how far each member is from a usage goal between the fullest
	// member and full, so that if every allocation went remote they would
	// all reach the goal together; urgent members get a much lower target.
	goal := maxUsage + (1-maxUsage)/2
	target := map[uint64]float64{}
	var sum, sumRemote float64
	for _, m := range members {
		x := math.Max(goal-usage[m.node], 1e-6) * (1 - 0.99*urgency[m.node])
		target[m.node] = x
		sum += x
		if m.node != self {
			sumRemote += x
		}
	}
	for _, m := range members {
		if m.node != self {
			t.at[m.node] = target[m.node] / sumRemote
		}
	}
	// Remote preference: the share of recent allocations self took beyond
	// its target share, eased within the tolerance, raised by its urgency.
	rp := 0.0
	if totalCreates > 0 {
		var mine float64
		for _, m := range members {
			if m.node == self {
				mine = m.creates
			}
		}
		share, want := mine/totalCreates, target[self]/sum
		if excess := share - want; excess > 0 {
			rp = excess / share
			if excess < t.tolerance {
				rp *= excess / t.tolerance
			}
			// An imbalance of a light ingest is no reason to scatter a
			// tree (one untar would place most of its directories
			// remotely, and every move between servers costs a table and
			// a barrier): the share counts in proportion to the load, in
			// full from loadLow creates per second.
			rp *= clamp01(mine / cfg.loadLow)
		}
	}
	rp = math.Max(rp, urgency[self])
	for c := range t.rp {
		t.rp[c] = rp
	}
	t.rp[catRoot] = 1
	return t
}

// category is the allocation category of a new directory whose parent is
// at depth (the layout level of its id: 0 for the root).
func category(depth int) int { return min(depth, categories-1) }

// roundRobin picks remote members by their AT shares: each pick goes to the
// member furthest behind its target share of the picks so far.
type roundRobin struct {
	issued map[uint64]float64
	total  float64
}

func (r *roundRobin) pick(at map[uint64]float64) uint64 {
	if r.issued == nil {
		r.issued = map[uint64]float64{}
	}
	nodes := make([]uint64, 0, len(at))
	for n := range at {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	best, bestLag := uint64(0), math.Inf(-1)
	for _, n := range nodes {
		lag := at[n]*(r.total+1) - r.issued[n]
		if lag > bestLag {
			best, bestLag = n, lag
		}
	}
	if best != 0 {
		r.issued[best]++
		r.total++
	}
	return best
}
