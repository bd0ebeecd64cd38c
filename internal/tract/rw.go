package tract

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// checkTract validates a request's blob id and tract number.
func checkTract(guid []byte, tract int64, allowMeta bool) (tractKey, error) {
	g, err := guidFromBytes(guid)
	if err != nil {
		return tractKey{}, invalidf("%v", err)
	}
	if tract < 0 && !(allowMeta && tract == MetadataTract) {
		return tractKey{}, invalidf("tract %d: tract numbers start at 0", tract)
	}
	if tract >= maxBlobTracts {
		return tractKey{}, invalidf("tract %d: a blob has at most %d tracts (maxBlobTracts)", tract, int64(maxBlobTracts))
	}
	return tractKey{guid: g, tract: tract}, nil
}

// nextStamp gives the next write of a tract its stamp under row version v.
func nextStamp(cur *tpb.TractMeta, v uint64) (*tpb.Stamp, error) {
	if cur == nil || cur.Stamp.GetRowVersion() < v {
		return &tpb.Stamp{RowVersion: v, Seq: 1}, nil
	}
	if cur.Stamp.GetRowVersion() > v {
		return nil, errorf(tpb.ErrorCode_TLT_BEHIND, "the tract was written at row version %d, newer than %d", cur.Stamp.GetRowVersion(), v)
	}
	return &tpb.Stamp{RowVersion: v, Seq: cur.Stamp.GetSeq() + 1}, nil
}

// writeTract is a client write, served by the row's primary: stamp, store
// locally, forward to every other replica, reply once all have it.
func (d *disk) writeTract(ctx context.Context, req *tpb.WriteTractRequest) (*tpb.WriteTractResponse, error) {
	k, err := checkTract(req.Guid, req.Tract, false)
	if err != nil {
		return nil, err
	}
	if req.Incarnation == 0 {
		return nil, invalidf("incarnation 0: open the blob first")
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, err
	}
	if req.Replication < 1 || int(req.Replication) > t.Replication {
		return nil, invalidf("replication %d: must be in [1, %d] (the TLT's)", req.Replication, t.Replication)
	}
	if len(req.Data) > t.TractSize {
		return nil, invalidf("tract data is %d bytes; the tract size is %d", len(req.Data), t.TractSize)
	}
	if Checksum(req.Data) != req.Crc32C {
		return nil, invalidf("data checksum %08x does not match the request's %08x (corrupted in transit)", Checksum(req.Data), req.Crc32C)
	}
	ri := t.Locate(k.guid, k.tract)
	t, row, err := d.svc.rowAt(ctx, ri, req.RowVersion)
	if err != nil {
		return nil, err
	}
	if role, _ := roleOf(row, d.id); role != tpb.RowRole_ROW_ROLE_PRIMARY {
		return nil, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s is not the primary of row %d at version %d", d.id, ri, row.Version)
	}
	unlock := d.locks.lock(k)
	defer unlock()
	cur, _ := d.store.Get(k)
	if err := d.checkTenantLife(ctx, k, req.Incarnation, cur.GetIncarnation()); err != nil {
		return nil, err
	}
	stamp, err := nextStamp(cur, row.Version)
	if err != nil {
		return nil, err
	}
	m := &tpb.TractMeta{
		Row: uint32(ri), Stamp: stamp, Length: uint32(len(req.Data)), Crc32C: req.Crc32C,
		Replication: req.Replication, Incarnation: req.Incarnation, WrittenUnixMs: d.svc.cfg.Now().UnixMilli(),
	}
	if err := d.store.PutUnforwarded(k, m, req.Data); err != nil {
		return nil, err
	}
	if err := d.forward(ctx, t, ri, row, k, m, req.Data, row.Targets(int(req.Replication))); err != nil {
		d.markUnforwarded(k)
		return nil, err
	}
	d.forwarded(k)
	d.svc.m.tractsWritten.Add(1)
	d.svc.m.bytesWritten.Add(uint64(len(req.Data)))
	return &tpb.WriteTractResponse{Stamp: stamp}, nil
}

