package fs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Reclaiming objects that lost their last name (doc.go, Orphans).

// orphaned is called after a transaction listed h as an orphan: it is
// reclaimed now, or at its last close if a session holds it open.
func (f *FS) orphaned(ctx context.Context, h Handle) {
	held := f.opens.markUnlinked(h) // reclaimed at its last close
	if !f.opensKnown(h) || isEarly(ctx) {
		// Early: the unlink may not be durable yet, and freeing the
		// tracts cannot be undone; the background reclaim's transactions
		// are durable before it frees anything.
		if !held {
			f.deferReclaim(h)
		}
		return
	}
	if held {
		return
	}
	if err := f.reclaim(ctx, h); err != nil {
		f.log.Warn("reclaiming an unlinked object; left to the background", "handle", h, "err", err)
	}
}

// dataHeld reports whether a session other than the caller's holds h's
// data (SetHold), so that reclaiming it now would wait for the hold.
func (f *FS) dataHeld(ctx context.Context, h Handle) bool {
	n, err := f.headInode(ctx, h)
	return err == nil && f.heldFrom(ctx, n)
}

// errTrimPending: an orphan's inode still has blocks to trim.
var errTrimPending = errors.New("fs: the orphan's blocks are not all trimmed yet")

// reclaim deletes orphan h: its blocks (freeing the tracts no snapshot
// needs), attributes and symlink chunks, then its inode and orphan record
// in one transaction, then its blob once no snapshot needs it.
func (f *FS) reclaim(ctx context.Context, h Handle) error {
	err := f.reclaimOnce(ctx, h)
	for range maxTruncateAttempts {
		if !errors.Is(err, errTrimPending) {
			break
		}
		if err = f.trim(ctx, h); err == nil {
			err = f.reclaimOnce(ctx, h)
		}
	}
	if errnoOf(err) == syscall.ENOENT {
		// Another client (or this one's background pass) reclaimed it
		// meanwhile: only the record may be left.
		return f.dropOrphanRecord(ctx, h)
	}
	return err
}

func (f *FS) reclaimOnce(ctx context.Context, h Handle) error {
	k := f.keys
	n, err := f.headInode(ctx, h)
	if errnoOf(err) == syscall.ENOENT {
		return f.dropOrphanRecord(ctx, h)
	}
	if err != nil {
		return err
	}
	if n.Nlink > 0 {
		return f.dropOrphanRecord(ctx, h)
	}
	if n.Mode&sIFMT == sIFREG && (n.BlobExists || n.Size > 0) {
		err := f.update(ctx, func(w *wtx) error {
			cur, in, err := w.inode(k, h)
			if err != nil || in.Nlink > 0 {
				return err
			}
			if in.TrimFrom == 0 {
				in.TrimFrom = 1
			}
			in.Size = 0
			return w.setInode(k, h, cur, in)
		})
		if err != nil {
			return err
		}
		if err := f.trim(ctx, h); err != nil {
			return err
		}
	}
	// Attributes, a few per transaction.
	for {
		names, err := f.ListXattr(ctx, h)
		if err != nil {
			return err
		}
		if len(names) == 0 {
			break
		}
		names = names[:min(len(names), blocksPerTxn)]
		err = f.update(ctx, func(w *wtx) error {
			icur, in, err := w.inode(k, h)
			if err != nil {
				return err
			}
			for _, name := range names {
				key := k.xattr(h, name)
				cur, _, err := w.current(key)
				if err != nil {
					return err
				}
				if cur.live() {
					if err := w.del(key, cur); err != nil {
						return err
					}
					in.Xattrs = max(in.Xattrs, 1) - 1
				}
			}
			return w.setInode(k, h, icur, in)
		})
		if err != nil {
			return err
		}
	}
	var queued GUID
	err = f.update(ctx, func(w *wtx) error {
		queued = GUID{}
		cur, in, err := w.inode(k, h)
		if errnoOf(err) == syscall.ENOENT {
			return w.tx.Delete(k.orphan(h))
		}
		if err != nil {
			return err
		}
		if in.Nlink > 0 {
			return w.tx.Delete(k.orphan(h))
		}
		if in.TrimFrom != 0 {
			// Blocks are left (a trim stopped short): deleting the inode
			// now would strand them.
			return errTrimPending
		}
		if in.Mode&sIFMT == sIFREG && in.Size > 0 {
			// Data committed since the trim ended (a late flush of the
			// session that held the orphan): every commit of blocks
			// raises the size the first step set to 0, so trim again
			// rather than strand its blocks.
			return errTrimPending
		}
		if in.Mode&sIFMT == sIFLNK && uint64(len(in.Target)) != in.Size {
			for i := uint64(0); i*symlinkChunkBytes < in.Size; i++ {
				ck := k.symlinkChunk(h, i)
				ccur, _, err := w.current(ck)
				if err != nil {
					return err
				}
				if err := w.del(ck, ccur); err != nil {
					return err
				}
			}
		}
		gone := w.delRemovesAll(cur)
		if err := w.del(k.inode(h), cur); err != nil {
			return err
		}
		if gone && in.BlobExists {
			queued = in.Blob
			if err := w.tx.Put(k.blobQueue(in.Blob), nil); err != nil {
				return err
			}
		}
		return w.tx.Delete(k.orphan(h))
	})
	if err != nil {
		return err
	}
	if !queued.IsZero() {
		return f.deleteQueuedBlob(ctx, queued)
	}
	return nil
}

