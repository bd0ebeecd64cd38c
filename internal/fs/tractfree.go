package fs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// The tract free queue (F, 5; doc.go, Freed tracts). A transaction that
// stops naming tracts lists them with queueFrees; after its commit,
// freeTracts empties them and deletes the records. What a crash leaves
// listed, DeleteQueuedBlobs empties.

// tractFreeRecord is one queue record: tracts of one blob.
type tractFreeRecord struct {
	blob   GUID
	tracts []uint64 // sorted; the key names the first
}

func (r tractFreeRecord) key(k keys) []byte { return k.tractFree(r.blob, r.tracts[0]) }

func (r tractFreeRecord) encode() []byte {
	var b []byte
	for _, t := range r.tracts {
		b = binary.AppendUvarint(b, t)
	}
	return b
}

func decodeTractFreeRecord(key, value []byte) (tractFreeRecord, error) {
	t, err := tuple.Unpack(key)
	if err != nil || len(t) != 4 {
		return tractFreeRecord{}, fmt.Errorf("%w: tract queue key %x", errCorrupt, key)
	}
	g, ok := t[2].([]byte)
	first, isUint := asUint(t[3])
	if !ok || len(g) != len(GUID{}) || !isUint {
		return tractFreeRecord{}, fmt.Errorf("%w: tract queue key %x", errCorrupt, key)
	}
	r := tractFreeRecord{blob: GUID(g)}
	for len(value) > 0 {
		v, n := binary.Uvarint(value)
		if n <= 0 {
			return tractFreeRecord{}, fmt.Errorf("%w: tract queue record %x", errCorrupt, key)
		}
		r.tracts = append(r.tracts, v)
		value = value[n:]
	}
	if len(r.tracts) == 0 || r.tracts[0] != first || !slices.IsSorted(r.tracts) {
		return tractFreeRecord{}, fmt.Errorf("%w: tract queue record %x does not list its key's tract first", errCorrupt, key)
	}
	return r, nil
}

// tractFreeRecords groups es by blob, each record's tracts sorted.
func tractFreeRecords(es []blockEntry) []tractFreeRecord {
	var out []tractFreeRecord
	for _, e := range es {
		if e.inline() {
			continue // no tract to free
		}
		i := slices.IndexFunc(out, func(r tractFreeRecord) bool { return r.blob == e.Blob })
		if i < 0 {
			out = append(out, tractFreeRecord{blob: e.Blob})
			i = len(out) - 1
		}
		out[i].tracts = append(out[i].tracts, e.Tract)
	}
	for i := range out {
		slices.Sort(out[i].tracts)
		out[i].tracts = slices.Compact(out[i].tracts)
	}
	return out
}

// queueFrees lists es in the transaction (one key per blob; the file
// system's transactions free tracts of one file, so one key).
func (f *FS) queueFrees(tx MetaTxn, es []blockEntry) error {
	for _, r := range tractFreeRecords(es) {
		if err := tx.Put(r.key(f.keys), r.encode()); err != nil {
			return err
		}
	}
	return nil
}

// freeTracts empties the tracts a committed transaction listed with
// queueFrees and deletes their records. A tract that cannot be emptied now
// stays listed, for DeleteQueuedBlobs.
func (f *FS) freeTracts(ctx context.Context, es []blockEntry) {
	for _, r := range tractFreeRecords(es) {
		if err := f.freeRecord(ctx, r); err != nil {
			f.log.Warn("freeing tracts; they stay queued", "blob", r.blob, "tracts", len(r.tracts), "err", err)
		}
	}
}

func (f *FS) freeRecord(ctx context.Context, r tractFreeRecord) error {
	if err := f.emptyTracts(ctx, r.blob, r.tracts); err != nil {
		return err
	}
	return f.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(r.key(f.keys)) })
}

// emptyTracts empties tracts of blob (the tract store keeps an empty tract
// at no cost). A blob already deleted has nothing left to empty.
func (f *FS) emptyTracts(ctx context.Context, blob GUID, tracts []uint64) error {
	return Parallel(ctx, len(tracts), maxParallelTracts, func(ctx context.Context, i int) error {
		err := f.data.WriteTract(ctx, blob, tracts[i], nil)
		if err != nil && !errors.Is(err, ErrBlobNotFound) {
			return storeErr(fmt.Sprintf("empty tract %v/%d", blob, tracts[i]), err)
		}
		return nil
	})
}

// discardTracts empties tracts written for a transaction that did not
// commit (nothing lists them: a crash before this leaks them, and fsck
// reports it).
func (f *FS) discardTracts(ctx context.Context, es []blockEntry) {
	for _, r := range tractFreeRecords(es) {
		if err := f.emptyTracts(ctx, r.blob, r.tracts); err != nil {
			f.log.Warn("emptying an unused tract; fsck will report it leaked", "blob", r.blob, "err", err)
		}
	}
}

// freeQueuedTracts empties the tracts listed under F, 5 (what freeTracts
// did not finish).
func (f *FS) freeQueuedTracts(ctx context.Context) error {
	recs, err := f.queuedTractFrees(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if err := f.freeRecord(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// queuedTractFrees reads the tract free queue.
func (f *FS) queuedTractFrees(ctx context.Context) ([]tractFreeRecord, error) {
	var out []tractFreeRecord
	p := f.keys.tractFreePrefix()
	err := f.meta.Scan(ctx, p, endOf(p), func(key, value []byte) error {
		r, err := decodeTractFreeRecord(key, value)
		if err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}
