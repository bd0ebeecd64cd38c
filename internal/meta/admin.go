package meta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/retry"
	"github.com/arbor-storage/arbor/internal/security"
)

// Administration of file systems, snapshots and tables. Any metadata
// server takes these requests; it acts through the directory, the tree
// and the owners of the tables concerned.

// freezeTimeout is how long a table stays frozen before its owner
// finishes the snapshot itself (its coordinator died half way).
const freezeTimeout = 10 * time.Second

// tablesOf returns file system f's tables from the delegation map.
func (s *Server) tablesOf(ctx context.Context, f uint64) ([]*dpb.Delegation, error) {
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
	if err != nil {
		return nil, fmt.Errorf("meta: read the delegation map: %w", err)
	}
	ds := dm.GetDelegations()
	sort.Slice(ds, func(i, j int) bool { return string(ds[i].GetStartKey()) < string(ds[j].GetStartKey()) })
	return ds, nil
}

// CreateFileSystem creates a file system (or finds it), formats its
// metadata and gives its first table, every directory id, to this server.
func (s *Server) CreateFileSystem(ctx context.Context, req *pb.CreateFileSystemRequest) (*pb.FileSystemResponse, error) {
	tenant, err := effectiveTenant(ctx, req.GetTenant())
	if err != nil {
		return &pb.FileSystemResponse{Error: errorToPB(err)}, nil
	}
	rec, created, err := s.createFileSystem(ctx, req.GetName(), req.GetDataLayout(), tenant)
	if err != nil {
		return &pb.FileSystemResponse{Error: errorToPB(err)}, nil
	}
	return &pb.FileSystemResponse{Number: rec.GetNumber(), Name: rec.GetName(), Created: created}, nil
}

// layoutChecker is the data store's check of a file system's data
// layout (fs.TractData.CheckLayout): it returns the canonical form and
// how many lost failure domains the layout's blobs survive, or why the
// cluster cannot hold it.
type layoutChecker interface {
	CheckLayout(ctx context.Context, layout string) (string, int, error)
	DefaultLayout(ctx context.Context) (string, error)
}

// metadataSurvival is how many lost nodes every piece of the cluster's
// metadata survives (a Raft group of n survives (n-1)/2): the directory
// group and the extents that hold the file systems' metadata, and which
// of them survives the fewest.
func (s *Server) metadataSurvival(ctx context.Context) (int, string, error) {
	st, err := s.cfg.Directory.Status(ctx, &dpb.StatusRequest{})
	if err != nil {
		return 0, "", fmt.Errorf("meta: the directory's status: %w", directoryError(err))
	}
	n := len(st.GetVoters())
	least, why := (n-1)/2, fmt.Sprintf("the directory has %d voters", n)
	var after uint64
	for range maxExtentPages {
		resp, err := s.cfg.Directory.ListExtents(ctx, &dpb.ListExtentsRequest{StartAfter: after})
		if err != nil {
			return 0, "", fmt.Errorf("meta: list the metadata extents: %w", directoryError(err))
		}
		for _, e := range resp.GetExtents() {
			if r := int(e.GetGeometry().GetReplication()); (r-1)/2 < least {
				least, why = (r-1)/2, fmt.Sprintf("metadata extent %d has %d replicas", e.GetExtentId(), r)
			}
		}
		if !resp.GetMore() || len(resp.GetExtents()) == 0 {
			break
		}
		after = resp.GetExtents()[len(resp.GetExtents())-1].GetExtentId()
	}
	return least, why, nil
}

// maxExtentPages bounds the pages of ListExtents metadataSurvival reads.
const maxExtentPages = 1024

// checkLayoutSurvival refuses a data layout whose blobs survive more lost
// nodes than the file system's metadata: its files would outlive the
// file system that names them, so the extra space buys nothing. The
// cluster's default layout is exempt (createFileSystem): every file system
// naming no layout has it already.
func (s *Server) checkLayoutSurvival(ctx context.Context, layout string, survives int) error {
	least, why, err := s.metadataSurvival(ctx)
	if err != nil {
		return err
	}
	if survives > least {
		return invalidf("data layout %s survives %d lost nodes, but this cluster's metadata survives %d (%s; 2f+1 survive f): create the cluster with --metadata-replicas %d and %d directory voters or more",
			layout, survives, least, why, 2*survives+1, 2*survives+1)
	}
	return nil
}

