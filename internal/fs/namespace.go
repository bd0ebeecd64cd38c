package fs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Cred is who creates an object: its owner and group.
type Cred struct {
	Uid, Gid uint32
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name   string
	Handle Handle
	Type   uint32 // the S_IFMT bits of the entry's mode
	// Cookie is the entry's position: ReadDir after it continues with the
	// next entry. Cookies of a directory's entries never change (a rename
	// gives the moved name a new one), so listings are stable.
	Cookie uint64
}

// Rename flags (renameat2(2)).
const (
	RenameNoReplace = 1 << 0
	RenameExchange  = 1 << 1
)

// maxLinks bounds an object's link count (EMLINK past it).
const maxLinks = 1 << 20

// maxDepth bounds the ancestor walk of a directory rename.
const maxDepth = 1 << 14

func checkName(name string) error {
	switch {
	case name == "":
		return errf(syscall.ENOENT, "empty name")
	case len(name) > MaxNameBytes:
		return errf(syscall.ENAMETOOLONG, "name of %d bytes (the bound is %d)", len(name), MaxNameBytes)
	case strings.ContainsAny(name, "/\x00"):
		return errf(syscall.EINVAL, "name %q holds '/' or NUL", name)
	}
	return nil
}

// CheckNewName returns the error creating an entry called name would
// fail with (EINVAL, ENAMETOOLONG, EEXIST for "." and ".."), or nil.
func CheckNewName(name string) error { return checkNewName(name) }

// checkNewName checks a name an operation would create.
func checkNewName(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if name == "." || name == ".." {
		return errf(syscall.EEXIST, "name %q", name)
	}
	return nil
}

// inode reads h's current inode, ENOENT if it does not exist.
func (w *wtx) inode(k keys, h Handle) (version, *inode, error) {
	cur, payload, err := w.current(k.inode(h))
	if err != nil {
		return cur, nil, err
	}
	if !cur.live() {
		return cur, nil, errf(syscall.ENOENT, "object %v", h)
	}
	n, err := decodeInode(payload)
	return cur, n, err
}

// dir reads directory h's inode: ENOENT if it is gone (or being removed),
// ENOTDIR if it is not a directory.
func (w *wtx) dir(k keys, h Handle) (version, *inode, error) {
	cur, n, err := w.inode(k, h)
	if err != nil {
		return cur, nil, err
	}
	if n.Mode&sIFMT != sIFDIR {
		return cur, nil, errf(syscall.ENOTDIR, "object %v", h)
	}
	if n.Nlink == 0 {
		return cur, nil, errf(syscall.ENOENT, "directory %v was removed", h)
	}
	return cur, n, nil
}

func (w *wtx) setInode(k keys, h Handle, cur version, n *inode) error {
	return w.put(k.inode(h), cur, n.encode())
}

// entry reads the current name entry of name in dir (nil if absent).
func (w *wtx) entry(k keys, dir Handle, name string) (version, *dirent, error) {
	cur, payload, err := w.current(k.name(dir, name))
	if err != nil || !cur.live() {
		return cur, nil, err
	}
	x, err := decodeDirent(payload)
	return cur, x, err
}

// addEntry points name in dir at h, with a new cookie from parent.
func (w *wtx) addEntry(k keys, dir Handle, parent *inode, name string, cur version, h Handle, typ uint32) error {
	c := parent.NextCookie
	parent.NextCookie++
	x := &dirent{H: h, Type: typ, Cookie: c}
	if err := w.put(k.name(dir, name), cur, x.encode()); err != nil {
		return err
	}
	return w.putFresh(k.cookie(dir, c), (&cookieEntry{H: h, Type: typ, Name: name}).encode())
}

// removeEntry removes name (whose entry is x at version cur) from dir.
func (w *wtx) removeEntry(k keys, dir Handle, name string, cur version, x *dirent) error {
	if err := w.del(k.name(dir, name), cur); err != nil {
		return err
	}
	ck := k.cookie(dir, x.Cookie)
	ccur, _, err := w.current(ck)
	if err != nil {
		return err
	}
	return w.del(ck, ccur)
}

// replaceEntry points the existing name (entry x at version cur) in dir at
// object h, keeping its cookie.
func (w *wtx) replaceEntry(k keys, dir Handle, name string, cur version, x *dirent, h Handle, typ uint32) error {
	if err := w.put(k.name(dir, name), cur, (&dirent{H: h, Type: typ, Cookie: x.Cookie}).encode()); err != nil {
		return err
	}
	ck := k.cookie(dir, x.Cookie)
	ccur, _, err := w.current(ck)
	if err != nil {
		return err
	}
	return w.put(ck, ccur, (&cookieEntry{H: h, Type: typ, Name: name}).encode())
}

