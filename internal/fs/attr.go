package fs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// SetAttr fields (SetAttrIn.Valid).
const (
	SetMode = 1 << iota
	SetUid
	SetGid
	SetSize
	SetAtime
	SetMtime
	SetAtimeNow
	SetMtimeNow
	SetCtime
	// SetHold: the calling session closed a regular file whose data it
	// is still writing (it flushes after the close returned): other
	// sessions' lookups, getattrs, opens and block reads of the file wait
	// until the session's next final block commit (or SetUnhold) clears
	// the hold, or HoldFor passes. It changes no attribute and no time.
	SetHold
	// SetUnhold clears the calling session's hold (its flush failed).
	SetUnhold
)

// HoldFor bounds how long a hold keeps other sessions waiting: a session
// that dies with its data unwritten leaves the file as it was, readable
// again after this.
const HoldFor = 20 * time.Second

// SetAttrIn says what SetAttr changes.
type SetAttrIn struct {
	Valid               uint32
	Mode                uint32 // permission bits (the type cannot change)
	Uid, Gid            uint32
	Size                uint64
	Atime, Mtime, Ctime time.Time
}

// SetAttr changes h's attributes. A size change truncates or extends the
// file (EISDIR for a directory, EINVAL for other non-regular objects,
// EFBIG past the size bound); every change sets the change time.
func (f *FS) SetAttr(ctx context.Context, h Handle, in SetAttrIn) (Attr, error) {
	if f.readOnly {
		return Attr{}, syscall.EROFS
	}
	if in.Valid&SetSize != 0 {
		a, err := f.truncate(ctx, h, in.Size)
		if err != nil {
			return Attr{}, err
		}
		in.Valid &^= SetSize
		if in.Valid == 0 {
			return a, nil
		}
	}
	if in.Valid == 0 {
		return f.GetAttr(ctx, h)
	}
	if in.Valid&(SetHold|SetUnhold) != 0 {
		if in.Valid&^(SetHold|SetUnhold) != 0 || in.Valid == SetHold|SetUnhold {
			return Attr{}, errf(syscall.EINVAL, "a data hold (%#x) goes alone, without other attribute changes", in.Valid)
		}
		return f.setHold(ctx, h, in.Valid == SetHold)
	}
	var a Attr
	err := f.update(ctx, func(w *wtx) error {
		cur, n, err := w.inode(f.keys, h)
		if err != nil {
			return err
		}
		now := f.opNow(ctx).UnixNano()
		if in.Valid&SetMode != 0 {
			n.Mode = n.Mode&sIFMT | in.Mode&permBits
		}
		if in.Valid&SetUid != 0 {
			n.Uid = in.Uid
		}
		if in.Valid&SetGid != 0 {
			n.Gid = in.Gid
		}
		switch {
		case in.Valid&SetAtimeNow != 0:
			n.Atime = now
		case in.Valid&SetAtime != 0:
			n.Atime = in.Atime.UnixNano()
		}
		switch {
		case in.Valid&SetMtimeNow != 0:
			n.Mtime = now
		case in.Valid&SetMtime != 0:
			n.Mtime = in.Mtime.UnixNano()
		}
		n.Ctime = now
		if in.Valid&SetCtime != 0 {
			n.Ctime = in.Ctime.UnixNano()
		}
		if err := w.setInode(f.keys, h, cur, n); err != nil {
			return err
		}
		a = f.attrOf(h, n)
		return nil
	})
	return a, err
}

// setHold places (on) or clears the calling session's data hold on
// regular file h (SetHold, SetUnhold).
func (f *FS) setHold(ctx context.Context, h Handle, on bool) (Attr, error) {
	session := SessionOf(ctx)
	if session == 0 {
		return Attr{}, errf(syscall.EINVAL, "a data hold needs a session")
	}
	var a Attr
	changed := false
	err := f.update(ctx, func(w *wtx) error {
		changed = false
		cur, n, err := w.inode(f.keys, h)
		if err != nil {
			return err
		}
		if n.Mode&sIFMT != sIFREG {
			return errf(syscall.EINVAL, "a data hold on non-regular object %v", h)
		}
		switch {
		case on:
			n.HoldSession, n.HoldUntil = session, f.now().Add(HoldFor).UnixNano()
		case n.HoldSession == session:
			n.HoldSession, n.HoldUntil = 0, 0
		default:
			a = f.attrOf(h, n)
			return nil
		}
		if err := w.setInode(f.keys, h, cur, n); err != nil {
			return err
		}
		a, changed = f.attrOf(h, n), true
		return nil
	})
	if err == nil && changed {
		f.noteHold(h, on, f.now().Add(HoldFor).UnixNano())
	}
	return a, err
}

