package tract

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// This file is the deterministic core of TLT management (FDS §3.2-§3.4):
// pure functions from a table and the servers' states to a new table or to
// row changes. The manager (manager.go) is the thin shell that feeds them
// the directory's state and proposes their output.

// ServerInfo describes a tractserver to the layout functions.
type ServerInfo struct {
	ID ServerID
	// Domain is the failure domain: no two members of a row share one
	// (FDS §3.3.1).
	Domain string
	// Weight is the server's share of the table (disk size or measured
	// speed); zero or negative counts as 1.
	Weight float64
}

func (s ServerInfo) weight() float64 {
	if s.Weight <= 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) {
		return 1
	}
	return s.Weight
}

// LayoutOptions tune the layout functions.
type LayoutOptions struct {
	// Seed makes every random choice reproducible.
	Seed uint64
	// MinRows repeats the all-pairs rows (each repetition in its own
	// random order) until the table has at least this many rows; more rows
	// spread one blob's tracts (and growth's moves) more finely. 0: once.
	MinRows int
	// AllowSharedDomains lets two members of a row share a failure domain
	// when there are not enough domains (a single-host development
	// cluster). Without it such a layout is an error.
	AllowSharedDomains bool
}

// errNoLayout says the servers cannot hold a table of the asked shape.
var errNoLayout = errors.New("not enough tractservers in distinct failure domains")

// RowChange is a new content for one row, conditioned on its version (the
// directory's UpdateTLTRows).
type RowChange struct {
	Row             int
	ExpectedVersion uint64
	Slots           []ServerID
	Pending         []Pending
	// Why says what the change does, for logs and tests.
	Why string
}

func (c RowChange) row() Row { return Row{Slots: c.Slots, Pending: c.Pending} }

// planner holds the running counts the greedy choices balance.
type planner struct {
	rng     *rand.Rand
	servers map[ServerID]ServerInfo
	// count of appearances (slots and pending) per server.
	count map[ServerID]int
	// target appearances per server (total slots shared by weight).
	target map[ServerID]float64
	opts   LayoutOptions
}

func newPlanner(servers []ServerInfo, totalSlots int, opts LayoutOptions) *planner {
	p := &planner{
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		servers: map[ServerID]ServerInfo{},
		count:   map[ServerID]int{},
		target:  map[ServerID]float64{},
		opts:    opts,
	}
	total := 0.0
	for _, s := range servers {
		p.servers[s.ID] = s
		total += s.weight()
	}
	for _, s := range servers {
		p.target[s.ID] = float64(totalSlots) * s.weight() / total
	}
	return p
}

// deficit is how far below its fair share s is (negative: above).
func (p *planner) deficit(s ServerID) float64 { return p.target[s] - float64(p.count[s]) }

// pick returns, among candidates, the one with the largest deficit; ties
// are broken at random (reproducibly). ok is false if there is none.
func (p *planner) pick(cands []ServerID) (ServerID, bool) {
	if len(cands) == 0 {
		return ServerID{}, false
	}
	slices.SortFunc(cands, func(a, b ServerID) int {
		if a.less(b) {
			return -1
		}
		if b.less(a) {
			return 1
		}
		return 0
	})
	best := math.Inf(-1)
	var ties []ServerID
	for _, c := range cands {
		d := p.deficit(c)
		switch {
		case d > best+1e-9:
			best, ties = d, []ServerID{c}
		case math.Abs(d-best) <= 1e-9:
			ties = append(ties, c)
		}
	}
	return ties[p.rng.IntN(len(ties))], true
}

// domainsOf returns the failure domains of the given members.
func (p *planner) domainsOf(members []ServerID) map[string]bool {
	d := map[string]bool{}
	for _, m := range members {
		if s, ok := p.servers[m]; ok {
			d[s.Domain] = true
		}
	}
	return d
}

