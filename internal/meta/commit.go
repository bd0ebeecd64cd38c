package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Group commit (doc.go, The table store). An operation's writes are
// applied to the cache under the store's lock and queued as a pending
// entry; one committer per store takes the queue's head, as many entries
// as fit in one MPSC (btree.UpdatePages: 15 leaf pages), and commits them
// in one B-tree transaction that also checks the header of every table
// they touch. Entries commit in queue order, so an operation that read
// another's not-yet-durable write is durable no earlier, and what is
// durable after a crash is a prefix of the queue.
//
// A commit that fails without a verdict (the extent store unavailable
// past the deadline, an outcome unknown) is tried again: the owner is its
// tables' only writer, so an unknown outcome is settled by reading the
// written keys back. Only a commit that cannot happen (a header changed:
// the table has a new owner, a snapshot froze it; or retries ran out)
// aborts the queue: every pending entry's units are forgotten, so the next
// reader loads what the tree holds; an operation still waiting fails with
// errRetry (its client asks again), and the entries answered early are
// reported lost (WaitSafe) and their tables gated until their sessions
// replayed them (doc.go, Early replies).

// pending is an operation's writes, applied to the cache, not yet durable.
type pending struct {
	seq uint64
	// gen is the store's abort count when the entry was applied.
	gen     uint64
	w       uint64 // the write epoch the operation ran at
	session uint64 // the operation's session (0: the server's own)
	// early: the operation may be answered before the entry is durable.
	early  bool
	writes []*bufWrite
	tables []*table
	units  []*unit
	done   chan struct{}
	err    error // set before done is closed
	// landed: committed (set under the store's mu, before done closes).
	landed bool
}

// wait blocks until p is durable (nil) or aborted (errRetry, or the
// commit's error).
func (p *pending) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the commit of an operation: %w", fs.ErrAmbiguousCommit, ctx.Err())
	}
}

// durableBefore reports whether p, applied before the abort that made
// the store's abort count gen, was durable rather than aborted. An entry
// applied since is neither yet (false).
// Callers hold the store's mu.
func (p *pending) durableBefore(gen uint64) bool {
	return p.gen < gen && p.landed
}

// replyTag is what the server tells the store of a recorded request, in
// its context: the reply record the operation's first write transaction
// writes, and whether it may be answered early. The store sets p to that
// transaction's entry when it answers before the entry is durable.
type replyTag struct {
	key     []byte
	seq     uint64
	written bool
	early   bool
	p       *pending
}

type replyTagKey struct{}

func withReply(ctx context.Context, r *replyTag) context.Context {
	return context.WithValue(ctx, replyTagKey{}, r)
}

func replyOf(ctx context.Context) *replyTag {
	r, _ := ctx.Value(replyTagKey{}).(*replyTag)
	return r
}

// addReply adds the operation's reply record to its first write
// transaction (the one that makes the operation visible: fs operations
// change what a client sees in their first transaction), and reports
// whether it did.
func (s *store) addReply(ctx context.Context, tx *txn) (bool, error) {
	r := replyOf(ctx)
	if r == nil || r.written {
		return false, nil
	}
	if err := tx.Put(r.key, (&replyRecord{Seq: r.seq}).encode()); err != nil {
		return false, err
	}
	r.written = true
	return true, nil
}

// applyLocked applies tx's writes to the cache and queues them. Callers
// hold mu for writing.
func (s *store) applyLocked(tx *txn, early bool) *pending {
	w, _ := s.writeEpochLocked()
	s.nextSeq++
	p := &pending{seq: s.nextSeq, gen: s.gen, w: w, session: tx.session, early: early, tables: tx.tables, done: make(chan struct{})}
	if early {
		s.m.earlyEntries.Add(1)
	}
	for _, k := range tx.order {
		bw := tx.writes[k]
		p.writes = append(p.writes, bw)
		if !bw.owned {
			continue
		}
		u := s.units[bw.d]
		if !slices.Contains(p.units, u) {
			p.units = append(p.units, u)
			u.dirty++
		}
		prefix, isInode := fs.InodePrefix([]byte(k))
		counted := isInode && u.inodes.Load() >= 0
		var before bool
		if counted {
			before = s.inodeCachedLocked(prefix)
		}
		_, e, ok := s.kv.Get(k)
		if ok {
			u.bytes -= entryBytes([]byte(k), e.val)
			s.bytes -= entryBytes([]byte(k), e.val)
		} else {
			e = &entry{u: u}
			s.kv.ReplaceOrInsert(k, e)
		}
		e.val, e.deleted, e.pending = bw.val, bw.deleted, p
		u.bytes += entryBytes([]byte(k), e.val)
		s.bytes += entryBytes([]byte(k), e.val)
		if counted {
			switch after := s.inodeCachedLocked(prefix); {
			case after && !before:
				u.inodes.Add(1)
			case before && !after:
				u.inodes.Add(-1)
			}
		}
	}
	s.queue = append(s.queue, p)
	s.m.pending.Add(1)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return p
}