// noteHold records a hold on h placed (until when) or cleared here.
func (f *FS) noteHold(h Handle, on bool, until int64) {
	f.holdsMu.Lock()
	defer f.holdsMu.Unlock()
	if !on {
		delete(f.holds, h)
		return
	}
	if f.holds == nil {
		f.holds = map[Handle]int64{}
	}
	f.holds[h] = until
}

// WaitHolds waits until no data hold placed here is left (each lapses
// after HoldFor) or ctx ends: a snapshot taken after it holds the data
// of every file closed before it began (fsclient flushes after close).
// A hold placed through another server (before a failover) is not
// waited for.
func (f *FS) WaitHolds(ctx context.Context) error {
	for {
		f.holdsMu.Lock()
		now := f.now().UnixNano()
		var check []Handle
		for h, until := range f.holds {
			if until <= now {
				delete(f.holds, h)
			} else {
				check = append(check, h)
			}
		}
		f.holdsMu.Unlock()
		left := 0
		for _, h := range check {
			// A hold may be gone without this FS seeing it cleared: its
			// file was removed, or its flush failed and gave up.
			n, err := f.headInode(ctx, h)
			if errnoOf(err) == syscall.ENOENT || (err == nil && (n.HoldSession == 0 || n.HoldUntil <= now)) {
				f.holdsMu.Lock()
				delete(f.holds, h)
				f.holdsMu.Unlock()
				continue
			}
			left++
		}
		if left == 0 {
			return nil
		}
		t := time.NewTimer(holdPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %d files' data held by their writers: %w", left, ctx.Err())
		}
	}
}

// heldFrom reports whether n's data is held by a session other than the
// caller's, so that the caller must wait to read it (a snapshot's reader
// never waits: a hold concerns the live file).
func (f *FS) heldFrom(ctx context.Context, n *inode) bool {
	return n.HoldSession != 0 && n.HoldSession != SessionOf(ctx) && f.readAt == headSnapshot && f.now().UnixNano() < n.HoldUntil
}

// holdPoll is how often a reader waiting on a data hold looks again.
const holdPoll = 2 * time.Millisecond

// unheld runs read, which reports whether it found its object held
// (heldFrom), until it does not or ctx ends.
func (f *FS) unheld(ctx context.Context, read func() (held bool, err error)) error {
	for {
		held, err := read()
		if err != nil || !held {
			return err
		}
		t := time.NewTimer(holdPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for another client to write the file's data: %w", ctx.Err())
		}
	}
}

// errNeedCopy asks truncate to copy a shared boundary block first.
var errNeedCopy = errors.New("fs: boundary block is shared with a snapshot")

