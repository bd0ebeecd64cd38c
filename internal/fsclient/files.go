package fsclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
)

// file is what this client holds of one regular file: open handles, the
// writes it buffers (write-back, flushed on Flush/Fsync/Release and when
// the buffer is large) and a cache of its state and block map. Data
// operations on a file are serialized by mu (reads share it).
type file struct {
	h  fs.Handle
	mu sync.RWMutex

	// Under FS.filesMu:
	opens int
	pins  int // calls using the state right now

	// sum is what attributes overlay while writes are buffered.
	sumMu      sync.Mutex
	dirtyEnd   uint64 // the size the buffered writes give the file
	dirtyMtime int64
	hasDirty   bool
	// attr is the file's attributes as last answered (attrKnown); pend,
	// attribute changes held back until the next flush (mergeable), made
	// at pendAt by this client's clock.
	attr      fs.Attr
	attrKnown bool
	attrAt    time.Time // when attr was answered
	pend      fs.SetAttrIn
	pendAt    int64

	// Under mu (written with mu held exclusively):
	dirty      map[uint64]*dirtyBlock
	dirtyBytes int64
	// late is open while a flush after close of the file waits to run
	// (it then takes mu and closes it).
	late chan struct{}

	// The committed state this client last saw, under cacheMu. complete
	// says blocks lists every live block (a missing start is a hole).
	cacheMu  sync.Mutex
	known    bool
	state    fs.FileState
	blocks   map[uint64]fs.BlockRef
	complete bool

	// Read-ahead, under raMu: where the reads of a sequential stream
	// have got to, and how far ahead of it tracts have been asked for.
	raMu     sync.Mutex
	raLast   uint64
	raIssued uint64
}

// setState records the file's committed state (under cacheMu); a new blob
// makes the cached blocks meaningless.
func (st *file) setState(s fs.FileState) {
	if st.known && st.state.Blob != s.Blob {
		st.blocks, st.complete = nil, false
	}
	st.known, st.state = true, s
}

// dirtyBlock is the buffered writes to one block: a buffer of the block's
// size and the intervals of it that were written.
type dirtyBlock struct {
	start, size uint64
	data        []byte
	ivs         []interval // sorted, disjoint, not adjacent
}

type interval struct{ lo, hi uint64 } // offsets within the block

func (d *dirtyBlock) add(lo, hi uint64) {
	out := d.ivs[:0:0]
	placed := false
	for _, iv := range d.ivs {
		switch {
		case iv.hi < lo:
			out = append(out, iv)
		case hi < iv.lo:
			if !placed {
				out = append(out, interval{lo, hi})
				placed = true
			}
			out = append(out, iv)
		default:
			lo, hi = min(lo, iv.lo), max(hi, iv.hi)
		}
	}
	if !placed {
		out = append(out, interval{lo, hi})
	}
	d.ivs = out
}

// covers reports whether the written intervals cover [0, n).
func (d *dirtyBlock) covers(n uint64) bool {
	if n == 0 {
		return true
	}
	return len(d.ivs) > 0 && d.ivs[0].lo == 0 && d.ivs[0].hi >= n
}

func (d *dirtyBlock) end() uint64 {
	if len(d.ivs) == 0 {
		return 0
	}
	return d.ivs[len(d.ivs)-1].hi
}

// pin returns the client's state of h, creating it if asked, and pins it
// until unpin: the state lives while it is pinned, open or dirty.
func (f *FS) pin(h fs.Handle, create bool) *file {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	st := f.files[h]
	if st == nil && create {
		st = &file{h: h, dirty: map[uint64]*dirtyBlock{}}
		f.files[h] = st
	}
	if st != nil {
		st.pins++
	}
	return st
}

// unpin releases a pin and drops the state if nothing holds it.
func (f *FS) unpin(st *file) {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	st.pins--
	st.sumMu.Lock()
	dirty := st.hasDirty
	st.sumMu.Unlock()
	if st.opens == 0 && st.pins == 0 && !dirty && f.files[st.h] == st {
		delete(f.files, st.h)
	}
}

// overlayDirty makes attributes show this client's buffered writes.
func (f *FS) overlayDirty(a *fs.Attr) {
	f.filesMu.Lock()
	st := f.files[a.Handle]
	f.filesMu.Unlock()
	if st == nil {
		return
	}
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	if a.Ino != 0 {
		st.attr, st.attrKnown, st.attrAt = *a, true, time.Now()
	}
	st.overlayLocked(a)
}