// Lookup returns the attributes of name in directory dir.
func (f *FS) Lookup(ctx context.Context, dir Handle, name string) (Attr, error) {
	if name == "." {
		return f.GetAttr(ctx, dir)
	}
	if name == ".." {
		var a Attr
		err := f.view(ctx, func(tx MetaTxn, s uint64) error {
			n, err := readInode(tx, f.keys, dir, s)
			if err != nil {
				return err
			}
			if n.Mode&sIFMT != sIFDIR {
				return errf(syscall.ENOTDIR, "object %v", dir)
			}
			parent := Handle{D: n.Parent}
			pn, err := readInode(tx, f.keys, parent, s)
			if err != nil {
				return err
			}
			a = f.attrOf(parent, pn)
			return nil
		})
		return a, err
	}
	if err := checkName(name); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := f.unheld(ctx, func() (held bool, err error) {
		return held, f.view(ctx, func(tx MetaTxn, s uint64) error {
			held = false
			x, err := readEntry(tx, f.keys, dir, name, s)
			if err != nil {
				return err
			}
			if x == nil {
				// Tell a missing name from a missing directory.
				dn, err := readInode(tx, f.keys, dir, s)
				if err != nil {
					return err
				}
				if dn.Mode&sIFMT != sIFDIR {
					return errf(syscall.ENOTDIR, "object %v", dir)
				}
				return errf(syscall.ENOENT, "%q in %v", name, dir)
			}
			n, err := readInode(tx, f.keys, x.H, s)
			if err != nil {
				return fmt.Errorf("%w: %q in %v names missing object %v: %w", errCorrupt, name, dir, x.H, err)
			}
			a, held = f.attrOf(x.H, n), f.heldFrom(ctx, n)
			return nil
		})
	})
	return a, err
}

func readInode(tx MetaTxn, k keys, h Handle, s uint64) (*inode, error) {
	v, payload, err := readAt(tx, k.inode(h), s)
	if err != nil {
		return nil, err
	}
	if !v.live() {
		return nil, errf(syscall.ENOENT, "object %v", h)
	}
	return decodeInode(payload)
}

func readEntry(tx MetaTxn, k keys, dir Handle, name string, s uint64) (*dirent, error) {
	v, payload, err := readAt(tx, k.name(dir, name), s)
	if err != nil || !v.live() {
		return nil, err
	}
	return decodeDirent(payload)
}

// GetAttr returns h's attributes.
func (f *FS) GetAttr(ctx context.Context, h Handle) (Attr, error) {
	var a Attr
	err := f.unheld(ctx, func() (held bool, err error) {
		return held, f.view(ctx, func(tx MetaTxn, s uint64) error {
			n, err := readInode(tx, f.keys, h, s)
			if err != nil {
				return err
			}
			a, held = f.attrOf(h, n), f.heldFrom(ctx, n)
			return nil
		})
	})
	return a, err
}

// newObject describes an object to create.
type newObject struct {
	mode   uint32
	rdev   uint64
	cred   Cred
	target string // symlinks
	// d, if set, is the new directory's id (a fresh root placed by the
	// caller, MkdirAt).
	d uint64
}

// Create creates a regular file (EEXIST if name exists).
func (f *FS) Create(ctx context.Context, dir Handle, name string, mode uint32, cred Cred) (Attr, error) {
	return f.mknode(ctx, dir, name, newObject{mode: sIFREG | mode&permBits, cred: cred})
}

// Mknod creates a regular file, FIFO, socket or device node.
func (f *FS) Mknod(ctx context.Context, dir Handle, name string, mode uint32, rdev uint64, cred Cred) (Attr, error) {
	switch mode & sIFMT {
	case 0:
		mode |= sIFREG
	case sIFREG, sIFIFO, sIFSOCK, sIFCHR, sIFBLK:
	default:
		return Attr{}, errf(syscall.EINVAL, "mknod of type %o", mode&sIFMT)
	}
	if t := mode & sIFMT; t != sIFCHR && t != sIFBLK {
		rdev = 0
	}
	return f.mknode(ctx, dir, name, newObject{mode: mode&sIFMT | mode&permBits, rdev: rdev, cred: cred})
}

// Mkdir creates a directory.
func (f *FS) Mkdir(ctx context.Context, dir Handle, name string, mode uint32, cred Cred) (Attr, error) {
	return f.mknode(ctx, dir, name, newObject{mode: sIFDIR | mode&permBits, cred: cred})
}

// MkdirAt is Mkdir with the new directory's id chosen by the caller: a
// root of the too-deep region it drew (TooDeepRoot), so the directory
// starts a subtree placed apart from its parent's (FlexGroup §3.5, remote
// placement). EEXIST if something has that id.
func (f *FS) MkdirAt(ctx context.Context, dir Handle, name string, mode uint32, cred Cred, d uint64) (Attr, error) {
	if Region(d) != regionTooDeep || f.layout.level(d) != 1 {
		return Attr{}, errf(syscall.EINVAL, "directory id %#x is not a root of the too-deep region", d)
	}
	return f.mknode(ctx, dir, name, newObject{mode: sIFDIR | mode&permBits, cred: cred, d: d})
}

// TooDeepRoot returns the k-th root of the too-deep region (k >= 1) and
// the range of its subtree; ok is false past the region's last root.
func (f *FS) TooDeepRoot(k uint64) (DRange, bool) {
	d, ok := f.layout.tooDeepRoot(k)
	if !ok {
		return DRange{}, false
	}
	lo, hi := f.layout.SubtreeRange(d)
	return DRange{Lo: lo, Hi: hi}, true
}

// DirLevel returns the depth the id of directory d encodes (0: the root,
// and the roots of the too-deep region count from 1).
func (f *FS) DirLevel(d uint64) int { return f.layout.level(d) }

