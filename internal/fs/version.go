package fs

import (
	"bytes"
	"context"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// wtx is a write transaction at epoch W with the snapshot set that was
// current when the superblock was read (doc.go, Snapshots). Every
// versioned read-modify-write goes through it, so the copy-on-write rules
// are in one place.
type wtx struct {
	tx    MetaTxn
	ctx   context.Context
	epoch uint64
	snaps *snapSet
	// sb is the superblock the transaction read; nil when the store gives
	// the epoch itself (EpochTxn).
	sb *superblock
	// sbDirty: the superblock was changed and must be written back.
	sbDirty bool
	// session is the calling session (WithSession).
	session uint64
	// checked are the directory moves whose ancestor checks were done
	// under the rename lock before this attempt (Config.Shared).
	checked []dirMove
	// drawn are ids drawn from Config.Shared by earlier attempts of the
	// same update, which did not commit: the next attempt uses them
	// again, so an attempt that must run again (a store that loads what
	// it touched first) finds the same keys.
	drawn map[Counter]uint64
}

// current reads the newest version of prefix. It reads by a scan, which
// the store charges per leaf page: reading keys that share a page with
// keys the transaction already read (a directory's inode, names and
// cookies; a file's inode and blocks) costs nothing more. Only written
// keys are charged one each.
func (w *wtx) current(prefix []byte) (version, []byte, error) {
	return readAt(w.tx, prefix, w.epoch)
}

func parseVersion(s uint64, v []byte) (version, []byte, error) {
	flags, payload, err := decodeVersioned(v)
	if err != nil {
		return version{}, nil, err
	}
	return version{Found: true, S: s, Tombstone: flags&flagTombstone != 0, HasOlder: flags&flagHasOlder != 0}, payload, nil
}

// shared reports whether the version is seen by a snapshot, so it must be
// kept as it is and a change must be a new version at W.
func (w *wtx) shared(v version) bool {
	return v.Found && v.S < w.epoch && w.snaps.anyIn(v.S, w.epoch-1)
}

// put writes payload as the newest version of prefix, whose current
// version is cur.
func (w *wtx) put(prefix []byte, cur version, payload []byte) error {
	switch {
	case !cur.Found:
		return w.tx.Put(versioned(prefix, w.epoch), encodeVersioned(0, payload))
	case cur.S == w.epoch || !w.shared(cur):
		// Nobody else sees cur: replace it where it is. A tombstone always
		// has older versions below it.
		var flags byte
		if cur.HasOlder || cur.Tombstone {
			flags = flagHasOlder
		}
		return w.tx.Put(versioned(prefix, cur.S), encodeVersioned(flags, payload))
	default:
		return w.tx.Put(versioned(prefix, w.epoch), encodeVersioned(flagHasOlder, payload))
	}
}

// putVersion returns the snapshot number put writes at given cur.
func (w *wtx) putVersion(cur version) uint64 {
	if cur.Found && (cur.S == w.epoch || !w.shared(cur)) {
		return cur.S
	}
	return w.epoch
}

// del removes prefix from W on, whose current version is cur (live).
func (w *wtx) del(prefix []byte, cur version) error {
	switch {
	case !cur.Found || cur.Tombstone:
		return nil
	case cur.S == w.epoch || !w.shared(cur):
		if cur.HasOlder {
			return w.tx.Put(versioned(prefix, cur.S), encodeVersioned(flagTombstone|flagHasOlder, nil))
		}
		return w.tx.Delete(versioned(prefix, cur.S))
	default:
		return w.tx.Put(versioned(prefix, w.epoch), encodeVersioned(flagTombstone|flagHasOlder, nil))
	}
}

// putFresh writes a key that has never existed (a new cookie, a new
// object's inode).
func (w *wtx) putFresh(prefix []byte, payload []byte) error {
	return w.tx.Put(versioned(prefix, w.epoch), encodeVersioned(0, payload))
}

// readAt reads the version of prefix a reader at snapshot s sees, in a
// transaction.
func readAt(tx MetaTxn, prefix []byte, s uint64) (version, []byte, error) {
	kvs, err := tx.Scan(versioned(prefix, s), tuple.PrefixEnd(prefix), 1)
	if err != nil {
		return version{}, nil, err
	}
	if len(kvs) == 0 {
		return version{}, nil, nil
	}
	_, vs, err := splitVersion(kvs[0].Key)
	if err != nil {
		return version{}, nil, err
	}
	return parseVersion(vs, kvs[0].Value)
}

// scanAt calls fn, in key order, with the version of each prefix in
// [from, to) that a reader at snapshot s sees (tombstones included): what
// readAt gives for every prefix of a range, by the store's Scan (not
// atomic).
func (f *FS) scanAt(ctx context.Context, from, to []byte, s uint64, fn func(prefix []byte, v version, payload []byte) error) error {
	var last []byte
	return f.meta.Scan(ctx, from, to, func(key, value []byte) error {
		prefix, vs, err := splitVersion(key)
		if err != nil {
			return err
		}
		if vs > s || (last != nil && bytes.Equal(prefix, last)) {
			return nil // newer than the reader, or a prefix already decided
		}
		last = append(last[:0], prefix...)
		v, payload, err := parseVersion(vs, value)
		if err != nil {
			return err
		}
		return fn(prefix, v, payload)
	})
}

// snapSet is the set of snapshot numbers with a record in the metadata
// (live or being deleted), sorted.
type snapSet struct {
	nums []uint64
}

// anyIn reports whether a snapshot numbered in [lo, hi] exists.
func (s *snapSet) anyIn(lo, hi uint64) bool {
	if s == nil || lo > hi {
		return false
	}
	// First number >= lo.
	i, j := 0, len(s.nums)
	for i < j {
		m := (i + j) / 2
		if s.nums[m] < lo {
			i = m + 1
		} else {
			j = m
		}
	}
	return i < len(s.nums) && s.nums[i] <= hi
}