func (s *Server) createFileSystem(ctx context.Context, name, layout, tenant string) (*dpb.FileSystem, bool, error) {
	if err := CheckFileSystemName(name); err != nil {
		return nil, false, err
	}
	if !s.ready() {
		return nil, false, errNotReady
	}
	if layout != "" {
		lc, ok := s.data().(layoutChecker)
		if !ok {
			return nil, false, invalidf("data layout %q: this metadata server's data store has a single layout", layout)
		}
		var survives int
		var err error
		if layout, survives, err = lc.CheckLayout(ctx, layout); err != nil {
			return nil, false, invalidf("%v", err)
		}
		// The cluster's own default is what a file system naming no
		// layout gets: naming it explicitly must not be refused.
		def, err := lc.DefaultLayout(ctx)
		if err != nil {
			return nil, false, err
		}
		if layout != def {
			if err := s.checkLayoutSurvival(ctx, layout, survives); err != nil {
				return nil, false, err
			}
		}
	}
	created := true
	rec, err := s.cfg.Directory.CreateFileSystem(ctx, &dpb.CreateFileSystemRequest{Name: name, DataLayout: layout, Tenant: tenant})
	if errors.Is(err, directory.ErrAlreadyExists) {
		created = false
		rec, err = s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: name})
	}
	if err != nil {
		return nil, false, fmt.Errorf("create file system %q: %w", name, directoryError(err))
	}
	if rec.GetTenant() != tenant {
		return nil, false, errOtherTenant(name, rec.GetTenant(), tenant)
	}
	f := rec.GetNumber()
	if err := fs.Format(ctx, fs.BTreeMeta{Tree: s.tree()}, f, fs.DefaultLayout, time.Now()); err != nil {
		return nil, false, fmt.Errorf("format file system %q (number %d): %w", name, f, err)
	}
	tabs, err := s.tablesOf(ctx, f)
	if err != nil {
		return nil, false, err
	}
	if len(tabs) == 0 {
		start, end := rangeToKeys(fs.AllD)
		d, err := s.cfg.Directory.SetDelegation(ctx, &dpb.SetDelegationRequest{FileSystem: f, StartKey: start, EndKey: end,
			OwnerNode: s.cfg.Node, LeaseDurationMs: s.cfg.LeaseDuration.Milliseconds()})
		if err != nil {
			return nil, false, fmt.Errorf("delegate file system %q's first table: %w", name, err)
		}
		if err := s.acquire(ctx, d); err != nil {
			s.log.Warn("serving a new file system's first table; the delegation map will bring it", "fs", f, "err", err)
		}
	}
	return rec, created, nil
}

// DeleteFileSystem deletes a file system: its tables leave the delegation
// map (their owners stop serving them within a lease), then every key and
// blob of it goes, then its directory record. A tenant's is refused unless
// the record it looked up, whose number it deletes, is the tenant's.
func (s *Server) DeleteFileSystem(ctx context.Context, req *pb.DeleteFileSystemRequest) (*pb.DeleteFileSystemResponse, error) {
	if !s.ready() {
		return &pb.DeleteFileSystemResponse{Error: errorToPB(errNotReady)}, nil
	}
	rec, err := s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: req.GetName()})
	if err != nil {
		return &pb.DeleteFileSystemResponse{Error: errorToPB(fmt.Errorf("file system %q: %w", req.GetName(), directoryError(err)))}, nil
	}
	// The tenancy guard checked the name before this look-up, and the
	// name may have changed hands since (deleted, then created by another
	// tenant): the record checked is the record deleted, by its number,
	// which is never reused.
	if t, ok := security.CallerTenant(ctx); ok && rec.GetTenant() != t {
		return nil, security.PermissionDenied("file system %q is not tenant %q's", req.GetName(), t)
	}
	f := rec.GetNumber()
	j := s.jobs.start(req.GetJob())
	defer j.finish()
	j.phaseStart("unmap tables", 1, 3, "steps", 2)
	tabs, err := s.tablesOf(ctx, f)
	if err != nil {
		return &pb.DeleteFileSystemResponse{Error: errorToPB(err)}, nil
	}
	for _, d := range tabs {
		if _, err := s.cfg.Directory.DeleteDelegation(ctx, &dpb.DeleteDelegationRequest{TableId: d.GetTableId(), ExpectedEpoch: d.GetEpoch()}); err != nil && !directory.IsNotFound(err) {
			return &pb.DeleteFileSystemResponse{Error: errorToPB(fmt.Errorf("remove table %d: %w", d.GetTableId(), err))}, nil
		}
	}
	if len(tabs) > 0 {
		// No owner serves past its lease: after one, nothing writes.
		j.set(1, 0)
		if err := retry.Sleep(ctx, s.cfg.LeaseDuration); err != nil {
			return &pb.DeleteFileSystemResponse{Error: errorToPB(err)}, nil
		}
	}
	j.set(2, 0)
	s.mu.Lock()
	if st := s.fss[f]; st != nil {
		delete(s.fss, f)
		st.st.close()
	}
	s.mu.Unlock()
	stats, err := fs.DestroyProgress(ctx, fs.BTreeMeta{Tree: s.tree()}, s.data(), f, destroyProgress(j))
	if err != nil {
		return &pb.DeleteFileSystemResponse{Error: errorToPB(err)}, nil
	}
	if _, err := s.cfg.Directory.DeleteFileSystem(ctx, &dpb.DeleteFileSystemRequest{Number: f}); err != nil && !directory.IsNotFound(err) {
		return &pb.DeleteFileSystemResponse{Error: errorToPB(fmt.Errorf("delete the directory record of %q: %w", req.GetName(), err))}, nil
	}
	return &pb.DeleteFileSystemResponse{Number: f, Keys: uint64(stats.Keys), Blobs: uint64(stats.Blobs)}, nil
}