// candidates returns the servers of pool that are not members and, if
// distinct, whose domain no member uses.
func (p *planner) candidates(pool []ServerID, members []ServerID, distinct bool) []ServerID {
	used := p.domainsOf(members)
	var out []ServerID
	for _, s := range pool {
		if slices.Contains(members, s) {
			continue
		}
		if distinct && used[p.servers[s].Domain] {
			continue
		}
		out = append(out, s)
	}
	return out
}

// BuildTable builds a TLT for servers with k slots per row (FDS §3.3): one
// row for every pair of servers in different failure domains (repeated up
// to opts.MinRows rows), each completed with k-2 more servers chosen to
// bring every server to its weighted share, no two of a row in one domain.
// Within each row the order of members balances how often each server is
// primary (and holds each slot). With k = 1 the rows are filled by weight
// alone (FDS §2.2). The result depends only on the inputs and opts.Seed.
func BuildTable(servers []ServerInfo, k int, opts LayoutOptions) ([]Row, error) {
	if k < 1 || k > maxReplication {
		return nil, fmt.Errorf("replication %d: must be in [1, %d]", k, maxReplication)
	}
	ids := make([]ServerInfo, len(servers))
	copy(ids, servers)
	sort.Slice(ids, func(i, j int) bool { return ids[i].ID.less(ids[j].ID) })
	for i := 1; i < len(ids); i++ {
		if ids[i].ID == ids[i-1].ID {
			return nil, fmt.Errorf("tractserver %s listed twice", ids[i].ID)
		}
	}
	domains := map[string]bool{}
	for _, s := range ids {
		domains[s.Domain] = true
	}
	if len(ids) < k || (len(domains) < k && !opts.AllowSharedDomains) {
		return nil, fmt.Errorf("%w: %d tractservers in %d failure domains for %d replicas", errNoLayout, len(ids), len(domains), k)
	}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed+1))
	// The base: every pair in distinct domains (shared ones only if there
	// are too few domains and that is allowed).
	var pairs [][]ServerID
	if k >= 2 {
		for i := range ids {
			for j := i + 1; j < len(ids); j++ {
				if ids[i].Domain == ids[j].Domain && len(domains) >= 2 {
					continue
				}
				pairs = append(pairs, []ServerID{ids[i].ID, ids[j].ID})
			}
		}
	}
	var base [][]ServerID
	switch {
	case k == 1:
		n := max(len(ids), opts.MinRows)
		for range n {
			base = append(base, nil)
		}
	default:
		copies := 1
		if opts.MinRows > len(pairs) {
			copies = (opts.MinRows + len(pairs) - 1) / len(pairs)
			// Prefer a number of slots every server can share equally.
			for c := copies; c < copies+len(ids); c++ {
				if len(pairs)*c*k%len(ids) == 0 {
					copies = c
					break
				}
			}
		}
		for range copies {
			order := rng.Perm(len(pairs))
			for _, i := range order {
				base = append(base, append([]ServerID(nil), pairs[i]...))
			}
		}
	}
	if len(base) > maxTLTRows {
		return nil, fmt.Errorf("the table would have %d rows, more than %d (maxTLTRows): too many tractservers for an all-pairs table", len(base), maxTLTRows)
	}
	p := newPlanner(ids, len(base)*k, opts)
	for _, m := range base {
		for _, s := range m {
			p.count[s]++
		}
	}
	pool := make([]ServerID, len(ids))
	for i, s := range ids {
		pool[i] = s.ID
	}
	// Complete the rows in an order that does not favour the first ones.
	for _, ri := range rng.Perm(len(base)) {
		members := base[ri]
		for len(members) < k {
			s, ok := p.pick(p.candidates(pool, members, true))
			if !ok && opts.AllowSharedDomains {
				s, ok = p.pick(p.candidates(pool, members, false))
			}
			if !ok {
				return nil, fmt.Errorf("%w: row %d cannot get %d members", errNoLayout, ri, k)
			}
			members = append(members, s)
			p.count[s]++
		}
		base[ri] = members
	}
	// The greedy pass can leave a server above its share when the last
	// rows could only take servers already ahead; move extras (never the
	// pair that makes a row) from the most loaded to the least loaded.
	firstExtra := 2
	if k == 1 {
		firstExtra = 0
	}
	p.rebalance(base, firstExtra, pool)
	// Order each row's members so that every server holds each slot (and
	// above all slot 0, the primary) about equally often.
	slotCount := make([]map[ServerID]int, k)
	for i := range slotCount {
		slotCount[i] = map[ServerID]int{}
	}
	rows := make([]Row, len(base))
	for ri, members := range base {
		rest := append([]ServerID(nil), members...)
		slots := make([]ServerID, 0, k)
		for slot := 0; slot < k; slot++ {
			bestI, best := -1, math.MaxInt
			var ties []int
			for i, s := range rest {
				c := slotCount[slot][s]
				switch {
				case c < best:
					bestI, best, ties = i, c, []int{i}
				case c == best:
					ties = append(ties, i)
				}
			}
			if len(ties) > 1 {
				bestI = ties[rng.IntN(len(ties))]
			}
			s := rest[bestI]
			rest = slices.Delete(rest, bestI, bestI+1)
			slotCount[slot][s]++
			slots = append(slots, s)
		}
		rows[ri] = Row{Slots: slots}
	}
	return rows, nil
}

