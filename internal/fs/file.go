package fs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// file is what this client holds of one regular file: open handles, the
// writes it buffers (write-back, flushed on Flush/Fsync/Release and when
// the buffer is large) and a cache of its block map. Data operations on a
// file are serialized by mu (reads share it).
type file struct {
	h  Handle
	mu sync.RWMutex

	// Under FS.filesMu:
	opens    int
	pins     int  // calls using the state right now
	unlinked bool // orphaned while open: reclaim at the last release

	// sum is what GetAttr overlays while writes are buffered.
	sumMu      sync.Mutex
	dirtyEnd   uint64 // the size the buffered writes give the file
	dirtyMtime int64
	hasDirty   bool

	// Under mu (written with mu held exclusively):
	dirty      map[uint64]*dirtyBlock
	dirtyBytes int64

	// The committed state this client last saw, under cacheMu.
	cacheMu sync.Mutex
	known   bool
	size    uint64
	blob    GUID
	blocks  map[uint64]cachedBlock
}

// dirtyBlock is the buffered writes to one block: a buffer of the block's
// size and the intervals of it that were written.
type dirtyBlock struct {
	start, size uint64
	data        []byte
	ivs         []interval // sorted, disjoint, not adjacent
}

type interval struct{ lo, hi uint64 } // offsets within the block