// forward sends a stored version of a tract to the other members and waits
// for all of them.
func (d *disk) forward(ctx context.Context, t *Table, ri int, row Row, k tractKey, m *tpb.TractMeta, data []byte, targets []ServerID) error {
	return d.forwardFailed(ri, row, targets, d.forwardTo(ctx, row, k, m, data, targets))
}

// forwardTo sends a stored version of a tract to targets in parallel and
// returns each one's failure (nil: it stored the version).
func (d *disk) forwardTo(ctx context.Context, row Row, k tractKey, m *tpb.TractMeta, data []byte, targets []ServerID) []error {
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, target := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.svc.peer(ctx, target)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
				_, err = c.Replicate(cctx, &tpb.ReplicateRequest{
					Disk: target.Disk, Guid: k.guid[:], Tract: k.tract, RowVersion: row.Version, Meta: m, Data: data,
				})
				cancel()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errs
}

// forwardFailed turns the targets' failures of a forward into its error
// (nil if every target stored the version).
func (d *disk) forwardFailed(ri int, row Row, targets []ServerID, errs []error) error {
	var failed []error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("replica %s: %w", targets[i], err))
			if te, ok := ErrorOf(err); ok && (te.Code == tpb.ErrorCode_STALE_TLT || te.Code == tpb.ErrorCode_WRONG_SERVER) {
				d.svc.refreshSoon()
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return errorf(tpb.ErrorCode_REPLICA_FAILED, "row %d version %d: %v", ri, row.Version, errors.Join(failed...))
}

// forwardRecord forwards a blob's metadata record (tract -1) to the
// row's other members, as forward does, and also lets the operation be
// acknowledged without some of them (the package doc, "Blob metadata
// with a member missing"): when every member that did not store it is
// on a node the directory has declared dead (its Replicate refused,
// cut off from the directory, or timed out) and a majority of the row's
// slots (this primary included) hold it. A member declared dead catches
// up every row it holds before it serves again (its TLT continuity is
// broken), and a successor catches up from the primary, so no member
// serves the row without the record; the majority bounds how far a row
// writes on with members missing.
func (d *disk) forwardRecord(ctx context.Context, t *Table, ri int, row Row, k tractKey, m *tpb.TractMeta) error {
	targets := row.Targets(t.Replication)
	errs := d.forwardTo(ctx, row, k, m, nil, targets)
	err := d.forwardFailed(ri, row, targets, errs)
	if err == nil || ctx.Err() != nil {
		return err
	}
	holders := 1 // this primary
	for i, target := range targets {
		if errs[i] == nil {
			if slices.Contains(row.Slots, target) {
				holders++
			}
			continue
		}
		if !d.svc.declaredDead(ctx, target.Node, errs[i]) {
			return err
		}
	}
	if 2*holders <= len(row.Slots) {
		return err
	}
	d.svc.m.degradedBlobOps.Add(1)
	d.log.Info("blob operation acknowledged with row members missing: their nodes are declared dead; they catch up when back",
		"tract", k, "row", ri, "version", row.Version, "holders", holders, "slots", len(row.Slots), "err", err)
	return nil
}

// replicate installs a tract version the row's primary forwarded.
func (d *disk) replicate(ctx context.Context, req *tpb.ReplicateRequest) error {
	k, err := checkTract(req.Guid, req.Tract, true)
	if err != nil {
		return err
	}
	m := req.Meta
	if m == nil || m.Stamp == nil {
		return invalidf("replicate without a record")
	}
	if (k.tract == MetadataTract) != (m.Blob != nil) {
		return invalidf("tract %d: a metadata record goes with tract -1 only", k.tract)
	}
	if m.Blob == nil && (len(req.Data) != int(m.Length) || Checksum(req.Data) != m.Crc32C) {
		return invalidf("tract %s: data does not match its record (corrupted in transit)", k)
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return err
	}
	ri := t.Locate(k.guid, k.tract)
	if _, row, err := d.svc.rowAt(ctx, ri, req.RowVersion); err != nil {
		return err
	} else if role, _ := roleOf(row, d.id); role == tpb.RowRole_ROW_ROLE_NONE || role == tpb.RowRole_ROW_ROLE_PRIMARY {
		return errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s is not a replica of row %d at version %d", d.id, ri, row.Version)
	}
	unlock := d.locks.lock(k)
	defer unlock()
	cur, _ := d.store.Get(k)
	if cur != nil && !stampLess(cur.Stamp, m.Stamp) {
		return nil // already has it (or a newer one): a repeat
	}
	m = proto.Clone(m).(*tpb.TractMeta)
	m.Row = uint32(ri)
	if err := d.store.Put(k, m, req.Data); err != nil {
		return err
	}
	d.svc.m.tractsReplicated.Add(1)
	d.svc.m.bytesReplicated.Add(uint64(len(req.Data)))
	return nil
}