// Symlink creates a symbolic link to target.
func (f *FS) Symlink(ctx context.Context, dir Handle, name, target string, cred Cred) (Attr, error) {
	if target == "" {
		return Attr{}, errf(syscall.ENOENT, "empty symlink target")
	}
	if len(target) > maxSymlinkBytes {
		return Attr{}, errf(syscall.ENAMETOOLONG, "symlink target of %d bytes (the bound is %d)", len(target), maxSymlinkBytes)
	}
	if strings.IndexByte(target, 0) >= 0 {
		return Attr{}, errf(syscall.EINVAL, "symlink target holds NUL")
	}
	return f.mknode(ctx, dir, name, newObject{mode: sIFLNK | 0o777, cred: cred, target: target})
}

func (f *FS) mknode(ctx context.Context, dir Handle, name string, obj newObject) (Attr, error) {
	if err := checkNewName(name); err != nil {
		return Attr{}, err
	}
	if want, replay := wantOf(ctx); replay && !want.Blob.IsZero() && !f.ownsGUID(want.Blob) {
		// A replayed create names the blob its first run was given: one
		// of this file system's (newGUID), never another's data.
		return Attr{}, errf(syscall.EINVAL, "replayed create of %q: blob %v is not a blob of file system %d", name, want.Blob, f.cfg.Number)
	}
	var a Attr
	err := f.update(ctx, func(w *wtx) error {
		k := f.keys
		pcur, parent, err := w.dir(k, dir)
		if err != nil {
			return err
		}
		ecur, x, err := w.entry(k, dir, name)
		if err != nil {
			return err
		}
		if x != nil {
			return errf(syscall.EEXIST, "%q in %v", name, dir)
		}
		isDir := obj.mode&sIFMT == sIFDIR
		if isDir && parent.Nlink >= maxLinks {
			return errf(syscall.EMLINK, "directory %v has %d links", dir, parent.Nlink)
		}
		var h Handle
		want, replay := wantOf(ctx)
		switch {
		case replay:
			h, err = f.allocWanted(w, dir, parent, isDir, want.Handle)
		case obj.d != 0:
			h = Handle{D: obj.d}
			if cur, _, err := w.current(k.inode(h)); err != nil {
				return err
			} else if cur.Found {
				return errf(syscall.EEXIST, "directory id %#x is taken", obj.d)
			}
		case isDir:
			h, err = f.allocDir(w, dir, parent)
		default:
			h, err = f.allocFile(w, dir, parent)
		}
		if err != nil {
			return err
		}
		now := f.opNow(ctx).UnixNano()
		n := &inode{Mode: obj.mode, Uid: obj.cred.Uid, Gid: obj.cred.Gid, Nlink: 1, Rdev: obj.rdev,
			Atime: now, Mtime: now, Ctime: now, Btime: now}
		if parent.Mode&syscall.S_ISGID != 0 {
			n.Gid = parent.Gid
			if isDir {
				n.Mode |= syscall.S_ISGID
			}
		}
		switch obj.mode & sIFMT {
		case sIFDIR:
			n.Nlink = 2
			n.Parent, n.NextChild, n.NextCookie, n.FileD, n.NextC = dir.D, 1, firstCookie, h.D, 1
			parent.Nlink++
		case sIFREG:
			n.Blob = newGUID(f.cfg.Number)
			if replay && !want.Blob.IsZero() {
				n.Blob = want.Blob // checked before the transaction
			}
		case sIFLNK:
			n.Size = uint64(len(obj.target))
			if len(obj.target) <= maxInlineSymlinkBytes {
				n.Target = obj.target
			} else {
				for i := 0; i*symlinkChunkBytes < len(obj.target); i++ {
					chunk := obj.target[i*symlinkChunkBytes : min(len(obj.target), (i+1)*symlinkChunkBytes)]
					if err := w.putFresh(k.symlinkChunk(h, uint64(i)), []byte(chunk)); err != nil {
						return err
					}
				}
			}
		}
		if err := w.putFresh(k.inode(h), n.encode()); err != nil {
			return err
		}
		if err := w.addEntry(k, dir, parent, name, ecur, h, obj.mode&sIFMT); err != nil {
			return err
		}
		parent.Entries++
		parent.Mtime, parent.Ctime = now, now
		if err := w.setInode(k, dir, pcur, parent); err != nil {
			return err
		}
		a = f.attrOf(h, n)
		return nil
	})
	return a, err
}

// allocWanted takes, for a replayed create, the handle its first run
// gave: the next id of the parent's counter then, but operations of the
// session still in flight (their answers lost with the server) may have
// taken lower ones first, so the handle is taken if it is one the parent
// could give and nothing holds it, and the counter moves past it.
func (f *FS) allocWanted(w *wtx, dir Handle, parent *inode, isDir bool, h Handle) (Handle, error) {
	diverged := func(why string) (Handle, error) {
		return Handle{}, errf(syscall.EIO, "replayed create of %v in %v: %s", h, dir, why)
	}
	if cur, _, err := w.current(f.keys.inode(h)); err != nil {
		return Handle{}, err
	} else if cur.Found {
		return diverged("the handle is taken")
	}
	if isDir {
		lv := f.layout.level(dir.D)
		v := f.layout.slot(h.D, lv+1)
		if d, ok := f.layout.childDir(dir.D, v); h.C != 0 || !ok || d != h.D {
			return diverged("not a child id of the directory")
		}
		parent.NextChild = max(parent.NextChild, v+1)
		return h, nil
	}
	if h.D != parent.FileD || h.C == 0 || h.C >= f.layout.fileLimit(h.D) {
		return diverged("not a file id of the directory")
	}
	parent.NextC = max(parent.NextC, h.C+1)
	return h, nil
}

