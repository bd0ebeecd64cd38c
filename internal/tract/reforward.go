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
// all have it, or until the disk is no longer the row's primary (the new
// primary's catch-up settles the row then). A later successful forward of
// the same tract takes it out of the set. An unacknowledged write may
// take effect (POSIX and FDS allow both outcomes); what this removes is
// the window in which the replicas disagree with what the primary serves.
// The set is in memory: a primary that restarts forgets it, and the
// difference then lasts until the tract's next write or the row's next
// catch-up, as before.

// markUnforwarded records that k's stored version may be missing on some
// replicas.
func (d *disk) markUnforwarded(k tractKey) {
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
// spares those writes the disk's lock.
func (d *disk) forwarded(k tractKey) {
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
			d.forwarded(k)
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
// forward).
func (d *disk) reforwardOne(ctx context.Context, k tractKey) (done bool, err error) {
	t, err := d.svc.currentTable()
	if err != nil {
		return false, err
	}
	ri := t.Locate(k.guid, k.tract)
	row := t.Rows[ri]
	if role, _ := roleOf(row, d.id); role != tpb.RowRole_ROW_ROLE_PRIMARY {
		return true, nil
	}
	unlock := d.locks.lock(k)
	defer unlock()
	m, ok := d.store.Get(k)
	if !ok || m.Shard != nil {
		return true, nil // gone, or a shard (written by its client to every slot)
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
	return true, nil
}
