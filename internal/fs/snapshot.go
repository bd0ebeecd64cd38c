package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Snapshots (doc.go, Snapshots; FSS §4; FlexGroup §4).

// SnapshotInfo describes a snapshot recorded in the metadata.
type SnapshotInfo struct {
	Number   uint64
	Name     string
	Created  int64 // nanoseconds since the epoch
	Deleting bool
}

// CreateSnapshot makes snapshot n (numbered by the cluster directory) of
// the file system: one transaction that raises the superblock's epoch past
// n and records the snapshot. Every write transaction reads the
// superblock, so the ones in flight either committed before (and are in
// the snapshot) or fail and run again at the new epoch (FlexGroup §4's
// fence, bump and unfence, done by MPSC conflicts). It is idempotent: a
// snapshot recorded already is left as it is.
func (f *FS) CreateSnapshot(ctx context.Context, n uint64, name string) error {
	if f.readOnly {
		return syscall.EROFS
	}
	if n == 0 || n >= headSnapshot {
		return errf(syscall.EINVAL, "snapshot number %d", n)
	}
	if name == "" || len(name) > maxSnapshotNameBytes {
		return errf(syscall.EINVAL, "snapshot name of %d bytes (1 to %d)", len(name), maxSnapshotNameBytes)
	}
	k := f.keys
	err := f.meta.Update(ctx, func(tx MetaTxn) error {
		sb, err := getSuperblock(tx, k)
		if err != nil {
			return err
		}
		_, ok, err := tx.Get(k.snapshot(n))
		if err != nil || ok {
			return err
		}
		// If a newer snapshot fenced already, n sees the instant of the
		// first fence that passed it (doc.go).
		sb.Epoch = max(sb.Epoch, n+1)
		sb.Gen++
		rec := &snapshotRecord{Name: name, Created: f.now().UnixNano()}
		if err := tx.Put(k.snapshot(n), rec.encode()); err != nil {
			return err
		}
		return tx.Put(k.superblock(), sb.encode())
	})
	if err != nil {
		return err
	}
	_, err = f.refreshSnapshots(ctx)
	return err
}

// ListSnapshots returns the snapshots recorded in the metadata.
func (f *FS) ListSnapshots(ctx context.Context) ([]SnapshotInfo, error) {
	var out []SnapshotInfo
	from, to := tuple.PrefixRange(f.keys.snapshotPrefix())
	err := f.meta.Scan(ctx, from, to, func(k, v []byte) error {
		t, err := tuple.Unpack(k)
		if err != nil || len(t) != 4 {
			return fmt.Errorf("%w: snapshot key %x", errCorrupt, k)
		}
		n, _ := asUint(t[3])
		rec, err := decodeSnapshotRecord(v)
		if err != nil {
			return err
		}
		out = append(out, SnapshotInfo{Number: n, Name: rec.Name, Created: rec.Created, Deleting: rec.Deleting})
		return nil
	})
	return out, err
}

// SweepStats counts what a sweep reclaimed.
type SweepStats struct {
	Keys       int // versioned keys looked at
	Versions   int // versions deleted
	Tracts     int // tracts freed
	Blobs      int // blobs deleted
	Rewritten  int // versions whose flags were corrected
	Candidates int // keys with versions to remove
}

// DeleteSnapshot deletes snapshot n: it marks the record deleting (from
// then on writers stop copying for it: refreshSnapshots), sweeps
// away every version and tract no remaining snapshot needs, and removes
// the record. Running it again after a crash finishes the job. Metadata
// servers take the three steps apart: MarkSnapshotDeleting and
// RemoveSnapshotRecord on the superblock, SweepRange by each table's owner.
func (f *FS) DeleteSnapshot(ctx context.Context, n uint64) (SweepStats, error) {
	if err := f.MarkSnapshotDeleting(ctx, n); err != nil {
		return SweepStats{}, err
	}
	stats, err := f.Sweep(ctx)
	if err != nil {
		return stats, err
	}
	return stats, f.RemoveSnapshotRecord(ctx, n)
}

// MarkSnapshotDeleting marks snapshot n's record deleting and refreshes
// the snapshot set (idempotent; nothing to do for a snapshot with no
// record).
func (f *FS) MarkSnapshotDeleting(ctx context.Context, n uint64) error {
	if f.readOnly {
		return syscall.EROFS
	}
	k := f.keys
	err := f.meta.Update(ctx, func(tx MetaTxn) error {
		sb, err := getSuperblock(tx, k)
		if err != nil {
			return err
		}
		v, ok, err := tx.Get(k.snapshot(n))
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		rec, err := decodeSnapshotRecord(v)
		if err != nil || rec.Deleting {
			return err
		}
		rec.Deleting = true
		sb.Gen++
		if err := tx.Put(k.snapshot(n), rec.encode()); err != nil {
			return err
		}
		return tx.Put(k.superblock(), sb.encode())
	})
	if err != nil {
		return err
	}
	_, err = f.refreshSnapshots(ctx)
	return err
}