// rebalance moves extra members (index firstExtra and up of each row) from
// servers above their share to servers below it while that narrows the
// gap and keeps the rows' failure domains distinct.
func (p *planner) rebalance(rows [][]ServerID, firstExtra int, pool []ServerID) {
	surplus := func(s ServerID) float64 { return -p.deficit(s) }
	for range len(rows) * len(pool) {
		byLoad := append([]ServerID(nil), pool...)
		sort.SliceStable(byLoad, func(i, j int) bool { return surplus(byLoad[i]) > surplus(byLoad[j]) })
		moved := false
	search:
		for _, hi := range byLoad {
			for li := len(byLoad) - 1; li >= 0; li-- {
				lo := byLoad[li]
				if surplus(hi)-surplus(lo) <= 1+1e-9 {
					break
				}
				for ri, members := range rows {
					for e := firstExtra; e < len(members); e++ {
						if members[e] != hi || slices.Contains(members, lo) {
							continue
						}
						others := append(append([]ServerID(nil), members[:e]...), members[e+1:]...)
						if p.domainsOf(others)[p.servers[lo].Domain] && !p.opts.AllowSharedDomains {
							continue
						}
						rows[ri][e] = lo
						p.count[hi]--
						p.count[lo]++
						moved = true
						break search
					}
				}
			}
		}
		if !moved {
			return
		}
	}
}

// RepairInput is the state PlanRepair judges.
type RepairInput struct {
	Table *Table
	// Live reports whether a server keeps its places: its node is alive or
	// suspect (FDS waits for a verdict of death).
	Live func(ServerID) bool
	// Eligible are the servers that may be given new places: alive, with
	// their domains and weights.
	Eligible []ServerInfo
	// InSync reports whether a server holds every tract of its slot in a
	// row; promotion to primary prefers one that does. Nil: unknown.
	InSync func(row int, s ServerID) bool
	// Gone reports whether a dead server will never return: its node is
	// decommissioned (`arbor tlt forget-member` does that for a dead one).
	// No row waits for it; a row whose only complete copies were on gone
	// members is repaired from the best copy that survives. Nil: none.
	Gone func(ServerID) bool
	// Held is how many tracts of a row a server reports holding; a row
	// repaired without a complete copy takes the live slot member holding
	// the most as its primary. Nil: unknown (the lowest live slot).
	Held func(row int, s ServerID) uint64
}

// WaitingRow is a row that has dead members but that PlanRepair leaves
// alone: no live member holds a complete copy of it, so the only complete
// copies are on dead servers (For). A kill is not a lost disk (FDS §3.2
// declares a tract lost only when every replica's disk is gone): the row
// waits, unwritable and perhaps unreadable, for one of them to return,
// rather than make an incomplete member its truth and lose what the dead
// ones hold.
type WaitingRow struct {
	Row     int
	Version uint64
	// For are the row's dead members, one of which holds the only complete
	// copy (which one is not known while they are down).
	For []ServerID
}

