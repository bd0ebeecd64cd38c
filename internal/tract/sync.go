package tract

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// syncRetryDelay is how long a failed catch-up waits before it runs again.
const syncRetryDelay = time.Second

// errRowChanged ends a catch-up whose row changed under it; it runs again
// for the new version.
var errRowChanged = errors.New("the row changed during the catch-up")

// syncWorker runs queued catch-ups until ctx ends.
func (d *disk) syncWorker(ctx context.Context) {
	for {
		r, ok := d.nextQueued()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
			case <-time.After(time.Second):
			}
			continue
		}
		// Other workers may find more work.
		d.kick()
		err := d.syncRow(ctx, r)
		d.mu.Lock()
		if st := d.rows[r]; st != nil {
			st.syncing = false
		}
		d.mu.Unlock()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case errors.Is(err, errRowChanged):
			d.requeue(r)
		default:
			level := slog.LevelWarn
			if c := CodeOf(err); c == tpb.ErrorCode_TLT_BEHIND || c == tpb.ErrorCode_NOT_READABLE {
				level = slog.LevelDebug // the primary has not seen the table yet
			}
			d.log.Log(ctx, level, "row catch-up failed; retrying", "row", r, "err", err)
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(syncRetryDelay):
					d.requeue(r)
				}
			}()
		}
	}
}

// nextQueued takes a queued row that is not being caught up already.
func (d *disk) nextQueued() (uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rows := make([]uint32, 0, len(d.queued))
	for r := range d.queued {
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i] < rows[j] })
	for _, r := range rows {
		st := d.rows[r]
		if st == nil || !st.member || (st.role == tpb.RowRole_ROW_ROLE_PRIMARY && st.inSync) {
			delete(d.queued, r)
			continue
		}
		if st.syncing {
			continue
		}
		delete(d.queued, r)
		st.syncing = true
		st.copiedTracts, st.copiedBytes = 0, 0
		return r, true
	}
	return 0, false
}

func (d *disk) requeue(r uint32) {
	d.mu.Lock()
	if st := d.rows[r]; st != nil && st.member && !(st.role == tpb.RowRole_ROW_ROLE_PRIMARY && st.inSync) {
		d.queued[r] = true
	}
	d.mu.Unlock()
	d.kick()
}