// readTract serves a client read from a slot member that is readable.
func (d *disk) readTract(ctx context.Context, req *tpb.ReadTractRequest) (*tpb.ReadTractResponse, error) {
	k, err := checkTract(req.Guid, req.Tract, false)
	if err != nil {
		return nil, err
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, err
	}
	ri := t.Locate(k.guid, k.tract)
	_, row, err := d.svc.rowAt(ctx, ri, req.RowVersion)
	if err != nil {
		return nil, err
	}
	role, _ := roleOf(row, d.id)
	if role != tpb.RowRole_ROW_ROLE_PRIMARY && role != tpb.RowRole_ROW_ROLE_REPLICA {
		return nil, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s holds no slot of row %d at version %d", d.id, ri, row.Version)
	}
	if st, ok := d.member(uint32(ri)); !ok || !st.readable || st.version != row.Version {
		return nil, errorf(tpb.ErrorCode_NOT_READABLE, "tractserver %s is catching up row %d", d.id, ri)
	}
	m, ok := d.store.Get(k)
	if !ok || m.Shard != nil || (req.Incarnation != 0 && m.Incarnation != req.Incarnation) {
		return &tpb.ReadTractResponse{}, nil
	}
	return d.serveRead(k, m, req.MetaOnly, "read another replica")
}

// serveRead answers a read of a stored tract (or shard): its record, and
// its data unless metaOnly. A checksum failure is never served: it starts
// a repair and answers CORRUPT, with hint saying where to read instead.
func (d *disk) serveRead(k tractKey, m *tpb.TractMeta, metaOnly bool, hint string) (*tpb.ReadTractResponse, error) {
	if metaOnly {
		return &tpb.ReadTractResponse{Found: true, Meta: m}, nil
	}
	data, err := d.store.ReadData(k, m)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			d.corrupt(k, err)
			return nil, errorf(tpb.ErrorCode_CORRUPT, "%v; %s", err, hint)
		}
		return nil, err
	}
	d.svc.m.tractsRead.Add(1)
	d.svc.m.bytesRead.Add(uint64(len(data)))
	return &tpb.ReadTractResponse{Found: true, Data: data, Meta: m}, nil
}