func (w WaitingRow) String() string {
	return fmt.Sprintf("row %d (version %d) waits for %v: the only complete copy is on a dead member", w.Row, w.Version, w.For)
}

// verdict is waits with the gone members given up: the row waits only for
// dead members that may return (waitFor); givenUp is set when it would
// wait but every dead member is gone, so it is repaired from what
// survives.
func (in RepairInput) verdict(ri int, row Row) (waitFor []ServerID, wait, givenUp bool) {
	dead, w := in.waits(ri, row)
	if !w {
		return nil, false, false
	}
	for _, s := range dead {
		if in.Gone == nil || !in.Gone(s) {
			waitFor = append(waitFor, s)
		}
	}
	if len(waitFor) == 0 {
		return nil, false, true
	}
	return waitFor, true, false
}

// bestCopy picks the live slot member holding the most tracts of row ri
// (the lowest slot on ties, so a live primary stays), for a row with no
// complete copy left.
func (in RepairInput) bestCopy(ri int, row Row, dead map[int]bool) (int, bool) {
	best, most := -1, uint64(0)
	for j, s := range row.Slots {
		if dead[j] {
			continue
		}
		var held uint64
		if in.Held != nil {
			held = in.Held(ri, s)
		}
		if best < 0 || held > most {
			best, most = j, held
		}
	}
	return best, best >= 0
}

// waits reports whether row ri (its dead pending entries not yet
// expunged) must wait for a dead member, and which are dead. With InSync
// known, the row waits unless a live member is complete and, when the
// primary is dead, a live slot member or the primary slot's pending entry
// is complete to take its place. Without InSync, only a row with no live
// member at all waits.
func (in RepairInput) waits(ri int, row Row) (dead []ServerID, wait bool) {
	liveComplete, primaryHeir, anyLive := false, false, false
	for i, s := range row.Slots {
		if !in.Live(s) {
			dead = append(dead, s)
			continue
		}
		anyLive = true
		if in.InSync != nil && in.InSync(ri, s) {
			liveComplete = true
			if i > 0 {
				primaryHeir = true
			}
		}
	}
	for _, pe := range row.Pending {
		if !in.Live(pe.Server) {
			continue
		}
		anyLive = true
		if in.InSync != nil && in.InSync(ri, pe.Server) {
			liveComplete = true
			if pe.Slot == 0 {
				primaryHeir = true
			}
		}
	}
	if len(dead) == 0 {
		return nil, false
	}
	if !anyLive {
		return dead, true
	}
	if in.InSync == nil {
		return dead, false
	}
	if !in.Live(row.Slots[0]) {
		return dead, !primaryHeir
	}
	return dead, !liveComplete
}

// MemberComplete reports whether a member of row, whose tractserver
// reported st for it (nil: no report), holds every tract of the row: a
// row unchanged since the table was installed (every write in it needed
// every member's acknowledgement); a member reporting the row's version
// readable; or its primary at that version, as a server takes the primary
// slot only complete (a row's first member, a complete replica promoted, a
// pending entry committed once in sync) and keeps the row's tracts while
// it pulls those of lower-replication blobs from the others. The TLT
// manager judges from these reports, so a new directory leader's manager
// judges the same.
func MemberComplete(row Row, st *tpb.RowStatus) bool {
	if row.Version == initialRowVersion {
		return true
	}
	return st != nil && st.Version == row.Version && (st.Readable || st.Role == tpb.RowRole_ROW_ROLE_PRIMARY)
}

// RowsWaiting lists the rows PlanRepair leaves alone because only dead
// members may hold a complete copy of them (see WaitingRow).
func RowsWaiting(in RepairInput) []WaitingRow {
	var out []WaitingRow
	for ri, row := range in.Table.Rows {
		if waitFor, wait, _ := in.verdict(ri, row); wait {
			out = append(out, WaitingRow{Row: ri, Version: row.Version, For: waitFor})
		}
	}
	return out
}