// cachedAttr returns the attributes of h, a file this client has open,
// as last answered less than openAttrFor ago, with what the client holds
// back laid over them.
func (f *FS) cachedAttr(h fs.Handle) (fs.Attr, bool) {
	f.filesMu.Lock()
	st := f.files[h]
	open := st != nil && st.opens > 0
	f.filesMu.Unlock()
	if !open {
		return fs.Attr{}, false
	}
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	if !st.attrKnown || time.Since(st.attrAt) > openAttrFor {
		return fs.Attr{}, false
	}
	a := st.attr
	st.overlayLocked(&a)
	return a, true
}

// openAttrFor is how long the attributes of a file this client has open
// answer its getattr without asking (the kernel asks after every write):
// the kernel's own attribute cache time.
const openAttrFor = time.Second

// forgetAttrs drops the cached attributes of every open file (a link count
// may have changed: a remove, rename or link by name).
func (f *FS) forgetAttrs() {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	for _, st := range f.files {
		st.sumMu.Lock()
		st.attrAt = time.Time{}
		st.sumMu.Unlock()
	}
}

// overlayLocked lays what the client holds back (buffered writes,
// attribute changes) over a. Callers hold st.sumMu.
func (st *file) overlayLocked(a *fs.Attr) {
	if st.hasDirty {
		a.Size = max(a.Size, st.dirtyEnd)
		a.Mtime = timeOf(st.dirtyMtime)
		if a.Mtime.After(a.Ctime) {
			a.Ctime = a.Mtime
		}
		a.Blocks = (a.Size + 511) / 512
	}
	p := st.pend
	if p.Valid == 0 {
		return
	}
	if p.Valid&fs.SetMode != 0 {
		a.Mode = a.Mode&syscall.S_IFMT | p.Mode&^syscall.S_IFMT
	}
	if p.Valid&fs.SetUid != 0 {
		a.Uid = p.Uid
	}
	if p.Valid&fs.SetGid != 0 {
		a.Gid = p.Gid
	}
	if p.Valid&fs.SetAtime != 0 {
		a.Atime = p.Atime
	}
	if p.Valid&fs.SetMtime != 0 {
		a.Mtime = p.Mtime
	}
	a.Ctime = timeOf(max(a.Ctime.UnixNano(), st.pendAt))
}

// mergeable are the attribute changes a client holds back while it has
// the file open and sends with its next flush (one operation instead of
// one each: tar's utimens, chown and chmod of every file).
const mergeable = fs.SetMode | fs.SetUid | fs.SetGid | fs.SetAtime | fs.SetAtimeNow | fs.SetMtime | fs.SetMtimeNow

// holdAttr holds back change in of h's attributes if it can wait for the
// next flush: h is a regular file this client has open and knows the
// attributes of, the change is mergeable and touches no set-id bit (a
// change of owner clears those). It returns the attributes with the
// change laid over them.
func (f *FS) holdAttr(h fs.Handle, in fs.SetAttrIn) (fs.Attr, bool) {
	if in.Valid == 0 || in.Valid&^mergeable != 0 {
		return fs.Attr{}, false
	}
	f.filesMu.Lock()
	st := f.files[h]
	open := st != nil && st.opens > 0
	f.filesMu.Unlock()
	if !open {
		return fs.Attr{}, false
	}
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	const setid = syscall.S_ISUID | syscall.S_ISGID
	if !st.attrKnown || st.attr.Mode&syscall.S_IFMT != syscall.S_IFREG || st.attr.Mode&setid != 0 ||
		(in.Valid&fs.SetMode != 0 && in.Mode&setid != 0) || (st.pend.Valid&fs.SetMode != 0 && st.pend.Mode&setid != 0) {
		return fs.Attr{}, false
	}
	now := f.now()
	p := &st.pend
	if in.Valid&fs.SetMode != 0 {
		p.Valid, p.Mode = p.Valid|fs.SetMode, in.Mode
	}
	if in.Valid&fs.SetUid != 0 {
		p.Valid, p.Uid = p.Valid|fs.SetUid, in.Uid
	}
	if in.Valid&fs.SetGid != 0 {
		p.Valid, p.Gid = p.Valid|fs.SetGid, in.Gid
	}
	switch {
	case in.Valid&fs.SetAtimeNow != 0:
		p.Valid, p.Atime = p.Valid|fs.SetAtime, now
	case in.Valid&fs.SetAtime != 0:
		p.Valid, p.Atime = p.Valid|fs.SetAtime, in.Atime
	}
	switch {
	case in.Valid&fs.SetMtimeNow != 0:
		p.Valid, p.Mtime = p.Valid|fs.SetMtime, now
	case in.Valid&fs.SetMtime != 0:
		p.Valid, p.Mtime = p.Valid|fs.SetMtime, in.Mtime
	}
	if in.Valid&(fs.SetMtime|fs.SetMtimeNow) != 0 && st.hasDirty {
		// Set after the buffered writes: it wins over their time.
		st.dirtyMtime = p.Mtime.UnixNano()
	}
	st.pendAt = now.UnixNano()
	a := st.attr
	st.overlayLocked(&a)
	return a, true
}