// delRemovesAll reports whether del(cur) leaves no version of the key.
func (w *wtx) delRemovesAll(cur version) bool {
	return (cur.S == w.epoch || !w.shared(cur)) && !cur.HasOlder
}

func (f *FS) dropOrphanRecord(ctx context.Context, h Handle) error {
	return f.update(ctx, func(w *wtx) error { return w.tx.Delete(f.keys.orphan(h)) })
}

// deleteQueuedBlob deletes a blob listed in the blob queue, then its entry.
func (f *FS) deleteQueuedBlob(ctx context.Context, g GUID) error {
	if err := f.data.DeleteBlob(ctx, g); err != nil && !errors.Is(err, ErrBlobNotFound) {
		return storeErr("delete blob", err)
	}
	return f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(f.keys.blobQueue(g)) })
}

// ReclaimOrphans reclaims the orphans no session may hold open: those not
// open here whose holder's session expired (all: every orphan not open
// here), and deletes the blobs queued for deletion. Whoever runs the file
// system runs it in the background; fsck --repair runs it with all.
func (f *FS) ReclaimOrphans(ctx context.Context, all bool) error {
	return errors.Join(f.ReclaimOrphansIn(ctx, AllD, all), f.DeleteQueuedBlobs(ctx))
}

// ReclaimOrphansIn is ReclaimOrphans for the orphans whose D is in r (a
// metadata server's tables), without the blob queue (DeleteQueuedBlobs).
func (f *FS) ReclaimOrphansIn(ctx context.Context, r DRange, all bool) error {
	if f.readOnly {
		return nil
	}
	k := f.keys
	sessions, err := f.sessions(ctx)
	if err != nil {
		return err
	}
	type orphan struct {
		h   Handle
		rec *orphanRecord
	}
	var orphans []orphan
	ofrom, oto := k.keysIn(spaceOrphans, r)
	err = f.meta.Scan(ctx, ofrom, oto, func(key, value []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) != 4 {
			return fmt.Errorf("%w: orphan key %x", errCorrupt, key)
		}
		d, ok1 := asUint(t[2])
		c, ok2 := asUint(t[3])
		if !ok1 || !ok2 {
			return fmt.Errorf("%w: orphan key %x", errCorrupt, key)
		}
		rec, err := decodeOrphanRecord(value)
		if err != nil {
			return err
		}
		orphans = append(orphans, orphan{Handle{D: d, C: c}, rec})
		return nil
	})
	if err != nil {
		return err
	}
	expired := f.now().Add(-SessionExpiry).UnixNano()
	var errs []error
	for _, o := range orphans {
		if f.opens.isOpen(o.h) {
			continue
		}
		switch {
		case all:
		case f.cfg.OpensKnown != nil && f.cfg.OpensKnown(o.h):
			// Every session holding a file of its table open has told
			// this FS, and none holds it.
		case o.rec.Mount == 0:
			continue // a session may yet tell of its open
		default:
			seen, recorded := sessions[o.rec.Mount]
			if !recorded {
				// A session whose record is not written yet (or lost)
				// counts from the orphan's birth.
				seen = o.rec.Since
			}
			if seen > expired {
				continue // its session may hold it open elsewhere
			}
		}
		if f.dataHeld(ctx, o.h) {
			// Its writer's flush is still to clear the hold (or the hold
			// lapses): a later pass reclaims it. Waiting here would hold
			// up every other orphan of the pass.
			continue
		}
		if err := f.reclaim(ctx, o.h); err != nil {
			errs = append(errs, fmt.Errorf("orphan %v: %w", o.h, err))
		}
	}
	// Sessions long expired are dropped.
	for id, seen := range sessions {
		if seen < f.now().Add(-10*SessionExpiry).UnixNano() {
			errs = append(errs, f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(k.session(id)) }))
		}
	}
	return errors.Join(errs...)
}

