package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
)

// Group commit (doc.go, The table store). An operation's writes are
// applied to the cache under the store's lock and queued as a pending
// entry; one committer per store takes the queue's head, as many entries
// as fit in one MPSC (btree.UpdatePages: 15 leaf pages), and commits them
// in one B-tree transaction that also checks the header of every table
// they touch. Entries commit in queue order, so an operation that read
// another's not-yet-durable write is durable no earlier. If a commit
// fails (a header changed: the table moved or is being snapshotted; the
// outcome is unknown; the store is unavailable past the deadline), every
// pending entry is aborted: its keys' units are forgotten, so the next
// reader loads what the tree holds, and its operation fails with errRetry.
// Clients then ask again, and reply records make that safe.

// pending is an operation's writes, applied to the cache, not yet durable.
type pending struct {
	seq    uint64
	w      uint64 // the write epoch the operation ran at
	writes []*bufWrite
	tables []*table
	units  []*unit
	done   chan struct{}
	err    error // set before done is closed
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

// replyKey is the reply record an operation must write: set in its
// context by the server (recorded), once per request.
type replyTag struct {
	key     []byte
	seq     uint64
	written bool
}

type replyTagKey struct{}

func withReply(ctx context.Context, r *replyTag) context.Context {
	return context.WithValue(ctx, replyTagKey{}, r)
}

// addReply adds the operation's reply record to its first write
// transaction (the one that makes the operation visible: fs operations
// change what a client sees in their first transaction).
func (s *store) addReply(ctx context.Context, tx *txn) error {
	r, _ := ctx.Value(replyTagKey{}).(*replyTag)
	if r == nil || r.written {
		return nil
	}
	if err := tx.Put(r.key, (&replyRecord{Seq: r.seq}).encode()); err != nil {
		return err
	}
	r.written = true
	return nil
}

// applyLocked applies tx's writes to the cache and queues them. Callers
// hold mu for writing.
func (s *store) applyLocked(tx *txn) *pending {
	w, _ := s.writeEpochLocked()
	s.nextSeq++
	p := &pending{seq: s.nextSeq, w: w, tables: tx.tables, done: make(chan struct{})}
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
		u.inodes.Store(-1)
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
	}
	s.queue = append(s.queue, p)
	s.m.pending.Add(1)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return p
}

// commitLoop is the committer: it commits the queue's head in batches.
func (s *store) commitLoop() {
	defer s.wg.Done()
	batch := s.lim.BatchEntries
	for {
		s.mu.Lock()
		n := min(len(s.queue), batch)
		todo := slices.Clone(s.queue[:n])
		s.mu.Unlock()
		if n == 0 {
			select {
			case <-s.kick:
				continue
			case <-s.stop:
				s.abortAll(errors.New("meta: the server is stopping"))
				return
			}
		}
		err := s.commit(todo)
		switch {
		case err == nil:
			s.finish(todo)
			batch = min(s.lim.BatchEntries, batch*2)
		case errors.Is(err, btree.ErrTooManyValues) && len(todo) > 1:
			batch = max(1, len(todo)/2)
		default:
			s.log.Warn("a batch commit failed; the pending operations are aborted and will be asked again", "entries", len(todo), "err", err)
			s.abortAll(err)
			batch = s.lim.BatchEntries
		}
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

// commit writes the entries in one B-tree transaction, conditional on the
// headers of the tables they touch.
func (s *store) commit(todo []*pending) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.lim.CommitTimeout)
	defer cancel()
	var tables []*table
	for _, p := range todo {
		for _, t := range p.tables {
			if !slices.Contains(tables, t) {
				tables = append(tables, t)
			}
		}
	}
	start := time.Now()
	err := s.tree.UpdatePages(ctx, func(tx *btree.Txn) error {
		for _, t := range tables {
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

// finish marks committed entries durable.
func (s *store) finish(todo []*pending) {
	s.mu.Lock()
	for _, p := range todo {
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
	s.m.pending.Add(-int64(len(todo)))
	s.evictLocked()
	s.changed.Broadcast()
	s.mu.Unlock()
	for _, p := range todo {
		close(p.done)
	}
}

// abortAll aborts every pending entry: their units are forgotten (the
// tree holds what was committed), and their operations fail.
func (s *store) abortAll(cause error) {
	s.mu.Lock()
	todo := s.queue
	s.queue = nil
	seen := map[*unit]bool{}
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