// RemoveSnapshotRecord removes snapshot n's record, once swept.
func (f *FS) RemoveSnapshotRecord(ctx context.Context, n uint64) error {
	if f.readOnly {
		return syscall.EROFS
	}
	k := f.keys
	err := f.meta.Update(ctx, func(tx MetaTxn) error {
		sb, err := getSuperblock(tx, k)
		if err != nil {
			return err
		}
		_, ok, err := tx.Get(k.snapshot(n))
		if err != nil || !ok {
			return err
		}
		sb.Gen++
		if err := tx.Delete(k.snapshot(n)); err != nil {
			return err
		}
		return tx.Put(k.superblock(), sb.encode())
	})
	if err != nil {
		return err
	}
	_, err = f.refreshSnapshots(ctx)
	return err
}

// liveSnapshots returns the numbers of the snapshots not being deleted.
func (f *FS) liveSnapshots(ctx context.Context) (*snapSet, uint64, error) {
	infos, err := f.ListSnapshots(ctx)
	if err != nil {
		return nil, 0, err
	}
	set := &snapSet{}
	for _, in := range infos {
		if !in.Deleting {
			set.nums = append(set.nums, in.Number)
		}
	}
	sb, err := f.readSuperblock(ctx)
	if err != nil {
		return nil, 0, err
	}
	return set, sb.Epoch, nil
}

// keyVersion is one version of a versioned key as a scan saw it.
type keyVersion struct {
	key, value []byte
	v          version
}

// neededVersions decides which versions of one key (newest first) a
// reader needs, given the live snapshots: the newest unless it is a
// tombstone with nothing kept below it, and each older one whose range of
// snapshots (up to the next newer version) holds a live snapshot.
func neededVersions(vs []keyVersion, live *snapSet) []bool {
	keep := make([]bool, len(vs))
	for i := range vs {
		if i == 0 {
			keep[i] = true
			continue
		}
		keep[i] = live.anyIn(vs[i].v.S, vs[i-1].v.S-1)
	}
	// A tombstone with no kept version below it says nothing.
	for i := len(vs) - 1; i >= 0; i-- {
		if !keep[i] {
			continue
		}
		if !vs[i].v.Tombstone {
			break
		}
		below := false
		for j := i + 1; j < len(vs); j++ {
			below = below || keep[j]
		}
		if !below {
			keep[i] = false
		}
	}
	return keep
}

// Sweep removes, across the whole file system, every version of a pair
// that neither the live file system nor a live snapshot reads, frees the
// tracts of removed block pairs and deletes the blobs of files no longer
// in any snapshot. Concurrent writers are safe: only versions below the
// newest are removed (a writer never changes those) and each removal is a
// transaction that checks the version is unchanged.
func (f *FS) Sweep(ctx context.Context) (SweepStats, error) { return f.SweepRange(ctx, AllD) }

// SweepRange is Sweep over the objects whose D is in r (a metadata server
// sweeps its own tables).
func (f *FS) SweepRange(ctx context.Context, r DRange) (SweepStats, error) {
	return f.SweepRangeProgress(ctx, r, nil)
}

// SweepRangeProgress is SweepRange telling progress, if set, the objects
// swept so far, counted by their inodes (a metadata server keeps their
// count, a long sweep's total).
func (f *FS) SweepRangeProgress(ctx context.Context, r DRange, progress func(keys int)) (SweepStats, error) {
	var stats SweepStats
	if f.readOnly {
		return stats, syscall.EROFS
	}
	live, _, err := f.liveSnapshots(ctx)
	if err != nil {
		return stats, err
	}
	from, to := f.keys.keysIn(spaceObjects, r)
	var group []keyVersion
	var groupPrefix []byte
	inodes := 0
	var errs []error
	flushGroup := func() {
		if len(group) == 0 {
			return
		}
		stats.Keys++
		if err := f.sweepKey(ctx, groupPrefix, group, live, &stats); err != nil {
			errs = append(errs, err)
		}
		group = group[:0]
	}
	err = f.meta.Scan(ctx, from, to, func(key, value []byte) error {
		if isTableRecord(key) {
			return nil // a metadata server's record of its table
		}
		prefix, s, err := splitVersion(key)
		if err != nil {
			return err
		}
		if !bytes.Equal(prefix, groupPrefix) {
			flushGroup()
			groupPrefix = bytes.Clone(prefix)
			if _, ok := InodePrefix(key); ok && progress != nil {
				inodes++
				progress(inodes)
			}
		}
		v, _, err := parseVersion(s, value)
		if err != nil {
			return err
		}
		group = append(group, keyVersion{key: bytes.Clone(key), value: bytes.Clone(value), v: v})
		return nil
	})
	flushGroup()
	if err != nil {
		return stats, err
	}
	return stats, errors.Join(errs...)
}