// truncate sets a regular file's size (truncate(2)) and returns the
// attributes it committed. A client flushes what it buffered for the file
// before it asks.
func (f *FS) truncate(ctx context.Context, h Handle, size uint64) (Attr, error) {
	if size > maxFileBytes {
		return Attr{}, errf(syscall.EFBIG, "size %d (the bound is %d)", size, uint64(maxFileBytes))
	}
	n, err := f.headInode(ctx, h)
	if err != nil {
		return Attr{}, err
	}
	switch n.Mode & sIFMT {
	case sIFREG:
	case sIFDIR:
		return Attr{}, errf(syscall.EISDIR, "truncate of directory %v", h)
	default:
		return Attr{}, errf(syscall.EINVAL, "truncate of non-regular object %v", h)
	}
	if n.TrimFrom != 0 {
		if err := f.trim(ctx, h); err != nil {
			return Attr{}, err
		}
	}
	maxBlock := pow2Floor(uint64(f.tractSize))
	bs, bsz := blockAt(size, maxBlock)
	partial := size > bs
	cut := bs
	if partial {
		cut = bs + bsz
	}
	keep := size - bs
	k := f.keys
	var prepared *blockEntry // a copy of the boundary block, cut to keep
	var preparedFrom blockEntry
	used := false
	var a Attr
	defer func() {
		if prepared != nil && !used {
			f.discardTracts(context.WithoutCancel(ctx), []blockEntry{*prepared})
		}
	}()
	for range maxTruncateAttempts {
		var needCopy *blockEntry
		err = f.update(ctx, func(w *wtx) error {
			needCopy, used = nil, false
			icur, in, err := w.inode(k, h)
			if err != nil {
				return err
			}
			if in.TrimFrom != 0 {
				return ErrRaced
			}
			if partial && size < in.Size {
				key := k.block(h, bs)
				cur, payload, err := w.current(key)
				if err != nil {
					return err
				}
				if cur.live() {
					e, err := decodeBlockEntry(payload)
					if err != nil {
						return err
					}
					if e.Length > keep {
						switch {
						case !w.shared(cur) || e.inline():
							// Cut in place, or (a snapshot shares it) an
							// inline block cut as a new version: there is
							// no tract to copy.
							old := *e
							if e.inline() {
								if err := readInlineChunks(w.tx, k, h, cur.S, e); err != nil {
									return err
								}
								e.Inline = e.Inline[:keep]
							}
							e.Length = keep
							if _, err := w.putBlock(k, h, bs, cur, &old, *e); err != nil {
								return err
							}
						case prepared != nil && preparedFrom.Blob == e.Blob && preparedFrom.Tract == e.Tract && preparedFrom.Length == e.Length:
							if err := w.put(key, cur, prepared.encode()); err != nil {
								return err
							}
							// The copy was written before this transaction:
							// a replay after an early answer was lost would
							// write another and leak this one. Answer once
							// durable.
							requireDurable(w.tx)
							used = true
						default:
							needCopy = e
							return errNeedCopy
						}
					}
				}
			}
			if size < in.Size && in.Size > cut {
				in.TrimFrom = cut + 1
			}
			now := f.opNow(ctx).UnixNano()
			in.Size = size
			in.Mtime, in.Ctime = now, now
			in.DataGen++
			if err := w.setInode(k, h, icur, in); err != nil {
				return err
			}
			a = f.attrOf(h, in)
			return nil
		})
		if errors.Is(err, errNeedCopy) {
			if prepared != nil {
				f.discardTracts(ctx, []blockEntry{*prepared})
				prepared = nil
			}
			data, rerr := f.readTract(ctx, *needCopy)
			if rerr != nil {
				return Attr{}, rerr
			}
			if uint64(len(data)) < keep {
				continue // stale: read again
			}
			first, xerr := f.data.Extend(ctx, needCopy.Blob, 1)
			if xerr != nil {
				return Attr{}, storeErr("extend blob", xerr)
			}
			cp := blockEntry{Blob: needCopy.Blob, Tract: first, Length: keep}
			if werr := f.data.WriteTract(ctx, cp.Blob, cp.Tract, data[:keep]); werr != nil {
				return Attr{}, storeErr("write tract", werr)
			}
			prepared, preparedFrom = &cp, *needCopy
			continue
		}
		if errors.Is(err, ErrRaced) {
			if err := f.trim(ctx, h); err != nil {
				return Attr{}, err
			}
			continue
		}
		if err != nil {
			return Attr{}, err
		}
		break
	}
	if err != nil {
		return Attr{}, err
	}
	if err := f.trim(ctx, h); err != nil {
		return Attr{}, err
	}
	return a, nil
}

// trim deletes the blocks a truncate cut off (from the inode's TrimFrom),
// in transactions of blocksPerTxn pairs, then clears TrimFrom.
func (f *FS) trim(ctx context.Context, h Handle) error {
	k := f.keys
	for {
		n, err := f.headInode(ctx, h)
		if err != nil {
			return err
		}
		if n.TrimFrom == 0 {
			return nil
		}
		mark := n.TrimFrom
		batch := blocksPerTxn
		if mark-1 == 0 {
			batch -= maxInlineChunks // the first block may be inline, with chunks to delete
		}
		starts, err := f.liveBlocks(ctx, h, mark-1, batch)
		if err != nil {
			return err
		}
		var frees []blockEntry
		err = f.update(ctx, func(w *wtx) error {
			frees = frees[:0]
			icur, in, err := w.inode(k, h)
			if err != nil {
				return err
			}
			if in.TrimFrom != mark {
				return nil // someone else is trimming; read again
			}
			if len(starts) == 0 {
				in.TrimFrom = 0
				return w.setInode(k, h, icur, in)
			}
			for _, s := range starts {
				key := k.block(h, s)
				cur, payload, err := w.current(key)
				if err != nil {
					return err
				}
				if !cur.live() {
					continue
				}
				e, err := decodeBlockEntry(payload)
				if err != nil {
					return err
				}
				if !w.shared(cur) {
					frees = append(frees, *e)
				}
				if err := w.delBlock(k, h, s, cur, e); err != nil {
					return err
				}
			}
			return f.queueFrees(w.tx, frees)
		})
		if err != nil {
			return err
		}
		f.freeTractsWhenDurable(ctx, frees)
	}
}

// liveBlocks lists up to max block starts at or after from whose newest
// version is live.
func (f *FS) liveBlocks(ctx context.Context, h Handle, from uint64, max int) ([]uint64, error) {
	var out []uint64
	stop := errors.New("stop")
	err := f.scanAt(ctx, f.keys.block(h, from), endOf(f.keys.blockPrefix(h)), headSnapshot, func(prefix []byte, v version, _ []byte) error {
		if !v.live() {
			return nil
		}
		x, err := blockOffset(prefix)
		if err != nil {
			return err
		}
		out = append(out, x)
		if len(out) >= max {
			return stop
		}
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		return nil, err
	}
	return out, nil
}