// CreateSnapshot takes a snapshot (snapshot.go): numbered by the
// directory, then freeze, bump and thaw.
func (s *Server) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.CreateSnapshotResponse, error) {
	n, err := s.createSnapshot(ctx, req.GetFs(), req.GetName())
	return &pb.CreateSnapshotResponse{Error: errorToPB(err), Number: n}, nil
}

func (s *Server) createSnapshot(ctx context.Context, f uint64, name string) (uint64, error) {
	if err := CheckSnapshotName(name); err != nil {
		return 0, err
	}
	st, err := s.fsOf(ctx, f)
	if err != nil {
		return 0, err
	}
	sn, err := s.cfg.Directory.CreateSnapshot(ctx, &dpb.CreateSnapshotRequest{FileSystem: f, Name: name})
	if err != nil {
		return 0, fmt.Errorf("number the snapshot: %w", directoryError(err))
	}
	if err := s.snapshotTables(ctx, st, sn.GetNumber(), name); err != nil {
		return 0, err
	}
	return sn.GetNumber(), nil
}

// directoryError gives the directory's refusals of bad input the errno
// they stand for (its other errors stay EIO).
func directoryError(err error) error {
	switch {
	case errors.Is(err, directory.ErrNotFound):
		return fmt.Errorf("%w: %w", syscall.ENOENT, err)
	case errors.Is(err, directory.ErrAlreadyExists):
		return fmt.Errorf("%w: %w", syscall.EEXIST, err)
	case errors.Is(err, directory.ErrInvalidArgument):
		return fmt.Errorf("%w: %w", errInvalid, err)
	}
	return err
}

