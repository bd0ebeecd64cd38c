package tract

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// disk is one tractserver: one disk's store and its view of the rows it
// belongs to.
type disk struct {
	svc   *Service
	index uint32
	id    ServerID
	path  string
	store *Store
	locks keyLocks
	log   *slog.Logger

	mu sync.Mutex
	// observed is set once the disk has seen a table.
	observed bool
	rows     map[uint32]*rowState
	// queued rows wait for a catch-up worker; wake signals them.
	queued map[uint32]bool
	wake   chan struct{}
	// unforwarded holds the tracts whose last forward failed, or that
	// were marked unforwarded in the store when the disk started
	// (reforward.go); unforwardedCount is its size, read without mu.
	unforwarded      map[tractKey]bool
	unforwardedCount atomic.Int64
	// repairs holds the stripes queued for repair after writes
	// acknowledged with shards missing (ec_repair.go).
	repairs map[tractKey]*stripeRepair
}

// initialRowVersion is the version of every row of a newly installed
// table: such a row has never changed, so every member holds every write
// made in it (each needed all members' acknowledgement).
const initialRowVersion = 1

// rowState is the tractserver's view of one row it belongs to (or still
// holds data of).
type rowState struct {
	version uint64
	member  bool
	role    tpb.RowRole
	slot    int
	// inSync: holds every tract its slot needs as of version.
	inSync bool
	// readable: serves reads; a member that was in sync at the row's
	// previous version and stayed a member stays readable while it catches
	// up the changes, a new member is not until it is in sync (FDS §3.5).
	readable bool
	syncing  bool
	// Progress of the running catch-up.
	copiedTracts, copiedBytes uint64
	// For a row the server is no longer a member of: since when, and how
	// long its tracts are kept.
	leftAt time.Time
	grace  time.Duration
}

func newDisk(s *Service, index uint32, path string, st *Store) *disk {
	d := &disk{
		svc: s, index: index, id: ServerID{Node: s.cfg.NodeID, Disk: index}, path: path, store: st,
		log:         s.log.With("disk", index),
		rows:        map[uint32]*rowState{},
		queued:      map[uint32]bool{},
		wake:        make(chan struct{}, 1),
		unforwarded: map[tractKey]bool{},
	}
	// Versions stored as primary before a crash, perhaps on no replica.
	for _, k := range st.Unforwarded() {
		d.unforwarded[k] = true
	}
	d.unforwardedCount.Store(int64(len(d.unforwarded)))
	return d
}

func roleOf(r Row, id ServerID) (role tpb.RowRole, slot int) {
	slot, pending, ok := r.RoleOf(id)
	switch {
	case !ok:
		return tpb.RowRole_ROW_ROLE_NONE, 0
	case pending:
		return tpb.RowRole_ROW_ROLE_PENDING, slot
	case slot == 0:
		return tpb.RowRole_ROW_ROLE_PRIMARY, 0
	}
	return tpb.RowRole_ROW_ROLE_REPLICA, slot
}

