package fs

import (
	"bytes"
	"fmt"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Key kinds: the small literal numbers of FSS Figure 5, which force the
// sort order of a file system's keys (see doc.go for the whole schema).
const (
	spaceSuper     = 0 // F, 0: superblock; F, 0, 2, n: snapshot records
	spaceObjects   = 1 // F, 1, D, C, kind, ...: everything of one object
	spaceOrphans   = 2 // F, 2, D, C: objects with no name left, to reclaim
	spaceBlobQueue = 3 // F, 3, guid: blobs to delete from the data store
	spaceSessions  = 4 // F, 4, mount: mounts that may hold orphans open

	superSnapshots = 2

	kindInode   = 2
	kindName    = 3
	kindCookie  = 4
	kindBlock   = 5
	kindXattr   = 6
	kindSymlink = 7
)

// Handle names an object of a file system (FSS §4): D is the directory it
// was created in (Ursa Minor's child-closest id), C the object within it
// (0 for the directory itself). A file keeps its handle when renamed.
// The snapshot a handle is read at belongs to the FS it is used with.
type Handle struct {
	D, C uint64
}

func (h Handle) String() string { return fmt.Sprintf("%x.%x", h.D, h.C) }

// IsDir reports whether the handle names a directory (C = 0).
func (h Handle) IsDir() bool { return h.C == 0 }

type keys struct {
	f uint64
}

func (k keys) superblock() []byte { return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceSuper) }

// fsRange is every key of the file system.
func (k keys) fsRange() (from, to []byte) {
	p := tuple.AppendUint(nil, k.f)
	return p, tuple.PrefixEnd(p)
}

func (k keys) snapshotPrefix() []byte {
	return tuple.AppendUint(k.superblock(), superSnapshots)
}

func (k keys) snapshot(n uint64) []byte { return tuple.AppendUint(k.snapshotPrefix(), n) }

func (k keys) objects() []byte { return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceObjects) }

// object is the prefix of every key of handle h (its inode, and for a
// directory its entries; for a file its blocks).
func (k keys) object(h Handle) []byte {
	return tuple.AppendUint(tuple.AppendUint(k.objects(), h.D), h.C)
}

// directory is the prefix of everything filed under directory id d:
// the directory (C = 0) and the files created in it.
func (k keys) inode(h Handle) []byte { return tuple.AppendUint(k.object(h), kindInode) }

func (k keys) namePrefix(dir Handle) []byte { return tuple.AppendUint(k.object(dir), kindName) }

func (k keys) name(dir Handle, name string) []byte {
	return tuple.AppendBytes(k.namePrefix(dir), []byte(name))
}

func (k keys) cookiePrefix(dir Handle) []byte { return tuple.AppendUint(k.object(dir), kindCookie) }

func (k keys) cookie(dir Handle, c uint64) []byte { return tuple.AppendUint(k.cookiePrefix(dir), c) }

func (k keys) blockPrefix(h Handle) []byte { return tuple.AppendUint(k.object(h), kindBlock) }

func (k keys) block(h Handle, off uint64) []byte { return tuple.AppendUint(k.blockPrefix(h), off) }

func (k keys) xattrPrefix(h Handle) []byte { return tuple.AppendUint(k.object(h), kindXattr) }

func (k keys) xattr(h Handle, name string) []byte {
	return tuple.AppendBytes(k.xattrPrefix(h), []byte(name))
}

func (k keys) symlinkChunk(h Handle, i uint64) []byte {
	return tuple.AppendUint(tuple.AppendUint(k.object(h), kindSymlink), i)
}

func (k keys) orphanPrefix() []byte {
	return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceOrphans)
}

func (k keys) orphan(h Handle) []byte {
	return tuple.AppendUint(tuple.AppendUint(k.orphanPrefix(), h.D), h.C)
}

func (k keys) blobQueuePrefix() []byte {
	return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceBlobQueue)
}

func (k keys) blobQueue(g GUID) []byte { return tuple.AppendBytes(k.blobQueuePrefix(), g[:]) }

func (k keys) sessionPrefix() []byte {
	return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceSessions)
}

func (k keys) session(id uint64) []byte { return tuple.AppendUint(k.sessionPrefix(), id) }

// Versioned keys. A versioned pair's key is its prefix followed by -S
// (FSS §4: a pair is valid from snapshot S until the next newer pair of
// the same prefix). The negation sorts a prefix's versions newest first,
// so the pair a read at snapshot S sees is the first one at or after
// (prefix, -S), whatever the number of older versions.

func versioned(prefix []byte, s uint64) []byte {
	return tuple.AppendInt(bytes.Clone(prefix), -int64(s))
}

// splitVersion splits a versioned key into its prefix and snapshot.
func splitVersion(k []byte) (prefix []byte, s uint64, err error) {
	t, err := tuple.Unpack(k)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: key %x: %w", errCorrupt, k, err)
	}
	if len(t) == 0 {
		return nil, 0, fmt.Errorf("%w: empty key", errCorrupt)
	}
	v, ok := t[len(t)-1].(int64)
	if !ok || v >= 0 {
		return nil, 0, fmt.Errorf("%w: key %x has no version", errCorrupt, k)
	}
	n := len(tuple.AppendInt(nil, v))
	return k[:len(k)-n], uint64(-v), nil
}

// endOf is the end of the range of keys starting with p.
func endOf(p []byte) []byte { return tuple.PrefixEnd(p) }