// DeleteQueuedBlobs deletes the blobs queued for deletion (F, 3) and
// empties the tracts queued to free (F, 5).
func (f *FS) DeleteQueuedBlobs(ctx context.Context) error {
	if f.readOnly {
		return nil
	}
	k := f.keys
	var errs []error
	if err := f.freeQueuedTracts(ctx); err != nil {
		errs = append(errs, err)
	}
	var queued []GUID
	bp := k.blobQueuePrefix()
	err := f.meta.Scan(ctx, bp, endOf(bp), func(key, _ []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) != 3 {
			return fmt.Errorf("%w: blob queue key %x", errCorrupt, key)
		}
		b, ok := t[2].([]byte)
		if !ok || len(b) != len(GUID{}) {
			return fmt.Errorf("%w: blob queue key %x", errCorrupt, key)
		}
		var g GUID
		copy(g[:], b)
		queued = append(queued, g)
		return nil
	})
	if err != nil {
		return err
	}
	for _, g := range queued {
		if err := f.deleteQueuedBlob(ctx, g); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func asUint(e any) (uint64, bool) {
	switch v := e.(type) {
	case int64:
		return uint64(v), v >= 0
	case uint64:
		return v, true
	}
	return 0, false
}

// sessions returns the session records: when each session was last seen
// (UnixNano).
func (f *FS) sessions(ctx context.Context) (map[uint64]int64, error) {
	sessions := map[uint64]int64{}
	sp := f.keys.sessionPrefix()
	err := f.meta.Scan(ctx, sp, endOf(sp), func(key, value []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) != 3 {
			return fmt.Errorf("%w: session key %x", errCorrupt, key)
		}
		id, _ := asUint(t[2])
		rec, err := decodeSessionRecord(value)
		if err != nil {
			return err
		}
		sessions[id] = rec.Seen
		return nil
	})
	return sessions, err
}

// LiveSessions returns the sessions whose records have not expired
// (SessionExpiry): those that may hold files open.
func (f *FS) LiveSessions(ctx context.Context) ([]uint64, error) {
	sessions, err := f.sessions(ctx)
	if err != nil {
		return nil, err
	}
	expired := f.now().Add(-SessionExpiry).UnixNano()
	out := make([]uint64, 0, len(sessions))
	for id, seen := range sessions {
		if seen > expired {
			out = append(out, id)
		}
	}
	return out, nil
}

// isOrphan reports whether h has an orphan record.
func (f *FS) isOrphan(ctx context.Context, h Handle) bool {
	var ok bool
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		var err error
		_, ok, err = tx.Get(f.keys.orphan(h))
		return err
	})
	return err == nil && ok
}

// Deferred reclaims: an orphan whose table's opens are not all known here
// yet (Config.OpensKnown) waits until they are, then is reclaimed unless a
// session told of holding it open meanwhile (it is then reclaimed at that
// session's last close). Whatever session its record names, an orphan
// nobody holds open once every open is known is reclaimed.
const (
	deferPoll = 250 * time.Millisecond
	// deferLimit bounds the wait: past it (the table went elsewhere) the
	// orphan is left to ReclaimOrphans.
	deferLimit = time.Minute
)

// deferReclaim queues orphan h for reclaimDeferred, starting it if idle.
func (f *FS) deferReclaim(h Handle) {
	f.deferMu.Lock()
	defer f.deferMu.Unlock()
	if f.deferred == nil {
		f.deferred = map[Handle]time.Time{}
	}
	if _, ok := f.deferred[h]; !ok {
		f.deferred[h] = time.Now()
	}
	if !f.deferRunning {
		f.deferRunning = true
		go f.reclaimDeferred()
	}
}

// reclaimDeferred reclaims the deferred orphans as their opens become
// known, until none is left.
func (f *FS) reclaimDeferred() {
	for {
		time.Sleep(deferPoll)
		var ready []Handle
		f.deferMu.Lock()
		for h, since := range f.deferred {
			switch {
			case f.opensKnown(h):
				ready = append(ready, h)
				delete(f.deferred, h)
			case time.Since(since) > deferLimit:
				delete(f.deferred, h)
			}
		}
		if len(f.deferred) == 0 && len(ready) == 0 {
			f.deferRunning = false
			f.deferMu.Unlock()
			return
		}
		f.deferMu.Unlock()
		for _, h := range ready {
			if f.opens.isOpen(h) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if f.isOrphan(ctx, h) {
				if err := f.reclaim(ctx, h); err != nil {
					f.log.Warn("reclaiming an unlinked object; left to the background", "handle", h, "err", err)
				}
			}
			cancel()
		}
	}
}
