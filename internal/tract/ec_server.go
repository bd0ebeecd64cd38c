package tract

import (
	"context"
	"errors"
	"fmt"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// This file is the tractserver's side of erasure-coded blobs (ec.go has
// the layout and the client's side): storing and serving one shard.

// checkShard validates a shard description against the TLT's width.
func checkShard(s *tpb.Shard, width int) error {
	if s == nil {
		return invalidf("a shard write needs its shard description")
	}
	ec := ECLayout{Data: int(s.GetEc().GetData()), Parity: int(s.GetEc().GetParity())}
	if err := ec.check(width); err != nil {
		return err
	}
	if int(s.Index) >= ec.Width() {
		return invalidf("shard %d of a stripe of %d", s.Index, ec.Width())
	}
	if s.WriteId == 0 {
		return invalidf("shard write id 0")
	}
	return nil
}

// shardRole returns the row and checks that this tractserver holds slot
// index of it (or is a pending entry for that slot) at the given version.
func (d *disk) shardRow(ctx context.Context, k tractKey, version uint64, index int, allowOther bool) (*Table, int, Row, error) {
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, 0, Row{}, err
	}
	ri := t.Locate(k.guid, k.tract)
	t, row, err := d.svc.rowAt(ctx, ri, version)
	if err != nil {
		return nil, 0, Row{}, err
	}
	slot, _, ok := row.RoleOf(d.id)
	if !ok || (!allowOther && slot != index) {
		return nil, 0, Row{}, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s does not hold slot %d of row %d at version %d", d.id, index, ri, row.Version)
	}
	return t, ri, row, nil
}

// writeShard stores one shard sent by a client: this server must hold the
// shard's slot (or be pending for it) in the tract's row at the request's
// version. The shard is this server's only; nothing is forwarded.
func (d *disk) writeShard(ctx context.Context, req *tpb.WriteShardRequest) (*tpb.WriteShardResponse, error) {
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
	if err := checkShard(req.Shard, t.Replication); err != nil {
		return nil, err
	}
	if int(req.Shard.TractLength) > t.TractSize {
		return nil, invalidf("tract length %d; the tract size is %d", req.Shard.TractLength, t.TractSize)
	}
	ec := layoutOf(req.Shard.Ec)
	if want := ec.ShardSize(int(req.Shard.TractLength)); len(req.Data) != want {
		return nil, invalidf("shard is %d bytes; a tract of %d bytes in %s has shards of %d", len(req.Data), req.Shard.TractLength, ec, want)
	}
	if Checksum(req.Data) != req.Crc32C {
		return nil, invalidf("shard checksum %08x does not match the request's %08x (corrupted in transit)", Checksum(req.Data), req.Crc32C)
	}
	_, ri, row, err := d.shardRow(ctx, k, req.RowVersion, int(req.Shard.Index), false)
	if err != nil {
		return nil, err
	}
	var expect *tpb.Stamp
	if req.Conditional {
		expect = &tpb.Stamp{}
		if req.Expect != nil {
			expect = req.Expect
		}
	}
	stamp, err := d.putShard(k, ri, row.Version, req.Incarnation, req.Shard, req.Data, expect, func(stored uint64) error {
		return d.checkTenantLife(ctx, k, req.Incarnation, stored)
	})
	if errors.Is(err, errShardChanged) || errors.Is(err, errShardNewer) {
		return nil, errorf(tpb.ErrorCode_REPLICA_FAILED, "tract %s: %v", k, err)
	}
	if err != nil {
		return nil, err
	}
	d.svc.m.tractsWritten.Add(1)
	d.svc.m.bytesWritten.Add(uint64(len(req.Data)))
	return &tpb.WriteShardResponse{Stamp: stamp}, nil
}

// errShardChanged says a rebuilt shard was not installed because the
// stored one changed since the rebuild read it.
var errShardChanged = errors.New("the shard was rewritten during its rebuild")

// errShardNewer refuses a client's shard write older than the shard held.
var errShardNewer = errors.New("a newer write of this stripe is held")

// putShard stores a shard under the tract's lock with the next stamp. With
// expect set (a rebuild), it installs only if the stored record still has
// that stamp (or there is none and expect is the zero stamp). checkLife,
// if set, is asked under the lock about the life of the stored record (0:
// none) and refuses by returning an error (a tenant's write: tenancy.go).
func (d *disk) putShard(k tractKey, ri int, version, incarnation uint64, s *tpb.Shard, data []byte, expect *tpb.Stamp, checkLife func(stored uint64) error) (*tpb.Stamp, error) {
	unlock := d.locks.lock(k)
	defer unlock()
	cur, ok := d.store.Get(k)
	if checkLife != nil {
		if err := checkLife(cur.GetIncarnation()); err != nil {
			return nil, err
		}
	}
	if expect != nil {
		if ok != (expect.RowVersion != 0) || ok && !stampEqual(cur.Stamp, expect) {
			return nil, errShardChanged
		}
	} else if ok && cur.Shard != nil && cur.Incarnation == incarnation && cur.Shard.WriteId != s.WriteId && s.Generation <= cur.Shard.Generation {
		// A client write no newer than the one held: a late retry, or a
		// concurrent writer (they must coordinate). It changes nothing.
		return nil, fmt.Errorf("%w: generation %d (write %016x) is held, this write's is %d", errShardNewer, cur.Shard.Generation, cur.Shard.WriteId, s.Generation)
	}
	stamp, err := nextStamp(cur, version)
	if err != nil {
		return nil, err
	}
	m := &tpb.TractMeta{
		Row: uint32(ri), Stamp: stamp, Length: uint32(len(data)), Crc32C: Checksum(data),
		Replication: 1, Incarnation: incarnation, WrittenUnixMs: d.svc.cfg.Now().UnixMilli(), Shard: s,
	}
	if err := d.store.Put(k, m, data); err != nil {
		return nil, err
	}
	return stamp, nil
}

// readShard serves the shard this server holds for a tract, whichever
// index it is: any member of the row (slot or pending) may be asked, and a
// shard needs no catch-up to be served (it is this server's own).
func (d *disk) readShard(ctx context.Context, req *tpb.ReadShardRequest) (*tpb.ReadTractResponse, error) {
	k, err := checkTract(req.Guid, req.Tract, false)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := d.shardRow(ctx, k, req.RowVersion, 0, true); err != nil {
		return nil, err
	}
	m, ok := d.store.Get(k)
	if !ok || m.Shard == nil || (req.Incarnation != 0 && m.Incarnation != req.Incarnation) {
		return &tpb.ReadTractResponse{}, nil
	}
	return d.serveRead(k, m, req.MetaOnly, "the stripe's other shards rebuild it")
}

// WriteShard implements tractpb.TractServerServer.
func (s *Service) WriteShard(ctx context.Context, req *tpb.WriteShardRequest) (*tpb.WriteShardResponse, error) {
	d, err := s.writableDisk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.writeShard(ctx, req)
	return resp, toStatus(ctx, err)
}

// ReadShard implements tractpb.TractServerServer.
func (s *Service) ReadShard(ctx context.Context, req *tpb.ReadShardRequest) (*tpb.ReadTractResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.readShard(ctx, req)
	return resp, toStatus(ctx, err)
}