// heldAttrs returns the attribute changes held back for st.
func (st *file) heldAttrs() fs.SetAttrIn {
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	return st.pend
}

// sentAttrs records that held changes p went with a block commit: they
// are no longer held, unless more came meanwhile.
func (st *file) sentAttrs(p fs.SetAttrIn) {
	if p.Valid == 0 {
		return
	}
	st.sumMu.Lock()
	if st.pend == p {
		st.pend = fs.SetAttrIn{}
	}
	st.sumMu.Unlock()
}

// sendHeldAttrs sends the attribute changes held back for st (after its
// buffered writes: an explicit time set after them wins).
func (f *FS) sendHeldAttrs(ctx context.Context, st *file) error {
	st.sumMu.Lock()
	p := st.pend
	st.sumMu.Unlock()
	if p.Valid == 0 {
		return nil
	}
	a, err := f.md.SetAttr(ctx, st.h, p)
	if e := fs.Errno(err); e == syscall.ENOENT || e == syscall.ESTALE {
		// Gone, as the buffered data (flushLocked): nothing to change.
		st.sumMu.Lock()
		st.pend = fs.SetAttrIn{}
		st.sumMu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	st.sumMu.Lock()
	if st.pend == p {
		st.pend = fs.SetAttrIn{}
	}
	st.attr, st.attrKnown, st.attrAt = a, true, time.Now()
	st.sumMu.Unlock()
	return nil
}

// Write writes data at off (write-back: the bytes are buffered and reach
// the stores at the next flush).
func (f *FS) Write(ctx context.Context, h fs.Handle, off int64, data []byte) (int, error) {
	if err := f.writable(); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d: %w", off, syscall.EINVAL)
	}
	end := uint64(off) + uint64(len(data))
	if end > fs.MaxFileBytes || uint64(off) > fs.MaxFileBytes {
		return 0, fmt.Errorf("write to %d bytes (the bound is %d): %w", end, uint64(fs.MaxFileBytes), syscall.EFBIG)
	}
	if len(data) == 0 {
		return 0, nil
	}
	st := f.pin(h, true)
	defer f.unpin(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	c, err := f.committed(ctx, st)
	if err != nil {
		return 0, err
	}
	if c.Mode&syscall.S_IFMT != syscall.S_IFREG {
		if c.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return 0, fmt.Errorf("write to directory %v: %w", h, syscall.EISDIR)
		}
		return 0, fmt.Errorf("write to non-regular object %v: %w", h, syscall.EINVAL)
	}
	starts, sizes := fs.BlocksIn(uint64(off), uint64(len(data)), f.tractSize)
	for i, s := range starts {
		db := st.dirty[s]
		if db == nil {
			db = &dirtyBlock{start: s, size: sizes[i], data: make([]byte, sizes[i])}
			st.dirty[s] = db
			st.dirtyBytes += int64(sizes[i])
			f.dirty.Add(int64(sizes[i]))
		}
		lo := max(uint64(off), s)
		hi := min(end, s+sizes[i])
		copy(db.data[lo-s:hi-s], data[lo-uint64(off):hi-uint64(off)])
		db.add(lo-s, hi-s)
	}
	now := f.now().UnixNano()
	st.sumMu.Lock()
	if !st.hasDirty {
		st.dirtyEnd = c.Size
	}
	st.hasDirty = true
	st.dirtyEnd = max(st.dirtyEnd, end)
	st.dirtyMtime = now
	st.pend.Valid &^= fs.SetMtime // a write after a held time set wins
	st.sumMu.Unlock()
	if st.dirtyBytes > f.cfg.MaxDirtyBytesPerFile || f.dirty.Load() > f.cfg.MaxDirtyBytes {
		if err := f.flushLocked(ctx, st); err != nil {
			return 0, err
		}
	}
	return len(data), nil
}

// committed returns the file's committed state: cached while the client
// holds it (from the create or the first use after an open), else asked.
func (f *FS) committed(ctx context.Context, st *file) (fs.FileState, error) {
	st.cacheMu.Lock()
	if st.known {
		s := st.state
		st.cacheMu.Unlock()
		return s, nil
	}
	st.cacheMu.Unlock()
	s, _, err := f.md.FileBlocks(ctx, st.h, nil)
	if err != nil {
		return fs.FileState{}, err
	}
	st.cacheMu.Lock()
	st.setState(s)
	st.cacheMu.Unlock()
	return s, nil
}

