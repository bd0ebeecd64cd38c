package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// File data, the metadata side (doc.go, Data). Clients read and write
// tracts themselves (DESIGN.md §2.6); what they need from the file system
// is a file's state and block map (FileBlocks) and, after writing new
// tracts, a transaction that points the block map at them (CommitBlocks).
// Opens are counted here, per session, so that a file whose last name goes
// while it is open is kept until its last close (Open, Release).

// FileState is what a client needs of a regular file to read or write its
// data.
type FileState struct {
	Mode       uint32
	Size       uint64
	Blob       GUID
	BlobExists bool
	DataGen    uint64
}

// BlockRef is a block map pair as read: Found says whether a live version
// exists (else the block is a hole); S is the version's snapshot number.
// A commit that replaces a block names the BlockRef it read, and fails with
// ErrRaced if the pair changed since.
type BlockRef struct {
	Found         bool
	S             uint64
	Tract, Length uint64
	// Inline is the block's data when the pair holds it (a small file);
	// Tract then only tells this write of the block from others.
	Inline []byte
}

// NewBlock is a block a client wrote to a new tract of the file's blob, to
// replace Base (the pair as the client read it). With Inline (at most
// MaxInlineBytes, the file's first block, and the file no larger), the
// data goes in the pair itself and Tract is any number the client chose
// to tell this write from others.
type NewBlock struct {
	Start, Tract, Length uint64
	Base                 BlockRef
	Inline               []byte
}

// BlocksCommitted is what CommitBlocks did: the file's new size and data
// generation, and the pair now in place for each block committed.
type BlocksCommitted struct {
	Size, DataGen uint64
	Blocks        []BlockRef
}

// ErrRaced is returned by CommitBlocks when another writer changed a block
// (or truncated the file) since the client read it: the client reads the
// blocks again and rewrites its data on top.
var ErrRaced = errors.New("fs: block changed by another writer")

// MaxBlocksPerCommit bounds the blocks one CommitBlocks takes (with the
// inode, well inside a transaction's values).
const MaxBlocksPerCommit = blocksPerTxn

// openFiles records which sessions hold which objects open. It lives in
// the memory of whoever runs the file system (a metadata server), which
// learns of a session's opens from the session itself: a session says it
// holds a file open (Open, again after a failover) and that it no longer
// does (Release, at its last close). A file open when its last name goes
// is kept as an orphan naming a session that holds it, and reclaimed when
// nobody does any more.
type openFiles struct {
	mu       sync.Mutex
	opens    map[Handle]map[uint64]bool // handle -> sessions holding it open
	unlinked map[Handle]bool            // orphaned while open: reclaim at the last close
}

func (o *openFiles) add(h Handle, session uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opens == nil {
		o.opens = map[Handle]map[uint64]bool{}
	}
	if o.opens[h] == nil {
		o.opens[h] = map[uint64]bool{}
	}
	o.opens[h][session] = true
}

// remove records that session no longer holds h open and reports whether
// h was orphaned while open and nobody holds it any more.
func (o *openFiles) remove(h Handle, session uint64) (reclaim bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.opens[h], session)
	if len(o.opens[h]) > 0 {
		return false
	}
	delete(o.opens, h)
	if o.unlinked[h] {
		delete(o.unlinked, h)
		return true
	}
	return false
}

// holder returns a session holding h open, preferring session.
func (o *openFiles) holder(h Handle, session uint64) (uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opens[h][session] {
		return session, true
	}
	for s := range o.opens[h] {
		return s, true
	}
	return 0, false
}

// holds reports whether session holds h open.
func (o *openFiles) holds(h Handle, session uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.opens[h][session]
}

func (o *openFiles) isOpen(h Handle) bool {
	_, ok := o.holder(h, 0)
	return ok
}

// markUnlinked records that open h lost its last name; false if nobody
// holds it (reclaim now).
func (o *openFiles) markUnlinked(h Handle) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.opens[h]) == 0 {
		return false
	}
	if o.unlinked == nil {
		o.unlinked = map[Handle]bool{}
	}
	o.unlinked[h] = true
	return true
}

// Open records that the calling session (WithSession) holds h open and
// returns its attributes. An open file stays alive after its last name is
// removed, until the session's Release. Opening again is harmless (a
// session that finds a new metadata server re-registers its opens).
func (f *FS) Open(ctx context.Context, h Handle) (Attr, error) {
	a, err := f.GetAttr(ctx, h)
	if err != nil {
		return a, err
	}
	if !a.IsDir() {
		f.opens.add(h, SessionOf(ctx))
	}
	return a, nil
}

// opensKnown reports whether every session holding h open has told this
// FS so (Config.OpensKnown).
func (f *FS) opensKnown(h Handle) bool { return f.cfg.OpensKnown == nil || f.cfg.OpensKnown(h) }

