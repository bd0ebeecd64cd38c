package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Moving and splitting tables (Ursa Minor §3.4): nothing is copied, the
// pages stay where they are in the extent store. The owner stops serving
// the table and lets its pending writes become durable (DROP), the
// delegation map changes (a new epoch), and the new owner acquires it by
// writing its epoch into the header (ADD), which fences anything of the
// old owner still in flight. Clients that ask the old owner are told
// NOT_OWNER and read the map again.

// delegation returns table id's delegation.
func (s *Server) delegation(ctx context.Context, id uint64) (*dpb.Delegation, error) {
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{})
	if err != nil {
		return nil, fmt.Errorf("meta: read the delegation map: %w", err)
	}
	for _, d := range dm.GetDelegations() {
		if d.GetTableId() == id {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%w: no table %d", errNoTable, id)
}

// errNoTable: the table named does not exist.
var errNoTable = fmt.Errorf("%w: unknown table", errInvalid)

// ownedDelegation returns table id's delegation if this server serves it.
func (s *Server) ownedDelegation(ctx context.Context, id uint64) (*dpb.Delegation, *fsState, error) {
	d, err := s.delegation(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	s.leaseMu.Lock()
	l := s.leases[id]
	s.leaseMu.Unlock()
	if d.GetOwnerNode() != s.cfg.Node || l == nil || l.epoch != d.GetEpoch() {
		return nil, nil, fmt.Errorf("%w: table %d is served by node %d", errNotOwner, id, d.GetOwnerNode())
	}
	st, err := s.fsOf(ctx, d.GetFileSystem())
	if err != nil {
		return nil, nil, err
	}
	return d, st, nil
}

// MoveTable implements pb.MetaServer: the owner hands a table to another
// live metadata server.
func (s *Server) MoveTable(ctx context.Context, req *pb.MoveTableRequest) (*pb.MoveTableResponse, error) {
	j := s.jobs.start(req.GetJob())
	defer j.finish()
	d, err := s.moveTableJob(ctx, req.GetTable(), req.GetNode(), j)
	if err != nil {
		return &pb.MoveTableResponse{Error: errorToPB(err)}, nil
	}
	return &pb.MoveTableResponse{Epoch: d.GetEpoch()}, nil
}

func (s *Server) moveTable(ctx context.Context, id, to uint64) (*dpb.Delegation, error) {
	return s.moveTableJob(ctx, id, to, nil)
}

// moveSteps are a move's steps, as its progress shows them.
var moveSteps = []string{"check the target", "freeze and flush", "hand off", "drop"}

// moveStep records that a move is at step i (from 0) of moveSteps.
func moveStep(j *job, i int) {
	j.phaseStart(moveSteps[i], i+1, len(moveSteps), "steps", uint64(len(moveSteps)))
	j.set(uint64(i), 0)
}

// moveTableJob is moveTable recording its steps in j (nil: not recorded).
func (s *Server) moveTableJob(ctx context.Context, id, to uint64, j *job) (*dpb.Delegation, error) {
	moveStep(j, 0)
	if to == 0 {
		return nil, invalidf("move table %d: no target node", id)
	}
	d, st, err := s.ownedDelegation(ctx, id)
	if err != nil {
		return nil, err
	}
	if to == s.cfg.Node {
		return d, nil
	}
	target, err := s.peers.freshNode(ctx, to)
	if err != nil {
		return nil, invalidf("move table %d to node %d: %v", id, to, err)
	}
	if target.GetState() != dpb.NodeState_NODE_STATE_ALIVE || !slices.Contains(target.GetRoles(), RoleMeta) {
		return nil, invalidf("move table %d to node %d: the node is %s and runs %v; a table goes only to a live metadata server",
			id, to, directory.StateName(target.GetState()), target.GetRoles())
	}
	nd, err := s.handOver(ctx, st, d, to, j)
	if err != nil {
		return nil, err
	}
	j.set(uint64(len(moveSteps)), 0)
	s.log.Info("moved a table", "table", id, "fs", d.GetFileSystem(), "to", to, "epoch", nd.GetEpoch())
	s.tellFollow(ctx, to)
	return nd, nil
}

// handOver stops serving table d and gives it to node to in the map.
func (s *Server) handOver(ctx context.Context, st *fsState, d *dpb.Delegation, to uint64, j *job) (*dpb.Delegation, error) {
	id := d.GetTableId()
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	moveStep(j, 1)
	resume, err := st.st.pause(ctx, id)
	if err != nil {
		return nil, err
	}
	moveStep(j, 2)
	nd, err := s.cfg.Directory.SetDelegation(ctx, &dpb.SetDelegationRequest{TableId: id, FileSystem: d.GetFileSystem(),
		StartKey: d.GetStartKey(), EndKey: d.GetEndKey(), OwnerNode: to,
		LeaseDurationMs: s.cfg.LeaseDuration.Milliseconds(), ExpectedEpoch: d.GetEpoch()})
	if err != nil {
		resume()
		return nil, fmt.Errorf("move table %d: %w", id, err)
	}
	s.leaseMu.Lock()
	delete(s.leases, id)
	s.leaseMu.Unlock()
	moveStep(j, 3)
	st.st.drop(ctx, id)
	return nd, nil
}

// tellFollow asks node to read the delegation map now (it would within a
// poll interval anyway).
func (s *Server) tellFollow(ctx context.Context, node uint64) {
	if node == s.cfg.Node {
		s.followMap(ctx)
		return
	}
	if c, err := s.peers.client(ctx, node); err == nil {
		_, _ = c.Tables(ctx, &pb.TablesRequest{Op: pb.TablesRequest_FOLLOW})
	}
}

// SplitTable implements pb.MetaServer: the owner cuts a table in two; both
// parts stay with it (a move can follow).
func (s *Server) SplitTable(ctx context.Context, req *pb.SplitTableRequest) (*pb.SplitTableResponse, error) {
	right, at, err := s.splitTable(ctx, req.GetTable(), req.GetAt())
	if err != nil {
		return &pb.SplitTableResponse{Error: errorToPB(err)}, nil
	}
	return &pb.SplitTableResponse{NewTable: right.GetTableId(), At: at}, nil
}

func (s *Server) splitTable(ctx context.Context, id, at uint64) (*dpb.Delegation, uint64, error) {
	d, st, err := s.ownedDelegation(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	r, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
	if err != nil {
		return nil, 0, err
	}
	if at == 0 {
		if at, err = s.splitPoint(ctx, st, r); err != nil {
			return nil, 0, err
		}
	}
	if at <= r.Lo || (r.Hi != 0 && at >= r.Hi) {
		return nil, 0, invalidf("split table %d %v at %#x: not inside the table", id, r, at)
	}
	// No snapshot may be under way: its freeze would miss the new table.
	unlock, err := s.fsLock(st.f, "tables")(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer unlock()
	if t, ok := st.st.serves(r.Lo); !ok || t.id != id || t.hdr.Frozen != 0 {
		return nil, 0, fmt.Errorf("%w: split table %d: it is not served here, or frozen by a snapshot not finished", errRetry, id)
	}
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	resume, err := st.st.pause(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	// The right part's retried requests look for their reply records in
	// its own area: copy them there (the table is paused: no reply record
	// changes) before it can serve anything. Records copied for a split
	// that then fails are table records no scan reads, and a later split
	// at the same point overwrites them.
	if err := copyReplies(ctx, s.tree(), st.f, r.Lo, at); err != nil {
		resume()
		return nil, 0, fmt.Errorf("split table %d: copy its reply records: %w", id, err)
	}
	key, _ := rangeToKeys(fs.DRange{Lo: at})
	pair, err := s.cfg.Directory.SplitDelegation(ctx, &dpb.SplitDelegationRequest{TableId: id, ExpectedEpoch: d.GetEpoch(), SplitKey: key})
	if err != nil {
		resume()
		return nil, 0, fmt.Errorf("split table %d: %w", id, err)
	}
	st.st.forget(id, at)
	st.st.dropUnit(at)
	s.leaseMu.Lock()
	delete(s.leases, id)
	s.leaseMu.Unlock()
	var errs []error
	for _, half := range []*dpb.Delegation{pair.GetLeft(), pair.GetRight()} {
		if err := s.acquire(ctx, half); err != nil {
			errs = append(errs, err)
		}
	}
	s.log.Info("split a table", "table", id, "fs", st.f, "at", fmt.Sprintf("%#x", at), "new_table", pair.GetRight().GetTableId())
	if err := errors.Join(errs...); err != nil {
		// The map names this server: the next poll acquires them.
		s.log.Warn("acquiring the parts of a split table", "err", err)
	}
	return pair.GetRight(), at, nil
}

// splitPoint chooses where to cut a table: at the directory id that halves
// the keys of the table's loaded directories (a hot table's active
// directories are loaded), else half way through what the tree holds.
func (s *Server) splitPoint(ctx context.Context, st *fsState, r fs.DRange) (uint64, error) {
	type w struct {
		d    uint64
		keys int
	}
	var ws []w
	total := 0
	st.st.mu.RLock()
	for d, u := range st.st.units {
		if r.Contains(d) && d != r.Lo {
			ws = append(ws, w{d, max(u.keys, 1)})
			total += max(u.keys, 1)
		}
	}
	st.st.mu.RUnlock()
	if len(ws) < 2 {
		// Count keys per directory in the tree, up to a bound.
		counts := map[uint64]int{}
		objects := fs.DirRanges(st.f, r.Lo)[0][0]
		_, end := fs.DirRanges(st.f, r.Lo)[0][0], []byte(nil)
		if r.Hi != 0 {
			end = fs.DirRanges(st.f, r.Hi)[0][0]
		}
		const maxKeys = 1 << 20
		n := 0
		stop := errors.New("stop")
		err := s.tree().Scan(ctx, objects, end, func(k, _ []byte) error {
			_, d, ok, err := fs.KeyDir(k)
			if err == nil && ok && d != r.Lo {
				counts[d]++
			}
			if n++; n >= maxKeys {
				return stop
			}
			return nil
		})
		if err != nil && !errors.Is(err, stop) {
			return 0, err
		}
		ws, total = ws[:0], 0
		for d, c := range counts {
			ws = append(ws, w{d, c})
			total += c
		}
	}
	if len(ws) < 2 {
		return 0, invalidf("table %v holds fewer than two directories: nothing to split", r)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].d < ws[j].d })
	acc := 0
	for i, x := range ws {
		acc += x.keys
		if 2*acc >= total && i+1 < len(ws) {
			return ws[i+1].d, nil
		}
	}
	return ws[len(ws)-1].d, nil
}

// borrow brings the tables of the directory ids ds that other servers own
// to this one (Ursa Minor §3.5 BORROW): their owners hand them over; they
// are returned after borrowHold without use (returnBorrowed).
func (s *Server) borrow(ctx context.Context, f uint64, ds []uint64) error {
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
	if err != nil {
		return err
	}
	moved := false
	for _, d := range dm.GetDelegations() {
		r, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ds, r.Contains) || d.GetOwnerNode() == s.cfg.Node {
			continue
		}
		if d.GetOwnerNode() == 0 {
			return fmt.Errorf("%w: table %d has no server now", errRetry, d.GetTableId())
		}
		c, err := s.peers.client(ctx, d.GetOwnerNode())
		if err != nil {
			return fmt.Errorf("%w: borrow table %d: %v", errRetry, d.GetTableId(), err)
		}
		resp, err := c.MoveTable(ctx, &pb.MoveTableRequest{Table: d.GetTableId(), Node: s.cfg.Node})
		if err == nil {
			err = errorFromPB(resp.GetError())
		}
		if err != nil {
			return fmt.Errorf("%w: borrow table %d from node %d: %v", errRetry, d.GetTableId(), d.GetOwnerNode(), err)
		}
		s.borrowMu.Lock()
		s.borrowed[d.GetTableId()] = &borrowed{from: d.GetOwnerNode(), used: time.Now()}
		s.borrowMu.Unlock()
		moved = true
	}
	if moved {
		s.followMap(ctx)
	}
	return nil
}

// borrowed is a table this server borrowed.
type borrowed struct {
	from uint64
	used time.Time
}

// borrowHold is how long a borrowed table stays unused before it goes back
// to its owner (a run of operations over two tables borrows once).
const borrowHold = 5 * time.Second

// returnBorrowed gives the tables borrowed and unused for borrowHold back
// to their owners (Ursa Minor §3.5 RETURN).
func (s *Server) returnBorrowed(ctx context.Context) {
	s.borrowMu.Lock()
	var due []uint64
	for id, b := range s.borrowed {
		if time.Since(b.used) >= borrowHold {
			due = append(due, id)
		}
	}
	s.borrowMu.Unlock()
	for _, id := range due {
		s.borrowMu.Lock()
		b := s.borrowed[id]
		delete(s.borrowed, id)
		s.borrowMu.Unlock()
		if _, err := s.moveTable(ctx, id, b.from); err != nil {
			s.log.Debug("returning a borrowed table", "table", id, "to", b.from, "err", err)
		}
	}
}

// touchBorrowed records a use of the borrowed tables of directories ds.
func (s *Server) touchBorrowed(st *fsState, ds []uint64) {
	s.borrowMu.Lock()
	defer s.borrowMu.Unlock()
	if len(s.borrowed) == 0 {
		return
	}
	for _, d := range ds {
		if t, ok := st.st.serves(d); ok {
			if b := s.borrowed[t.id]; b != nil {
				b.used = time.Now()
			}
		}
	}
}