// cachedBlock is a block map pair as read: found says whether a live
// version exists (else the block is a hole).
type cachedBlock struct {
	v     version
	entry blockEntry
}

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
func (f *FS) pin(h Handle, create bool) *file {
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

func (f *FS) isOpen(h Handle) bool {
	f.filesMu.Lock()
	defer f.filesMu.Unlock()
	st := f.files[h]
	return st != nil && st.opens > 0
}

// overlayDirty makes attributes show this client's buffered writes.
func (f *FS) overlayDirty(a *Attr) {
	f.filesMu.Lock()
	st := f.files[a.Handle]
	f.filesMu.Unlock()
	if st == nil {
		return
	}
	st.sumMu.Lock()
	defer st.sumMu.Unlock()
	if st.hasDirty {
		a.Size = max(a.Size, st.dirtyEnd)
		a.Mtime = timeOf(st.dirtyMtime)
		a.Ctime = a.Mtime
	}
}

// Open opens h for reading and writing its data. Close-to-open
// consistency: what other clients flushed before the open is seen (the
// client's cached block map is dropped). Open handles keep a file alive
// after its last name is removed, until Release.
func (f *FS) Open(ctx context.Context, h Handle) (Attr, error) {
	a, err := f.GetAttr(ctx, h)
	if err != nil {
		return a, err
	}
	if !a.IsDir() {
		f.OpenNew(h)
	}
	return a, nil
}

// OpenNew is Open for a regular file this client has just created: its
// attributes are known, so it does not read them again (one B-tree read
// less per create through FUSE).
func (f *FS) OpenNew(h Handle) {
	st := f.pin(h, true)
	defer f.unpin(st)
	f.filesMu.Lock()
	st.opens++
	f.filesMu.Unlock()
	st.cacheMu.Lock()
	st.known, st.blocks = false, nil
	st.cacheMu.Unlock()
}

// Release closes one open handle of h: it flushes h's buffered writes and,
// if h lost its last name while open and this was the last handle,
// reclaims it.
func (f *FS) Release(ctx context.Context, h Handle) error {
	st := f.pin(h, false)
	if st == nil {
		return nil
	}
	defer f.unpin(st)
	err := f.Flush(ctx, h)
	f.filesMu.Lock()
	if st.opens > 0 {
		st.opens--
	}
	last := st.opens == 0
	unlinked := last && st.unlinked
	if unlinked {
		st.unlinked = false
	}
	f.filesMu.Unlock()
	if unlinked {
		if rerr := f.reclaim(ctx, h); rerr != nil {
			f.log.Warn("reclaiming an unlinked file at its last close; left to the background", "handle", h, "err", rerr)
		}
	}
	return err
}

// Write writes data at off (write-back: the bytes are buffered and reach
// the stores at the next flush).
func (f *FS) Write(ctx context.Context, h Handle, off int64, data []byte) (int, error) {
	if f.readOnly {
		return 0, syscall.EROFS
	}
	if off < 0 {
		return 0, errf(syscall.EINVAL, "negative offset %d", off)
	}
	end := uint64(off) + uint64(len(data))
	if end > maxFileBytes || uint64(off) > maxFileBytes {
		return 0, errf(syscall.EFBIG, "write to %d bytes (the bound is %d)", end, uint64(maxFileBytes))
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
	if c.mode&sIFMT != sIFREG {
		if c.mode&sIFMT == sIFDIR {
			return 0, errf(syscall.EISDIR, "write to directory %v", h)
		}
		return 0, errf(syscall.EINVAL, "write to non-regular object %v", h)
	}
	maxBlock := pow2Floor(uint64(f.tractSize))
	starts, sizes := blocksIn(uint64(off), uint64(len(data)), maxBlock)
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
		st.dirtyEnd = c.size
	}
	st.hasDirty = true
	st.dirtyEnd = max(st.dirtyEnd, end)
	st.dirtyMtime = now
	st.sumMu.Unlock()
	if st.dirtyBytes > f.cfg.MaxDirtyBytesPerFile || f.dirty.Load() > f.cfg.MaxDirtyBytes {
		if err := f.flushLocked(ctx, st); err != nil {
			return 0, err
		}
	}
	return len(data), nil
}

// committedState is what a data operation needs of the inode.
type committedState struct {
	mode uint32
	size uint64
}

// committed returns the inode's committed size (cached while the file's
// state lives; reloaded after an open).
func (f *FS) committed(ctx context.Context, st *file) (committedState, error) {
	var n *inode
	err := f.view(ctx, func(tx MetaTxn, s uint64) error {
		var err error
		n, err = readInode(tx, f.keys, st.h, s)
		return err
	})
	if err != nil {
		return committedState{}, err
	}
	st.cacheMu.Lock()
	if !st.known || st.blob != n.Blob {
		st.blocks = nil
	}
	st.known, st.size, st.blob = true, n.Size, n.Blob
	st.cacheMu.Unlock()
	return committedState{mode: n.Mode, size: n.Size}, nil
}

// Flush writes h's buffered data to the stores (close(2), fsync(2)).
func (f *FS) Flush(ctx context.Context, h Handle) error {
	st := f.pin(h, false)
	if st == nil {
		return nil
	}
	defer f.unpin(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	return f.flushLocked(ctx, st)
}

// Fsync is Flush: data is durable once the stores acknowledged it.
func (f *FS) Fsync(ctx context.Context, h Handle) error { return f.Flush(ctx, h) }

// SyncAll flushes every file's buffered writes.
func (f *FS) SyncAll(ctx context.Context) error { return f.syncAll(ctx, false) }

// syncAll flushes every file; with dropStale, a file another client
// removed meanwhile is not an error (its data is gone, as it would be had
// it been flushed), only logged.
func (f *FS) syncAll(ctx context.Context, dropStale bool) error {
	f.filesMu.Lock()
	var all []Handle
	for h := range f.files {
		all = append(all, h)
	}
	f.filesMu.Unlock()
	var errs []error
	for _, h := range all {
		err := f.Flush(ctx, h)
		if dropStale && errnoOf(err) == syscall.ESTALE {
			f.log.Warn("buffered writes to a removed file dropped", "err", err)
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// maxFlushAttempts bounds how often a flush starts again after another
// writer changed its blocks.
const maxFlushAttempts = 8

func (f *FS) flushLocked(ctx context.Context, st *file) error {
	if len(st.dirty) == 0 {
		return nil
	}
	var err error
	for range maxFlushAttempts {
		err = f.flushOnce(ctx, st)
		if !errors.Is(err, errRaced) {
			break
		}
		st.cacheMu.Lock()
		st.blocks = nil
		st.cacheMu.Unlock()
	}
	if e := errnoOf(err); e == syscall.ENOENT || e == syscall.ESTALE || errors.Is(err, ErrBlobNotFound) {
		// Another client removed the file's last name and reclaimed it
		// (an open file is kept alive only by the client holding it
		// open): the buffered data has nowhere to go. The flush may learn
		// it from the data store first, when the reclaim has already
		// deleted the file's blob (only the reclaim of a removed file
		// deletes one).
		var lost int64
		for _, db := range st.dirty {
			lost += int64(db.size)
		}
		f.dropDirty(st)
		return errf(syscall.ESTALE, "flush %v: the file was removed by another client; %d buffered bytes dropped", st.h, lost)
	}
	if err != nil {
		return fmt.Errorf("flush %v: %w", st.h, err)
	}
	f.stats.Flushes.Add(1)
	// Flushed: the buffer is now what the stores hold.
	f.dropDirty(st)
	return nil
}

// newBlock is a block a flush writes.
type newBlock struct {
	start   uint64
	data    []byte
	base    cachedBlock // the pair the new content was merged onto
	after   cachedBlock // the pair written
	tract   uint64
	written bool
}

func (f *FS) flushOnce(ctx context.Context, st *file) error {
	h := st.h
	n, err := f.headInode(ctx, h)
	if err != nil {
		return err
	}
	if n.Mode&sIFMT != sIFREG {
		return errf(syscall.EINVAL, "data for non-regular object %v", h)
	}
	if n.TrimFrom != 0 {
		if err := f.trim(ctx, st); err != nil {
			return err
		}
		if n, err = f.headInode(ctx, h); err != nil {
			return err
		}
	}
	starts := make([]uint64, 0, len(st.dirty))
	for s := range st.dirty {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	bases, err := f.blockEntries(ctx, st, starts)
	if err != nil {
		return err
	}
	// Merge the buffered writes onto the committed blocks.
	blocks := make([]*newBlock, len(starts))
	for i, s := range starts {
		db := st.dirty[s]
		base := bases[s]
		var oldLen uint64
		if base.v.live() {
			oldLen = min(base.entry.Length, db.size)
			if n.Size < s+oldLen {
				oldLen = n.Size - min(n.Size, s)
			}
		}
		newLen := max(oldLen, db.end())
		content := make([]byte, newLen)
		if oldLen > 0 && !db.covers(oldLen) {
			old, err := f.readTract(ctx, base.entry)
			if err != nil {
				return err
			}
			if uint64(len(old)) < oldLen {
				return errRaced // the tract was freed: our pair is stale
			}
			copy(content, old[:oldLen])
		}
		for _, iv := range db.ivs {
			copy(content[iv.lo:iv.hi], db.data[iv.lo:iv.hi])
		}
		blocks[i] = &newBlock{start: s, data: content, base: base}
	}
	// Every new block goes to a new tract: tracts are never rewritten, so
	// a snapshot's blocks and a concurrent reader's are never changed.
	if !n.BlobExists {
		if err := f.data.CreateBlob(ctx, n.Blob); err != nil {
			return storeErr("create blob", err)
		}
	}
	first, err := f.data.Extend(ctx, n.Blob, uint64(len(blocks)))
	if err != nil {
		return storeErr("extend blob", err)
	}
	for i, b := range blocks {
		b.tract = first + uint64(i)
	}
	committedUpTo := 0
	defer func() {
		// Tracts written for batches that did not commit are garbage.
		var dead []blockEntry
		for _, b := range blocks[committedUpTo:] {
			if b.written {
				dead = append(dead, blockEntry{Blob: n.Blob, Tract: b.tract})
			}
		}
		f.freeTracts(context.WithoutCancel(ctx), dead)
	}()
	if err := f.parallel(ctx, len(blocks), func(ctx context.Context, i int) error {
		b := blocks[i]
		if err := f.data.WriteTract(ctx, n.Blob, b.tract, b.data); err != nil {
			return storeErr("write tract", err)
		}
		b.written = true
		f.stats.TractWrites.Add(1)
		f.tracts.put(tractKey{n.Blob, b.tract}, b.data)
		return nil
	}); err != nil {
		return err
	}
	st.sumMu.Lock()
	finalSize, mtime := st.dirtyEnd, st.dirtyMtime
	st.sumMu.Unlock()
	k := f.keys
	for lo := 0; lo < len(blocks); lo += blocksPerTxn {
		batch := blocks[lo:min(len(blocks), lo+blocksPerTxn)]
		last := lo+len(batch) == len(blocks)
		var frees []blockEntry
		var size uint64
		err := f.update(ctx, func(w *wtx) error {
			frees = frees[:0]
			icur, in, err := w.inode(k, h)
			if err != nil {
				if errnoOf(err) == syscall.ENOENT {
					return errf(syscall.ESTALE, "file %v was removed", h)
				}
				return err
			}
			if in.Blob != n.Blob || in.TrimFrom != 0 {
				return errRaced
			}
			if in.Nlink == 0 {
				// An orphan takes data only from the client that holds
				// it open (its record names that client): another one
				// may be reclaiming it and would leave our blocks behind.
				v, ok, err := w.tx.Get(k.orphan(h))
				if err != nil {
					return err
				}
				if !ok {
					return errf(syscall.ESTALE, "file %v was removed", h)
				}
				rec, err := decodeOrphanRecord(v)
				if err != nil {
					return err
				}
				if rec.Mount != f.mountID {
					return errf(syscall.ESTALE, "file %v was removed by another client", h)
				}
			}
			for _, b := range batch {
				key := k.block(h, b.start)
				cur, payload, err := w.current(key)
				if err != nil {
					return err
				}
				got := cachedBlock{v: cur}
				if cur.live() {
					e, err := decodeBlockEntry(payload)
					if err != nil {
						return err
					}
					got.entry = *e
				}
				if !sameBlock(got, b.base) {
					return errRaced
				}
				e := blockEntry{Blob: n.Blob, Tract: b.tract, Length: uint64(len(b.data))}
				b.after = cachedBlock{v: version{Found: true, S: w.putVersion(cur)}, entry: e}
				if err := w.put(key, cur, e.encode()); err != nil {
					return err
				}
				if cur.live() && !w.shared(cur) {
					frees = append(frees, got.entry)
				}
				in.Size = max(in.Size, b.start+uint64(len(b.data)))
			}
			if last {
				in.Size = max(in.Size, finalSize)
				in.Mtime, in.Ctime = mtime, mtime
			}
			in.BlobExists = true
			in.DataGen++
			size = in.Size
			return w.setInode(k, h, icur, in)
		})
		if err != nil {
			return err
		}
		committedUpTo = lo + len(batch)
		f.freeTracts(ctx, frees)
		st.cacheMu.Lock()
		if st.blocks != nil && f.readAt == headSnapshot {
			for _, b := range batch {
				st.blocks[b.start] = b.after
			}
		}
		st.known, st.size, st.blob = true, size, n.Blob
		st.cacheMu.Unlock()
	}
	return nil
}

func sameBlock(a, b cachedBlock) bool {
	if a.v.live() != b.v.live() {
		return false
	}
	if !a.v.live() {
		return true
	}
	return a.v.S == b.v.S && a.entry == b.entry
}

func (f *FS) headInode(ctx context.Context, h Handle) (*inode, error) {
	var n *inode
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		var err error
		n, err = readInode(tx, f.keys, h, headSnapshot)
		return err
	})
	return n, err
}

// blockEntries returns the block map pairs of the given block starts at the
// FS's read snapshot, from the client's cache or the store.
func (f *FS) blockEntries(ctx context.Context, st *file, starts []uint64) (map[uint64]cachedBlock, error) {
	out := make(map[uint64]cachedBlock, len(starts))
	var missing []uint64
	st.cacheMu.Lock()
	for _, s := range starts {
		if b, ok := st.blocks[s]; ok {
			out[s] = b
		} else {
			missing = append(missing, s)
		}
	}
	st.cacheMu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	// One scan over the range of the missing blocks.
	k := f.keys
	want := map[uint64]bool{}
	for _, s := range missing {
		want[s] = true
	}
	from := k.block(st.h, missing[0])
	to := tuple.PrefixEnd(k.block(st.h, missing[len(missing)-1]))
	found := map[uint64]cachedBlock{}
	err := f.scanAt(ctx, from, to, f.readAt, func(prefix []byte, v version, payload []byte) error {
		off, err := blockOffset(prefix)
		if err != nil {
			return err
		}
		if !want[off] {
			return nil
		}
		b := cachedBlock{v: v}
		if v.live() {
			e, err := decodeBlockEntry(payload)
			if err != nil {
				return err
			}
			b.entry = *e
		}
		found[off] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	st.cacheMu.Lock()
	if st.blocks == nil {
		st.blocks = map[uint64]cachedBlock{}
	}
	for _, s := range missing {
		b := found[s]
		out[s] = b
		st.blocks[s] = b
	}
	st.cacheMu.Unlock()
	return out, nil
}

// blockOffset returns the offset of a block map key's prefix.
func blockOffset(prefix []byte) (uint64, error) {
	t, err := tuple.Unpack(prefix)
	if err != nil || len(t) != 6 {
		return 0, fmt.Errorf("%w: block key %x", errCorrupt, prefix)
	}
	o, ok := t[5].(int64)
	if !ok || o < 0 {
		return 0, fmt.Errorf("%w: block key %x", errCorrupt, prefix)
	}
	return uint64(o), nil
}

// readTract returns the data of a block's tract (cached).
func (f *FS) readTract(ctx context.Context, e blockEntry) ([]byte, error) {
	return f.tracts.get(ctx, tractKey{e.Blob, e.Tract}, func(ctx context.Context) ([]byte, error) {
		f.stats.TractReads.Add(1)
		data, err := f.data.ReadTract(ctx, e.Blob, e.Tract)
		return data, storeErr("read tract", err)
	})
}

// freeTracts empties tracts no pair names any more (the tract store keeps
// an empty tract at no cost), in the background of the caller.
func (f *FS) freeTracts(ctx context.Context, es []blockEntry) {
	if len(es) == 0 {
		return
	}
	_ = f.parallel(ctx, len(es), func(ctx context.Context, i int) error {
		f.tracts.drop(tractKey{es[i].Blob, es[i].Tract})
		if err := f.data.WriteTract(ctx, es[i].Blob, es[i].Tract, nil); err != nil {
			f.log.Warn("freeing a tract; fsck will report it leaked", "blob", es[i].Blob, "tract", es[i].Tract, "err", err)
			return nil
		}
		f.stats.TractFrees.Add(1)
		return nil
	})
}

// parallel runs fn(0..n-1), at most maxParallelTracts at once, and returns
// the first error.
func (f *FS) parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	if n == 1 {
		return fn(ctx, 0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, maxParallelTracts)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// Read reads up to len(dest) bytes at off; it returns fewer only at the end
// of the file.
func (f *FS) Read(ctx context.Context, h Handle, off int64, dest []byte) (int, error) {
	if off < 0 {
		return 0, errf(syscall.EINVAL, "negative offset %d", off)
	}
	st := f.pin(h, true)
	defer f.unpin(st)
	st.mu.RLock()
	defer st.mu.RUnlock()
	var err error
	for range maxStaleReads {
		var n int
		n, err = f.readOnce(ctx, st, uint64(off), dest)
		if !errors.Is(err, errRaced) {
			return n, err
		}
		f.stats.StaleReads.Add(1)
		st.cacheMu.Lock()
		st.known, st.blocks = false, nil
		st.cacheMu.Unlock()
	}
	return 0, fmt.Errorf("read %v: blocks kept changing: %w", h, syscall.EIO)
}

func (f *FS) readOnce(ctx context.Context, st *file, off uint64, dest []byte) (int, error) {
	st.cacheMu.Lock()
	known, size := st.known, st.size
	st.cacheMu.Unlock()
	if !known {
		c, err := f.committed(ctx, st)
		if err != nil {
			return 0, err
		}
		if c.mode&sIFMT == sIFDIR {
			return 0, errf(syscall.EISDIR, "read of directory %v", st.h)
		}
		size = c.size
	}
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
	maxBlock := pow2Floor(uint64(f.tractSize))
	starts, sizes := blocksIn(off, n, maxBlock)
	entries, err := f.blockEntries(ctx, st, starts)
	if err != nil {
		return 0, err
	}
	err = f.parallel(ctx, len(starts), func(ctx context.Context, i int) error {
		s := starts[i]
		b := entries[s]
		if !b.v.live() {
			return nil // a hole
		}
		data, err := f.readTract(ctx, b.entry)
		if err != nil {
			return err
		}
		if uint64(len(data)) < b.entry.Length {
			return errRaced
		}
		valid := data[:b.entry.Length]
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
	// Read ahead the next block if this read ends in the last block.
	if last := starts[len(starts)-1]; off+n == last+sizes[len(sizes)-1] && off+n < size {
		f.prefetch(st, off+n)
	}
	return int(n), nil
}

// prefetch loads the tract of the block at off into the cache in the
// background.
func (f *FS) prefetch(st *file, off uint64) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultPrefetchTimeout)
		defer cancel()
		maxBlock := pow2Floor(uint64(f.tractSize))
		s, _ := blockAt(off, maxBlock)
		entries, err := f.blockEntries(ctx, st, []uint64{s})
		if err != nil || !entries[s].v.live() {
			return
		}
		_, _ = f.readTract(ctx, entries[s].entry)
	}()
}
