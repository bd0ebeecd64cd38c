package meta

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RaduBerinde/btreemap"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
)

// store is one metadata server's view of one file system's metadata
// (doc.go, The table store): the tables of it the server owns, cached and
// written through group commit, and the rest of the tree, read directly.
// It is the fs.MetaStore of the file-system engines the server runs for
// that file system.
type store struct {
	f    uint64
	node uint64
	tree *btree.Tree
	log  *slog.Logger
	lim  Limits

	mu      sync.RWMutex
	changed *sync.Cond // on mu: tables, frozen state or units changed
	tables  []*table   // owned, sorted by range
	// served is what opensKnown reads of tables (it runs inside
	// transactions, which hold mu): each table's range and since, set
	// with tables (publishServedLocked). split are tables forgotten by a
	// split, whose parts keep their since.
	served atomic.Pointer[[]servedTable]
	split  []splitPart
	// opensMu guards what tells whether the opens of a table are known
	// here (opensKnown): which sessions told of theirs (SyncOpens) since
	// the table has been served here, and the live sessions, read from
	// their records at liveAt. It is taken inside mu, never around it.
	opensMu sync.Mutex
	synced  map[uint64]map[uint64]bool // table id -> sessions
	live    []uint64
	liveAt  time.Time
	kv      *btreemap.BTreeMap[string, *entry]
	units   map[uint64]*unit // loaded units by directory id
	unitIdx *btreemap.BTreeMap[uint64, *unit]
	bytes   int64 // cached bytes
	useTick atomic.Uint64

	loadMu  sync.Mutex
	loading map[uint64]chan struct{}

	// Pending entries, in commit order (commit.go). id names this store
	// (this server's incarnation of it) to clients holding early answers;
	// durable is the newest committed entry, gen counts the aborts and
	// lost the entries the last ones lost.
	id    uint64
	queue []*pending
	// holdUntil holds new writes (a snapshot drains the store before it
	// freezes its tables: drain).
	holdUntil time.Time
	// retryWait is the first wait before a failed commit is tried again.
	retryWait time.Duration
	nextSeq   uint64
	durable   uint64
	gen       uint64
	lost      []lostRange
	// urgent counts callers waiting for the queue to be durable (WaitSafe
	// asked urgently, WaitDurable): the committer does not space commits
	// for them.
	urgent int
	kick   chan struct{}

	stop chan struct{}
	// ctx ends at close: it bounds the committer's work.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	m      *storeMetrics
}

// entry is a cached key. A pending write (pending != 0) is applied here
// but not yet durable; a deleted entry is a pending delete, absent to
// readers.
type entry struct {
	val     []byte
	deleted bool
	pending *pending
	u       *unit
}

// unit is everything filed under one directory id (fs.DirRanges): what the
// store loads and forgets at once. dirty counts its pending writes: a unit
// with pending writes is never forgotten.
type unit struct {
	d       uint64
	bytes   int64
	dirty   int
	lastUse atomic.Uint64
	keys    int
	// inodes counts the inodes among its cached keys, -1 when not
	// counted since its keys changed (cachedCounts counts it again).
	// Atomic: cachedCounts stores it under the read lock.
	inodes atomic.Int64
}

// table is a table the server owns.
type table struct {
	id    uint64
	r     fs.DRange
	epoch uint64 // the delegation epoch the server acquired it at
	hdr   tableHeader
	// serving is false while the table is being dropped: its requests are
	// refused.
	serving bool
	// frozenSince is when the server found it frozen.
	frozenSince time.Time
	// since is when the server began serving it: after opensGrace, every
	// session holding a file of it open has told the server (opensKnown).
	since time.Time
	// leaseUntil is when the server stops serving the table unless its
	// lease is renewed (the lease's holder deadline).
	leaseUntil time.Time
	// The replay gate (doc.go, Early replies): until gateUntil, requests
	// other than replays wait while a session of gateSessions (whose early
	// answers an abort here lost) has not synced since, or, with gateAll
	// (taken over without a clean handover), while some live session has
	// not synced its opens to this owner.
	gateUntil    time.Time
	gateAll      bool
	gateSessions map[uint64]bool
}

