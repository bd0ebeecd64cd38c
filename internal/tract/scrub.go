package tract

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// corrupt records a checksum failure found while serving and repairs the
// tract in the background.
func (d *disk) corrupt(k tractKey, err error) {
	d.svc.m.checksumFailures.Add(1)
	d.log.Error("corrupt tract; repairing it from another replica", "tract", k, "err", err)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*d.svc.cfg.RPCTimeout)
		defer cancel()
		if _, err := d.repair(ctx, k); err != nil {
			d.log.Error("repair failed", "tract", k, "err", err)
		}
	}()
}

// repair replaces a corrupt tract with a good copy: a replica takes the
// primary's version (the row's truth); the primary takes a replica's copy
// of the same version.
func (d *disk) repair(ctx context.Context, k tractKey) (bool, error) {
	unlockKey := d.locks.lock(k)
	own, ok := d.store.Get(k)
	unlockKey()
	if !ok {
		return false, nil
	}
	if _, err := d.store.ReadData(k, own); err == nil {
		return false, nil // repaired meanwhile
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return false, err
	}
	ri := t.Locate(k.guid, k.tract)
	row := t.Rows[ri]
	role, _ := roleOf(row, d.id)
	if role == tpb.RowRole_ROW_ROLE_NONE {
		return false, fmt.Errorf("tractserver %s is not in row %d any more", d.id, ri)
	}
	var sources []ServerID
	for i, s := range row.Slots {
		if s == d.id || (own.Blob == nil && i >= int(own.Replication)) {
			continue
		}
		sources = append(sources, s)
	}
	var errs []error
	for _, src := range sources {
		c, err := d.svc.peer(ctx, src)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
		f, err := c.FetchTract(fctx, &tpb.FetchTractRequest{Disk: src.Disk, Guid: k.guid[:], Tract: k.tract, RowVersion: row.Version})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		if !f.Found || f.Meta == nil {
			continue
		}
		fromPrimary := src == row.Slots[0]
		if !fromPrimary && !stampEqual(f.Meta.Stamp, own.Stamp) {
			continue
		}
		if f.Meta.Blob == nil && (len(f.Data) != int(f.Meta.Length) || Checksum(f.Data) != f.Meta.Crc32C) {
			continue
		}
		unlock := d.locks.lock(k)
		cur, ok := d.store.Get(k)
		if ok && !stampEqual(cur.Stamp, own.Stamp) {
			unlock()
			return false, nil // rewritten meanwhile
		}
		m := proto.Clone(f.Meta).(*tpb.TractMeta)
		m.Row = uint32(ri)
		err = d.store.Put(k, m, f.Data)
		unlock()
		if err != nil {
			return false, err
		}
		d.svc.m.repairs.Add(1)
		d.log.Info("repaired corrupt tract", "tract", k, "from", src, "stamp", stampString(m.Stamp))
		return true, nil
	}
	return false, fmt.Errorf("tract %s: no good copy found: %w", k, errors.Join(errs...))
}

// scrub runs one pass of the scrubber: with verify, every tract is re-read
// and a corrupt one repaired; then tracts of deleted blobs (FDS §2.3: a
// scrubber finds tracts with no metadata) and data files no record names
// are reclaimed once older than the orphan grace.
func (d *disk) scrub(ctx context.Context, verify bool) (*tpb.ScrubResponse, error) {
	res := &tpb.ScrubResponse{}
	if verify {
		for _, k := range d.store.Keys() {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			m, ok := d.store.Get(k)
			if !ok || m.Blob != nil {
				continue
			}
			res.CheckedTracts++
			if _, err := d.store.ReadData(k, m); errors.Is(err, ErrCorrupt) {
				res.CorruptTracts++
				d.svc.m.checksumFailures.Add(1)
				d.log.Error("scrub found a corrupt tract", "tract", k, "err", err)
				if ok, err := d.repair(ctx, k); err != nil {
					d.log.Error("repair failed", "tract", k, "err", err)
				} else if ok {
					res.RepairedTracts++
				}
			}
		}
	}
	if err := d.reclaimDeleted(ctx, res); err != nil {
		return res, err
	}
	files, err := d.store.UnreferencedFiles()
	if err != nil {
		return res, err
	}
	now := d.svc.cfg.Now()
	for _, f := range files {
		info, err := d.store.FS().Stat(f)
		if err != nil || now.Sub(info.ModTime()) < d.svc.cfg.OrphanGrace {
			continue
		}
		if err := d.store.FS().Remove(f); err == nil {
			res.UnreferencedFiles++
		}
	}
	return res, nil
}

// reclaimDeleted deletes the data tracts whose blob no longer exists (or
// is a later incarnation), asking each blob's metadata primary once.
func (d *disk) reclaimDeleted(ctx context.Context, res *tpb.ScrubResponse) error {
	t, err := d.svc.currentTable()
	if err != nil {
		return nil // not serving: nothing can be judged
	}
	byBlob := map[GUID][]tractKey{}
	for _, k := range d.store.Keys() {
		if k.tract != MetadataTract {
			byBlob[k.guid] = append(byBlob[k.guid], k)
		}
	}
	graceMs := d.svc.cfg.OrphanGrace.Milliseconds()
	now := d.svc.cfg.Now().UnixMilli()
	for g, keys := range byBlob {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		meta, gone, err := d.blobMeta(ctx, t, g)
		if err != nil {
			continue // unknown: judge it next time
		}
		for _, k := range keys {
			unlock := d.locks.lock(k)
			m, ok := d.store.Get(k)
			orphan := ok && now-m.WrittenUnixMs >= graceMs && (gone || m.Incarnation != meta.GetIncarnation())
			if orphan {
				if err := d.store.Delete(k); err == nil {
					res.ReclaimedTracts++
					res.ReclaimedBytes += uint64(m.Length)
					d.svc.m.tractsReclaimed.Add(1)
					d.svc.m.bytesReclaimed.Add(uint64(m.Length))
				}
			}
			unlock()
		}
	}
	if res.ReclaimedTracts > 0 {
		d.log.Info("scrubber reclaimed tracts of deleted blobs", "tracts", res.ReclaimedTracts, "bytes", res.ReclaimedBytes)
	}
	return nil
}

// blobMeta asks the primary of a blob's metadata row for its record; gone
// is set if the blob does not exist.
func (d *disk) blobMeta(ctx context.Context, t *Table, g GUID) (*tpb.BlobMeta, bool, error) {
	ri := t.Locate(g, MetadataTract)
	row := t.Rows[ri]
	primary := row.Slots[0]
	req := &tpb.BlobOpRequest{Disk: primary.Disk, Guid: g[:], RowVersion: row.Version, Op: tpb.BlobOpKind_BLOB_OP_GET}
	var resp *tpb.BlobOpResponse
	var err error
	if primary == d.id {
		resp, err = d.blobOp(ctx, req)
	} else {
		c, cerr := d.svc.peer(ctx, primary)
		if cerr != nil {
			return nil, false, cerr
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err = c.BlobOp(cctx, req)
		cancel()
	}
	if CodeOf(err) == tpb.ErrorCode_BLOB_NOT_FOUND {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	return resp.Meta, false, nil
}