// observe brings the rows' states up to a new table. continuous says the
// server has seen every table since the previous one (it kept reaching the
// directory under the same epoch); otherwise it may have been out of a row
// and back without noticing, so no row is trusted until caught up.
func (d *disk) observe(ctx context.Context, t *Table, continuous bool) {
	now := d.svc.cfg.Now()
	var pushTo []uint32
	var records []uint32
	d.mu.Lock()
	first := !d.observed
	d.observed = true
	dataRows := d.store.Rows()
	for ri, row := range t.Rows {
		r := uint32(ri)
		role, slot := roleOf(row, d.id)
		st := d.rows[r]
		if role == tpb.RowRole_ROW_ROLE_NONE {
			if st != nil && st.member {
				grace := d.svc.cfg.DropGrace
				if !continuous {
					grace = d.svc.cfg.ReturnGrace
				}
				d.rows[r] = &rowState{version: row.Version, leftAt: now, grace: grace}
				d.log.Info("left TLT row", "row", r, "version", row.Version, "keep_data_for", grace)
			} else if st == nil && dataRows[r] > 0 {
				d.rows[r] = &rowState{version: row.Version, leftAt: now, grace: d.svc.cfg.ReturnGrace}
			}
			continue
		}
		if st != nil && st.member && continuous && st.version == row.Version && st.role == role && st.slot == slot {
			continue
		}
		ns := &rowState{version: row.Version, member: true, role: role, slot: slot}
		switch {
		case role == tpb.RowRole_ROW_ROLE_PRIMARY:
			// The primary's copy is the row's truth, so it must be
			// complete before it serves reads, blob operations and
			// catch-ups: a row unchanged since the table was installed,
			// a primary that stays primary, a pending entry committed to
			// the primary slot once caught up, or a restart into a row
			// that has not changed are complete; anyone else (a promoted
			// replica, which may lack the tracts of blobs with fewer
			// replicas than its old slot) first pulls what it lacks from
			// the row's complete replicas.
			complete := row.Version == initialRowVersion
			switch {
			case st == nil || first:
				rs, ok := d.store.RowSync(r)
				complete = complete || ok && rs.SyncedVersion == row.Version && rs.SyncedSlot == 0
			case continuous && st.member && st.inSync && st.slot == 0 &&
				(st.role == tpb.RowRole_ROW_ROLE_PRIMARY || st.role == tpb.RowRole_ROW_ROLE_PENDING):
				complete = true
			}
			ns.inSync, ns.readable = complete, complete
			if complete {
				records = append(records, r)
				if st == nil || !continuous || !st.member || st.role != tpb.RowRole_ROW_ROLE_PRIMARY {
					pushTo = append(pushTo, r)
				}
			} else {
				d.queued[r] = true
			}
		case st == nil || first:
			// First sight since start: trust what was recorded if the row
			// has not changed since.
			rs, ok := d.store.RowSync(r)
			ns.inSync = row.Version == initialRowVersion || ok && rs.SyncedVersion == row.Version && int(rs.SyncedSlot) == slot
			ns.readable = ns.inSync && role == tpb.RowRole_ROW_ROLE_REPLICA
			d.queued[r] = true
		default:
			prevGood := st.member && (st.inSync || st.readable) && continuous && slot >= st.slot
			ns.readable = (prevGood || row.Version == initialRowVersion) && role == tpb.RowRole_ROW_ROLE_REPLICA
			d.queued[r] = true
		}
		if st != nil && st.syncing {
			ns.syncing = true
		}
		d.rows[r] = ns
	}
	// Rows past the table's end (never, unless the table was replaced).
	for r, st := range d.rows {
		if int(r) >= len(t.Rows) && st.member {
			d.rows[r] = &rowState{leftAt: now, grace: d.svc.cfg.ReturnGrace}
		}
	}
	d.mu.Unlock()
	for _, r := range records {
		if err := d.store.SetRowSync(r, &tpb.RowSync{SyncedVersion: t.Rows[r].Version, SyncedSlot: 0}); err != nil {
			d.log.Error("record row sync", "row", r, "err", err)
		}
	}
	d.kick()
	if len(pushTo) > 0 {
		go d.pushSync(ctx, t, pushTo)
	}
	if first && len(records) > 0 {
		go d.recheckShards(ctx, t, records)
	}
}

// pushSync asks the other members of rows this server (newly) leads to
// catch up from it: a primary that restarted may hold writes its replicas
// missed, and a new primary's copy is the row's truth.
func (d *disk) pushSync(ctx context.Context, t *Table, rows []uint32) {
	for _, r := range rows {
		row := t.Rows[r]
		var targets []ServerID
		targets = append(targets, row.Slots[1:]...)
		for _, p := range row.Pending {
			targets = append(targets, p.Server)
		}
		for _, m := range targets {
			c, err := d.svc.peer(ctx, m)
			if err != nil {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = c.SyncRow(cctx, &tpb.SyncRowRequest{Disk: m.Disk, Row: r, RowVersion: row.Version})
			cancel()
			if err != nil {
				d.log.Debug("ask member to sync", "row", r, "member", m, "err", err)
			}
		}
	}
}

func (d *disk) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// member returns the server's state in row r if it is a member.
func (d *disk) member(r uint32) (rowState, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.rows[r]
	if st == nil || !st.member {
		return rowState{}, false
	}
	return *st, true
}

func (d *disk) catchingUp() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, st := range d.rows {
		if st.member && !st.inSync {
			n++
		}
	}
	return n
}