// allocDir assigns a new directory's id under parent dir (layout.go).
func (f *FS) allocDir(w *wtx, dir Handle, parent *inode) (Handle, error) {
	if d, ok := f.layout.childDir(dir.D, parent.NextChild); ok {
		parent.NextChild++
		return Handle{D: d}, nil
	}
	// Too deep, or the parent has used every slot value: a new root of
	// the too-deep region, else the catch-all region.
	if hierarchical(dir.D) || Region(dir.D) == regionCatchAll {
		k, err := f.nextID(w, CounterTooDeep)
		if err != nil {
			return Handle{}, err
		}
		if d, ok := f.layout.tooDeepRoot(k); ok {
			return Handle{D: d}, nil
		}
	}
	k, err := f.nextID(w, CounterCatchAll)
	if err != nil {
		return Handle{}, err
	}
	d, ok := catchAllID(k)
	if !ok {
		return Handle{}, fmt.Errorf("%w: %w", errIDSpace, syscall.ENOSPC)
	}
	return Handle{D: d}, nil
}

// nextID draws the next value of a superblock counter: in the
// transaction's superblock, or from Config.Shared (a value drawn by an
// attempt that does not commit is lost, which costs nothing but an id).
func (f *FS) nextID(w *wtx, c Counter) (uint64, error) {
	if w.sb == nil {
		if f.cfg.Shared == nil {
			return 0, errors.New("fs: a store that gives its epoch needs Config.Shared")
		}
		if v, ok := w.drawn[c]; ok {
			return v, nil
		}
		v, err := f.cfg.Shared.NextID(w.ctx, c)
		if err == nil {
			w.drawn[c] = v
		}
		return v, err
	}
	p := w.sb.counter(c)
	*p++
	w.sbDirty = true
	return *p, nil
}

// dirMove is a directory moved below another directory by a rename.
type dirMove struct{ dir, moved Handle }

// needRenameLock asks update to take the rename lock and check moves
// before running the transaction again (Config.Shared).
type needRenameLock struct{ moves []dirMove }

func (e *needRenameLock) Error() string { return "fs: directory move needs the rename lock" }

// checkMoves makes directory moves between parents safe. Alone, the FS
// serializes them through the superblock (every such transaction writes
// it, so any two conflict) and checks ancestors with reads outside the
// transaction; with Shared, the ancestors are checked before the
// transaction under the file system's rename lock (update).
func (f *FS) checkMoves(w *wtx, moves []dirMove) error {
	if len(moves) == 0 {
		return nil
	}
	if w.sb != nil {
		w.sb.RenameSeq++
		w.sbDirty = true
		return f.checkBelow(w.ctx, moves)
	}
	if !slices.Equal(w.checked, moves) {
		return &needRenameLock{moves: moves}
	}
	return nil
}

// checkBelow fails with EINVAL if a move would put a directory below
// itself.
func (f *FS) checkBelow(ctx context.Context, moves []dirMove) error {
	for _, m := range moves {
		below, err := f.isBelow(ctx, m.dir, m.moved)
		if err != nil {
			return err
		}
		if below {
			return errf(syscall.EINVAL, "move of directory %v below itself", m.moved)
		}
	}
	return nil
}

// allocFile assigns a new file's handle in directory dir.
func (f *FS) allocFile(w *wtx, dir Handle, parent *inode) (Handle, error) {
	if parent.NextC < f.layout.fileLimit(parent.FileD) {
		h := Handle{D: parent.FileD, C: parent.NextC}
		parent.NextC++
		return h, nil
	}
	// The directory's file ids ran out (Ursa Minor §3.3, too wide).
	next, err := f.overflowFileD(w, dir, parent)
	if err != nil {
		return Handle{}, err
	}
	parent.FileD, parent.NextC = next, 2
	return Handle{D: next, C: 1}, nil
}

func (f *FS) overflowFileD(w *wtx, dir Handle, parent *inode) (uint64, error) {
	k := f.keys
	// Take over the next sibling's id if nobody has it yet: the parent's
	// child counter has not reached it.
	if sib, v, ok := f.layout.sibling(parent.FileD); ok && dir != RootHandle {
		lv := f.layout.level(parent.FileD)
		idParent := parent.FileD &^ (f.layout.slotMax() << f.layout.slotShift(lv))
		if idParent == parent.Parent {
			gcur, grand, err := w.dir(k, Handle{D: parent.Parent})
			if err == nil && grand.NextChild == v {
				grand.NextChild = v + 1
				if err := w.setInode(k, Handle{D: parent.Parent}, gcur, grand); err != nil {
					return 0, err
				}
				return sib, nil
			} else if err != nil && errnoOf(err) == syscall.EIO {
				return 0, err
			}
		}
	}
	n, err := f.nextID(w, CounterTooWide)
	if err != nil {
		return 0, err
	}
	if d, ok := tooWideID(n); ok {
		return d, nil
	}
	if n, err = f.nextID(w, CounterCatchAll); err != nil {
		return 0, err
	}
	if d, ok := catchAllID(n); ok {
		return d, nil
	}
	return 0, fmt.Errorf("%w: %w", errIDSpace, syscall.ENOSPC)
}