// Limits bound what a store keeps and does.
type Limits struct {
	// CacheBytes bounds the cached keys and values of one file system on
	// one server; clean units are forgotten past it (least recently used
	// first).
	CacheBytes int64
	// BatchEntries bounds the operations one commit carries.
	BatchEntries int
	// CommitInterval spaces commits of operations answered early, so that
	// more share one commit (each costs a Raft round on three replicas):
	// a commit starts this long after the previous one started, unless
	// someone waits for the queue (an operation answered only once
	// durable, an fsync, a barrier).
	CommitInterval time.Duration
	// CommitTimeout bounds one batch commit, retries included.
	CommitTimeout time.Duration
}

// DefaultLimits are the limits a server uses unless told otherwise.
var DefaultLimits = Limits{CacheBytes: 512 << 20, BatchEntries: 256, CommitTimeout: 30 * time.Second, CommitInterval: 10 * time.Millisecond}

// maxWrittenKeys bounds the distinct keys one operation's transaction
// writes: with its reply record and the headers of up to two tables it
// stays within one commit's MPSC pages (btree.MaxTxnValues), whatever
// the pages the keys fall on.
const maxWrittenKeys = btree.MaxTxnValues - 3

// Errors of the store.
var (
	// errRetry: the operation was not applied because the store lost its
	// cached state (a commit failed, a table moved); asking again is safe.
	errRetry = errors.New("meta: the table's owner lost its state; ask again")
	// errNotOwner: the key's table is not served here.
	errNotOwner = errors.New("meta: table not served here")
)

// missError asks Update or View to load unit d and run again.
type missError struct{ d uint64 }

func (e *missError) Error() string { return fmt.Sprintf("meta: directory %#x is not loaded", e.d) }

// ForeignError is what an update that touched tables this server does not
// own fails with (wrapping fs.ErrForeign): the operation must run where
// all of them are (BORROW, Ursa Minor §3.5).
type ForeignError struct {
	FS uint64
	D  []uint64 // directory ids of the keys served elsewhere
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("meta: file system %d: keys of directories %#x are served elsewhere", e.FS, e.D)
}

func (e *ForeignError) Unwrap() error { return fs.ErrForeign }

func newStore(f, node uint64, tree *btree.Tree, lim Limits, log *slog.Logger, m *storeMetrics) *store {
	s := &store{
		f: f, node: node, tree: tree, log: log.With("fs", f), lim: lim, id: rand.Uint64() | 1,
		kv:      btreemap.New[string, *entry](32, strings.Compare),
		units:   map[uint64]*unit{},
		unitIdx: btreemap.New[uint64, *unit](16, cmp.Compare[uint64]),
		loading: map[uint64]chan struct{}{},
		kick:    make(chan struct{}, 1), retryWait: commitRetryWait,
		stop: make(chan struct{}),
		m:    m,
	}
	s.changed = sync.NewCond(&s.mu)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.commitLoop()
	return s
}

// close stops the committer; pending operations fail.
func (s *store) close() {
	close(s.stop)
	s.cancel()
	s.wg.Wait()
}

// keyClass is what a key is to this store.
type keyClass int

const (
	classShared  keyClass = iota // the file system's shared records
	classOwned                   // a key of a table served here
	classForeign                 // a key of a table served elsewhere
)

// classify says what k is; for a table key, its directory id and (if
// owned) table. Callers hold mu.
func (s *store) classify(k []byte) (keyClass, uint64, *table, error) {
	f, d, isTable, err := fs.KeyDir(k)
	if err != nil {
		return 0, 0, nil, err
	}
	if f != s.f {
		return 0, 0, nil, fmt.Errorf("meta: key %x of file system %d in the store of %d", k, f, s.f)
	}
	if !isTable {
		return classShared, 0, nil, nil
	}
	t := s.tableOf(d)
	if t != nil && t.live() {
		return classOwned, d, t, nil
	}
	if u := s.units[d]; t != nil && u != nil && u.dirty > 0 {
		// Served here but not now (its lease is being renewed, it is
		// paused for a move): the tree lacks the writes not yet durable,
		// and the cache may be overtaken by a next owner. Neither can be
		// read.
		return 0, 0, nil, fmt.Errorf("%w: table %d is not served at the moment (directory %#x has writes not yet durable)", errNotOwner, t.id, d)
	}
	return classForeign, d, nil, nil
}

// live reports whether the table is served now: not being dropped, and
// under a lease.
func (t *table) live() bool { return t.serving && time.Now().Before(t.leaseUntil) }