// run runs the disk's catch-up workers, row drops and scrubber until ctx
// ends.
func (d *disk) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range d.svc.cfg.SyncParallelism {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.syncWorker(ctx)
		}()
	}
	housekeeping := time.NewTicker(time.Second)
	defer housekeeping.Stop()
	lastScrub, lastVerify := d.svc.cfg.Now(), d.svc.cfg.Now()
	for {
		select {
		case <-ctx.Done():
			d.kick()
			wg.Wait()
			return
		case <-housekeeping.C:
		}
		d.dropOldRows()
		d.reforward(ctx)
		d.repairStripes(ctx)
		now := d.svc.cfg.Now()
		if now.Sub(lastScrub) >= d.svc.cfg.ScrubInterval {
			verify := now.Sub(lastVerify) >= d.svc.cfg.VerifyInterval
			if _, err := d.scrub(ctx, verify); err != nil && ctx.Err() == nil {
				d.log.Warn("scrub", "err", err)
			}
			lastScrub = now
			if verify {
				lastVerify = now
			}
		}
	}
}

// dropOldRows deletes the tracts of rows the server left long enough ago
// (FDS §3.4: the replaced server garbage-collects the row).
func (d *disk) dropOldRows() {
	now := d.svc.cfg.Now()
	var drop []uint32
	d.mu.Lock()
	for r, st := range d.rows {
		if !st.member && now.Sub(st.leftAt) >= st.grace {
			drop = append(drop, r)
		}
	}
	d.mu.Unlock()
	sort.Slice(drop, func(i, j int) bool { return drop[i] < drop[j] })
	for _, r := range drop {
		n, bytes := 0, uint64(0)
		for _, k := range d.store.RowTracts(r) {
			unlock := d.locks.lock(k)
			// Recheck under the lock: the server may have rejoined.
			if st, ok := d.member(r); ok && st.member {
				unlock()
				break
			}
			if m, ok := d.store.Get(k); ok {
				if err := d.store.Delete(k); err != nil {
					d.log.Error("drop tract", "tract", k, "err", err)
				} else {
					n++
					bytes += uint64(m.Length)
				}
			}
			unlock()
		}
		d.mu.Lock()
		if st := d.rows[r]; st != nil && !st.member {
			delete(d.rows, r)
		}
		d.mu.Unlock()
		if _, ok := d.member(r); !ok {
			_ = d.store.SetRowSync(r, nil)
		}
		d.svc.m.tractsReclaimed.Add(uint64(n))
		d.svc.m.bytesReclaimed.Add(bytes)
		if n > 0 {
			d.log.Info("dropped the tracts of a row this server left", "row", r, "tracts", n, "bytes", bytes)
		}
	}
}

// status reports the disk for Status.
func (d *disk) status(all bool) *tpb.DiskStatus {
	tracts, bytes := d.store.Usage()
	ds := &tpb.DiskStatus{Disk: d.index, Path: d.path, Tracts: tracts, Bytes: bytes,
		RecoveredTracts: d.svc.m.tractsRecovered.Load(), RecoveredBytes: d.svc.m.bytesRecovered.Load()}
	if u, err := d.store.FS().GetDiskUsage(d.store.Dir()); err == nil {
		ds.CapacityBytes = u.TotalBytes
	}
	counts := d.store.Rows()
	d.mu.Lock()
	rows := make([]uint32, 0, len(d.rows))
	for r := range d.rows {
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i] < rows[j] })
	for _, r := range rows {
		st := d.rows[r]
		if !st.member {
			ds.OrphanRows = append(ds.OrphanRows, r)
			continue
		}
		if !st.inSync {
			ds.RowsCatchingUp++
		}
		if all || !st.inSync {
			ds.Rows = append(ds.Rows, &tpb.RowStatus{
				Row: r, Version: st.version, Role: st.role, Slot: uint32(st.slot), InSync: st.inSync, Readable: st.readable,
				Tracts: uint64(counts[r]), CopiedTracts: st.copiedTracts, CopiedBytes: st.copiedBytes,
			})
		}
	}
	d.mu.Unlock()
	return ds
}