// snapshotTables freezes f's tables for snapshot n, records it, thaws
// them, and has their owners read their headers after each step.
func (s *Server) snapshotTables(ctx context.Context, st *fsState, n uint64, name string) error {
	unlock, err := s.fsLock(st.f, "tables")(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	tabs, err := s.tablesOf(ctx, st.f)
	if err != nil {
		return err
	}
	los := make([]uint64, len(tabs))
	for i, d := range tabs {
		r, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
		if err != nil {
			return err
		}
		los[i] = r.Lo
	}
	// Owners first make what they answered durable and hold new writes,
	// so that the freeze aborts nothing answered early (an owner that does
	// not answer loses its entries in flight, and its clients replay them).
	if _, err := s.tellOwners(ctx, st.f, tabs, pb.TablesRequest_DRAIN); err != nil {
		s.log.Info("draining the tables' owners before a snapshot", "fs", st.f, "snapshot", n, "err", err)
	}
	for _, lo := range los {
		if err := freezeTable(ctx, s.tree(), st.f, lo, n); err != nil {
			return fmt.Errorf("freeze for snapshot %d: %w", n, err)
		}
	}
	s.tellOwners(ctx, st.f, tabs, pb.TablesRequest_REFRESH)
	err = takeSnapshot(ctx, s.tree(), st.direct, los, n, name)
	s.tellOwners(ctx, st.f, tabs, pb.TablesRequest_REFRESH)
	return err
}

// completeFrozen finishes the snapshot that froze a table served here
// longer than freezeTimeout ago: whoever began it died half way. A frozen
// table only ever thaws past its snapshot, so the snapshot is taken.
func (s *Server) completeFrozen(ctx context.Context, st *fsState) {
	for _, t := range st.st.owned() {
		if t.hdr.Frozen == 0 || time.Since(t.frozenSince) < freezeTimeout {
			continue
		}
		n := t.hdr.Frozen
		name := fmt.Sprintf("snapshot-%d", n)
		if rec, err := s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: st.f}); err == nil {
			for _, sn := range rec.GetSnapshots() {
				if sn.GetNumber() == n {
					name = sn.GetName()
				}
			}
		}
		s.log.Warn("finishing a snapshot whose coordinator stopped half way", "fs", st.f, "snapshot", n, "table", t.id)
		if err := s.snapshotTables(ctx, st, n, name); err != nil {
			s.log.Warn("finishing an interrupted snapshot", "fs", st.f, "snapshot", n, "err", err)
		}
		return
	}
}

// tellOwners asks the owner of each table to act on its tables of f,
// this server directly; owners that do not answer learn on their own
// (a failed commit, the frozen-table poll). It returns the sum of what
// they did.
func (s *Server) tellOwners(ctx context.Context, f uint64, tabs []*dpb.Delegation, op pb.TablesRequest_Op) (*pb.TablesResponse, error) {
	return s.tellOwnersJob(ctx, f, tabs, op, "")
}

// tellOwnersJob is tellOwners with the owners recording their progress
// under job (empty: not recorded).
func (s *Server) tellOwnersJob(ctx context.Context, f uint64, tabs []*dpb.Delegation, op pb.TablesRequest_Op, job string) (*pb.TablesResponse, error) {
	owners := map[uint64][]*pb.TableAt{}
	for _, d := range tabs {
		if o := d.GetOwnerNode(); o != 0 {
			owners[o] = append(owners[o], &pb.TableAt{Table: d.GetTableId(), Epoch: d.GetEpoch()})
		}
	}
	sum := &pb.TablesResponse{}
	var firstErr error
	for o, owned := range owners {
		var resp *pb.TablesResponse
		var err error
		req := &pb.TablesRequest{Fs: f, Op: op, Tables: owned, Job: job}
		if o == s.cfg.Node {
			resp, err = s.Tables(ctx, req)
		} else {
			var c pb.MetaClient
			if c, err = s.peers.client(ctx, o); err == nil {
				resp, err = c.Tables(ctx, req)
			}
		}
		if err == nil {
			err = errorFromPB(resp.GetError())
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", o, err)
			}
			continue
		}
		sum.Versions += resp.GetVersions()
		sum.Tracts += resp.GetTracts()
		sum.Blobs += resp.GetBlobs()
	}
	return sum, firstErr
}

