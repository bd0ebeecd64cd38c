package tract

import (
	"context"
	"sort"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// A primary stores a write or a blob operation before it forwards it
// (FDS §3.1). When the forward fails, the client is told so and the write
// is not acknowledged, but the primary keeps it: readers served by the
// primary see it while its replicas do not, and if the primary then died
// they would see the older version again. A failed forward therefore
// leaves the tract in the disk's unforwarded set, and housekeeping sends
// the primary's current version to the row's other members until they
// all have it, or until the disk is no longer the row's primary. A later
// successful forward of the same tract takes it out of the set.
//
// The set survives a crash: the primary stores each version together
// with a mark (Store.PutUnforwarded, one pebble batch) that a successful
// forward removes, and a restarted disk starts with every marked tract in
// its set. A primary killed during a forward, or restarted before it
// forwarded a failed one again, thus still forwards it.
//
// Which side is right when the primary holds a version no replica has
// and no client was told it succeeded: the primary's, as long as it is
// still the row's primary at the row version it stored the version
// under. An unacknowledged operation may take effect or not (POSIX and
// FDS allow both; the client was told it failed, or nothing, and retries
// with the same request id for blob operations); what matters is that
// every member ends up with the version the primary serves. Its stamp
// orders after every version the replicas hold (invariant 1), so they
// install it over theirs. If the row changed meanwhile (the primary was
// declared dead and replaced, or demoted), the version is no longer this
// disk's to forward: the forward is refused (the replicas are at a newer
// row version) or skipped (the disk is no longer primary), and the row's
// new primary decides; a returning old primary's catch-up deletes the
// tracts of its window that the new primary lacks, so the operation then
// does not take effect, which is the other allowed outcome.

// markUnforwarded records that k's stored version may be missing on some
// replicas: in the disk's set and durably in its store (usually marked
// already by the Put that stored the version). The caller holds k's lock.
func (d *disk) markUnforwarded(k tractKey) {
	if err := d.store.MarkUnforwarded(k); err != nil {
		d.log.Warn("forward again after a restart", "tract", k, "err", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.unforwarded == nil {
		d.unforwarded = map[tractKey]bool{}
	}
	d.unforwarded[k] = true
	d.unforwardedCount.Store(int64(len(d.unforwarded)))
}

// forwarded records that every replica holds k's stored version. It is
// on every write's path, and the set is almost always empty: the count
// spares those writes the disk's lock. The caller holds k's lock (so a
// newer version's mark is not taken for this one's).
func (d *disk) forwarded(k tractKey) {
	if err := d.store.Forwarded(k); err != nil {
		d.log.Warn("clear a forwarded tract's mark", "tract", k, "err", err)
	}
	if d.unforwardedCount.Load() == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.unforwarded, k)
	d.unforwardedCount.Store(int64(len(d.unforwarded)))
}

// reforward sends every unforwarded tract's stored version to its row's
// other members once; the ones still failing stay for the next round.
func (d *disk) reforward(ctx context.Context) {
	if d.unforwardedCount.Load() == 0 {
		return
	}
	d.mu.Lock()
	keys := make([]tractKey, 0, len(d.unforwarded))
	for k := range d.unforwarded {
		keys = append(keys, k)
	}
	d.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		done, err := d.reforwardOne(ctx, k)
		if done {
			continue
		}
		// The member that refused this one most likely refuses the rest
		// too: try again next round rather than hold housekeeping for an
		// RPC timeout per tract.
		d.log.Debug("forward again", "tract", k, "err", err, "waiting", len(keys))
		return
	}
}

// reforwardOne forwards k's stored version; done is true when nothing is
// left to do for k here (forwarded, gone, or no longer this disk's to
// forward), and k is then out of the set.
func (d *disk) reforwardOne(ctx context.Context, k tractKey) (done bool, err error) {
	unlock := d.locks.lock(k)
	defer unlock()
	t, err := d.svc.currentTable()
	if err != nil {
		return false, err
	}
	ri := t.Locate(k.guid, k.tract)
	row := t.Rows[ri]
	m, ok := d.store.Get(k)
	if role, _ := roleOf(row, d.id); role != tpb.RowRole_ROW_ROLE_PRIMARY || !ok || m.Shard != nil {
		// No longer the primary, gone, or a shard (written by its client
		// to every slot).
		d.forwarded(k)
		return true, nil
	}
	var data []byte
	replication := t.Replication
	if m.Blob == nil {
		if data, err = d.store.ReadData(k, m); err != nil {
			return false, err
		}
		replication = int(m.Replication)
	}
	if err := d.forward(ctx, t, ri, row, k, m, data, row.Targets(replication)); err != nil {
		return false, err
	}
	d.forwarded(k)
	return true, nil
}
