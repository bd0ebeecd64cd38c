package tract

import (
	"bytes"
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
	if own.Shard != nil {
		return d.repairShard(ctx, k, own)
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
	if verify {
		d.scrubStripes(ctx, res)
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
		if d.removeUnreferenced(f) {
			res.UnreferencedFiles++
		}
	}
	return res, nil
}

// removeUnreferenced removes a data file no record names. A file is
// written before its record, under the tract's lock, and a slow sync can
// leave it unnamed for longer than the orphan grace: so the record is
// checked again under that lock, and a file it now names is kept.
func (d *disk) removeUnreferenced(path string) bool {
	if k, st, ok := parseFileName(d.store.FS().PathBase(path)); ok {
		unlock := d.locks.lock(k)
		defer unlock()
		if m, has := d.store.Get(k); has && !m.Embedded && proto.Equal(m.Stamp, st) {
			return false
		}
	}
	return d.store.FS().Remove(path) == nil
}

// reclaimDeleted deletes the data tracts whose blob no longer exists (or
// is a later incarnation), asking each blob's metadata primary: a call per
// primary and maxBlobMetas blobs, since a pass covers every blob the disk
// holds tracts of.
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
	byPrimary := map[ServerID][]*tpb.BlobRef{}
	for g := range byBlob {
		row := t.Rows[t.Locate(g, MetadataTract)]
		byPrimary[row.Slots[0]] = append(byPrimary[row.Slots[0]], &tpb.BlobRef{Guid: bytes.Clone(g[:]), RowVersion: row.Version})
	}
	graceMs := d.svc.cfg.OrphanGrace.Milliseconds()
	now := d.svc.cfg.Now().UnixMilli()
	for primary, refs := range byPrimary {
		for len(refs) > 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			n := min(len(refs), maxBlobMetas)
			results, err := d.blobMetas(ctx, primary, refs[:n])
			if err != nil {
				d.log.Debug("scrubber could not ask for blob records; it judges them next time", "primary", primary, "blobs", n, "err", err)
				refs = refs[n:]
				continue // unknown: judge them next time
			}
			for i, r := range results {
				gone := r.Code == tpb.ErrorCode_BLOB_NOT_FOUND
				if r.Meta == nil && !gone {
					continue // unknown: judge it next time
				}
				for _, k := range byBlob[GUID(refs[i].Guid)] {
					d.reclaimIfOrphan(k, gone, r.Meta.GetIncarnation(), now, graceMs, res)
				}
			}
			refs = refs[n:]
		}
	}
	if res.ReclaimedTracts > 0 {
		d.log.Info("scrubber reclaimed tracts of deleted blobs", "tracts", res.ReclaimedTracts, "bytes", res.ReclaimedBytes)
	}
	return nil
}

// reclaimIfOrphan deletes tract k if it is older than the grace and its
// blob is gone or a later incarnation.
func (d *disk) reclaimIfOrphan(k tractKey, gone bool, incarnation uint64, now, graceMs int64, res *tpb.ScrubResponse) {
	unlock := d.locks.lock(k)
	defer unlock()
	m, ok := d.store.Get(k)
	if !ok || now-m.WrittenUnixMs < graceMs || !(gone || m.Incarnation != incarnation) {
		return
	}
	if err := d.store.Delete(k); err == nil {
		res.ReclaimedTracts++
		res.ReclaimedBytes += uint64(m.Length)
		d.svc.m.tractsReclaimed.Add(1)
		d.svc.m.bytesReclaimed.Add(uint64(m.Length))
	}
}

// blobMetas asks primary, the primary of the blobs' metadata rows, for
// their records (this disk itself without a call); one result per ref.
func (d *disk) blobMetas(ctx context.Context, primary ServerID, refs []*tpb.BlobRef) ([]*tpb.BlobMetaResult, error) {
	if primary == d.id {
		resp, err := d.answerBlobMetas(ctx, refs)
		return resp.GetResults(), err
	}
	c, err := d.svc.peer(ctx, primary)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.BlobMetas(cctx, &tpb.BlobMetasRequest{Disk: primary.Disk, Blobs: refs})
	if err != nil {
		return nil, err
	}
	if len(resp.GetResults()) != len(refs) {
		return nil, fmt.Errorf("tractserver %s answered %d blob records for %d asked", primary, len(resp.GetResults()), len(refs))
	}
	return resp.GetResults(), nil
}

// answerBlobMetas answers BlobMetas as a BlobOp GET of each blob would.
func (d *disk) answerBlobMetas(ctx context.Context, refs []*tpb.BlobRef) (*tpb.BlobMetasResponse, error) {
	out := &tpb.BlobMetasResponse{Results: make([]*tpb.BlobMetaResult, len(refs))}
	for i, ref := range refs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		resp, err := d.blobOp(ctx, &tpb.BlobOpRequest{Disk: d.id.Disk, Guid: ref.GetGuid(), RowVersion: ref.GetRowVersion(), Op: tpb.BlobOpKind_BLOB_OP_GET})
		r := &tpb.BlobMetaResult{Meta: resp.GetMeta()}
		if err != nil {
			r.Code, r.Message = CodeOf(err), err.Error()
			if r.Code < 0 {
				r.Code = tpb.ErrorCode_IO_ERROR
			}
		}
		out.Results[i] = r
	}
	return out, nil
}