// Readlink returns a symlink's target.
func (f *FS) Readlink(ctx context.Context, h Handle) (string, error) {
	var target string
	err := f.view(ctx, func(tx MetaTxn, s uint64) error {
		n, err := readInode(tx, f.keys, h, s)
		if err != nil {
			return err
		}
		if n.Mode&sIFMT != sIFLNK {
			return errf(syscall.EINVAL, "object %v is not a symlink", h)
		}
		if uint64(len(n.Target)) == n.Size {
			target = n.Target
			return nil
		}
		var b strings.Builder
		for i := uint64(0); uint64(b.Len()) < n.Size; i++ {
			v, payload, err := readAt(tx, f.keys.symlinkChunk(h, i), s)
			if err != nil {
				return err
			}
			if !v.live() {
				return fmt.Errorf("%w: symlink %v lacks chunk %d", errCorrupt, h, i)
			}
			b.Write(payload)
		}
		target = b.String()
		return nil
	})
	return target, err
}

// Link gives object h the name newName in directory dir.
func (f *FS) Link(ctx context.Context, h Handle, dir Handle, newName string) (Attr, error) {
	if err := checkNewName(newName); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := f.update(ctx, func(w *wtx) error {
		k := f.keys
		pcur, parent, err := w.dir(k, dir)
		if err != nil {
			return err
		}
		ecur, x, err := w.entry(k, dir, newName)
		if err != nil {
			return err
		}
		if x != nil {
			return errf(syscall.EEXIST, "%q in %v", newName, dir)
		}
		tcur, n, err := w.inode(k, h)
		if err != nil {
			return err
		}
		if n.Mode&sIFMT == sIFDIR {
			return errf(syscall.EPERM, "hard link to directory %v", h)
		}
		if n.Nlink == 0 {
			return errf(syscall.ENOENT, "object %v has been removed", h)
		}
		if n.Nlink >= maxLinks {
			return errf(syscall.EMLINK, "object %v has %d links", h, n.Nlink)
		}
		now := f.opNow(ctx).UnixNano()
		n.Nlink++
		n.Ctime = now
		if err := w.setInode(k, h, tcur, n); err != nil {
			return err
		}
		if err := w.addEntry(k, dir, parent, newName, ecur, h, n.Mode&sIFMT); err != nil {
			return err
		}
		parent.Entries++
		parent.Mtime, parent.Ctime = now, now
		if err := w.setInode(k, dir, pcur, parent); err != nil {
			return err
		}
		a = f.attrOf(h, n)
		return nil
	})
	return a, err
}

// linkFate is what became of an object that lost a name.
type linkFate int

const (
	linkKept     linkFate = iota // it has other names
	linkDeleted                  // deleted in the same transaction
	linkOrphaned                 // listed as an orphan, to reclaim
)

// dropLink takes one link from object h (inode n at cur), the target of a
// removed name, and deletes it or lists it as an orphan when none is
// left.
func (f *FS) dropLink(w *wtx, h Handle, cur version, n *inode, now int64) (linkFate, error) {
	k := f.keys
	if n.Mode&sIFMT == sIFDIR {
		n.Nlink = 0
	} else {
		n.Nlink--
	}
	n.Ctime = now
	if n.Nlink > 0 {
		return linkKept, w.setInode(k, h, cur, n)
	}
	if f.disposable(h, n) {
		return linkDeleted, w.del(k.inode(h), cur)
	}
	if err := w.setInode(k, h, cur, n); err != nil {
		return linkKept, err
	}
	// The record names a session that holds the object open (the
	// remover's first): only it may still write to it, and the orphan
	// stays while its session lives. While the opens are not all known
	// here it names none (0): a session that tells of its open may write,
	// and the background reclaims it once the opens are known.
	var holder uint64
	if f.opensKnown(h) {
		if holder, _ = f.opens.holder(h, w.session); holder == 0 {
			holder = w.session
		}
	}
	rec := &orphanRecord{Mount: holder, Since: now}
	return linkOrphaned, w.tx.Put(k.orphan(h), rec.encode())
}

// afterDrop does what follows a committed dropLink.
func (f *FS) afterDrop(ctx context.Context, h Handle, fate linkFate) {
	if fate == linkOrphaned {
		f.orphaned(ctx, h)
	}
}

// disposable reports whether an object whose last link goes can be
// deleted in the same transaction: it holds nothing outside its inode and
// no session holds it open.
func (f *FS) disposable(h Handle, n *inode) bool {
	if n.Xattrs != 0 || n.TrimFrom != 0 || f.opens.isOpen(h) || !f.opensKnown(h) {
		return false
	}
	switch n.Mode & sIFMT {
	case sIFREG:
		return !n.BlobExists && n.Size == 0
	case sIFLNK:
		return uint64(len(n.Target)) == n.Size
	}
	return true
}