// HoldOpens records that session holds each of hs open (a session telling
// a new metadata server of its opens; Open for one file).
func (f *FS) HoldOpens(session uint64, hs []Handle) {
	for _, h := range hs {
		if !h.IsDir() {
			f.opens.add(h, session)
		}
	}
}

// OpenNew records an open of a regular file the session has just created
// (Create returned its attributes already).
func (f *FS) OpenNew(ctx context.Context, h Handle) { f.opens.add(h, SessionOf(ctx)) }

// Release records that the calling session no longer holds h open (its
// last handle closed). If h lost its last name while open and nobody holds
// it now, it is reclaimed; so is an orphan whose record names the session
// and which nobody here is known to hold (the session opened it through
// another server, before a failover).
func (f *FS) Release(ctx context.Context, h Handle) error {
	session := SessionOf(ctx)
	if !f.opens.remove(h, session) {
		if f.opens.isOpen(h) || !f.orphanOf(ctx, h, session) {
			return nil
		}
	}
	if !f.opensKnown(h) {
		// A session this FS has not heard from may hold it.
		f.deferReclaim(h)
		return nil
	}
	if err := f.reclaim(ctx, h); err != nil {
		f.log.Warn("reclaiming an unlinked file at its last close; left to the background", "handle", h, "err", err)
	}
	return nil
}

// orphanOf reports whether h is an orphan whose record names session (or
// no session: its holders were not known when it lost its last name).
func (f *FS) orphanOf(ctx context.Context, h Handle, session uint64) bool {
	var mine bool
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		v, ok, err := tx.Get(f.keys.orphan(h))
		if err != nil || !ok {
			return err
		}
		rec, err := decodeOrphanRecord(v)
		mine = err == nil && (rec.Mount == session || rec.Mount == 0)
		return err
	})
	return err == nil && mine
}

// FileBlocks returns regular file h's state and the block map pairs at the
// given block starts, at the FS's read snapshot. A truncate that was
// interrupted is finished first (doc.go, Data).
func (f *FS) FileBlocks(ctx context.Context, h Handle, starts []uint64) (FileState, []BlockRef, error) {
	n, err := f.readInodeAt(ctx, h)
	if err != nil {
		return FileState{}, nil, err
	}
	if n.TrimFrom != 0 && !f.readOnly {
		if err := f.trim(ctx, h); err != nil {
			return FileState{}, nil, err
		}
		if n, err = f.readInodeAt(ctx, h); err != nil {
			return FileState{}, nil, err
		}
	}
	st := FileState{Mode: n.Mode, Size: n.Size, Blob: n.Blob, BlobExists: n.BlobExists, DataGen: n.DataGen}
	if len(starts) == 0 {
		return st, nil, nil
	}
	if n.Mode&sIFMT != sIFREG {
		if n.Mode&sIFMT == sIFDIR {
			return st, nil, errf(syscall.EISDIR, "data of directory %v", h)
		}
		return st, nil, errf(syscall.EINVAL, "data of non-regular object %v", h)
	}
	refs, err := f.blockRefs(ctx, h, starts)
	return st, refs, err
}

// readInodeAt reads h's inode at the FS's read snapshot, once no other
// session holds its data (SetHold).
func (f *FS) readInodeAt(ctx context.Context, h Handle) (*inode, error) {
	var n *inode
	err := f.unheld(ctx, func() (bool, error) {
		err := f.view(ctx, func(tx MetaTxn, s uint64) error {
			var err error
			n, err = readInode(tx, f.keys, h, s)
			return err
		})
		return err == nil && f.heldFrom(ctx, n), err
	})
	return n, err
}