// Tables acts on the tables of a file system served here.
func (s *Server) Tables(ctx context.Context, req *pb.TablesRequest) (*pb.TablesResponse, error) {
	if req.GetOp() == pb.TablesRequest_FOLLOW {
		if s.ready() {
			s.followMap(ctx)
		}
		return &pb.TablesResponse{}, nil
	}
	s.mu.Lock()
	st := s.fss[req.GetFs()]
	s.mu.Unlock()
	if req.GetOp() == pb.TablesRequest_SWEEP {
		// Sweeping only what is served here when the caller counts on a
		// table that is not would leave it unswept, and the snapshot's
		// versions in it would outlive the snapshot.
		for _, ta := range req.GetTables() {
			if st == nil || !st.st.has(ta.GetTable(), ta.GetEpoch()) {
				return &pb.TablesResponse{Error: errorToPB(fmt.Errorf("%w: table %d at epoch %d, to be swept", errNotOwner, ta.GetTable(), ta.GetEpoch()))}, nil
			}
		}
	}
	if st == nil {
		return &pb.TablesResponse{}, nil
	}
	switch req.GetOp() {
	case pb.TablesRequest_REFRESH:
		st.st.refreshHeaders(ctx, false)
		st.st.release()
		return &pb.TablesResponse{}, nil
	case pb.TablesRequest_DRAIN:
		// Files closed with their data still on the way first: their
		// flushes must not be held by the drain.
		if err := st.live.WaitHolds(ctx); err != nil {
			s.log.Info("a snapshot goes on without data still held by its writers", "fs", st.f, "err", err)
		}
		if err := st.st.drain(ctx, drainHold); err != nil {
			return &pb.TablesResponse{Error: errorToPB(err)}, nil
		}
		return &pb.TablesResponse{}, nil
	case pb.TablesRequest_SWEEP:
		if err := st.live.RefreshSnapshots(ctx); err != nil {
			return &pb.TablesResponse{Error: errorToPB(err)}, nil
		}
		resp := &pb.TablesResponse{}
		owned := st.st.owned()
		j := s.jobs.start(req.GetJob())
		defer j.finish()
		if j != nil {
			var total uint64
			for _, t := range owned {
				inodes, _, _ := st.st.cachedCounts(t.r)
				total += inodes
			}
			j.phaseStart("sweep", 1, 1, "inodes", total)
		}
		var swept uint64 // inodes of the tables swept before this one
		for _, t := range owned {
			var n int
			stats, err := st.live.SweepRangeProgress(ctx, t.r, func(inodes int) {
				n = inodes
				j.set(swept+uint64(inodes), 0)
			})
			if err != nil {
				return &pb.TablesResponse{Error: errorToPB(fmt.Errorf("sweep table %d: %w", t.id, err))}, nil
			}
			swept += uint64(n)
			resp.Versions += uint64(stats.Versions)
			resp.Tracts += uint64(stats.Tracts)
			resp.Blobs += uint64(stats.Blobs)
		}
		j.phaseDone()
		return resp, nil
	}
	return &pb.TablesResponse{Error: errorToPB(invalidf("unknown tables operation %v", req.GetOp()))}, nil
}

// DeleteSnapshot deletes a snapshot: marked deleting in the superblock,
// swept by the owner of every table, then its records removed.
func (s *Server) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*pb.DeleteSnapshotResponse, error) {
	j := s.jobs.start(req.GetJob())
	defer j.finish()
	resp, err := s.deleteSnapshot(ctx, req.GetFs(), req.GetNumber(), j, req.GetJob())
	if err != nil {
		return &pb.DeleteSnapshotResponse{Error: errorToPB(err)}, nil
	}
	return resp, nil
}

// j records its progress (nil: none); owners record their sweeps under
// job, which j's Progress adds up.
func (s *Server) deleteSnapshot(ctx context.Context, f, n uint64, j *job, jobID string) (*pb.DeleteSnapshotResponse, error) {
	if n == 0 {
		return nil, invalidf("snapshot 0 is the live file system")
	}
	st, err := s.fsOf(ctx, f)
	if err != nil {
		return nil, err
	}
	// A snapshot is in the directory's record from before it is taken
	// until its deletion is done: one not there was never taken, or is
	// deleted already.
	rec, err := s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f})
	if err != nil {
		return nil, fmt.Errorf("read the directory record of file system %d: %w", f, directoryError(err))
	}
	if !slices.ContainsFunc(rec.GetSnapshots(), func(sn *dpb.Snapshot) bool { return sn.GetNumber() == n }) {
		return nil, fmt.Errorf("file system %d has no snapshot %d: %w", f, n, syscall.ENOENT)
	}
	j.phaseStart("mark deleting", 1, 3, "steps", 1)
	if err := st.direct.MarkSnapshotDeleting(ctx, n); err != nil {
		return nil, err
	}
	j.set(1, 0)
	tabs, err := s.tablesOf(ctx, f)
	if err != nil {
		return nil, err
	}
	for _, d := range tabs {
		if d.GetOwnerNode() == 0 {
			return nil, fmt.Errorf("%w: table %d has no owner to sweep it now", errRetry, d.GetTableId())
		}
	}
	j.phaseStart("sweep", 2, 3, "inodes", 0)
	for o := range tableOwners(tabs) {
		j.addOwner(o)
	}
	sum, err := s.tellOwnersJob(ctx, f, tabs, pb.TablesRequest_SWEEP, sweepJob(jobID))
	if err != nil {
		// An owner that did not sweep (it died, the table moved): the
		// client asks again, and every step is idempotent.
		return nil, fmt.Errorf("%w: sweep for snapshot %d: %v", errRetry, n, err)
	}
	j.phaseStart("remove records", 3, 3, "steps", 2)
	if err := st.direct.RemoveSnapshotRecord(ctx, n); err != nil {
		return nil, err
	}
	j.set(1, 0)
	if _, err := s.cfg.Directory.DeleteSnapshot(ctx, &dpb.DeleteSnapshotRequest{FileSystem: f, Snapshot: n}); err != nil && !directory.IsNotFound(err) {
		return nil, fmt.Errorf("delete the directory record of snapshot %d: %w", n, err)
	}
	j.set(2, 0)
	return &pb.DeleteSnapshotResponse{Versions: sum.GetVersions(), Tracts: sum.GetTracts(), Blobs: sum.GetBlobs()}, nil
}