// Unlink removes name from directory dir; the object goes with its last
// link, or when the last open handle closes.
func (f *FS) Unlink(ctx context.Context, dir Handle, name string) error {
	return f.remove(ctx, dir, name, false)
}

// Rmdir removes the empty directory name from dir.
func (f *FS) Rmdir(ctx context.Context, dir Handle, name string) error {
	return f.remove(ctx, dir, name, true)
}

func (f *FS) remove(ctx context.Context, dir Handle, name string, wantDir bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	if name == "." {
		return errf(syscall.EINVAL, "remove %q", name)
	}
	if name == ".." {
		return errf(syscall.ENOTEMPTY, "remove %q", name)
	}
	var orphan Handle
	var fate linkFate
	err := f.update(ctx, func(w *wtx) error {
		fate = linkKept
		k := f.keys
		pcur, parent, err := w.dir(k, dir)
		if err != nil {
			return err
		}
		ecur, x, err := w.entry(k, dir, name)
		if err != nil {
			return err
		}
		if x == nil {
			return errf(syscall.ENOENT, "%q in %v", name, dir)
		}
		isDir := x.Type == sIFDIR
		switch {
		case wantDir && !isDir:
			return errf(syscall.ENOTDIR, "%q in %v", name, dir)
		case !wantDir && isDir:
			return errf(syscall.EISDIR, "%q in %v", name, dir)
		}
		tcur, n, err := w.inode(k, x.H)
		if err != nil {
			return fmt.Errorf("%w: %q in %v names missing object %v: %w", errCorrupt, name, dir, x.H, err)
		}
		if isDir && n.Entries > 0 {
			return errf(syscall.ENOTEMPTY, "directory %q has %d entries", name, n.Entries)
		}
		now := f.opNow(ctx).UnixNano()
		if err := w.removeEntry(k, dir, name, ecur, x); err != nil {
			return err
		}
		parent.Entries--
		if isDir {
			parent.Nlink--
		}
		parent.Mtime, parent.Ctime = now, now
		if err := w.setInode(k, dir, pcur, parent); err != nil {
			return err
		}
		fate, err = f.dropLink(w, x.H, tcur, n, now)
		orphan = x.H
		return err
	})
	if err != nil {
		return err
	}
	f.afterDrop(ctx, orphan, fate)
	return nil
}