// blobOp runs a metadata operation as the primary of the blob's metadata
// row: it reads the current record, decides, stores the new one and
// forwards it to every replica before replying (FDS §2.3, §3.1).
func (d *disk) blobOp(ctx context.Context, req *tpb.BlobOpRequest) (*tpb.BlobOpResponse, error) {
	k, err := checkTract(req.Guid, MetadataTract, true)
	if err != nil {
		return nil, err
	}
	if len(req.RequestId) > maxRequestIDBytes {
		return nil, invalidf("request id is %d bytes; at most %d (maxRequestIDBytes)", len(req.RequestId), maxRequestIDBytes)
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case tpb.BlobOpKind_BLOB_OP_CREATE:
		if req.Ec != nil {
			if req.Replication != 0 {
				return nil, invalidf("an erasure-coded blob has no replication level (got %d)", req.Replication)
			}
			if err := layoutOf(req.Ec).check(t.Replication); err != nil {
				return nil, err
			}
			req.Replication = uint32(layoutOf(req.Ec).Width())
		}
		if req.Replication < 1 || int(req.Replication) > t.Replication {
			return nil, invalidf("replication %d: must be in [1, %d] (the TLT's)", req.Replication, t.Replication)
		}
		if req.ExtendTracts > maxExtendTracts {
			return nil, invalidf("create with %d tracts: at most %d (maxExtendTracts)", req.ExtendTracts, maxExtendTracts)
		}
	case tpb.BlobOpKind_BLOB_OP_EXTEND:
		if req.ExtendTracts < 1 || req.ExtendTracts > maxExtendTracts {
			return nil, invalidf("extend by %d tracts: must be in [1, %d] (maxExtendTracts)", req.ExtendTracts, maxExtendTracts)
		}
	case tpb.BlobOpKind_BLOB_OP_GET, tpb.BlobOpKind_BLOB_OP_DELETE:
	default:
		return nil, invalidf("unknown blob operation %v", req.Op)
	}
	ri := t.Locate(k.guid, k.tract)
	t, row, err := d.svc.rowAt(ctx, ri, req.RowVersion)
	if err != nil {
		return nil, err
	}
	if role, _ := roleOf(row, d.id); role != tpb.RowRole_ROW_ROLE_PRIMARY {
		return nil, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s is not the primary of row %d at version %d", d.id, ri, row.Version)
	}
	if st, ok := d.member(uint32(ri)); !ok || !st.inSync || st.version != row.Version {
		// A new primary must hold the blob's record before it decides.
		return nil, errorf(tpb.ErrorCode_NOT_READABLE, "tractserver %s is catching up row %d as its new primary", d.id, ri)
	}
	unlock := d.locks.lock(k)
	defer unlock()
	cur, _ := d.store.Get(k)
	var old *tpb.BlobMeta
	if cur != nil {
		old = cur.Blob
	}
	live := old != nil && !old.Deleted
	tenant, err := blobTenant(ctx, req, old, live)
	if err != nil {
		return nil, err
	}
	if req.Op == tpb.BlobOpKind_BLOB_OP_GET {
		if !live {
			return nil, errorf(tpb.ErrorCode_BLOB_NOT_FOUND, "blob %s does not exist", k.guid)
		}
		return &tpb.BlobOpResponse{Meta: old}, nil
	}
	if prev, ok := recentResult(old, req.RequestId); ok {
		// A retry of a mutation that was applied here. The first attempt
		// may have failed in its forward (a replica unreachable, the reply
		// lost): forward the record again, so that the retry is answered
		// only once every replica holds it, as the first would have been.
		// A replica that has it already takes the repeat as a no-op.
		if err := d.forwardRecord(ctx, t, ri, row, k, cur); err != nil {
			d.markUnforwarded(k)
			return nil, err
		}
		d.forwarded(k)
		out := proto.Clone(old).(*tpb.BlobMeta)
		out.LengthTracts = prev
		return &tpb.BlobOpResponse{Meta: out}, nil
	}
	now := d.svc.cfg.Now().UnixMilli()
	var nb *tpb.BlobMeta
	switch req.Op {
	case tpb.BlobOpKind_BLOB_OP_CREATE:
		if live {
			return nil, errorf(tpb.ErrorCode_BLOB_EXISTS, "blob %s already exists", k.guid)
		}
		nb = &tpb.BlobMeta{Replication: req.Replication, Incarnation: newIncarnation(old), CreatedUnixMs: now, ModifiedUnixMs: now,
			LengthTracts: req.ExtendTracts, Ec: req.Ec, Tenant: tenant}
	case tpb.BlobOpKind_BLOB_OP_EXTEND:
		if !live {
			return nil, errorf(tpb.ErrorCode_BLOB_NOT_FOUND, "blob %s does not exist", k.guid)
		}
		if old.LengthTracts+req.ExtendTracts > maxBlobTracts {
			return nil, invalidf("blob %s would have %d tracts; at most %d (maxBlobTracts)", k.guid, old.LengthTracts+req.ExtendTracts, int64(maxBlobTracts))
		}
		nb = proto.Clone(old).(*tpb.BlobMeta)
		nb.LengthTracts += req.ExtendTracts
		nb.ModifiedUnixMs = now
	case tpb.BlobOpKind_BLOB_OP_DELETE:
		if !live {
			return nil, errorf(tpb.ErrorCode_BLOB_NOT_FOUND, "blob %s does not exist", k.guid)
		}
		nb = proto.Clone(old).(*tpb.BlobMeta)
		nb.Deleted = true
		nb.ModifiedUnixMs = now
	}
	if len(req.RequestId) > 0 {
		nb.Recent = append(nb.Recent, &tpb.RecentRequest{Id: req.RequestId, ResultTracts: nb.LengthTracts})
		if len(nb.Recent) > recentRequests {
			nb.Recent = nb.Recent[len(nb.Recent)-recentRequests:]
		}
	}
	stamp, err := nextStamp(cur, row.Version)
	if err != nil {
		return nil, err
	}
	m := &tpb.TractMeta{Row: uint32(ri), Stamp: stamp, Replication: uint32(t.Replication), Incarnation: nb.Incarnation,
		WrittenUnixMs: now, Blob: nb}
	if err := d.store.PutUnforwarded(k, m, nil); err != nil {
		return nil, err
	}
	if nb.Deleted {
		// This server refuses the dead life at once (tenancy.go).
		d.svc.owners.forget(k.guid)
	}
	if err := d.forwardRecord(ctx, t, ri, row, k, m); err != nil {
		d.markUnforwarded(k)
		return nil, err
	}
	d.forwarded(k)
	d.svc.m.blobOps.Add(1)
	return &tpb.BlobOpResponse{Meta: nb}, nil
}