// setLease records that table id, acquired at epoch, is leased until
// deadline.
func (s *store) setLease(id, epoch uint64, deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tableAtLocked(id, epoch); t != nil {
		t.leaseUntil = deadline
	}
}

// tableAtLocked returns table id if it is served here at epoch. Callers
// hold mu.
func (s *store) tableAtLocked(id, epoch uint64) *table {
	for _, t := range s.tables {
		if t.id == id && t.epoch == epoch {
			return t
		}
	}
	return nil
}

// tableOf returns the owned table holding directory id d. Callers hold mu.
func (s *store) tableOf(d uint64) *table {
	i := sort.Search(len(s.tables), func(i int) bool {
		r := s.tables[i].r
		return r.Hi == 0 || d < r.Hi
	})
	if i < len(s.tables) && s.tables[i].r.Contains(d) {
		return s.tables[i]
	}
	return nil
}

// touch marks u used now. Callers hold mu (a read lock is enough: the tick
// is advisory, and atomic since readers share the lock).
func (s *store) touch(u *unit) {
	u.lastUse.Store(s.useTick.Add(1))
}

// load reads unit d from the tree into the cache, once however many ask.
func (s *store) load(ctx context.Context, d uint64) error {
	s.loadMu.Lock()
	if ch, ok := s.loading[d]; ok {
		s.loadMu.Unlock()
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ch := make(chan struct{})
	s.loading[d] = ch
	s.loadMu.Unlock()
	defer func() {
		s.loadMu.Lock()
		delete(s.loading, d)
		s.loadMu.Unlock()
		close(ch)
	}()
	var kvs []btree.KV
	for _, r := range fs.DirRanges(s.f, d) {
		err := s.tree.Scan(ctx, r[0], r[1], func(k, v []byte) error {
			kvs = append(kvs, btree.KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
			return nil
		})
		if err != nil {
			return fmt.Errorf("meta: load directory %#x of file system %d: %w", d, s.f, err)
		}
	}
	s.m.loads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.units[d]; ok {
		return nil
	}
	if t := s.tableOf(d); t == nil || !t.serving {
		return nil // dropped meanwhile
	}
	// A unit is loaded only while it has no pending writes (they need the
	// unit loaded), and nothing writes its keys but this store: what the
	// scan read is the truth.
	u := &unit{d: d}
	u.inodes.Store(-1)
	for _, kv := range kvs {
		s.kv.ReplaceOrInsert(string(kv.Key), &entry{val: kv.Value, u: u})
		u.bytes += entryBytes(kv.Key, kv.Value)
		u.keys++
	}
	s.units[d] = u
	s.unitIdx.ReplaceOrInsert(d, u)
	s.bytes += u.bytes
	s.touch(u)
	s.evictLocked()
	return nil
}

func entryBytes(k, v []byte) int64 { return int64(len(k) + len(v) + 64) }

// evictLocked forgets least recently used clean units while the cache is
// over its bound. Callers hold mu for writing.
func (s *store) evictLocked() {
	if s.bytes <= s.lim.CacheBytes {
		return
	}
	us := make([]*unit, 0, len(s.units))
	for _, u := range s.units {
		if u.dirty == 0 {
			us = append(us, u)
		}
	}
	slices.SortFunc(us, func(a, b *unit) int { return cmp.Compare(a.lastUse.Load(), b.lastUse.Load()) })
	for _, u := range us {
		if s.bytes <= s.lim.CacheBytes*9/10 {
			break
		}
		s.dropUnitLocked(u)
		s.m.evictions.Add(1)
	}
}

// dropUnitLocked forgets unit u (it must be clean).
func (s *store) dropUnitLocked(u *unit) {
	for _, r := range fs.DirRanges(s.f, u.d) {
		var ks []string
		s.kv.AscendFunc(btreemap.GE(string(r[0])), btreemap.LT(string(r[1])), func(k string, _ *entry) bool {
			ks = append(ks, k)
			return true
		})
		for _, k := range ks {
			s.kv.Delete(k)
		}
	}
	delete(s.units, u.d)
	s.unitIdx.Delete(u.d)
	s.bytes -= u.bytes
}

// View implements fs.MetaStore: fn reads owned keys from the cache (all
// under one read lock, so consistently), other keys from the tree. If fn
// saw writes not yet durable, View returns once they are, so nothing it
// answers can be lost.
func (s *store) View(ctx context.Context, fn func(fs.MetaTxn) error) error {
	for {
		s.mu.RLock()
		if err := s.passedGateLocked(ctx); err != nil {
			s.mu.RUnlock()
			return err
		}
		tx := &txn{s: s, ctx: ctx, session: fs.SessionOf(ctx)}
		ferr := fn(tx)
		s.mu.RUnlock()
		if err := s.retryAfter(ctx, tx.err); err != nil {
			return err
		} else if tx.err != nil {
			continue
		}
		if ferr != nil {
			return ferr
		}
		return tx.waitSeen(ctx)
	}
}

// retryAfter handles a transaction's sticky error: a miss is loaded (nil:
// run again), anything else is returned.
func (s *store) retryAfter(ctx context.Context, err error) error {
	var miss *missError
	if errors.As(err, &miss) {
		return s.load(ctx, miss.d)
	}
	return err
}

// Update implements fs.MetaStore: fn runs against the cache under the
// store's lock (so operations on this server's tables are serialized), its
// writes are applied to the cache at once and Update returns when they are
// durable (the group commit, commit.go), or at once for the first write
// transaction of an operation that may be answered early (replyTag.early)
// if it read no other session's writes not yet durable and asked for no
// durability (doc.go, Early replies). A write to a table served elsewhere
// fails with a *ForeignError.
func (s *store) Update(ctx context.Context, fn func(fs.MetaTxn) error) error {
	for {
		if err := s.waitWritable(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		if err := s.passedGateLocked(ctx); err != nil {
			s.mu.Unlock()
			return err
		}
		tx := &txn{s: s, ctx: ctx, write: true, session: fs.SessionOf(ctx)}
		ferr := fn(tx)
		if tx.err != nil {
			s.mu.Unlock()
			if err := s.retryAfter(ctx, tx.err); err != nil {
				return err
			}
			continue
		}
		if ferr != nil {
			s.mu.Unlock()
			if errors.Is(ferr, errWait) {
				continue
			}
			return ferr
		}
		if len(tx.order) == 0 {
			s.mu.Unlock()
			return tx.waitSeen(ctx)
		}
		first, err := s.addReply(ctx, tx)
		if err != nil {
			s.mu.Unlock()
			if err := s.retryAfter(ctx, err); err != nil {
				return err
			}
			continue
		}
		r := replyOf(ctx)
		early := first && r.early && !tx.durable && tx.seen == nil
		p := s.applyLocked(tx, early)
		s.mu.Unlock()
		if early {
			r.p = p
			return nil
		}
		return p.wait(ctx)
	}
}

// errWait makes Update wait for the store's tables to be writable (not
// frozen, one write epoch) and run again.
var errWait = errors.New("meta: tables not writable yet")

// waitWritable blocks while a table is frozen or the tables disagree on
// the write epoch (a snapshot is being taken).
func (s *store) waitWritable(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		held := time.Now().Before(s.holdUntil)
		if _, ok := s.writeEpochLocked(); ok && len(s.queue) < maxQueued && !held {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("meta: waiting for a snapshot to finish: %w", err)
		}
		wait := 50 * time.Millisecond
		if held {
			wait = min(wait, time.Until(s.holdUntil))
		}
		waitCond(ctx, s.changed, wait)
	}
}

// WaitDurable implements fs.DurableWaiter: it waits for the newest
// pending entry (entries commit in order).
func (s *store) WaitDurable(ctx context.Context) error {
	s.mu.Lock()
	var last *pending
	if n := len(s.queue); n > 0 {
		last = s.queue[n-1]
	}
	s.mu.Unlock()
	if last == nil {
		return nil
	}
	defer s.hurry()()
	return last.wait(ctx)
}

// hurry tells the committer someone waits for the queue, until the
// returned func is called.
func (s *store) hurry() func() {
	s.mu.Lock()
	s.urgent++
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return func() {
		s.mu.Lock()
		s.urgent--
		s.mu.Unlock()
	}
}

var _ fs.DurableWaiter = (*store)(nil)

// drain holds new writes for up to hold (or until release) and returns
// once every pending entry is durable (or aborted).
func (s *store) drain(ctx context.Context, hold time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdUntil = time.Now().Add(hold)
	for len(s.queue) > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("meta: draining the table store: %w", err)
		}
		waitCond(ctx, s.changed, 50*time.Millisecond)
	}
	return nil
}