// maxQueued bounds the entries a store has pending: past it, updates wait
// for the committer (an early answer does not let clients outrun it).
const maxQueued = 8192

// Commit retries: a batch that fails without a verdict is tried again
// after commitRetryWait, up to maxCommitTries times (each bounded by
// Limits.CommitTimeout), then aborted.
const (
	maxCommitTries  = 8
	commitRetryWait = 100 * time.Millisecond
)

// commitLoop is the committer: it commits the queue's head in batches.
func (s *store) commitLoop() {
	defer s.wg.Done()
	batch := s.lim.BatchEntries
	tries := 0
	var last time.Time // when the last commit started
	for {
		s.mu.Lock()
		n := batchLen(s.queue, batch)
		todo := slices.Clone(s.queue[:n])
		var wait time.Duration
		if n > 0 && n < batch {
			wait = time.Until(last.Add(s.lim.CommitInterval))
			if wait > 0 && (s.urgent > 0 || !allEarly(s.queue)) {
				wait = 0
				s.m.hurried.Add(1)
			}
		}
		s.mu.Unlock()
		if n == 0 || wait > 0 {
			var timer <-chan time.Time
			if wait > 0 {
				timer = time.After(wait)
			}
			select {
			case <-s.kick:
			case <-timer:
				last = time.Time{}
			case <-s.stop:
				s.abortAll(errors.New("meta: the server is stopping"))
				return
			}
			continue
		}
		last = time.Now()
		err := s.commit(todo)
		if errors.Is(err, btree.ErrAmbiguous) {
			if landed, rerr := s.landed(todo); rerr == nil && landed {
				err = nil
			} else if rerr == nil {
				err = fmt.Errorf("%w: it did not land", errCommitFailed)
			}
		}
		var fenced *errFenced
		switch {
		case err == nil:
			s.finish(todo)
			batch = min(s.lim.BatchEntries, batch*2)
			tries = 0
		case (errors.Is(err, btree.ErrTooManyValues) || errors.Is(err, btree.ErrGaveUp)) && len(todo) > 1:
			// Too many pages, or too many splits for one transaction's
			// attempts: smaller batches.
			if errors.Is(err, btree.ErrGaveUp) {
				s.log.Info("a batch commit gave up; trying smaller batches", "entries", len(todo), "err", err)
			}
			batch = max(1, len(todo)/2)
		case errors.As(err, &fenced) || tries+1 >= maxCommitTries || s.stopping():
			s.log.Warn("a batch commit failed; the pending operations are aborted", "entries", len(todo), "err", err)
			s.abortAll(err)
			batch = s.lim.BatchEntries
			tries = 0
		default:
			tries++
			s.log.Info("a batch commit failed; trying it again", "entries", len(todo), "try", tries, "err", err)
			select {
			case <-time.After(s.retryWait << min(tries, 5)):
			case <-s.stop:
			}
		}
	}
}

// maxBatchBytes bounds the bytes one batch writes (keys and values): a
// batch's leaves must fit one MPSC (btree.MaxTxnValues pages), and a
// batch that fills pages makes the tree split them first, one structural
// transaction and one attempt of the batch each (past a few, attempts
// back off: a batch of 70 small files kept inline once took minutes).
// Two leaves' worth keeps it to a split or two.
const maxBatchBytes = 16 << 10

// batchLen is how many entries from the head of queue the next batch
// takes: at most max, and no more bytes than maxBatchBytes (but one at
// least).
func batchLen(queue []*pending, max int) int {
	n, size := 0, 0
	for n < len(queue) && n < max {
		for _, w := range queue[n].writes {
			size += len(w.key) + len(w.val)
		}
		if n > 0 && size > maxBatchBytes {
			break
		}
		n++
	}
	return n
}

// allEarly reports whether every entry of queue was answered early
// (nobody waits for them to be durable).
func allEarly(queue []*pending) bool {
	for _, p := range queue {
		if !p.early {
			return false
		}
	}
	return true
}

// errCommitFailed: a commit whose outcome was unknown did not land.
var errCommitFailed = errors.New("meta: batch commit failed")