func recentResult(b *tpb.BlobMeta, id []byte) (uint64, bool) {
	if b == nil || len(id) == 0 {
		return 0, false
	}
	for _, r := range b.Recent {
		if bytes.Equal(r.Id, id) {
			return r.ResultTracts, true
		}
	}
	return 0, false
}

// newIncarnation picks a random non-zero incarnation different from the
// previous life's.
func newIncarnation(old *tpb.BlobMeta) uint64 {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		v := binary.BigEndian.Uint64(b[:])
		if v != 0 && (old == nil || v != old.Incarnation) {
			return v
		}
	}
}

// listRow lists a row's tracts for a catch-up (from the primary) or a
// verification (any member, row version 0).
func (d *disk) listRow(ctx context.Context, req *tpb.ListRowRequest) (*tpb.ListRowResponse, error) {
	if req.RowVersion != 0 {
		// A catch-up source: the primary, or a replica a new primary
		// pulls from; either must be complete.
		_, row, err := d.svc.rowAt(ctx, int(req.Row), req.RowVersion)
		if err != nil {
			return nil, err
		}
		if role, _ := roleOf(row, d.id); role != tpb.RowRole_ROW_ROLE_PRIMARY && role != tpb.RowRole_ROW_ROLE_REPLICA {
			return nil, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s holds no slot of row %d at version %d", d.id, req.Row, row.Version)
		}
		if st, ok := d.member(req.Row); !ok || !st.readable || st.version != row.Version {
			return nil, errorf(tpb.ErrorCode_NOT_READABLE, "tractserver %s is catching up row %d itself", d.id, req.Row)
		}
	}
	limit := int(req.Limit)
	if limit == 0 || limit > maxListEntries {
		limit = maxListEntries
	}
	var after *tractKey
	if len(req.AfterGuid) > 0 {
		g, err := guidFromBytes(req.AfterGuid)
		if err != nil {
			return nil, invalidf("after_guid: %v", err)
		}
		after = &tractKey{guid: g, tract: req.AfterTract}
	}
	resp := &tpb.ListRowResponse{}
	for _, k := range d.store.RowTracts(req.Row) {
		if after != nil && !after.less(k) {
			continue
		}
		m, ok := d.store.Get(k)
		if !ok || m.Stamp.GetRowVersion() < req.SinceVersion {
			continue
		}
		if (m.Shard != nil) != req.Shards {
			continue // shards are listed only when asked for, and then alone
		}
		if m.Blob == nil && m.Replication < req.MinReplication {
			continue
		}
		if len(resp.Entries) >= limit {
			resp.More = true
			break
		}
		e := &tpb.TractEntry{Guid: append([]byte(nil), k.guid[:]...), Tract: k.tract, Meta: m}
		if req.Verify {
			_, err := d.store.ReadData(k, m)
			e.Verified = err == nil
			if errors.Is(err, ErrCorrupt) {
				d.corrupt(k, err)
			}
		}
		resp.Entries = append(resp.Entries, e)
	}
	if st, ok := d.member(req.Row); ok {
		resp.Row = &tpb.RowStatus{Row: req.Row, Version: st.version, Role: st.role, Slot: uint32(st.slot), InSync: st.inSync, Readable: st.readable}
	} else {
		resp.Row = &tpb.RowStatus{Row: req.Row}
	}
	return resp, nil
}