// Flush writes h's buffered data to the stores (close(2)); with
// FSConfig.FlushAfterClose, a file whose data goes to tracts is flushed
// after it returns (flushLater).
func (f *FS) Flush(ctx context.Context, h fs.Handle) error {
	return f.flush(ctx, h, f.cfg.FlushAfterClose)
}

func (f *FS) flush(ctx context.Context, h fs.Handle, later bool) error {
	st := f.pin(h, false)
	if st == nil {
		return nil
	}
	defer f.unpin(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	if later && !f.readOnly {
		if st.late != nil {
			return nil // the flush waiting to run takes these writes too
		}
		if f.canFlushLater(st) && f.flushLater(ctx, st) {
			return nil
		}
	}
	err := f.flushLocked(ctx, st)
	if err == nil {
		err = f.sendHeldAttrs(ctx, st)
	}
	if err != nil && st.late != nil {
		f.unhold(st) // the late flush will find nothing to commit
	}
	return err
}

// Fsync flushes h's buffered writes and waits until every metadata change
// this client was answered early is durable (Syncer): the data is durable
// once the tract store acknowledged it. A flush after close of h that
// failed is reported here.
func (f *FS) Fsync(ctx context.Context, h fs.Handle) error {
	if err := f.flush(ctx, h, false); err != nil {
		return err
	}
	if err := f.SyncMetadata(ctx); err != nil {
		return err
	}
	return f.takeLateErr()
}

// SyncMetadata waits until every metadata change this client was
// answered early is durable (fsyncdir, syncfs).
func (f *FS) SyncMetadata(ctx context.Context) error {
	if s, ok := f.md.(Syncer); ok {
		return s.Sync(ctx)
	}
	return nil
}

// SyncClosed waits for the flushes after close and for every metadata
// change this client was answered early to be durable (fsyncdir), and
// reports a flush after close that failed.
func (f *FS) SyncClosed(ctx context.Context) error {
	if err := f.waitLate(ctx); err != nil {
		return err
	}
	if err := f.SyncMetadata(ctx); err != nil {
		return err
	}
	return f.takeLateErr()
}

// SyncAll flushes every file's buffered writes, waits for the flushes
// after close and for the metadata (syncfs), and reports a flush after
// close that failed.
func (f *FS) SyncAll(ctx context.Context) error {
	if err := f.waitLate(ctx); err != nil {
		return err
	}
	if err := f.syncAll(ctx, false); err != nil {
		return err
	}
	if err := f.SyncMetadata(ctx); err != nil {
		return err
	}
	return f.takeLateErr()
}

// Flushes after close. POSIX makes data durable at fsync, not close, and
// a single-threaded untar or cp waits for every close: writing each
// file's tracts (a replicated round or two) before close returns made it
// the largest cost of a small file. So close only places a data hold on
// the file at its metadata server (an early answer, journaled like any
// change) and queues the flush; the flush's last block commit clears the
// hold. Until then other clients' lookups, getattrs and opens of the file
// wait at the server (fs.SetHold), so close-to-open consistency holds
// across clients; this client sees its buffered writes anyway. Fsync and
// syncfs wait for the flushes (and report one that failed), rename waits
// for them first (a file renamed into place is never seen without its
// data), and so does unmount. A client that dies loses what it had not
// flushed, as before, but now possibly after close returned: the file
// keeps its earlier contents, and other clients wait at most fs.HoldFor
// for it. Small files (inline) and read-only mounts never flush late.

// canFlushLater reports whether st's buffered writes may be flushed after
// close: they go to tracts (an inline file costs one early-answered
// change, as a hold would) and the client's buffers are not too full.
func (f *FS) canFlushLater(st *file) bool {
	if len(st.dirty) == 0 || f.dirty.Load() > f.cfg.MaxDirtyBytes/2 {
		return false
	}
	f.lateMu.Lock()
	queued := f.late
	f.lateMu.Unlock()
	if queued >= maxLateFlushesQueued {
		return false
	}
	st.sumMu.Lock()
	size := st.dirtyEnd
	st.sumMu.Unlock()
	st.cacheMu.Lock()
	size = max(size, st.state.Size)
	st.cacheMu.Unlock()
	return size > fs.MaxInlineBytes
}

// flushLater places st's hold and queues its flush, and reports whether
// it did (if not, the caller flushes now). Callers hold st.mu.
func (f *FS) flushLater(ctx context.Context, st *file) bool {
	if _, err := f.md.SetAttr(ctx, st.h, fs.SetAttrIn{Valid: fs.SetHold}); err != nil {
		f.log.Debug("a data hold was refused; flushing at close", "handle", st.h, "err", err)
		return false
	}
	st.late = make(chan struct{})
	f.filesMu.Lock()
	st.pins++
	f.filesMu.Unlock()
	f.lateMu.Lock()
	f.late++
	f.lateMu.Unlock()
	f.stats.LateFlushes.Add(1)
	go f.runLate(st)
	return true
}

// runLate runs the flush flushLater queued for st.
func (f *FS) runLate(st *file) {
	f.lateSlots <- struct{}{}
	ctx, cancel := context.WithTimeout(context.Background(), lateFlushTimeout)
	st.mu.Lock()
	done := st.late
	st.late = nil
	err := f.flushLocked(ctx, st)
	if err == nil {
		err = f.sendHeldAttrs(ctx, st)
	}
	if err != nil {
		f.unhold(st)
	}
	st.mu.Unlock()
	cancel()
	<-f.lateSlots
	close(done)
	f.unpin(st)
	f.lateMu.Lock()
	f.late--
	if err != nil {
		f.stats.LateFailures.Add(1)
		f.log.Warn("a file's data, flushed after its close, could not be written; the next fsync or syncfs reports it", "handle", st.h, "err", err)
		if f.lateErr == nil {
			f.lateErr = fmt.Errorf("writing a file's data after its close: %w", err)
		}
	}
	f.lateDone.Broadcast()
	f.lateMu.Unlock()
}

// unhold clears st's data hold after a flush that failed (best effort:
// the hold lapses after fs.HoldFor anyway).
func (f *FS) unhold(st *file) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.md.SetAttr(ctx, st.h, fs.SetAttrIn{Valid: fs.SetUnhold}); err != nil && fs.Errno(err) != syscall.ENOENT && fs.Errno(err) != syscall.ESTALE {
		f.log.Debug("clearing a data hold", "handle", st.h, "err", err)
	}
}