func (s *store) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// errFenced: a table's header no longer names this owner at its epoch, or
// a snapshot froze it.
type errFenced struct {
	t   *table
	hdr *tableHeader // nil: the header is gone
}

func (e *errFenced) Error() string {
	if e.hdr == nil {
		return fmt.Sprintf("meta: the header of table %d is gone", e.t.id)
	}
	return fmt.Sprintf("meta: table %d: header at epoch %d (owner %d, W %d, frozen %d); this owner holds epoch %d",
		e.t.id, e.hdr.Epoch, e.hdr.Owner, e.hdr.W, e.hdr.Frozen, e.t.epoch)
}

// batchTables returns the tables the entries touch.
func batchTables(todo []*pending) []*table {
	var tables []*table
	for _, p := range todo {
		for _, t := range p.tables {
			if !slices.Contains(tables, t) {
				tables = append(tables, t)
			}
		}
	}
	return tables
}

// checkHeader fails with *errFenced unless table t's header in tx names
// this owner at its epoch, unfrozen, at the write epoch of every entry of
// todo that touches t.
func (s *store) checkHeader(tx *btree.Txn, t *table, todo []*pending) error {
	v, ok, err := tx.Get(headerKey(s.f, t.r.Lo))
	if err != nil {
		return err
	}
	if !ok {
		return &errFenced{t: t}
	}
	h, err := decodeHeader(v)
	if err != nil {
		return err
	}
	if h.Epoch != t.epoch || h.Owner != s.node || h.Frozen != 0 {
		return &errFenced{t: t, hdr: h}
	}
	for _, p := range todo {
		if slices.Contains(p.tables, t) && p.w != h.W {
			return &errFenced{t: t, hdr: h}
		}
	}
	return nil
}