// fetchTract returns a tract to a member catching up (or repairing) from
// this one, which must be the row's primary or a readable member.
func (d *disk) fetchTract(ctx context.Context, req *tpb.FetchTractRequest) (*tpb.FetchTractResponse, error) {
	k, err := checkTract(req.Guid, req.Tract, true)
	if err != nil {
		return nil, err
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, err
	}
	ri := t.Locate(k.guid, k.tract)
	if _, _, err := d.svc.rowAt(ctx, ri, req.RowVersion); err != nil {
		return nil, err
	}
	if st, ok := d.member(uint32(ri)); !ok || !st.readable {
		return nil, errorf(tpb.ErrorCode_NOT_READABLE, "tractserver %s cannot serve row %d", d.id, ri)
	}
	m, ok := d.store.Get(k)
	if !ok {
		return &tpb.FetchTractResponse{}, nil
	}
	data, err := d.store.ReadData(k, m)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			d.corrupt(k, err)
			return nil, errorf(tpb.ErrorCode_CORRUPT, "%v", err)
		}
		return nil, err
	}
	return &tpb.FetchTractResponse{Found: true, Data: data, Meta: m}, nil
}

// requestSync queues a catch-up of a row this server is a replica of.
func (d *disk) requestSync(ctx context.Context, req *tpb.SyncRowRequest) error {
	if _, _, err := d.svc.rowAt(ctx, int(req.Row), req.RowVersion); err != nil {
		return err
	}
	d.mu.Lock()
	st := d.rows[req.Row]
	if st == nil || !st.member || st.role == tpb.RowRole_ROW_ROLE_PRIMARY {
		d.mu.Unlock()
		return errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s is not a replica of row %d", d.id, req.Row)
	}
	d.queued[req.Row] = true
	d.mu.Unlock()
	d.kick()
	return nil
}

// listBlobs lists the metadata records this server holds as primary.
func (d *disk) listBlobs(req *tpb.ListBlobsRequest) (*tpb.ListBlobsResponse, error) {
	limit := int(req.Limit)
	if limit == 0 || limit > maxListEntries {
		limit = maxListEntries
	}
	var after GUID
	hasAfter := len(req.AfterGuid) > 0
	if hasAfter {
		g, err := guidFromBytes(req.AfterGuid)
		if err != nil {
			return nil, invalidf("after_guid: %v", err)
		}
		after = g
	}
	resp := &tpb.ListBlobsResponse{}
	for _, k := range d.store.Keys() {
		if k.tract != MetadataTract || (hasAfter && bytes.Compare(k.guid[:], after[:]) <= 0) {
			continue
		}
		m, ok := d.store.Get(k)
		if !ok || m.Blob == nil || (m.Blob.Deleted && !req.Deleted) {
			continue
		}
		if st, ok := d.member(m.Row); !ok || st.role != tpb.RowRole_ROW_ROLE_PRIMARY {
			continue
		}
		if len(resp.Blobs) >= limit {
			resp.More = true
			break
		}
		resp.Blobs = append(resp.Blobs, &tpb.BlobEntry{Guid: append([]byte(nil), k.guid[:]...), Meta: m.Blob})
	}
	return resp, nil
}