// blockRefs reads the pairs of the given block starts with one scan over
// their range.
func (f *FS) blockRefs(ctx context.Context, h Handle, starts []uint64) ([]BlockRef, error) {
	sorted := slices.Clone(starts)
	slices.Sort(sorted)
	want := make(map[uint64]bool, len(starts))
	for _, s := range starts {
		want[s] = true
	}
	k := f.keys
	from := k.block(h, sorted[0])
	to := tuple.PrefixEnd(k.block(h, sorted[len(sorted)-1]))
	found := map[uint64]BlockRef{}
	err := f.scanAt(ctx, from, to, f.readAt, func(prefix []byte, v version, payload []byte) error {
		off, err := blockOffset(prefix)
		if err != nil {
			return err
		}
		if !want[off] {
			return nil
		}
		b := BlockRef{Found: v.live(), S: v.S}
		if v.live() {
			e, err := decodeBlockEntry(payload)
			if err != nil {
				return err
			}
			b.Tract, b.Length, b.Inline = e.Tract, e.Length, e.Inline
		}
		found[off] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	if b := found[0]; b.Found && b.Inline != nil && inlineChunks(b.Length) > 0 {
		// The pair and its chunks in one transaction: a pair changed in
		// place has its chunks rewritten in place (inline.go).
		if found[0], err = f.inlineBlock(ctx, h); err != nil {
			return nil, err
		}
	}
	out := make([]BlockRef, len(starts))
	for i, s := range starts {
		out[i] = found[s]
	}
	return out, nil
}

// inlineBlock reads h's first block pair and, if it is inline, all its
// data, at the FS's read snapshot.
func (f *FS) inlineBlock(ctx context.Context, h Handle) (BlockRef, error) {
	var b BlockRef
	err := f.view(ctx, func(tx MetaTxn, s uint64) error {
		b = BlockRef{}
		v, payload, err := readAt(tx, f.keys.block(h, 0), s)
		if err != nil || !v.live() {
			return err
		}
		e, err := decodeBlockEntry(payload)
		if err != nil {
			return err
		}
		if err := readInlineChunks(tx, f.keys, h, v.S, e); err != nil {
			return err
		}
		b = BlockRef{Found: true, S: v.S, Tract: e.Tract, Length: e.Length, Inline: e.Inline}
		return nil
	})
	return b, err
}

// Commit is what a block commit also sets: the file's size (at least),
// a non-zero modification time (and change time), and attribute changes
// the client held back while it had the file open (mode, owner, explicit
// times: fsclient's held changes, sent with the data they follow).
type Commit struct {
	Size  uint64
	Mtime int64
	Attrs SetAttrIn
}

// committable are the attribute changes a block commit takes.
const committable = SetMode | SetUid | SetGid | SetAtime | SetMtime

// CommitBlocks points h's block map at new tracts of its blob blob, which
// the client wrote, in one transaction (at most MaxBlocksPerCommit
// blocks). It fails with ErrRaced if a block is no longer its Base, or the
// file's blob changed, or a truncate is in progress; with ESTALE if the
// file was removed (an orphan takes data only from a session holding it
// open). The size becomes at least the end of every block and size; a
// non-zero mtime sets the modification and change times, and c.Attrs
// (only committable changes) apply last. The tracts of replaced pairs no
// snapshot needs are emptied.
func (f *FS) CommitBlocks(ctx context.Context, h Handle, blob GUID, blocks []NewBlock, c Commit) (BlocksCommitted, error) {
	size, mtime := c.Size, c.Mtime
	if c.Attrs.Valid&^committable != 0 {
		return BlocksCommitted{}, errf(syscall.EINVAL, "attribute changes %#x with a block commit (only mode, owner and explicit times)", c.Attrs.Valid)
	}
	if f.readOnly {
		return BlocksCommitted{}, syscall.EROFS
	}
	if len(blocks) > MaxBlocksPerCommit {
		return BlocksCommitted{}, errf(syscall.EINVAL, "%d blocks in one commit (the bound is %d)", len(blocks), MaxBlocksPerCommit)
	}
	if size > maxFileBytes {
		return BlocksCommitted{}, errf(syscall.EFBIG, "size %d (the bound is %d)", size, uint64(maxFileBytes))
	}
	maxBlock := pow2Floor(uint64(f.tractSize))
	inline := false
	for _, b := range blocks {
		s, sz := blockAt(b.Start, maxBlock)
		if s != b.Start || b.Length == 0 || b.Length > sz || b.Start+b.Length > maxFileBytes {
			return BlocksCommitted{}, errf(syscall.EINVAL, "block [%d, +%d) is not within one block of the file's layout", b.Start, b.Length)
		}
		if b.Inline != nil {
			if b.Start != 0 || uint64(len(b.Inline)) != b.Length || b.Length > MaxInlineBytes || len(blocks) != 1 || size > MaxInlineBytes {
				return BlocksCommitted{}, errf(syscall.EINVAL, "inline block [%d, +%d) with %d bytes in a file of size %d: only a file of at most %d bytes is kept inline, as its first and only block",
					b.Start, b.Length, len(b.Inline), size, MaxInlineBytes)
			}
			inline = true
		}
	}
	session := SessionOf(ctx)
	k := f.keys
	var frees []blockEntry
	var out BlocksCommitted
	unheld := false
	err := f.update(ctx, func(w *wtx) error {
		frees = frees[:0]
		out = BlocksCommitted{Blocks: make([]BlockRef, len(blocks))}
		icur, in, err := w.inode(k, h)
		if err != nil {
			if errnoOf(err) == syscall.ENOENT {
				return errf(syscall.ESTALE, "file %v was removed", h)
			}
			return err
		}
		if in.Mode&sIFMT != sIFREG {
			return errf(syscall.EINVAL, "data for non-regular object %v", h)
		}
		if in.Blob != blob || in.TrimFrom != 0 {
			return ErrRaced
		}
		if inline && in.Size > MaxInlineBytes {
			return ErrRaced // grew meanwhile: not a small file any more
		}
		if in.Nlink == 0 {
			// An orphan takes data only from a session that holds it
			// open: another one may be reclaiming it and would leave our
			// blocks behind.
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
			if rec.Mount != session && (rec.Mount != 0 || !(f.opens.holds(h, session) || isReplay(ctx))) {
				return errf(syscall.ESTALE, "file %v was removed by another client", h)
			}
		}
		for i, b := range blocks {
			cur, payload, err := w.current(k.block(h, b.Start))
			if err != nil {
				return err
			}
			got := BlockRef{Found: cur.live(), S: cur.S}
			var old *blockEntry
			if cur.live() {
				if old, err = decodeBlockEntry(payload); err != nil {
					return err
				}
				got.Tract, got.Length, got.Inline = old.Tract, old.Length, old.Inline
				if old.Blob != blob {
					return ErrRaced
				}
			}
			if !sameBlock(got, b.Base) {
				return ErrRaced
			}
			e := blockEntry{Blob: blob, Tract: b.Tract, Length: b.Length, Inline: b.Inline}
			s, err := w.putBlock(k, h, b.Start, cur, old, e)
			if err != nil {
				return err
			}
			out.Blocks[i] = BlockRef{Found: true, S: s, Tract: b.Tract, Length: b.Length, Inline: b.Inline}
			if cur.live() && !w.shared(cur) && got.Inline == nil {
				frees = append(frees, blockEntry{Blob: blob, Tract: got.Tract, Length: got.Length})
			}
			in.Size = max(in.Size, b.Start+b.Length)
		}
		in.Size = max(in.Size, size)
		if mtime != 0 {
			in.Mtime, in.Ctime = mtime, max(in.Ctime, mtime) // a change made since the writes (a chmod after close) keeps its time
		}
		if a := c.Attrs; a.Valid != 0 {
			if a.Valid&SetMode != 0 {
				in.Mode = in.Mode&sIFMT | a.Mode&permBits
			}
			if a.Valid&SetUid != 0 {
				in.Uid = a.Uid
			}
			if a.Valid&SetGid != 0 {
				in.Gid = a.Gid
			}
			if a.Valid&SetAtime != 0 {
				in.Atime = a.Atime.UnixNano()
			}
			if a.Valid&SetMtime != 0 {
				in.Mtime = a.Mtime.UnixNano()
			}
			in.Ctime = max(in.Ctime, f.opNow(ctx).UnixNano())
		}
		if !inline {
			in.BlobExists = true // the client created it before writing its tracts
		}
		unheld = false
		if mtime != 0 && in.HoldSession == session {
			// The commit that ends a flush: the data its close held back
			// is there (SetHold).
			in.HoldSession, in.HoldUntil, unheld = 0, 0, true
		}
		in.DataGen++
		out.Size, out.DataGen = in.Size, in.DataGen
		if err := f.queueFrees(w.tx, frees); err != nil {
			return err
		}
		return w.setInode(k, h, icur, in)
	})
	if err != nil {
		return BlocksCommitted{}, err
	}
	if unheld {
		f.noteHold(h, false, 0)
	}
	f.freeTractsWhenDurable(ctx, frees)
	return out, nil
}

// sameBlock reports whether a and b are the same write of a block (an
// inline block's Tract tells its writes apart).
func sameBlock(a, b BlockRef) bool {
	if a.Found != b.Found {
		return false
	}
	return !a.Found || (a.S == b.S && a.Tract == b.Tract && a.Length == b.Length && (a.Inline == nil) == (b.Inline == nil))
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

// readTract returns the data of a block's tract.
func (f *FS) readTract(ctx context.Context, e blockEntry) ([]byte, error) {
	if e.inline() {
		return bytes.Clone(e.Inline), nil
	}
	data, err := f.data.ReadTract(ctx, e.Blob, e.Tract)
	return data, storeErr("read tract", err)
}

// Parallel runs fn(0..n-1), at most limit at once, and returns the first
// error (cancelling the others' context).
func Parallel(ctx context.Context, n, limit int, fn func(ctx context.Context, i int) error) error {
	if n == 1 {
		return fn(ctx, 0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, max(limit, 1))
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

// BlockAt returns the start and size of the block holding offset off, for
// a data store of tracts of tractSize bytes (blocks.go).
func BlockAt(off uint64, tractSize int) (start, size uint64) {
	return blockAt(off, pow2Floor(uint64(tractSize)))
}

// BlocksIn returns the starts and sizes of the blocks overlapping
// [off, off+n) for a data store of tracts of tractSize bytes.
func BlocksIn(off, n uint64, tractSize int) (starts, sizes []uint64) {
	return blocksIn(off, n, pow2Floor(uint64(tractSize)))
}
