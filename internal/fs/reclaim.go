package fs

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Reclaiming objects that lost their last name (doc.go, Orphans).

// orphaned is called after a transaction listed h as an orphan: it is
// reclaimed now, or at its last close if a session holds it open.
func (f *FS) orphaned(ctx context.Context, h Handle) {
	if f.opens.markUnlinked(h) {
		return
	}
	if err := f.reclaim(ctx, h); err != nil {
		f.log.Warn("reclaiming an unlinked object; left to the background", "handle", h, "err", err)
	}
}

// reclaim deletes orphan h: its blocks (freeing the tracts no snapshot
// needs), attributes and symlink chunks, then its inode and orphan record
// in one transaction, then its blob once no snapshot needs it.
func (f *FS) reclaim(ctx context.Context, h Handle) error {
	err := f.reclaimOnce(ctx, h)
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
	sessions := map[uint64]int64{}
	sp := k.sessionPrefix()
	err := f.meta.Scan(ctx, sp, endOf(sp), func(key, value []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) != 3 {
			return fmt.Errorf("%w: session key %x", errCorrupt, key)
		}
		id, _ := t[2].(int64)
		rec, err := decodeSessionRecord(value)
		if err != nil {
			return err
		}
		sessions[uint64(id)] = rec.Seen
		return nil
	})
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
		seen, live := sessions[o.rec.Mount]
		if live && seen > expired && !all {
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

// DeleteQueuedBlobs deletes the blobs queued for deletion (F, 3).
func (f *FS) DeleteQueuedBlobs(ctx context.Context) error {
	if f.readOnly {
		return nil
	}
	k := f.keys
	var errs []error
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