// PlanRepair returns the row changes that take dead servers out of the
// table (FDS §3.2): pending entries of dead servers are expunged (§3.4); a
// dead slot is taken by its pending entry if it has one, else by a server
// chosen like BuildTable's extras (least loaded for its weight, in a new
// failure domain for the row, not busy with pending entries if possible).
// A dead primary is replaced by promoting a complete surviving member (or
// the primary slot's complete pending entry), whose slot is then
// refilled: the primary must hold every tract of the row. Every changed
// row gets a new version from the directory. A row none of whose live
// members is complete (or none of whose members is live) is left alone
// until a dead member returns (RowsWaiting): replacing its dead members
// would lose the tracts only they hold; unless every dead member is Gone
// (never returns): then the live member holding the most tracts becomes
// its primary and the dead slots are refilled. A slot that no server can take
// keeps its dead server and the row is reported in Why.
func PlanRepair(in RepairInput, opts LayoutOptions) []RowChange {
	t := in.Table
	p := newPlanner(in.Eligible, len(t.Rows)*t.Replication, opts)
	for s, c := range t.Appearances() {
		p.count[s] = c
	}
	busy := map[ServerID]bool{}
	for _, r := range t.Rows {
		for _, pe := range r.Pending {
			busy[pe.Server] = true
		}
	}
	var pool, idle []ServerID
	for _, s := range in.Eligible {
		pool = append(pool, s.ID)
		if !busy[s.ID] {
			idle = append(idle, s.ID)
		}
	}
	var changes []RowChange
	for ri, old := range t.Rows {
		_, wait, givenUp := in.verdict(ri, old)
		if wait {
			continue
		}
		row := old.clone()
		var why []string
		// Expunge the pending entries of dead servers.
		kept := row.Pending[:0]
		for _, pe := range row.Pending {
			if in.Live(pe.Server) {
				kept = append(kept, pe)
			} else {
				why = append(why, fmt.Sprintf("expunge pending %s", pe.Server))
				p.count[pe.Server]--
			}
		}
		row.Pending = kept
		dead := map[int]bool{}
		for i, s := range row.Slots {
			if !in.Live(s) {
				dead[i] = true
			}
		}
		if len(dead) == 0 && len(why) == 0 {
			continue
		}
		if givenUp {
			// No complete copy survives its gone members: the best
			// remaining one becomes the row's truth.
			if j, ok := in.bestCopy(ri, row, dead); ok && j != 0 {
				why = append(why, fmt.Sprintf("promote %s, the live member holding the most of the row, to primary (the complete copies were on members given up)", row.Slots[j]))
				row.Slots[0], row.Slots[j] = row.Slots[j], row.Slots[0]
				if dead[0] {
					delete(dead, 0)
					dead[j] = true
				}
			}
		}
		if dead[0] {
			if j, ok := promotion(row, ri, dead, in.InSync); ok {
				why = append(why, fmt.Sprintf("promote %s to primary", row.Slots[j]))
				row.Slots[0], row.Slots[j] = row.Slots[j], row.Slots[0]
				delete(dead, 0)
				dead[j] = true
			} else if pi := pendingFor(row, 0); pi >= 0 && (in.InSync == nil || in.InSync(ri, row.Pending[pi].Server)) {
				why = append(why, fmt.Sprintf("pending %s takes the primary slot", row.Pending[pi].Server))
				row.Slots[0] = row.Pending[pi].Server
				row.Pending = slices.Delete(row.Pending, pi, pi+1)
				delete(dead, 0)
			}
		}
		for _, i := range sortedInts(dead) {
			gone := row.Slots[i]
			if pi := pendingFor(row, i); pi >= 0 {
				why = append(why, fmt.Sprintf("slot %d: pending %s replaces dead %s", i, row.Pending[pi].Server, gone))
				row.Slots[i] = row.Pending[pi].Server
				row.Pending = slices.Delete(row.Pending, pi, pi+1)
				p.count[gone]--
				continue
			}
			others := rowMembersExcept(row, i)
			var s ServerID
			ok := false
			for _, try := range []struct {
				pool     []ServerID
				distinct bool
			}{{idle, true}, {pool, true}, {idle, false}, {pool, false}} {
				if !try.distinct && !opts.AllowSharedDomains {
					continue
				}
				if s, ok = p.pick(p.candidates(try.pool, others, try.distinct)); ok {
					break
				}
			}
			if !ok {
				why = append(why, fmt.Sprintf("slot %d: no server can replace dead %s", i, gone))
				continue
			}
			why = append(why, fmt.Sprintf("slot %d: %s replaces dead %s", i, s, gone))
			row.Slots[i] = s
			p.count[gone]--
			p.count[s]++
		}
		if rowsEqual(row, old) {
			continue
		}
		changes = append(changes, RowChange{Row: ri, ExpectedVersion: old.Version, Slots: row.Slots, Pending: row.Pending, Why: joinWhy(why)})
	}
	return changes
}

