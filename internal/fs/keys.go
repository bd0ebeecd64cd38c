package fs

import (
	"bytes"
	"fmt"
	"math"

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
	spaceTractFree = 5 // F, 5, guid, tract: tracts to empty once committed away

	superSnapshots = 2

	kindInode   = 2
	kindName    = 3
	kindCookie  = 4
	kindBlock   = 5
	kindXattr   = 6
	kindSymlink = 7
	kindInline  = 8
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

// inlineChunk is chunk i (from 1: chunk 0 is in the block pair) of a
// small file's inline data; its versions are its block pair's (inline.go).
func (k keys) inlineChunk(h Handle, i uint64) []byte {
	return tuple.AppendUint(tuple.AppendUint(k.object(h), kindInline), i)
}

func (k keys) symlinkChunk(h Handle, i uint64) []byte {
	return tuple.AppendUint(tuple.AppendUint(k.object(h), kindSymlink), i)
}

// KeyDir returns the directory id D a key is filed under when it is an
// object's key (F, 1, D, ...) or an orphan's (F, 2, D, ...): the keys a
// metadata server's tables own (DESIGN.md §2.6). ok is false for the file
// system's shared records (superblock, snapshots, blob queue, sessions).
func KeyDir(key []byte) (f, d uint64, ok bool, err error) {
	corrupt := func(why string) error { return fmt.Errorf("%w: key %x: %s", errCorrupt, key, why) }
	next := func(b []byte) (uint64, []byte, error) {
		x, rest, err := tuple.Next(b)
		if err != nil {
			return 0, nil, corrupt(err.Error())
		}
		v, isUint := asUint(x)
		if !isUint {
			return 0, nil, corrupt("a leading element is not a non-negative integer")
		}
		return v, rest, nil
	}
	f, rest, err := next(key)
	if err != nil || len(rest) == 0 {
		return f, 0, false, err
	}
	space, rest, err := next(rest)
	if err != nil || (space != spaceObjects && space != spaceOrphans) || len(rest) == 0 {
		return f, 0, false, err
	}
	d, _, err = next(rest)
	return f, d, err == nil, err
}

// DirRanges returns the two key ranges filed under directory id d in file
// system f (its objects' keys and its orphans'): what a metadata server
// loads and forgets as one unit.
func DirRanges(f, d uint64) [2][2][]byte {
	k := keys{f: f}
	r := DRange{Lo: d, Hi: d + 1}
	if d == math.MaxUint64 {
		r.Hi = 0
	}
	var out [2][2][]byte
	out[0][0], out[0][1] = k.keysIn(spaceObjects, r)
	out[1][0], out[1][1] = k.keysIn(spaceOrphans, r)
	return out
}

// TableRecordKey returns the key (F, 1, lo, -1, elems...) of a record of
// the table that starts at directory id lo (its header, its reply records):
// a metadata server's, which the file system's own scans skip. Such keys
// sort before every other key filed under lo.
func TableRecordKey(f, lo uint64, elems ...uint64) []byte {
	b := tuple.AppendInt(tuple.AppendUint(tuple.AppendUint(tuple.AppendUint(nil, f), spaceObjects), lo), -1)
	for _, e := range elems {
		b = tuple.AppendUint(b, e)
	}
	return b
}

// InodePrefix reports whether key is a version of an inode key
// (F, 1, D, C, 2, -S), and returns the key without its version.
func InodePrefix(key []byte) ([]byte, bool) {
	prefix, _, err := splitVersion(key)
	if err != nil {
		return nil, false
	}
	rest := prefix
	var x any
	for i := range 5 {
		if x, rest, err = tuple.Next(rest); err != nil {
			return nil, false
		}
		if i == 4 {
			k, ok := asUint(x)
			return prefix, ok && k == kindInode && len(rest) == 0
		}
	}
	return nil, false
}

// LiveVersion reports whether a versioned value (the newest version of its
// key) is live rather than a tombstone.
func LiveVersion(value []byte) (bool, error) {
	flags, _, err := decodeVersioned(value)
	return err == nil && flags&flagTombstone == 0, err
}

// isTableRecord reports whether a key under (F, 1) is a table record
// (TableRecordKey): its fourth element is negative.
func isTableRecord(key []byte) bool {
	rest := key
	for range 3 {
		var err error
		if _, rest, err = tuple.Next(rest); err != nil {
			return false
		}
	}
	x, _, err := tuple.Next(rest)
	if err != nil {
		return false
	}
	v, ok := x.(int64)
	return ok && v < 0
}

// DRange is a range [Lo, Hi) of directory ids D; Hi 0 means up to 2^64
// (a table's range, DESIGN.md §2.6).
type DRange struct{ Lo, Hi uint64 }

// AllD is every directory id.
var AllD = DRange{}

// Contains reports whether d is in r.
func (r DRange) Contains(d uint64) bool { return d >= r.Lo && (r.Hi == 0 || d < r.Hi) }

// keysIn returns [from, to) of the keys under space (objects or orphans)
// whose D is in r.
func (k keys) keysIn(space uint64, r DRange) (from, to []byte) {
	p := tuple.AppendUint(tuple.AppendUint(nil, k.f), space)
	from = tuple.AppendUint(bytes.Clone(p), r.Lo)
	if r.Hi == 0 {
		return from, tuple.PrefixEnd(p)
	}
	return from, tuple.AppendUint(p, r.Hi)
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

func (k keys) tractFreePrefix() []byte {
	return tuple.AppendUint(tuple.AppendUint(nil, k.f), spaceTractFree)
}

// tractFree is the key of the queue record that lists tracts of blob g
// to empty, named by the first of them (a tract is freed once: the key is
// the transaction's alone).
func (k keys) tractFree(g GUID, first uint64) []byte {
	return tuple.AppendUint(tuple.AppendBytes(k.tractFreePrefix(), g[:]), first)
}

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