// waitLate waits until every flush after close queued so far is done.
func (f *FS) waitLate(ctx context.Context) error {
	f.lateMu.Lock()
	defer f.lateMu.Unlock()
	if f.late == 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		f.lateMu.Lock()
		f.lateDone.Broadcast()
		f.lateMu.Unlock()
	})
	defer stop()
	for f.late > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: waiting for %d files' data to be written: %w", syscall.EIO, f.late, err)
		}
		f.lateDone.Wait()
	}
	return nil
}

// takeLateErr returns (once) the first flush after close that failed
// since the last call.
func (f *FS) takeLateErr() error {
	f.lateMu.Lock()
	defer f.lateMu.Unlock()
	err := f.lateErr
	f.lateErr = nil
	if err != nil {
		return fmt.Errorf("%w: %w", syscall.EIO, err)
	}
	return nil
}

// syncAll flushes every file; with dropStale, a file another client
// removed meanwhile is not an error (its data is gone, as it would be had
// it been flushed), only logged.
func (f *FS) syncAll(ctx context.Context, dropStale bool) error {
	f.filesMu.Lock()
	var all []fs.Handle
	for h := range f.files {
		all = append(all, h)
	}
	f.filesMu.Unlock()
	var errs []error
	for _, h := range all {
		err := f.flush(ctx, h, false)
		if dropStale && fs.Errno(err) == syscall.ESTALE {
			f.log.Warn("buffered writes to a removed file dropped", "err", err)
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dropDirty forgets st's buffered writes.
func (f *FS) dropDirty(st *file) {
	for _, db := range st.dirty {
		f.dirty.Add(-int64(db.size))
	}
	clear(st.dirty)
	st.dirtyBytes = 0
	st.sumMu.Lock()
	st.hasDirty = false
	st.attrAt = time.Time{} // the flush changed size and times: ask again
	st.sumMu.Unlock()
}

func (f *FS) flushLocked(ctx context.Context, st *file) error {
	if len(st.dirty) == 0 {
		return nil
	}
	var err error
	for range maxFlushAttempts {
		err = f.flushOnce(ctx, st)
		if !errors.Is(err, fs.ErrRaced) {
			break
		}
		st.cacheMu.Lock()
		st.known, st.blocks, st.complete = false, nil, false
		st.cacheMu.Unlock()
	}
	if e := fs.Errno(err); e == syscall.ENOENT || e == syscall.ESTALE || errors.Is(err, fs.ErrBlobNotFound) {
		// Another client removed the file's last name and reclaimed it
		// (an open file is kept alive only for the session holding it
		// open): the buffered data has nowhere to go. The flush may learn
		// it from the data store first, when the reclaim has already
		// deleted the file's blob.
		var lost int64
		for _, db := range st.dirty {
			lost += int64(db.size)
		}
		f.dropDirty(st)
		f.filesMu.Lock()
		open := st.opens > 0
		f.filesMu.Unlock()
		if !open {
			// Nobody here holds the file open: its unflushed data went
			// with its last name, as a local file system's would.
			return nil
		}
		return fmt.Errorf("flush %v: the file was removed by another client; %d buffered bytes dropped: %w", st.h, lost, syscall.ESTALE)
	}
	if err != nil {
		return fmt.Errorf("flush %v: %w", st.h, err)
	}
	f.stats.Flushes.Add(1)
	f.dropDirty(st)
	return nil
}

// newBlock is a block a flush writes.
type newBlock struct {
	start   uint64
	data    []byte
	base    fs.BlockRef // the pair the new content was merged onto
	tract   uint64
	written bool
}

func (f *FS) flushOnce(ctx context.Context, st *file) error {
	h := st.h
	starts := make([]uint64, 0, len(st.dirty))
	for s := range st.dirty {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	state, bases, err := f.blockRefs(ctx, st, starts)
	if err != nil {
		return err
	}
	if state.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("data for non-regular object %v: %w", h, syscall.EINVAL)
	}
	// Merge the buffered writes onto the committed blocks.
	blocks := make([]*newBlock, len(starts))
	for i, s := range starts {
		db := st.dirty[s]
		base := bases[i]
		var oldLen uint64
		if base.Found {
			oldLen = min(base.Length, db.size)
			if state.Size < s+oldLen {
				oldLen = state.Size - min(state.Size, s)
			}
		}
		newLen := max(oldLen, db.end())
		content := make([]byte, newLen)
		if oldLen > 0 && !db.covers(oldLen) {
			old, err := f.blockData(ctx, state.Blob, base)
			if err != nil {
				return err
			}
			if uint64(len(old)) < oldLen {
				return fs.ErrRaced // the tract was freed: our pair is stale
			}
			copy(content, old[:oldLen])
		}
		for _, iv := range db.ivs {
			copy(content[iv.lo:iv.hi], db.data[iv.lo:iv.hi])
		}
		blocks[i] = &newBlock{start: s, data: content, base: base}
	}
	st.sumMu.Lock()
	finalSize, mtime := st.dirtyEnd, st.dirtyMtime
	st.sumMu.Unlock()
	if len(blocks) == 1 && blocks[0].start == 0 && max(finalSize, state.Size) <= fs.MaxInlineBytes {
		// A small file: its bytes go in the metadata, no tract.
		return f.commitInline(ctx, st, state, blocks[0], finalSize, mtime)
	}
	// Every new block goes to a new tract: tracts are never rewritten, so
	// a snapshot's blocks and a concurrent reader's are never changed.
	blob := state.Blob
	first, err := f.newTracts(ctx, blob, state.BlobExists, uint64(len(blocks)))
	if err != nil {
		return err
	}
	for i, b := range blocks {
		b.tract = first + uint64(i)
	}
	committedUpTo := 0
	defer func() {
		// Tracts written for batches that did not commit are garbage.
		var dead []uint64
		for _, b := range blocks[committedUpTo:] {
			if b.written {
				dead = append(dead, b.tract)
			}
		}
		f.freeTracts(context.WithoutCancel(ctx), blob, dead)
	}()
	if err := fs.Parallel(ctx, len(blocks), maxParallelTracts, func(ctx context.Context, i int) error {
		b := blocks[i]
		if err := f.data.WriteTract(ctx, blob, b.tract, b.data); err != nil {
			return fmt.Errorf("write tract: %w", err)
		}
		b.written = true
		f.stats.TractWrites.Add(1)
		f.tracts.put(tractKey{blob, b.tract}, b.data)
		return nil
	}); err != nil {
		return err
	}
	for lo := 0; lo < len(blocks); lo += fs.MaxBlocksPerCommit {
		batch := blocks[lo:min(len(blocks), lo+fs.MaxBlocksPerCommit)]
		nbs := make([]fs.NewBlock, len(batch))
		for i, b := range batch {
			nbs[i] = fs.NewBlock{Start: b.start, Tract: b.tract, Length: uint64(len(b.data)), Base: b.base}
		}
		var c fs.Commit
		if lo+len(batch) == len(blocks) {
			c = fs.Commit{Size: finalSize, Mtime: mtime, Attrs: st.heldAttrs()}
		}
		res, err := f.md.CommitBlocks(ctx, h, blob, nbs, c)
		if err != nil {
			return err
		}
		st.sentAttrs(c.Attrs)
		committedUpTo = lo + len(batch)
		st.cacheMu.Lock()
		if st.blocks != nil && f.cfg.Snapshot == 0 {
			for i, b := range batch {
				st.blocks[b.start] = res.Blocks[i]
			}
		}
		state.Size, state.DataGen, state.BlobExists = res.Size, res.DataGen, true
		st.setState(state)
		st.cacheMu.Unlock()
	}
	return nil
}

// newTracts makes n new tracts of blob, creating it first unless it
// exists, and returns the first.
func (f *FS) newTracts(ctx context.Context, blob fs.GUID, exists bool, n uint64) (uint64, error) {
	if !exists {
		if s, ok := f.data.(fs.BlobSizer); ok {
			first, err := s.CreateSized(ctx, blob, n)
			if err != nil {
				return 0, fmt.Errorf("create blob: %w", err)
			}
			return first, nil
		}
		if err := f.data.CreateBlob(ctx, blob); err != nil {
			return 0, fmt.Errorf("create blob: %w", err)
		}
	}
	first, err := f.data.Extend(ctx, blob, n)
	if err != nil {
		return 0, fmt.Errorf("extend blob: %w", err)
	}
	return first, nil
}

// commitInline commits b, the only block of a file of at most
// fs.MaxInlineBytes, with its data in the metadata.
func (f *FS) commitInline(ctx context.Context, st *file, state fs.FileState, b *newBlock, size uint64, mtime int64) error {
	nb := fs.NewBlock{Start: 0, Tract: rand.Uint64(), Length: uint64(len(b.data)), Base: b.base, Inline: b.data}
	held := st.heldAttrs()
	res, err := f.md.CommitBlocks(ctx, st.h, state.Blob, []fs.NewBlock{nb}, fs.Commit{Size: size, Mtime: mtime, Attrs: held})
	if err != nil {
		return err
	}
	st.sentAttrs(held)
	f.stats.InlineCommits.Add(1)
	st.cacheMu.Lock()
	if st.blocks != nil && f.cfg.Snapshot == 0 {
		st.blocks[0] = res.Blocks[0]
	}
	state.Size, state.DataGen = res.Size, res.DataGen
	st.setState(state)
	st.cacheMu.Unlock()
	return nil
}

// blockData returns the data of block ref of blob: its tract's (cached),
// or what the pair holds (a small file).
func (f *FS) blockData(ctx context.Context, blob fs.GUID, ref fs.BlockRef) ([]byte, error) {
	if ref.Inline != nil {
		return ref.Inline, nil
	}
	return f.readTract(ctx, blob, ref.Tract)
}

// blockRefs returns the file's committed state and the pairs of the given
// block starts, from the client's cache or the metadata service.
func (f *FS) blockRefs(ctx context.Context, st *file, starts []uint64) (fs.FileState, []fs.BlockRef, error) {
	out := make([]fs.BlockRef, len(starts))
	var missing []uint64
	st.cacheMu.Lock()
	state, known := st.state, st.known
	for i, s := range starts {
		if b, ok := st.blocks[s]; ok {
			out[i] = b
		} else if !st.complete || !known {
			missing = append(missing, s)
		}
	}
	st.cacheMu.Unlock()
	if len(missing) == 0 && known {
		return state, out, nil
	}
	state, got, err := f.md.FileBlocks(ctx, st.h, missing)
	if err != nil {
		return fs.FileState{}, nil, err
	}
	st.cacheMu.Lock()
	st.setState(state)
	if st.blocks == nil {
		st.blocks = map[uint64]fs.BlockRef{}
	}
	for i, s := range missing {
		st.blocks[s] = got[i]
	}
	for i, s := range starts {
		out[i] = st.blocks[s]
	}
	st.cacheMu.Unlock()
	return state, out, nil
}

// readTract returns the data of a tract of blob (cached).
func (f *FS) readTract(ctx context.Context, blob fs.GUID, tract uint64) ([]byte, error) {
	return f.tracts.get(ctx, tractKey{blob, tract}, func(ctx context.Context) ([]byte, error) {
		f.stats.TractReads.Add(1)
		data, err := f.data.ReadTract(ctx, blob, tract)
		if err != nil {
			return nil, fmt.Errorf("read tract: %w", err)
		}
		return data, nil
	})
}

// freeTracts empties tracts of blob no pair names (written by a flush that
// did not commit them).
func (f *FS) freeTracts(ctx context.Context, blob fs.GUID, tracts []uint64) {
	if len(tracts) == 0 {
		return
	}
	_ = fs.Parallel(ctx, len(tracts), maxParallelTracts, func(ctx context.Context, i int) error {
		f.tracts.drop(tractKey{blob, tracts[i]})
		if err := f.data.WriteTract(ctx, blob, tracts[i], nil); err != nil {
			f.log.Warn("freeing a tract; fsck will report it leaked", "blob", blob, "tract", tracts[i], "err", err)
			return nil
		}
		f.stats.TractFrees.Add(1)
		return nil
	})
}

// Read reads up to len(dest) bytes at off; it returns fewer only at the end
// of the file.
func (f *FS) Read(ctx context.Context, h fs.Handle, off int64, dest []byte) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d: %w", off, syscall.EINVAL)
	}
	st := f.pin(h, true)
	defer f.unpin(st)
	st.mu.RLock()
	defer st.mu.RUnlock()
	var err error
	for range maxStaleReads {
		var n int
		n, err = f.readOnce(ctx, st, uint64(off), dest)
		if !errors.Is(err, fs.ErrRaced) {
			return n, err
		}
		f.stats.StaleReads.Add(1)
		st.cacheMu.Lock()
		st.known, st.blocks, st.complete = false, nil, false
		st.cacheMu.Unlock()
	}
	return 0, fmt.Errorf("read %v: blocks kept changing: %w", h, syscall.EIO)
}

func (f *FS) readOnce(ctx context.Context, st *file, off uint64, dest []byte) (int, error) {
	c, err := f.committed(ctx, st)
	if err != nil {
		return 0, err
	}
	if c.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return 0, fmt.Errorf("read of directory %v: %w", st.h, syscall.EISDIR)
	}
	size := c.Size
	st.sumMu.Lock()
	if st.hasDirty {
		size = max(size, st.dirtyEnd)
	}
	st.sumMu.Unlock()
	if off >= size || len(dest) == 0 {
		return 0, nil
	}
	n := min(uint64(len(dest)), size-off)
	dest = dest[:n]
	clear(dest)
	starts, sizes := fs.BlocksIn(off, n, f.tractSize)
	state, refs, err := f.blockRefs(ctx, st, starts)
	if err != nil {
		return 0, err
	}
	err = fs.Parallel(ctx, len(starts), maxParallelTracts, func(ctx context.Context, i int) error {
		s := starts[i]
		b := refs[i]
		if !b.Found {
			return nil // a hole
		}
		data, err := f.blockData(ctx, state.Blob, b)
		if err != nil {
			return err
		}
		if uint64(len(data)) < b.Length {
			return fs.ErrRaced
		}
		valid := data[:b.Length]
		lo, hi := max(off, s), min(off+n, s+sizes[i])
		if lo-s < uint64(len(valid)) {
			copy(dest[lo-off:hi-off], valid[lo-s:min(hi-s, uint64(len(valid)))])
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	// Buffered writes on top.
	for i, s := range starts {
		db := st.dirty[s]
		if db == nil {
			continue
		}
		lo, hi := max(off, s), min(off+n, s+sizes[i])
		for _, iv := range db.ivs {
			a, b := max(lo, s+iv.lo), min(hi, s+iv.hi)
			if a < b {
				copy(dest[a-off:b-off], db.data[a-s:b-s])
			}
		}
	}
	f.readAhead(st, off, off+n, size)
	return int(n), nil
}

// readAhead keeps the next readAheadTracts tracts' worth of a file read
// sequentially loading in the background, so that a stream of reads
// finds them cached: one tract at a time would leave the stream waiting
// a tract read per tract. The kernel's own read-ahead sends reads out of
// order within a window, so a read counts as sequential if it starts
// near where the stream has got to (a file's first read, at its start,
// does); any other read starts a new stream.
func (f *FS) readAhead(st *file, off, end, size uint64) {
	st.raMu.Lock()
	if off+readAheadSlack < st.raLast || off > st.raLast+readAheadSlack {
		// A jump: a new stream, read ahead once a next read follows it
		// (a random reader gets no tracts it did not ask for).
		st.raLast, st.raIssued = end, end
		st.raMu.Unlock()
		return
	}
	st.raLast = max(st.raLast, end)
	from := max(st.raLast, st.raIssued)
	limit := min(size, st.raLast+readAheadTracts*uint64(f.tractSize))
	// Ask only once a block starts in the window's new part: the block
	// holding from was asked for with the part before.
	next, bsize := fs.BlockAt(from, f.tractSize)
	if next < from {
		next += bsize
	}
	if next >= limit {
		st.raMu.Unlock()
		return
	}
	st.raIssued = limit
	st.raMu.Unlock()
	f.stats.ReadAheads.Add(1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), prefetchTimeout)
		defer cancel()
		starts, _ := fs.BlocksIn(next, limit-next, f.tractSize)
		state, refs, err := f.blockRefs(ctx, st, starts)
		if err != nil {
			return
		}
		_ = fs.Parallel(ctx, len(refs), maxParallelTracts, func(ctx context.Context, i int) error {
			if refs[i].Found && refs[i].Inline == nil {
				_, _ = f.readTract(ctx, state.Blob, refs[i].Tract)
			}
			return nil
		})
	}()
}

func timeOf(ns int64) time.Time { return time.Unix(0, ns) }