// promotion picks the survivor to become primary when slot 0 is dead.
func promotion(row Row, ri int, dead map[int]bool, inSync func(int, ServerID) bool) (int, bool) {
	first := -1
	for j := 1; j < len(row.Slots); j++ {
		if dead[j] {
			continue
		}
		if first < 0 {
			first = j
		}
		if inSync != nil && inSync(ri, row.Slots[j]) {
			return j, true
		}
	}
	// With InSync known, an incomplete member never becomes the row's
	// truth.
	return first, first >= 0 && inSync == nil
}

func pendingFor(row Row, slot int) int {
	for i, pe := range row.Pending {
		if pe.Slot == slot {
			return i
		}
	}
	return -1
}

// rowMembersExcept lists the row's servers but the one in slot skip.
func rowMembersExcept(row Row, skip int) []ServerID {
	var out []ServerID
	for i, s := range row.Slots {
		if i != skip {
			out = append(out, s)
		}
	}
	for _, pe := range row.Pending {
		out = append(out, pe.Server)
	}
	return out
}

// GrowthInput is the state PlanGrowth judges.
type GrowthInput struct {
	Table *Table
	// Servers are every live, eligible server, newcomers included, with
	// their domains and weights.
	Servers []ServerInfo
	// Newcomers are servers to bring up to their share, in order.
	Newcomers []ServerID
	// HasData reports whether a newcomer still holds data of a row (a
	// server back from an absence): such rows are given back first, so it
	// copies only the writes it missed. Nil: none.
	HasData func(row int, s ServerID) bool
	// InSync reports whether a member is in sync with its row; in a row
	// the newcomer has data for, a member still catching up is the one it
	// replaces (its recovery is then abandoned). Nil: unknown.
	InSync func(row int, s ServerID) bool
}