// Rename moves srcName in srcDir to dstName in dstDir, replacing what
// dstName named (unless flags has RenameNoReplace). It refuses to move a
// directory into itself or below itself (EINVAL).
func (f *FS) Rename(ctx context.Context, srcDir Handle, srcName string, dstDir Handle, dstName string, flags uint32) error {
	if flags&^(RenameNoReplace|RenameExchange) != 0 || flags == RenameNoReplace|RenameExchange {
		return errf(syscall.EINVAL, "rename flags %#x", flags)
	}
	if err := checkName(srcName); err != nil {
		return err
	}
	if err := checkName(dstName); err != nil {
		return err
	}
	if srcName == "." || srcName == ".." || dstName == "." || dstName == ".." {
		return errf(syscall.EINVAL, "rename of %q to %q", srcName, dstName)
	}
	if flags&RenameExchange != 0 {
		return f.exchange(ctx, srcDir, srcName, dstDir, dstName)
	}
	var orphan Handle
	var fate linkFate
	err := f.update(ctx, func(w *wtx) error {
		fate = linkKept
		k := f.keys
		scur, sp, err := w.dir(k, srcDir)
		if err != nil {
			return err
		}
		dcur, dp := scur, sp
		if dstDir != srcDir {
			if dcur, dp, err = w.dir(k, dstDir); err != nil {
				return err
			}
		}
		secur, se, err := w.entry(k, srcDir, srcName)
		if err != nil {
			return err
		}
		if se == nil {
			return errf(syscall.ENOENT, "%q in %v", srcName, srcDir)
		}
		decur, de, err := w.entry(k, dstDir, dstName)
		if err != nil {
			return err
		}
		if de != nil && flags&RenameNoReplace != 0 {
			return errf(syscall.EEXIST, "%q in %v", dstName, dstDir)
		}
		if de != nil && de.H == se.H {
			return nil // two names of one object: nothing to do (POSIX)
		}
		if srcDir == dstDir && srcName == dstName {
			return nil
		}
		moving := se.Type == sIFDIR
		if moving && srcDir != dstDir {
			// The destination must not be below the moved directory.
			if err := f.checkMoves(w, []dirMove{{dstDir, se.H}}); err != nil {
				return err
			}
		}
		if de != nil {
			switch {
			case moving && de.Type != sIFDIR:
				return errf(syscall.ENOTDIR, "%q in %v is not a directory", dstName, dstDir)
			case !moving && de.Type == sIFDIR:
				return errf(syscall.EISDIR, "%q in %v is a directory", dstName, dstDir)
			}
		}
		mcur, moved, err := w.inode(k, se.H)
		if err != nil {
			return fmt.Errorf("%w: %q in %v names missing object %v: %w", errCorrupt, srcName, srcDir, se.H, err)
		}
		var tcur version
		var target *inode
		if de != nil {
			if tcur, target, err = w.inode(k, de.H); err != nil {
				return fmt.Errorf("%w: %q in %v names missing object %v: %w", errCorrupt, dstName, dstDir, de.H, err)
			}
			if de.Type == sIFDIR && target.Entries > 0 {
				return errf(syscall.ENOTEMPTY, "directory %q has %d entries", dstName, target.Entries)
			}
		}
		now := f.opNow(ctx).UnixNano()
		// Names: the source goes; the destination points at the moved
		// object, with the replaced entry's cookie or a new one.
		if err := w.removeEntry(k, srcDir, srcName, secur, se); err != nil {
			return err
		}
		if de != nil {
			err = w.replaceEntry(k, dstDir, dstName, decur, de, se.H, se.Type)
		} else {
			err = w.addEntry(k, dstDir, dp, dstName, decur, se.H, se.Type)
		}
		if err != nil {
			return err
		}
		// Link counts: a directory's ".." moves with it.
		sp.Entries--
		if de == nil {
			dp.Entries++
		}
		if moving && srcDir != dstDir {
			sp.Nlink--
			dp.Nlink++
			moved.Parent = dstDir.D
		}
		if de != nil && de.Type == sIFDIR {
			dp.Nlink--
		}
		moved.Ctime = now
		if err := w.setInode(k, se.H, mcur, moved); err != nil {
			return err
		}
		sp.Mtime, sp.Ctime = now, now
		if srcDir != dstDir {
			dp.Mtime, dp.Ctime = now, now
			if err := w.setInode(k, dstDir, dcur, dp); err != nil {
				return err
			}
		}
		if err := w.setInode(k, srcDir, scur, sp); err != nil {
			return err
		}
		if de != nil {
			fate, err = f.dropLink(w, de.H, tcur, target, now)
			orphan = de.H
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	f.afterDrop(ctx, orphan, fate)
	return nil
}

// exchange swaps two names (renameat2 RENAME_EXCHANGE).
func (f *FS) exchange(ctx context.Context, srcDir Handle, srcName string, dstDir Handle, dstName string) error {
	return f.update(ctx, func(w *wtx) error {
		k := f.keys
		scur, sp, err := w.dir(k, srcDir)
		if err != nil {
			return err
		}
		dcur, dp := scur, sp
		if dstDir != srcDir {
			if dcur, dp, err = w.dir(k, dstDir); err != nil {
				return err
			}
		}
		secur, se, err := w.entry(k, srcDir, srcName)
		if err != nil {
			return err
		}
		decur, de, err := w.entry(k, dstDir, dstName)
		if err != nil {
			return err
		}
		if se == nil || de == nil {
			return errf(syscall.ENOENT, "exchange of %q and %q: both must exist", srcName, dstName)
		}
		if se.H == de.H || (srcDir == dstDir && srcName == dstName) {
			return nil
		}
		now := f.opNow(ctx).UnixNano()
		if srcDir != dstDir {
			var moves []dirMove
			if se.Type == sIFDIR {
				moves = append(moves, dirMove{dstDir, se.H})
			}
			if de.Type == sIFDIR {
				moves = append(moves, dirMove{srcDir, de.H})
			}
			if err := f.checkMoves(w, moves); err != nil {
				return err
			}
		}
		// Each name keeps its cookie and points at the other object.
		if err := w.replaceEntry(k, srcDir, srcName, secur, se, de.H, de.Type); err != nil {
			return err
		}
		if err := w.replaceEntry(k, dstDir, dstName, decur, de, se.H, se.Type); err != nil {
			return err
		}
		if srcDir != dstDir {
			for _, c := range []struct {
				e      *dirent
				parent uint64
			}{{se, dstDir.D}, {de, srcDir.D}} {
				if c.e.Type != sIFDIR {
					continue
				}
				cur, n, err := w.inode(k, c.e.H)
				if err != nil {
					return err
				}
				n.Parent, n.Ctime = c.parent, now
				if err := w.setInode(k, c.e.H, cur, n); err != nil {
					return err
				}
			}
			if se.Type == sIFDIR && de.Type != sIFDIR {
				sp.Nlink--
				dp.Nlink++
			} else if de.Type == sIFDIR && se.Type != sIFDIR {
				dp.Nlink--
				sp.Nlink++
			}
			dp.Mtime, dp.Ctime = now, now
			if err := w.setInode(k, dstDir, dcur, dp); err != nil {
				return err
			}
		}
		sp.Mtime, sp.Ctime = now, now
		return w.setInode(k, srcDir, scur, sp)
	})
}

// isBelow reports whether directory d is dir or below it, walking d's
// parents with reads of their own (checkMoves says why the answer holds
// until the rename commits).
func (f *FS) isBelow(ctx context.Context, d, dir Handle) (bool, error) {
	cur := d
	for range maxDepth {
		if cur == dir {
			return true, nil
		}
		if cur == RootHandle {
			return false, nil
		}
		var parent uint64
		err := f.meta.View(ctx, func(tx MetaTxn) error {
			n, err := readInode(tx, f.keys, cur, headSnapshot)
			if err != nil {
				return err
			}
			parent = n.Parent
			return nil
		})
		if err != nil {
			return false, err
		}
		cur = Handle{D: parent}
	}
	return false, errf(syscall.ELOOP, "directory %v is more than %d levels deep", d, maxDepth)
}

// ReadDir returns up to max entries of directory dir (without "." and
// "..") whose cookies come after the cookie after (0: from the start).
func (f *FS) ReadDir(ctx context.Context, dir Handle, after uint64, max int) ([]DirEntry, error) {
	if max <= 0 || max > maxReadDirEntries {
		max = maxReadDirEntries
	}
	if _, err := f.dirAttr(ctx, dir); err != nil {
		return nil, err
	}
	k := f.keys
	from := k.cookie(dir, after+1)
	_, to := tuple.PrefixRange(k.cookiePrefix(dir))
	var out []DirEntry
	done := fmt.Errorf("done")
	err := f.scanAt(ctx, from, to, f.readAt, func(prefix []byte, v version, payload []byte) error {
		if !v.live() {
			return nil
		}
		ce, err := decodeCookieEntry(payload)
		if err != nil {
			return err
		}
		t, err := tuple.Unpack(prefix)
		if err != nil || len(t) < 6 {
			return fmt.Errorf("%w: cookie key %x", errCorrupt, prefix)
		}
		c, ok := t[len(t)-1].(int64)
		if !ok {
			return fmt.Errorf("%w: cookie key %x", errCorrupt, prefix)
		}
		out = append(out, DirEntry{Name: ce.Name, Handle: ce.H, Type: ce.Type, Cookie: uint64(c)})
		if len(out) >= max {
			return done
		}
		return nil
	})
	if err != nil && err != done {
		return nil, err
	}
	return out, nil
}

// DirEntryPlus is a directory entry with its object's attributes
// (READDIRPLUS). OK is false when the attributes could not be read here
// (the object lives in another table): ask GetAttr.
type DirEntryPlus struct {
	DirEntry
	Attr Attr
	OK   bool
}

// ReadDirPlus is ReadDir with each entry's attributes.
func (f *FS) ReadDirPlus(ctx context.Context, dir Handle, after uint64, max int) ([]DirEntryPlus, error) {
	es, err := f.ReadDir(ctx, dir, after, max)
	if err != nil {
		return nil, err
	}
	out := make([]DirEntryPlus, len(es))
	for i, e := range es {
		out[i].DirEntry = e
		a, err := f.GetAttr(ctx, e.Handle)
		switch {
		case err == nil:
			out[i].Attr, out[i].OK = a, true
		case errnoOf(err) == syscall.ENOENT:
			// Removed since the listing: the entry shows without
			// attributes, as a concurrent change may.
		case errors.Is(err, ErrForeign):
		default:
			return nil, err
		}
	}
	return out, nil
}

func (f *FS) dirAttr(ctx context.Context, dir Handle) (Attr, error) {
	a, err := f.GetAttr(ctx, dir)
	if err != nil {
		return a, err
	}
	if !a.IsDir() {
		return a, errf(syscall.ENOTDIR, "object %v", dir)
	}
	return a, nil
}

// StatFS is what statfs(2) shows.
type StatFS struct {
	Blocks, Bfree, Bavail uint64
	Files, Ffree          uint64
	Bsize, Frsize         uint32
	NameLen               uint32
}

// statFSBlockBytes is the block size statfs reports: the unit of Blocks,
// Bfree and Bavail.
const statFSBlockBytes = 4096

// nominalStatFSCount is what statfs reports for a count the file system
// does not know: block counts when nobody supplied the cluster's capacity
// (WithCapacity), and always the inode counts: handles never run out
// (layout.go), and no exact count of a file system's objects is kept. One
// counter in every create and remove would make them all conflict; the
// metadata servers' per-unit counts (internal/meta, TableStats) cover only
// the inodes they hold in memory, a lower bound that falls when a table
// moves (a test saw 7 of 22), so df -i would mislead; an exact count is a
// scan of the file system's keys, too dear for every statfs.
const nominalStatFSCount = 1 << 40

// StatFS returns the file system's statistics. The block counts are
// nominal (large free counts that never run out) until the caller sets
// the cluster's capacity with WithCapacity: capacity is shared by every
// file system of the cluster, and this engine does not see it. Files and
// Ffree are always nominal (nominalStatFSCount).
func (f *FS) StatFS(ctx context.Context) (StatFS, error) {
	if _, err := f.readSuperblock(ctx); err != nil {
		return StatFS{}, err
	}
	const nominal = nominalStatFSCount
	return StatFS{Blocks: nominal, Bfree: nominal, Bavail: nominal, Files: nominal, Ffree: nominal,
		Bsize: statFSBlockBytes, Frsize: statFSBlockBytes, NameLen: MaxNameBytes}, nil
}

// Capacity is the space file data can take, in bytes of file data (raw
// disk bytes already divided by the number of replicas each byte is
// kept in): TotalBytes in all, FreeBytes of it unused.
type Capacity struct {
	TotalBytes, FreeBytes uint64
}

// WithCapacity returns s with its block counts taken from c, rounded down
// to whole blocks. Free space is all available to unprivileged users
// (Bavail = Bfree): the cluster reserves none for root.
func (s StatFS) WithCapacity(c Capacity) StatFS {
	bs := uint64(s.Frsize)
	if bs == 0 {
		bs = statFSBlockBytes
	}
	s.Blocks = c.TotalBytes / bs
	s.Bfree = min(c.FreeBytes, c.TotalBytes) / bs
	s.Bavail = s.Bfree
	return s
}
