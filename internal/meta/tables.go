package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/RaduBerinde/btreemap"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
)

// Owning tables (doc.go, Tables): acquiring one writes the owner's
// delegation epoch into its header; dropping one stops serving it.

// errStaleAssignment: the table's header is at a newer epoch than the
// assignment the server acted on.
var errStaleAssignment = errors.New("meta: the table's header is newer than this assignment")

// assignment is a table the delegation map gives this server.
type assignment struct {
	id    uint64
	r     fs.DRange
	epoch uint64
}

// acquire takes table a: its header gets this owner's epoch (fencing any
// transaction of the previous owner still in flight) and, unless a
// snapshot is freezing it, a write epoch no older than the superblock's.
// Then the table is served.
func (s *store) acquire(ctx context.Context, a assignment) error {
	sbEpoch, err := superblockEpoch(ctx, s.tree, s.f)
	if err != nil {
		return err
	}
	var h *tableHeader
	clean := true
	err = s.tree.Update(ctx, func(tx *btree.Txn) error {
		v, ok, err := tx.Get(headerKey(s.f, a.r.Lo))
		if err != nil {
			return err
		}
		h = &tableHeader{W: sbEpoch}
		clean = true // a table never served has nothing to replay
		if ok {
			if h, err = decodeHeader(v); err != nil {
				return err
			}
			if h.Epoch > a.epoch || (h.Epoch == a.epoch && h.Table == a.id && h.Owner != s.node) {
				return fmt.Errorf("%w: table %d header at epoch %d (owner %d), assignment at %d", errStaleAssignment, a.id, h.Epoch, h.Owner, a.epoch)
			}
			clean = h.Clean
		}
		h.Table, h.Epoch, h.Owner, h.Lo, h.Hi, h.Clean = a.id, a.epoch, s.node, a.r.Lo, a.r.Hi, false
		if h.Frozen == 0 {
			// A table that was not served when a snapshot was taken (new,
			// or between owners) writes past it from now on.
			h.W = max(h.W, sbEpoch)
		}
		return tx.Put(headerKey(s.f, a.r.Lo), h.encode())
	})
	if err != nil {
		return fmt.Errorf("meta: acquire table %d of file system %d at epoch %d: %w", a.id, s.f, a.epoch, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tables {
		if t.id != a.id && rangesOverlap(t.r, a.r) {
			return fmt.Errorf("meta: table %d %v overlaps table %d %v served here", a.id, a.r, t.id, t.r)
		}
	}
	since, synced := time.Now(), map[uint64]bool{} // the sessions whose opens are known already
	for _, t := range s.tables {
		if t.id == a.id && t.r == a.r && a.epoch == t.epoch+1 {
			// Served here all along (taken again after its lease lapsed).
			s.opensMu.Lock()
			since, synced = t.since, maps.Clone(s.synced[t.id])
			s.opensMu.Unlock()
		}
	}
	// A part of a table split here, acquired right after the split: the
	// server served its keys all along. Only then: a part that moved away
	// and comes back (a borrow, a move) has opens this server never saw.
	for i, p := range s.split {
		if p.r == a.r && time.Since(p.at) < splitPartFresh {
			since, synced = p.since, p.synced
			s.split = slices.Delete(s.split, i, i+1)
			break
		}
	}
	if synced == nil {
		synced = map[uint64]bool{}
	}
	s.opensMu.Lock()
	if s.synced == nil {
		s.synced = map[uint64]map[uint64]bool{}
	}
	s.synced[a.id] = synced
	s.opensMu.Unlock()
	s.tables = slices.DeleteFunc(s.tables, func(t *table) bool { return t.id == a.id })
	t := &table{id: a.id, r: a.r, epoch: a.epoch, hdr: *h, serving: true, since: since}
	if h.Frozen != 0 {
		t.frozenSince = time.Now()
	}
	if !clean {
		// The last owner may have answered writes early that it never
		// made durable: their sessions replay them before anyone else is
		// served (doc.go, Early replies).
		t.gateAll, t.gateUntil = true, time.Now().Add(gateTimeout)
	}
	s.tables = append(s.tables, t)
	slices.SortFunc(s.tables, func(x, y *table) int {
		if x.r.Lo < y.r.Lo {
			return -1
		}
		return 1
	})
	s.publishServedLocked()
	s.changed.Broadcast()
	s.log.Info("serving table", "table", a.id, "range", a.r, "epoch", a.epoch, "w", h.W, "frozen", h.Frozen, "clean", clean)
	return nil
}

// gateTimeout bounds a replay gate: a session that has not replayed by
// then (dead with its unsafe writes, or cut off) is not waited for, and
// its late replays may find the table changed (they fail, and its client
// reports the loss).
const gateTimeout = 5 * time.Second

// gatedLocked reports whether t's replay gate holds requests other than
// replays; it lifts a gate whose sessions all synced or whose time ran
// out. Callers hold mu (a read lock is enough: lifting races harmlessly).
func (s *store) gatedLocked(t *table) bool {
	if t.gateUntil.IsZero() {
		return false
	}
	if time.Now().Before(t.gateUntil) {
		if len(t.gateSessions) > 0 {
			return true
		}
		if t.gateAll && !s.syncedAll(t) {
			return true
		}
	}
	return false
}

// syncedAll reports whether every live session, as read since t was
// taken, has synced its opens (and replayed) to this owner. Callers hold
// mu.
func (s *store) syncedAll(t *table) bool {
	s.opensMu.Lock()
	defer s.opensMu.Unlock()
	if !s.liveAt.After(t.since) {
		return false
	}
	for _, sess := range s.live {
		if !s.synced[t.id][sess] {
			return false
		}
	}
	return true
}

// waitGate waits while directory id d's table holds requests other than
// replays (a replay passes at once). It returns ctx marked with the
// store's abort count as it passed (withGateGen): an abort after that
// (which raises a gate) makes the request's next Update or View ask again
// instead of reading a state that lacks what the abort lost.
func (s *store) waitGate(ctx context.Context, d uint64, replay bool) (context.Context, error) {
	if replay {
		return ctx, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		t := s.tableOf(d)
		if t == nil || !s.gatedLocked(t) {
			ctx = context.WithValue(ctx, gateGenKey{}, &gatePass{gen: s.gen})
			if t != nil && !t.gateUntil.IsZero() {
				if time.Now().After(t.gateUntil) {
					s.opensMu.Lock()
					s.log.Warn("a table's replay gate timed out; serving it", "table", t.id, "waiting_for", len(t.gateSessions), "live", s.live, "live_at", s.liveAt, "since", t.since, "synced", s.synced[t.id])
					s.opensMu.Unlock()
				}
				t.gateUntil, t.gateAll, t.gateSessions = time.Time{}, false, nil
			}
			return ctx, nil
		}
		if err := ctx.Err(); err != nil {
			return ctx, fmt.Errorf("meta: waiting for sessions to replay to table %d: %w", t.id, err)
		}
		waitCond(ctx, s.changed, time.Until(t.gateUntil))
	}
}

// gateGenKey marks a request's context with a *gatePass.
type gateGenKey struct{}

// gatePass is the store's abort count when a request passed the replay
// gate (or last found that no abort since concerned it).
type gatePass struct{ gen uint64 }

// passedGateLocked reports whether the request of ctx may go on with the
// cache after an abort that came since it passed the gate: the abort may
// have lost what the request read, so it asks again (errRetry) unless
// its first write transaction (with its reply record) was durable before
// the abort; a retry would then find the record and not run the rest.
// Callers hold mu.
func (s *store) passedGateLocked(ctx context.Context) error {
	g, ok := ctx.Value(gateGenKey{}).(*gatePass)
	if !ok || g.gen == s.gen {
		return nil
	}
	if r := replyOf(ctx); r != nil && r.written && (r.p == nil || r.p.durableBefore(s.gen)) {
		g.gen = s.gen
		return nil
	}
	return fmt.Errorf("%w: an abort raised the replay gate while the request ran", errRetry)
}

func rangesOverlap(a, b fs.DRange) bool {
	return (b.Hi == 0 || a.Lo < b.Hi) && (a.Hi == 0 || b.Lo < a.Hi)
}

// superblockEpoch reads the superblock's write epoch.
func superblockEpoch(ctx context.Context, tree *btree.Tree, f uint64) (uint64, error) {
	w, _, err := fs.ReadEpoch(ctx, fs.BTreeMeta{Tree: tree}, f)
	return w, err
}

// drop stops serving table id: new requests are refused at once; once the
// pending writes that touch it are durable (or aborted), its units are
// forgotten.
func (s *store) drop(ctx context.Context, id uint64) {
	s.mu.Lock()
	var t *table
	for _, x := range s.tables {
		if x.id == id {
			t = x
		}
	}
	if t == nil {
		s.mu.Unlock()
		return
	}
	t.serving = false
	var last *pending
	for _, p := range s.queue {
		if slices.Contains(p.tables, t) {
			last = p
		}
	}
	s.mu.Unlock()
	if last != nil {
		_ = last.wait(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tables = slices.DeleteFunc(s.tables, func(x *table) bool { return x == t })
	s.publishServedLocked()
	for _, u := range s.units {
		if t.r.Contains(u.d) && u.dirty == 0 {
			s.dropUnitLocked(u)
		}
	}
	s.changed.Broadcast()
	s.log.Info("dropped table", "table", id, "range", t.r, "epoch", t.epoch)
}

// fenced handles a commit that found a table's header changed: another
// owner took it (drop it), or a snapshot froze it (wait for the thaw), or
// a snapshot thawed it at a new write epoch (write at that).
func (s *store) fenced(e *errFenced) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := e.t
	switch {
	case e.hdr == nil || e.hdr.Epoch != t.epoch || e.hdr.Owner != s.node:
		t.serving = false
		s.tables = slices.DeleteFunc(s.tables, func(x *table) bool { return x == t })
		s.publishServedLocked()
		s.log.Warn("lost table to a newer owner", "table", t.id, "epoch", t.epoch, "header", e.hdr)
	default:
		if e.hdr.Frozen != 0 && t.hdr.Frozen == 0 {
			t.frozenSince = time.Now()
		}
		t.hdr = *e.hdr
	}
	s.changed.Broadcast()
}

// refreshUnsettled reads again the headers of the tables that keep the
// store from writing (the server polls them): frozen ones, which a thaw
// gives a new write epoch, and ones whose write epoch lags another's. A
// commit that hit a thaw's fence updates only its own tables, and the
// store writes only while all agree (writeEpochLocked): without this,
// when the thaw's refresh did not reach this server, the others would
// never learn the new epoch and the store would wait forever.
func (s *store) refreshUnsettled(ctx context.Context) { s.refreshHeaders(ctx, true) }

// refreshHeaders reads the headers of the owned tables (only the unsettled
// ones if unsettledOnly) and takes what changed: a freeze, a thaw at a new
// write epoch, a newer owner. A snapshot's coordinator has owners do it
// after a freeze and after a thaw, so they do not learn it from a failed
// commit.
func (s *store) refreshHeaders(ctx context.Context, unsettledOnly bool) {
	s.mu.RLock()
	var newest uint64
	for _, t := range s.tables {
		newest = max(newest, t.hdr.W)
	}
	var ts []*table
	for _, t := range s.tables {
		if !unsettledOnly || t.hdr.Frozen != 0 || t.hdr.W != newest {
			ts = append(ts, t)
		}
	}
	s.mu.RUnlock()
	for _, t := range ts {
		v, ok, err := s.tree.Get(ctx, headerKey(s.f, t.r.Lo))
		if err != nil {
			continue
		}
		var h *tableHeader
		if ok {
			if h, err = decodeHeader(v); err != nil {
				s.log.Warn("reading a table's header", "table", t.id, "err", err)
				continue
			}
		}
		s.fenced(&errFenced{t: t, hdr: h})
	}
}

// owned returns the tables served here (copies).
func (s *store) owned() []table {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]table, 0, len(s.tables))
	for _, t := range s.tables {
		out = append(out, *t)
	}
	return out
}

// opensKnown reports whether every session that may hold a file of h's
// table open has told this server of its opens there since it began
// serving the table (fs.Config.OpensKnown): each live session (its record
// not expired, as read after the table was taken) has sent SyncOpens, or
// the table has been served here longer than a session lives without
// renewing. Sessions sync each table they find at a new delegation epoch,
// within a second or at their next request to it. It takes no lock of
// the store's (the file system asks inside transactions).
func (s *store) opensKnown(h fs.Handle) bool {
	p := s.served.Load()
	if p == nil {
		return false
	}
	for _, t := range *p {
		if !t.r.Contains(h.D) {
			continue
		}
		if time.Since(t.since) >= fs.SessionExpiry {
			return true
		}
		s.opensMu.Lock()
		defer s.opensMu.Unlock()
		if !s.liveAt.After(t.since) {
			return false
		}
		for _, sess := range s.live {
			if !s.synced[t.id][sess] {
				return false
			}
		}
		return true
	}
	return false
}

// has reports whether table id is among the tables served here (even
// paused for a move or split), at epoch.
func (s *store) has(id, epoch uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tableAtLocked(id, epoch) != nil
}

// setLive records the live sessions, read from their records at at.
func (s *store) setLive(sessions []uint64, at time.Time) {
	s.opensMu.Lock()
	s.live, s.liveAt = sessions, at
	s.opensMu.Unlock()
	s.changed.Broadcast()
}

// addLive records a session that just renewed its record here.
func (s *store) addLive(session uint64) {
	s.opensMu.Lock()
	defer s.opensMu.Unlock()
	if !slices.Contains(s.live, session) {
		s.live = append(slices.Clip(s.live), session)
	}
}

// syncedOpens records that session told of its opens in table id, which
// is served here at epoch; false if it is not.
func (s *store) syncedOpens(id, epoch, session uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t := s.tableAtLocked(id, epoch); t == nil || !t.live() {
		return false
	}
	s.opensMu.Lock()
	s.synced[id][session] = true
	s.opensMu.Unlock()
	return true
}

// replayed records that session has replayed its early writes lost in
// table id (SyncOpens ends its replays): the table's gate no longer waits
// for it.
func (s *store) replayed(id, session uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tables {
		if t.id == id && t.gateSessions[session] {
			delete(t.gateSessions, session)
		}
	}
	s.changed.Broadcast()
}

// serves reports whether directory id d's table is served here, and
// which.
func (s *store) serves(d uint64) (table, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t := s.tableOf(d); t != nil && t.live() {
		return *t, true
	}
	return table{}, false
}

// cachedCounts returns, for the units of range r that are loaded, the
// inodes (newest versions of inode keys), keys and bytes cached.
func (s *store) cachedCounts(r fs.DRange) (inodes, keys, size uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	hi := btreemap.Max[uint64]()
	if r.Hi != 0 {
		hi = btreemap.LT(r.Hi)
	}
	s.unitIdx.AscendFunc(btreemap.GE(r.Lo), hi, func(d uint64, u *unit) bool {
		keys += uint64(u.keys)
		size += uint64(u.bytes)
		inodes += uint64(s.unitInodesRLocked(u))
		return true
	})
	return inodes, keys, size
}

// unitInodesRLocked returns the inodes among u's cached keys, counted once
// after the unit loads and then kept by applyLocked as keys change (every
// server asks every other for its tables' counts once a second: a scan of
// every cached key each time cost a fifth of a server's CPU, and a scan
// of each changed unit still grew with the size of the directories being
// filled). Callers hold mu, for reading at least: no key of u changes
// meanwhile.
func (s *store) unitInodesRLocked(u *unit) int64 {
	if n := u.inodes.Load(); n >= 0 {
		return n
	}
	var n int64
	objects := fs.DirRanges(s.f, u.d)[0]
	var last []byte
	s.kv.AscendFunc(btreemap.GE(string(objects[0])), btreemap.LT(string(objects[1])), func(k string, e *entry) bool {
		if e.deleted {
			return true
		}
		if p, ok := fs.InodePrefix([]byte(k)); ok && !bytes.Equal(p, last) {
			n++
			last = p
		}
		return true
	})
	u.inodes.Store(n)
	return n
}

// inodeCachedLocked reports whether some version of the inode whose keys
// start with prefix is cached and not deleted: what unitInodesRLocked
// counts. Callers hold mu.
func (s *store) inodeCachedLocked(prefix []byte) bool {
	found := false
	from := string(prefix)
	s.kv.AscendFunc(btreemap.GE(from), btreemap.Max[string](), func(k string, e *entry) bool {
		if !strings.HasPrefix(k, from) {
			return false
		}
		if p, ok := fs.InodePrefix([]byte(k)); ok && bytes.Equal(p, prefix) && !e.deleted {
			found = true
			return false
		}
		return true
	})
	return found
}

// pause stops serving table id (its requests get NOT_OWNER) and waits
// until the pending writes that touch it are durable; resume serves it
// again (a move or split that did not happen).
func (s *store) pause(ctx context.Context, id uint64) (resume func(), err error) {
	s.mu.Lock()
	var t *table
	for _, x := range s.tables {
		if x.id == id && x.serving {
			t = x
		}
	}
	if t == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: table %d", errNotOwner, id)
	}
	t.serving = false
	var last *pending
	for _, p := range s.queue {
		if slices.Contains(p.tables, t) {
			last = p
		}
	}
	gated := s.gatedLocked(t)
	s.mu.Unlock()
	marked := false
	resume = func() {
		if marked {
			if err := s.markClean(ctx, t, false); err != nil {
				s.log.Warn("clearing a paused table's clean mark; dropping it", "table", t.id, "err", err)
				s.drop(ctx, t.id)
				return
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		t.serving = true
		s.changed.Broadcast()
	}
	if last != nil {
		if err := last.wait(ctx); err != nil {
			if errors.Is(err, errRetry) {
				return resume, nil // lost: the next owner must let sessions replay
			}
			resume()
			return nil, err
		}
	}
	if !gated {
		// Every write answered is durable: the next owner need not wait
		// for replays.
		if err := s.markClean(ctx, t, true); err != nil {
			s.log.Info("marking a paused table clean; its next owner waits for replays", "table", t.id, "err", err)
		} else {
			marked = true
		}
	}
	return resume, nil
}

// markClean sets t's header's Clean flag, if the header still names this
// owner at t's epoch.
func (s *store) markClean(ctx context.Context, t *table, clean bool) error {
	return updateHeader(ctx, s.tree, s.f, t.r.Lo, func(h *tableHeader) bool {
		if h.Epoch != t.epoch || h.Owner != s.node || h.Clean == clean {
			return false
		}
		h.Clean = clean
		return true
	})
}

// forget removes table id, just split at directory id at, from the
// tables served here but keeps its cached units: the same server serves
// its keys on under the two parts, which it acquires next and which carry
// over when it began serving the table and who synced their opens
// (acquire).
func (s *store) forget(id, at uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tables {
		if t.id == id {
			// The sessions synced before the split, not those that sync to
			// one part (the left keeps the id) before the other is acquired.
			s.opensMu.Lock()
			synced := maps.Clone(s.synced[id])
			s.opensMu.Unlock()
			for _, r := range []fs.DRange{{Lo: t.r.Lo, Hi: at}, {Lo: at, Hi: t.r.Hi}} {
				s.split = append(s.split, splitPart{servedTable: servedTable{id: t.id, r: r, since: t.since}, at: time.Now(), synced: maps.Clone(synced)})
			}
			if len(s.split) > maxSplitMemory {
				s.split = s.split[len(s.split)-maxSplitMemory:]
			}
		}
	}
	s.tables = slices.DeleteFunc(s.tables, func(t *table) bool { return t.id == id })
	s.publishServedLocked()
	s.changed.Broadcast()
}

// maxSplitMemory bounds the parts of split tables a store remembers;
// splitPartFresh, how long after the split a part may inherit from it.
const (
	maxSplitMemory = 16
	splitPartFresh = 30 * time.Second
)

// splitPart is one part of a table split here, not acquired yet: its range
// and the split table's id and serving time.
type splitPart struct {
	servedTable
	at     time.Time
	synced map[uint64]bool // the sessions synced to the split table
}

// servedTable is a table's range and when the server began serving it.
type servedTable struct {
	id    uint64
	r     fs.DRange
	since time.Time
}

// publishServedLocked sets served from tables. Callers hold mu.
func (s *store) publishServedLocked() {
	out := make([]servedTable, len(s.tables))
	for i, t := range s.tables {
		out[i] = servedTable{id: t.id, r: t.r, since: t.since}
	}
	s.served.Store(&out)
}

// dropUnit forgets unit d (if loaded and clean), so its next reader loads
// what the tree holds.
func (s *store) dropUnit(d uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.units[d]; u != nil && u.dirty == 0 {
		s.dropUnitLocked(u)
	}
}

// copyReplies copies the reply records of the table area at from to the
// area at to (a split: requests of the right part's directories retried
// after the split look there). It writes the tree directly: neither area
// is served while it runs.
func copyReplies(ctx context.Context, tree *btree.Tree, f, from, to uint64) error {
	lo := fs.TableRecordKey(f, from, replyRecords)
	hi := fs.TableRecordKey(f, from, replyRecords+1)
	var kvs []btree.KV
	err := tree.Scan(ctx, lo, hi, func(k, v []byte) error {
		kvs = append(kvs, btree.KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		return nil
	})
	if err != nil {
		return err
	}
	const perTxn = 64
	for i := 0; i < len(kvs); i += perTxn {
		batch := kvs[i:min(len(kvs), i+perTxn)]
		err := tree.UpdatePages(ctx, func(tx *btree.Txn) error {
			for _, kv := range batch {
				sess, slot, err := replyKeySlot(kv.Key)
				if err != nil {
					return err
				}
				if err := tx.Put(replyKey(f, to, sess, slot), kv.Value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("meta: copy reply records to the table at %#x: %w", to, err)
		}
	}
	return nil
}

// markAllClean marks clean every table served here that holds no replay
// gate (a drained store at stop).
func (s *store) markAllClean(ctx context.Context) {
	s.mu.Lock()
	var ts []*table
	for _, t := range s.tables {
		if !s.gatedLocked(t) {
			t.serving = false
			ts = append(ts, t)
		}
	}
	s.mu.Unlock()
	for _, t := range ts {
		if err := s.markClean(ctx, t, true); err != nil {
			s.log.Info("marking a table clean at stop", "table", t.id, "err", err)
		}
	}
}