// commit writes the entries in one B-tree transaction, conditional on the
// headers of the tables they touch.
func (s *store) commit(todo []*pending) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.lim.CommitTimeout)
	defer cancel()
	tables := batchTables(todo)
	start := time.Now()
	err := s.tree.UpdatePages(ctx, func(tx *btree.Txn) error {
		for _, t := range tables {
			if err := s.checkHeader(tx, t, todo); err != nil {
				return err
			}
		}
		for _, p := range todo {
			for _, w := range p.writes {
				var err error
				if w.deleted {
					err = tx.Delete([]byte(w.key))
				} else {
					err = tx.Put([]byte(w.key), w.val)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
	s.m.commitSeconds.Observe(time.Since(start).Seconds())
	if err == nil {
		s.m.commits.Add(1)
		s.m.committedEntries.Add(int64(len(todo)))
	}
	var fenced *errFenced
	if errors.As(err, &fenced) {
		s.fenced(fenced)
	}
	return err
}

// landed settles a commit of todo whose outcome is unknown: in a read-only
// transaction, the headers must still name this owner (else a new owner
// may have written since: *errFenced) and every key the batch writes must
// hold what the batch's last write of it says. The owner is the only
// writer of its tables' keys and the batch commits atomically, so a batch
// that did not land leaves some key different, unless it wrote nothing
// new, in which case the state is as if it had landed.
func (s *store) landed(todo []*pending) (bool, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.lim.CommitTimeout)
	defer cancel()
	final := map[string]*bufWrite{}
	for _, p := range todo {
		for _, w := range p.writes {
			final[w.key] = w
		}
	}
	tables := batchTables(todo)
	same := true
	err := s.tree.View(ctx, func(tx *btree.Txn) error {
		same = true
		for _, t := range tables {
			if err := s.checkHeader(tx, t, todo); err != nil {
				return err
			}
		}
		for k, w := range final {
			v, ok, err := tx.Get([]byte(k))
			if err != nil {
				return err
			}
			if ok == w.deleted || (ok && !bytes.Equal(v, w.val)) {
				same = false
				return nil
			}
		}
		return nil
	})
	var fenced *errFenced
	if errors.As(err, &fenced) {
		s.fenced(fenced)
	}
	return same, err
}

// finish marks committed entries durable.
func (s *store) finish(todo []*pending) {
	s.mu.Lock()
	for _, p := range todo {
		p.landed = true
		for _, w := range p.writes {
			if !w.owned {
				continue
			}
			if _, e, ok := s.kv.Get(w.key); ok && e.pending == p {
				e.pending = nil
				if e.deleted {
					s.kv.Delete(w.key)
					e.u.bytes -= entryBytes([]byte(w.key), nil)
					s.bytes -= entryBytes([]byte(w.key), nil)
				}
			}
		}
		for _, u := range p.units {
			u.dirty--
		}
	}
	s.queue = s.queue[len(todo):]
	s.durable = todo[len(todo)-1].seq
	s.m.pending.Add(-int64(len(todo)))
	s.evictLocked()
	s.changed.Broadcast()
	s.mu.Unlock()
	for _, p := range todo {
		close(p.done)
	}
}

// abortAll aborts every pending entry: their units are forgotten (the
// tree holds what was committed), and their operations fail. Entries
// answered early are lost: the store's abort count grows and remembers
// their range for WaitSafe, and each table they touched that is still
// served here is gated until their sessions have replayed them.
func (s *store) abortAll(cause error) {
	s.mu.Lock()
	todo := s.queue
	s.queue = nil
	seen := map[*unit]bool{}
	gated := map[*table]map[uint64]bool{}
	for _, p := range todo {
		for _, u := range p.units {
			if !seen[u] {
				seen[u] = true
				u.dirty = 0
				if s.units[u.d] == u {
					s.dropUnitLocked(u)
				}
			}
		}
		if p.early {
			for _, t := range p.tables {
				if gated[t] == nil {
					gated[t] = map[uint64]bool{}
				}
				gated[t][p.session] = true
			}
		}
	}
	if len(todo) > 0 {
		s.gen++
		s.lost = append(s.lost, lostRange{gen: s.gen, from: todo[0].seq, to: todo[len(todo)-1].seq})
		if len(s.lost) > maxLostRanges {
			s.lost = s.lost[len(s.lost)-maxLostRanges:]
		}
	}
	for t, sessions := range gated {
		if !slices.Contains(s.tables, t) {
			continue // gone to a new owner: it gates them
		}
		if t.gateSessions == nil {
			t.gateSessions = map[uint64]bool{}
		}
		for sess := range sessions {
			t.gateSessions[sess] = true
		}
		t.gateUntil = time.Now().Add(gateTimeout)
		s.log.Warn("a table's early answers were lost; holding it until their sessions replay them", "table", t.id, "sessions", len(t.gateSessions))
	}
	s.m.pending.Add(-int64(len(todo)))
	s.m.aborts.Add(int64(len(todo)))
	s.changed.Broadcast()
	s.mu.Unlock()
	err := fmt.Errorf("%w (%v)", errRetry, cause)
	if errors.Is(cause, btree.ErrAmbiguous) {
		err = fmt.Errorf("%w: %w", fs.ErrAmbiguousCommit, err)
	}
	for _, p := range todo {
		p.err = err
		close(p.done)
	}
}

// lostRange is the entries one abort lost.
type lostRange struct {
	gen      uint64 // the abort count after it
	from, to uint64
}

// maxLostRanges bounds the aborts a store remembers; a client asking about
// an older one is told the store is unknown (it replays everything).
const maxLostRanges = 256

// safeState is what WaitSafe answers: the newest durable entry, the abort
// count, and the ranges the aborts after gen lost; known is false when
// the aborts after gen are forgotten.
type safeState struct {
	durable, gen uint64
	lost         []lostRange
	known        bool
}

// waitSafe waits until the store's durable entry passes after or its abort
// count passes gen, or until d passes or ctx ends; then it says where the
// store is. urgent: the caller waits on it (the committer does not space
// its commits meanwhile).
func (s *store) waitSafe(ctx context.Context, after, gen uint64, urgent bool, d time.Duration) safeState {
	deadline := time.Now().Add(d)
	if urgent {
		defer s.hurry()()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.durable <= after && s.gen <= gen && time.Now().Before(deadline) && ctx.Err() == nil {
		waitCond(ctx, s.changed, time.Until(deadline))
	}
	st := safeState{durable: s.durable, gen: s.gen, known: true}
	if s.gen > gen {
		if len(s.lost) == 0 || s.lost[0].gen > gen+1 {
			st.known = false
		}
		for _, r := range s.lost {
			if r.gen > gen {
				st.lost = append(st.lost, r)
			}
		}
	}
	return st
}

// pendingOf returns the entry that wrote key if it is not durable yet.
func (s *store) pendingOf(key []byte) *pending {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, e, ok := s.kv.Get(string(key)); ok {
		return e.pending
	}
	return nil
}

// ack is the Ack of an operation of this store: p is the entry it was
// answered early at (nil: durable when answered), now the time it ran at.
func (s *store) ack(p *pending, now time.Time) *pb.Ack {
	s.mu.RLock()
	a := &pb.Ack{Store: s.id, Durable: s.durable, StoreGen: s.gen, NowNs: now.UnixNano()}
	s.mu.RUnlock()
	if p != nil {
		a.Seq, a.Gen = p.seq, p.gen
	}
	return a
}