// PlanGrowth gives each newcomer pending entries (FDS §3.4) until it holds
// its weighted share of the table's slots, taking slots from the servers
// furthest above their share, in rows that have no pending entry and whose
// other members are in other failure domains. Rows the newcomer still
// holds data for come first. The newcomer copies the rows' tracts, is
// written to as well as the current holder, and is committed by
// PlanCommit once in sync.
func PlanGrowth(in GrowthInput, opts LayoutOptions) []RowChange {
	t := in.Table
	p := newPlanner(in.Servers, len(t.Rows)*t.Replication, opts)
	for s, c := range t.Appearances() {
		p.count[s] = c
	}
	// How often each server holds each slot index, so that a newcomer
	// does not end up primary of every row it takes.
	pos := map[ServerID][]int{}
	for _, r := range t.Rows {
		for j, s := range r.Slots {
			if pos[s] == nil {
				pos[s] = make([]int, t.Replication)
			}
			pos[s][j]++
		}
	}
	posOf := func(s ServerID, j int) int {
		if pos[s] == nil {
			pos[s] = make([]int, t.Replication)
		}
		return pos[s][j]
	}
	changed := map[int]Row{}
	var order []int
	rowOf := func(ri int) Row {
		if r, ok := changed[ri]; ok {
			return r
		}
		return t.Rows[ri]
	}
	for _, n := range in.Newcomers {
		if _, ok := p.servers[n]; !ok {
			continue
		}
		domain := p.servers[n].Domain
		for p.deficit(n) >= 0.5 {
			bestRow, bestSlot := -1, -1
			var bestScore [4]float64
			for ri := range t.Rows {
				row := rowOf(ri)
				if len(row.Pending) > 0 || row.Has(n) {
					continue
				}
				data := in.HasData != nil && in.HasData(ri, n)
				for j, holder := range row.Slots {
					if _, alive := p.servers[holder]; !alive {
						continue // a dead holder is repair's job
					}
					used := p.domainsOf(rowMembersExcept(row, j))
					if used[domain] && !opts.AllowSharedDomains {
						continue
					}
					surplus := -p.deficit(holder)
					// A move must narrow the gap between the two, or give
					// back a row the newcomer holds data of, taking it
					// from a holder above its share: one at or below its
					// share would then be a growth candidate holding the
					// row's data, take it back, and the row would go round
					// between servers for ever (seen when a returning
					// server and the one that replaced it both held it).
					if surplus+p.deficit(n) <= 1+1e-9 && !(data && surplus > 1e-9) {
						continue
					}
					score := [4]float64{0, 0, math.Floor(surplus + 0.5), float64(posOf(holder, j) - posOf(n, j))}
					if data {
						score[0] = 1
						if in.InSync != nil && !in.InSync(ri, holder) {
							score[1] = 1
						}
					}
					if used[domain] {
						score[2] -= 1000 // a shared domain only as a last resort
					}
					if bestRow < 0 || scoreLess(bestScore, score) {
						bestRow, bestSlot, bestScore = ri, j, score
					}
				}
			}
			if bestRow < 0 {
				break
			}
			row := rowOf(bestRow).clone()
			if _, seen := changed[bestRow]; !seen {
				order = append(order, bestRow)
			}
			row.Pending = append(row.Pending, Pending{Slot: bestSlot, Server: n})
			changed[bestRow] = row
			p.count[n]++
			p.count[row.Slots[bestSlot]]--
			pos[n][bestSlot]++
			pos[row.Slots[bestSlot]][bestSlot]--
		}
	}
	var changes []RowChange
	for _, ri := range order {
		r := changed[ri]
		pe := r.Pending[len(r.Pending)-1]
		changes = append(changes, RowChange{
			Row: ri, ExpectedVersion: t.Rows[ri].Version, Slots: r.Slots, Pending: r.Pending,
			Why: fmt.Sprintf("%s pending for slot %d (held by %s)", pe.Server, pe.Slot, r.Slots[pe.Slot]),
		})
	}
	return changes
}