// sweepKey removes the unneeded versions of one key.
func (f *FS) sweepKey(ctx context.Context, prefix []byte, vs []keyVersion, live *snapSet, stats *SweepStats) error {
	kind, h, err := objectKind(prefix)
	if err != nil {
		return err
	}
	if kind == kindInline {
		return nil // removed with the block pair version they belong to (inline.go)
	}
	keep := neededVersions(vs, live)
	var drop []keyVersion
	kept := 0
	for i, kv := range vs {
		if keep[i] {
			kept++
		} else {
			drop = append(drop, kv)
		}
	}
	if len(drop) == 0 {
		return nil
	}
	stats.Candidates++
	var queued GUID
	skipped := 0
	perTxn := blocksPerTxn
	if kind == kindBlock {
		perTxn = blocksPerTxn / (1 + maxInlineChunks) // a version may be inline, with chunks to delete
	}
	for lo := 0; lo < len(drop); lo += perTxn {
		batch := drop[lo:min(len(drop), lo+perTxn)]
		lastBatch := lo+len(batch) == len(drop)
		var frees []blockEntry
		var removed int
		queued = GUID{}
		err := f.meta.Update(ctx, func(tx MetaTxn) error {
			frees, removed, queued = frees[:0], 0, GUID{}
			for _, kv := range batch {
				cur, ok, err := tx.Get(kv.key)
				if err != nil {
					return err
				}
				if !ok || !bytes.Equal(cur, kv.value) {
					continue // changed since the scan: leave it to the next sweep
				}
				if err := tx.Delete(kv.key); err != nil {
					return err
				}
				removed++
				_, payload, err := decodeVersioned(kv.value)
				if err != nil {
					return err
				}
				if kind == kindBlock && !kv.v.Tombstone {
					e, err := decodeBlockEntry(payload)
					if err != nil {
						return err
					}
					frees = append(frees, *e)
					if e.inline() {
						if err := deleteInlineChunks(tx, f.keys, h, kv.v.S, e.Length); err != nil {
							return err
						}
					}
				}
			}
			if err := f.queueFrees(tx, frees); err != nil {
				return err
			}
			if kind == kindInode && kept == 0 && lastBatch && skipped == 0 && removed == len(batch) {
				// The object is gone from every snapshot: its blob goes too.
				for _, kv := range vs {
					_, payload, err := decodeVersioned(kv.value)
					if err != nil {
						return err
					}
					if kv.v.Tombstone {
						continue
					}
					n, err := decodeInode(payload)
					if err != nil {
						return err
					}
					if n.Mode&sIFMT == sIFREG && !n.Blob.IsZero() {
						queued = n.Blob
						return tx.Put(f.keys.blobQueue(n.Blob), nil)
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("sweep %v: %w", h, err)
		}
		stats.Versions += removed
		skipped += len(batch) - removed
		stats.Tracts += len(frees)
		f.freeTracts(ctx, frees)
	}
	if !queued.IsZero() {
		if err := f.deleteQueuedBlob(ctx, queued); err != nil {
			return err
		}
		stats.Blobs++
	}
	return nil
}

// objectKind parses the prefix of a versioned key under (F, 1).
func objectKind(prefix []byte) (kind int, h Handle, err error) {
	t, err := tuple.Unpack(prefix)
	if err != nil || len(t) < 5 {
		return 0, h, fmt.Errorf("%w: key %x", errCorrupt, prefix)
	}
	d, ok1 := asUint(t[2])
	c, ok2 := asUint(t[3])
	kd, ok3 := asUint(t[4])
	if !ok1 || !ok2 || !ok3 {
		return 0, h, fmt.Errorf("%w: key %x", errCorrupt, prefix)
	}
	return int(kd), Handle{D: d, C: c}, nil
}