// release lets writes through again after drain.
func (s *store) release() {
	s.mu.Lock()
	s.holdUntil = time.Time{}
	s.mu.Unlock()
	s.changed.Broadcast()
}

// drainHold bounds how long a drain holds writes when nothing releases
// them (its snapshot's coordinator died).
const drainHold = 10 * time.Second

// writeEpochLocked returns the write epoch every owned table is at, and
// false while one is frozen or they disagree.
func (s *store) writeEpochLocked() (uint64, bool) {
	var w uint64
	for _, t := range s.tables {
		if t.hdr.Frozen != 0 || (w != 0 && t.hdr.W != w) {
			return 0, false
		}
		w = t.hdr.W
	}
	return w, true
}

// waitCond waits on c (its lock held) until signalled or d passes.
func waitCond(ctx context.Context, c *sync.Cond, d time.Duration) {
	t := time.AfterFunc(d, c.Broadcast)
	defer t.Stop()
	stop := context.AfterFunc(ctx, c.Broadcast)
	defer stop()
	c.Wait()
}

// Scan implements fs.MetaStore: the owned units in [from, to) that are
// loaded come from the cache, everything else from the tree; like the
// tree's own scan, it is not atomic.
func (s *store) Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error {
	cur := bytes.Clone(from)
	for to == nil || bytes.Compare(cur, to) < 0 {
		// The next loaded unit at or after cur, if it starts before to.
		s.mu.RLock()
		lo, hi, u := s.nextLoadedLocked(cur, to)
		s.mu.RUnlock()
		end := to
		if u != nil {
			end = lo
		}
		if end == nil || bytes.Compare(cur, end) < 0 {
			if err := s.tree.Scan(ctx, cur, end, fn); err != nil {
				return err
			}
		}
		if u == nil {
			return nil
		}
		// The unit's keys from the cache, those not yet durable included
		// (they wait for durability below).
		var kvs []btree.KV
		var seen *pending
		s.mu.RLock()
		start := cur
		if bytes.Compare(lo, cur) > 0 {
			start = lo
		}
		stop := hi
		if to != nil && bytes.Compare(to, hi) < 0 {
			stop = to
		}
		session := fs.SessionOf(ctx)
		s.kv.AscendFunc(btreemap.GE(string(start)), btreemap.LT(string(stop)), func(k string, e *entry) bool {
			if p := e.pending; p != nil && (p.session == 0 || p.session != session) && (seen == nil || p.seq > seen.seq) {
				seen = p
			}
			if !e.deleted {
				kvs = append(kvs, btree.KV{Key: []byte(k), Value: e.val})
			}
			return true
		})
		s.touch(u)
		s.mu.RUnlock()
		if seen != nil {
			if err := seen.wait(ctx); err != nil {
				return err
			}
		}
		for _, kv := range kvs {
			if err := fn(kv.Key, kv.Value); err != nil {
				return err
			}
		}
		cur = hi
	}
	return nil
}