func scoreLess(a, b [4]float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// GrowthCandidates returns the servers PlanGrowth should bring up to
// their share: those at least one slot below it (a new server has none)
// and not already catching up on pending entries, most behind first.
func GrowthCandidates(t *Table, servers []ServerInfo) []ServerID {
	p := newPlanner(servers, len(t.Rows)*t.Replication, LayoutOptions{})
	busy := map[ServerID]bool{}
	for s, c := range t.Appearances() {
		p.count[s] = c
	}
	for _, r := range t.Rows {
		for _, pe := range r.Pending {
			busy[pe.Server] = true
		}
	}
	var out []ServerID
	for _, s := range servers {
		if !busy[s.ID] && p.deficit(s.ID) >= 1-1e-9 {
			out = append(out, s.ID)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		di, dj := p.deficit(out[i]), p.deficit(out[j])
		if di != dj {
			return di > dj
		}
		return out[i].less(out[j])
	})
	return out
}

// PlanCommit moves every pending entry that is in sync into its slot (FDS
// §3.4: the row's version changes and the replaced server may drop the
// row's tracts).
func PlanCommit(t *Table, inSync func(row int, s ServerID) bool) []RowChange {
	var changes []RowChange
	for ri, old := range t.Rows {
		if len(old.Pending) == 0 {
			continue
		}
		row := old.clone()
		var why []string
		kept := row.Pending[:0]
		for _, pe := range row.Pending {
			if inSync(ri, pe.Server) {
				why = append(why, fmt.Sprintf("commit %s to slot %d (was %s)", pe.Server, pe.Slot, row.Slots[pe.Slot]))
				row.Slots[pe.Slot] = pe.Server
			} else {
				kept = append(kept, pe)
			}
		}
		row.Pending = kept
		if len(why) > 0 {
			changes = append(changes, RowChange{Row: ri, ExpectedVersion: old.Version, Slots: row.Slots, Pending: row.Pending, Why: joinWhy(why)})
		}
	}
	return changes
}

// ApplyChanges returns the table with the changes applied and each changed
// row at version newVersion (what the directory does).
func ApplyChanges(t *Table, changes []RowChange, newVersion uint64) *Table {
	out := &Table{Version: newVersion, TractSize: t.TractSize, Replication: t.Replication, Rows: make([]Row, len(t.Rows))}
	for i, r := range t.Rows {
		out.Rows[i] = r.clone()
	}
	for _, c := range changes {
		out.Rows[c.Row] = Row{Version: newVersion, Slots: append([]ServerID(nil), c.Slots...), Pending: append([]Pending(nil), c.Pending...)}
	}
	return out
}

// Balance describes how evenly a table spreads slots over its servers.
type Balance struct {
	Servers int
	// MaxOverMean is the most-loaded server's appearances over the mean
	// (1 is perfect).
	MaxOverMean float64
	// PrimaryMaxOverMean is the same for slot 0.
	PrimaryMaxOverMean float64
	// MissingPairs counts pairs of servers in distinct domains that share
	// no row (0 for a freshly built table).
	MissingPairs int
}

// TableBalance measures t over the given servers (weights ignored).
func TableBalance(t *Table, servers []ServerInfo) Balance {
	app := map[ServerID]int{}
	prim := map[ServerID]int{}
	together := map[[2]ServerID]bool{}
	for _, r := range t.Rows {
		for i, s := range r.Slots {
			app[s]++
			if i == 0 {
				prim[s]++
			}
			for _, o := range r.Slots[i+1:] {
				a, b := s, o
				if b.less(a) {
					a, b = b, a
				}
				together[[2]ServerID{a, b}] = true
			}
		}
	}
	b := Balance{Servers: len(servers)}
	b.MaxOverMean = maxOverMean(app, servers)
	b.PrimaryMaxOverMean = maxOverMean(prim, servers)
	for i := range servers {
		for j := i + 1; j < len(servers); j++ {
			x, y := servers[i], servers[j]
			if x.Domain == y.Domain {
				continue
			}
			a, c := x.ID, y.ID
			if c.less(a) {
				a, c = c, a
			}
			if !together[[2]ServerID{a, c}] {
				b.MissingPairs++
			}
		}
	}
	return b
}

func maxOverMean(counts map[ServerID]int, servers []ServerInfo) float64 {
	if len(servers) == 0 {
		return 0
	}
	total, top := 0, 0
	for _, s := range servers {
		total += counts[s.ID]
		top = max(top, counts[s.ID])
	}
	if total == 0 {
		return 0
	}
	return float64(top) / (float64(total) / float64(len(servers)))
}

func rowsEqual(a, b Row) bool {
	return slices.Equal(a.Slots, b.Slots) && slices.Equal(a.Pending, b.Pending)
}

func sortedInts(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

func sortedServers(m map[ServerID]bool) []ServerID {
	out := make([]ServerID, 0, len(m))
	for s := range m {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].less(out[j]) })
	return out
}

func joinWhy(w []string) string {
	out := ""
	for i, s := range w {
		if i > 0 {
			out += "; "
		}
		out += s
	}
	return out
}