// syncRow catches row r up from its primary (FDS §3.2-§3.4, and Boxwood's
// degraded-mode catch-up):
//
//   - it lists the primary's tracts of the row written at or after the row
//     version this server last finished a catch-up at (the writes it may
//     have missed: those made while it was away, and those in flight when
//     it left), restricted to blobs replicated onto its slot; a server
//     that never held the row, or now holds a lower slot, lists everything;
//   - it copies each listed tract whose stamp differs from its own, unless
//     its own is a newer write of the current row version (writes keep
//     arriving from the primary during the catch-up);
//   - it deletes its own tracts of that window that the primary does not
//     have (writes that were never acknowledged);
//   - if the row is still at the same version it records the version as
//     caught up, and becomes readable.
func (d *disk) syncRow(ctx context.Context, r uint32) error {
	t, err := d.svc.currentTable()
	if err != nil {
		return err
	}
	if int(r) >= len(t.Rows) {
		return nil
	}
	row := t.Rows[r]
	st, ok := d.member(r)
	if !ok || st.version != row.Version {
		return errRowChanged
	}
	if st.role == tpb.RowRole_ROW_ROLE_PRIMARY {
		if st.inSync {
			return nil
		}
		return d.syncPrimary(ctx, t, r, row)
	}
	primary := row.Slots[0]
	since := uint64(0)
	if rs, ok := d.store.RowSync(r); ok && st.slot >= int(rs.SyncedSlot) {
		since = rs.SyncedVersion
	}
	src, err := d.svc.peer(ctx, primary)
	if err != nil {
		return err
	}
	start := d.svc.cfg.Now()
	listed := map[tractKey]bool{}
	req := &tpb.ListRowRequest{Disk: primary.Disk, Row: r, RowVersion: row.Version, SinceVersion: since, MinReplication: uint32(st.slot + 1)}
	var copied, copiedBytes uint64
	for {
		lctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
		resp, err := src.ListRow(lctx, req)
		cancel()
		if err != nil {
			return d.syncError(r, row.Version, fmt.Errorf("list row %d at primary %s: %w", r, primary, err))
		}
		var todo []*tpb.TractEntry
		for _, e := range resp.Entries {
			k, err := checkTract(e.Guid, e.Tract, true)
			if err != nil {
				return fmt.Errorf("primary %s listed a bad tract: %w", primary, err)
			}
			listed[k] = true
			own, ok := d.store.Get(k)
			if ok && stampEqual(own.Stamp, e.Meta.GetStamp()) {
				continue
			}
			if ok && own.Stamp.GetRowVersion() >= row.Version && !stampLess(own.Stamp, e.Meta.GetStamp()) {
				continue
			}
			todo = append(todo, e)
		}
		n, b, err := d.fetchAll(ctx, src, primary, r, row.Version, todo, true)
		copied += n
		copiedBytes += b
		if err != nil {
			return d.syncError(r, row.Version, err)
		}
		if !resp.More || len(resp.Entries) == 0 {
			break
		}
		last := resp.Entries[len(resp.Entries)-1]
		req.AfterGuid, req.AfterTract = last.Guid, last.Tract
	}
	// Tracts of the window the primary does not have were never
	// acknowledged (or are not for this slot): drop them.
	dropped := 0
	for _, k := range d.store.RowTracts(r) {
		if listed[k] {
			continue
		}
		unlock := d.locks.lock(k)
		own, ok := d.store.Get(k)
		if ok && own.Shard == nil && own.Stamp.GetRowVersion() >= since && own.Stamp.GetRowVersion() < row.Version {
			if err := d.store.Delete(k); err != nil {
				unlock()
				return err
			}
			dropped++
		}
		unlock()
	}
	// Shards of erasure-coded tracts are never copied from the primary:
	// this server decodes the one of its slot from the other members.
	n, b, err := d.rebuildShards(ctx, r, row, st.slot)
	copied += n
	copiedBytes += b
	if err != nil {
		return d.syncError(r, row.Version, err)
	}
	d.mu.Lock()
	cur := d.rows[r]
	if cur == nil || !cur.member || cur.version != row.Version || cur.slot != st.slot || cur.role != st.role {
		d.mu.Unlock()
		return errRowChanged
	}
	d.mu.Unlock()
	if err := d.store.SetRowSync(r, &tpb.RowSync{SyncedVersion: row.Version, SyncedSlot: uint32(st.slot)}); err != nil {
		return err
	}
	d.mu.Lock()
	if cur := d.rows[r]; cur != nil && cur.version == row.Version {
		cur.inSync = true
		cur.readable = cur.role == tpb.RowRole_ROW_ROLE_REPLICA
	}
	d.mu.Unlock()
	d.svc.m.syncsCompleted.Add(1)
	level := d.log.Debug
	if copied > 0 || dropped > 0 {
		level = d.log.Info
	}
	level("row caught up", "row", r, "version", row.Version, "from", primary, "since_version", since,
		"copied_tracts", copied, "copied_bytes", copiedBytes, "dropped_tracts", dropped, "took", d.svc.cfg.Now().Sub(start).Round(time.Millisecond))
	return nil
}

// syncError turns an error from the primary into errRowChanged when the
// row moved on.
func (d *disk) syncError(r uint32, version uint64, err error) error {
	if te, ok := ErrorOf(err); ok && (te.Code == tpb.ErrorCode_STALE_TLT || te.Code == tpb.ErrorCode_WRONG_SERVER) {
		d.svc.refreshSoon()
		return errRowChanged
	}
	if st, ok := d.member(r); !ok || st.version != version {
		return errRowChanged
	}
	return err
}

