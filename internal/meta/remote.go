package meta

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// The refresh process and remote placement (placement.go has the
// heuristics).

// placer holds this server's placement tables.
type placer struct {
	mu     sync.Mutex
	tables placementTables
	// members: what the last refresh heard from each live server.
	members []memberLoad
	rr      roundRobin
	rng     *rand.Rand
}

// refreshPlacement gathers every live metadata server's table statistics
// (the refresh process, once a second) and recomputes the tables. A
// server that serves no table skips it and forgets what it heard: the
// figures decide only where this server's new directories go (placeRemote)
// and where its hot tables move (quietestPeer), and asking every peer
// once a second from every server was the untar's most frequent
// background call (BENCHMARKS.md). It still answers others' TableStats.
func (s *Server) refreshPlacement(ctx context.Context) {
	s.leaseMu.Lock()
	serving := len(s.leases) > 0
	s.leaseMu.Unlock()
	if !serving {
		s.place.mu.Lock()
		s.place.tables, s.place.members = placementTables{}, nil
		s.place.mu.Unlock()
		return
	}
	nodes, err := s.peers.list(ctx, false)
	if err != nil {
		return
	}
	var members []memberLoad
	for _, n := range metaNodes(nodes) {
		var resp *pb.TableStatsResponse
		if n.GetId() == s.cfg.Node {
			resp, err = s.TableStats(ctx, &pb.TableStatsRequest{})
		} else {
			var c pb.MetaClient
			if c, err = s.peers.clientAt(n.GetAddress()); err == nil {
				resp, err = c.TableStats(ctx, &pb.TableStatsRequest{})
			}
		}
		if err != nil {
			continue // not heard from: not a candidate this round
		}
		m := memberLoad{node: n.GetId(), tables: len(resp.GetTables())}
		for _, t := range resp.GetTables() {
			m.inodes += float64(t.GetInodes())
			m.bytes += float64(t.GetCachedBytes())
			m.creates += t.GetCreatesPerSecond()
			m.ops += t.GetOpsPerSecond()
		}
		members = append(members, m)
	}
	t := computePlacement(s.cfg.Node, members, defaultPlacement)
	s.place.mu.Lock()
	s.place.tables, s.place.members = t, members
	s.place.mu.Unlock()
}

// maxTablesPerMember bounds the tables remote placement makes: once the
// members serve this many each on average, no directory goes remote. An
// untar of the Linux source made 829 tables in 19 minutes without it, and
// their lease renewals slowed everything.
const maxTablesPerMember = 32

// placeRemote decides, for a new directory in dir, whether it goes to
// another member, and which.
func (s *Server) placeRemote(engine *fs.FS, dir fs.Handle) (uint64, bool) {
	p := &s.place
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tables.at) == 0 {
		return 0, false
	}
	tables := 0
	for _, m := range p.members {
		tables += m.tables
	}
	if tables >= maxTablesPerMember*len(p.members) {
		// Every table costs a lease renewal a second in the directory and
		// a row in every client's map: past this many, new directories
		// stay with their parent (tables still split when hot or large).
		return 0, false
	}
	if p.rng == nil {
		p.rng = rand.New(rand.NewPCG(s.cfg.Node, rand.Uint64()))
	}
	if p.rng.Float64() >= p.tables.rp[category(engine.DirLevel(dir.D))] {
		return 0, false
	}
	target := p.rr.pick(p.tables.at)
	return target, target != 0
}

// remoteDirectory prepares a new directory placed on member target: a new
// root of the too-deep region, whose subtree becomes a table of its own,
// served here for the mkdir (the caller moves it to target afterwards).
// It returns the directory id and the table.
func (s *Server) remoteDirectory(ctx context.Context, st *fsState, engine *fs.FS) (uint64, uint64, error) {
	k, err := fs.SuperblockCounter(ctx, fs.BTreeMeta{Tree: s.tree()}, st.f, fs.CounterTooDeep)
	if err != nil {
		return 0, 0, err
	}
	r, ok := engine.TooDeepRoot(k)
	if !ok {
		return 0, 0, fmt.Errorf("the too-deep region has no root left (%d drawn)", k)
	}
	id, err := s.carveTable(ctx, st.f, r)
	if err != nil {
		return 0, 0, err
	}
	return r.Lo, id, nil
}

// carveTable makes range r of file system f a table of its own served by
// this server: the table holding it is split at r's ends by its owner,
// and the part brought here.
func (s *Server) carveTable(ctx context.Context, f uint64, r fs.DRange) (uint64, error) {
	for attempt := 0; attempt < 8; attempt++ {
		dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
		if err != nil {
			return 0, err
		}
		var u *dpb.Delegation
		var ur fs.DRange
		for _, d := range dm.GetDelegations() {
			x, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
			if err != nil {
				return 0, err
			}
			if x.Contains(r.Lo) {
				u, ur = d, x
			}
		}
		if u == nil || u.GetOwnerNode() == 0 {
			return 0, fmt.Errorf("%w: no server holds directory %#x now", errRetry, r.Lo)
		}
		var at uint64
		switch {
		case ur.Lo < r.Lo:
			at = r.Lo
		case r.Hi != 0 && (ur.Hi == 0 || ur.Hi > r.Hi):
			at = r.Hi
		case u.GetOwnerNode() != s.cfg.Node:
			if err := s.borrow(ctx, f, []uint64{r.Lo}); err != nil {
				return 0, err
			}
			s.borrowMu.Lock()
			delete(s.borrowed, u.GetTableId()) // carved for keeps, not lent
			s.borrowMu.Unlock()
			continue
		default:
			return u.GetTableId(), nil
		}
		if u.GetOwnerNode() == s.cfg.Node {
			_, _, err = s.splitTable(ctx, u.GetTableId(), at)
		} else {
			var c pb.MetaClient
			if c, err = s.peers.client(ctx, u.GetOwnerNode()); err == nil {
				var resp *pb.SplitTableResponse
				if resp, err = c.SplitTable(ctx, &pb.SplitTableRequest{Table: u.GetTableId(), At: at}); err == nil {
					err = errorFromPB(resp.GetError())
				}
			}
		}
		if err != nil {
			return 0, fmt.Errorf("carve directories [%#x, %#x) into a table: %w", r.Lo, r.Hi, err)
		}
	}
	return 0, fmt.Errorf("%w: carving directories [%#x, %#x) into a table kept racing", errRetry, r.Lo, r.Hi)
}