// Check checks a file system (fsck) from the tree itself: what every
// owner acknowledged is there.
func (s *Server) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	st, err := s.fsOf(ctx, req.GetFs())
	if err != nil {
		return &pb.CheckResponse{Error: errorToPB(err)}, nil
	}
	j := s.jobs.start(req.GetJob())
	defer j.finish()
	var inodes uint64
	if j != nil {
		inodes = s.fsInodeEstimate(ctx, req.GetFs())
	}
	// The check is not atomic: background work that was under way as it
	// read (an orphan reclaimed after an early-answered unlink, a commit)
	// can look like a problem. A problem stands only if passes a moment
	// apart all find it.
	var rep *fs.CheckReport
	for pass := 0; pass < checkPasses && (rep == nil || !rep.OK()); pass++ {
		if pass > 0 {
			if err := retry.Sleep(ctx, checkRecheck); err != nil {
				return &pb.CheckResponse{Error: errorToPB(err)}, nil
			}
		}
		opts := fs.CheckOptions{Data: req.GetData(), Progress: checkProgress(j, inodes, pass)}
		if rep, err = st.direct.Check(ctx, opts); err != nil {
			return &pb.CheckResponse{Error: errorToPB(err)}, nil
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return &pb.CheckResponse{Error: errorToPB(err)}, nil
	}
	return &pb.CheckResponse{ReportJson: b}, nil
}

// A check with problems is run again checkRecheck later, up to
// checkPasses passes in all (Check).
const (
	checkPasses  = 3
	checkRecheck = time.Second
)

// TableStats reports the tables served here.
func (s *Server) TableStats(ctx context.Context, req *pb.TableStatsRequest) (*pb.TableStatsResponse, error) {
	resp := &pb.TableStatsResponse{}
	for _, st := range s.fsStates() {
		for _, t := range st.st.owned() {
			inodes, keys, bytes := st.st.cachedCounts(t.r)
			if req.GetExact() {
				n, err := s.countInodes(ctx, st.f, t.r)
				if err != nil {
					return nil, err
				}
				inodes = n
			}
			ops, creates := st.stats.rates(t.id)
			resp.Tables = append(resp.Tables, &pb.TableStats{Table: t.id, Fs: st.f, Lo: t.r.Lo, Hi: t.r.Hi, Owner: s.cfg.Node,
				Epoch: t.epoch, Inodes: inodes, Keys: keys, CachedBytes: bytes, OpsPerSecond: ops, CreatesPerSecond: creates,
				WriteEpoch: t.hdr.W, Frozen: t.hdr.Frozen})
		}
	}
	return resp, nil
}

// countInodes counts the inodes of file system f whose directory id is in
// r, from the tree (durable state: what every owner acknowledged).
func (s *Server) countInodes(ctx context.Context, f uint64, r fs.DRange) (uint64, error) {
	from := fs.DirRanges(f, r.Lo)[0][0]
	var to []byte
	if r.Hi != 0 {
		to = fs.DirRanges(f, r.Hi)[0][0]
	} else {
		to = fs.DirRanges(f, ^uint64(0))[0][1]
	}
	var n uint64
	var last []byte
	err := s.tree().Scan(ctx, from, to, func(k, v []byte) error {
		if p, ok := fs.InodePrefix(k); ok && !bytes.Equal(p, last) {
			last = append(last[:0], p...)
			if live, err := fs.LiveVersion(v); err == nil && live {
				n++
			}
		}
		return nil
	})
	return n, err
}