// fetchAll copies tracts from the primary, FetchParallelism at a time.
func (d *disk) fetchAll(ctx context.Context, src tpb.TractServerClient, from ServerID, r uint32, version uint64, todo []*tpb.TractEntry, adopt bool) (uint64, uint64, error) {
	var (
		mu           sync.Mutex
		firstErr     error
		tracts, size uint64
	)
	sem := make(chan struct{}, d.svc.cfg.FetchParallelism)
	var wg sync.WaitGroup
	for _, e := range todo {
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := d.fetchOne(ctx, src, from, r, version, e, adopt)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			if n >= 0 {
				tracts++
				size += uint64(n)
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return tracts, size, firstErr
}

// fetchOne copies one tract; it returns the bytes copied, or -1 if nothing
// was installed. With adopt (a replica copying from its primary), a tract
// the server holds from before the row's current version is replaced by
// the primary's whatever their stamps (the primary's is the truth);
// without, only a newer version is installed.
func (d *disk) fetchOne(ctx context.Context, src tpb.TractServerClient, primary ServerID, r uint32, version uint64, e *tpb.TractEntry, adopt bool) (int, error) {
	k, _ := checkTract(e.Guid, e.Tract, true)
	fctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
	f, err := src.FetchTract(fctx, &tpb.FetchTractRequest{Disk: primary.Disk, Guid: e.Guid, Tract: e.Tract, RowVersion: version})
	cancel()
	if err != nil {
		return -1, fmt.Errorf("fetch %s from %s: %w", k, primary, err)
	}
	if !f.Found || f.Meta == nil {
		return -1, nil // gone since the listing
	}
	if f.Meta.Blob == nil && (len(f.Data) != int(f.Meta.Length) || Checksum(f.Data) != f.Meta.Crc32C) {
		return -1, fmt.Errorf("fetch %s from %s: data does not match its record", k, primary)
	}
	unlock := d.locks.lock(k)
	defer unlock()
	if st, ok := d.member(r); !ok || st.version != version {
		return -1, errRowChanged
	}
	own, ok := d.store.Get(k)
	if ok && (stampEqual(own.Stamp, f.Meta.Stamp) || ((!adopt || own.Stamp.GetRowVersion() >= version) && !stampLess(own.Stamp, f.Meta.Stamp))) {
		return -1, nil
	}
	m := proto.Clone(f.Meta).(*tpb.TractMeta)
	m.Row = r
	if err := d.store.Put(k, m, f.Data); err != nil {
		return -1, err
	}
	d.svc.m.tractsRecovered.Add(1)
	d.svc.m.bytesRecovered.Add(uint64(len(f.Data)))
	d.mu.Lock()
	if st := d.rows[r]; st != nil {
		st.copiedTracts++
		st.copiedBytes += uint64(len(f.Data))
	}
	d.mu.Unlock()
	return len(f.Data), nil
}

// syncPrimary makes a primary that may lack tracts complete: it pulls every
// tract it lacks (or holds an older version of) from each complete
// replica of the row, then serves. If no replica is complete (every other
// member is new), the tracts only dead servers held are lost, and the row
// goes on with what it has.
func (d *disk) syncPrimary(ctx context.Context, t *Table, r uint32, row Row) error {
	start := d.svc.cfg.Now()
	sources, unreachable := 0, 0
	var copied, copiedBytes uint64
	for _, m := range row.Slots[1:] {
		src, err := d.svc.peer(ctx, m)
		if err != nil {
			unreachable++
			continue
		}
		req := &tpb.ListRowRequest{Disk: m.Disk, Row: r, RowVersion: row.Version}
		complete := true
	pages:
		for {
			lctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
			resp, err := src.ListRow(lctx, req)
			cancel()
			switch {
			case CodeOf(err) == tpb.ErrorCode_NOT_READABLE:
				complete = false
				break pages
			case err != nil:
				if e := d.syncError(r, row.Version, err); errors.Is(e, errRowChanged) {
					return e
				}
				unreachable++
				complete = false
				break pages
			}
			var todo []*tpb.TractEntry
			for _, e := range resp.Entries {
				k, err := checkTract(e.Guid, e.Tract, true)
				if err != nil {
					return fmt.Errorf("replica %s listed a bad tract: %w", m, err)
				}
				if own, ok := d.store.Get(k); !ok || stampLess(own.Stamp, e.Meta.GetStamp()) {
					todo = append(todo, e)
				}
			}
			n, b, err := d.fetchAll(ctx, src, m, r, row.Version, todo, false)
			copied += n
			copiedBytes += b
			if err != nil {
				return d.syncError(r, row.Version, err)
			}
			if !resp.More || len(resp.Entries) == 0 {
				break
			}
			last := resp.Entries[len(resp.Entries)-1]
			req.AfterGuid, req.AfterTract = last.Guid, last.Tract
		}
		if complete {
			sources++
		}
	}
	if sources == 0 && unreachable > 0 {
		return fmt.Errorf("row %d: no complete replica reachable to catch the new primary up (%d unreachable)", r, unreachable)
	}
	if sources == 0 {
		d.log.Error("new primary has no complete replica to copy from: tracts only dead servers held are lost", "row", r, "version", row.Version)
	}
	n, b, err := d.rebuildShards(ctx, r, row, 0)
	copied += n
	copiedBytes += b
	if err != nil {
		return d.syncError(r, row.Version, err)
	}
	d.mu.Lock()
	cur := d.rows[r]
	if cur == nil || cur.version != row.Version || cur.role != tpb.RowRole_ROW_ROLE_PRIMARY {
		d.mu.Unlock()
		return errRowChanged
	}
	d.mu.Unlock()
	if err := d.store.SetRowSync(r, &tpb.RowSync{SyncedVersion: row.Version, SyncedSlot: 0}); err != nil {
		return err
	}
	d.mu.Lock()
	if cur := d.rows[r]; cur != nil && cur.version == row.Version {
		cur.inSync, cur.readable = true, true
	}
	d.mu.Unlock()
	d.svc.m.syncsCompleted.Add(1)
	d.log.Info("new primary caught up", "row", r, "version", row.Version, "sources", sources,
		"copied_tracts", copied, "copied_bytes", copiedBytes, "took", d.svc.cfg.Now().Sub(start).Round(time.Millisecond))
	go d.pushSync(ctx, t, []uint32{r})
	return nil
}