// nextLoadedLocked finds the first loaded unit range [lo, hi) that ends
// after cur and starts before to (nil: none): objects' ranges first, then
// orphans', each in directory id order.
func (s *store) nextLoadedLocked(cur, to []byte) (lo, hi []byte, u *unit) {
	first := fs.DirRanges(s.f, 0)
	last := fs.DirRanges(s.f, ^uint64(0))
	for space := range 2 {
		start, end := first[space][0], last[space][1]
		if bytes.Compare(cur, end) >= 0 {
			continue
		}
		if to != nil && bytes.Compare(start, to) >= 0 {
			return nil, nil, nil
		}
		var d0 uint64
		if bytes.Compare(cur, start) > 0 {
			_, d, ok, err := fs.KeyDir(cur)
			if err == nil && ok {
				d0 = d
			}
		}
		var found *unit
		s.unitIdx.AscendFunc(btreemap.GE(d0), btreemap.Max[uint64](), func(d uint64, un *unit) bool {
			r := fs.DirRanges(s.f, d)[space]
			if bytes.Compare(r[1], cur) <= 0 {
				return true // ends before cur: the next one
			}
			if to == nil || bytes.Compare(r[0], to) < 0 {
				found, lo, hi = un, r[0], r[1]
			}
			return false
		})
		if found != nil {
			return lo, hi, found
		}
	}
	return nil, nil, nil
}
