package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// DestroyStats counts what Destroy removed.
type DestroyStats struct {
	Keys, Blobs int
}

// Destroy removes file system f from the stores: it marks the superblock
// deleting (so no mount opens it and open mounts fail their next write),
// deletes the blob of every file (and every blob queued for deletion),
// then every key of f, the superblock last. Running it again after a
// crash finishes the job; destroying a file system that has no superblock
// removes whatever keys of f remain.
func Destroy(ctx context.Context, meta MetaStore, data DataStore, f uint64) (DestroyStats, error) {
	return DestroyProgress(ctx, meta, data, f, nil)
}

// DestroyProgress is Destroy telling progress, if set, its stage
// ("blobs", then "keys") and how far it got in it: blobs deleted of all
// found, keys deleted (total 0: the keys are not counted beforehand, which
// would read them all twice).
func DestroyProgress(ctx context.Context, meta MetaStore, data DataStore, f uint64, progress func(stage string, done, total int)) (DestroyStats, error) {
	if progress == nil {
		progress = func(string, int, int) {}
	}
	var st DestroyStats
	if f == 0 {
		return st, errors.New("fs: file system number 0 is reserved")
	}
	k := keys{f: f}
	err := meta.Update(ctx, func(tx MetaTxn) error {
		v, ok, err := tx.Get(k.superblock())
		if err != nil || !ok {
			return err
		}
		sb, err := decodeSuperblock(v)
		if err != nil || sb.Deleting {
			return err
		}
		sb.Deleting = true
		return tx.Put(k.superblock(), sb.encode())
	})
	if err != nil {
		return st, fmt.Errorf("fs: mark file system %d deleting: %w", f, err)
	}

	// Blobs: of every inode version (snapshots' too) and of the queue.
	blobs := map[GUID]bool{}
	from := k.objects()
	err = meta.Scan(ctx, from, endOf(from), func(key, value []byte) error {
		prefix, _, err := splitVersion(key)
		if err != nil {
			return nil // not a versioned key: nothing to learn
		}
		t, err := tuple.Unpack(prefix)
		if err != nil || len(t) != 5 {
			return nil
		}
		if kind, _ := asUint(t[4]); kind != kindInode {
			return nil
		}
		_, payload, err := decodeVersioned(value)
		if err != nil || len(payload) == 0 {
			return nil
		}
		n, err := decodeInode(payload)
		if err == nil && !n.Blob.IsZero() {
			blobs[n.Blob] = true
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("fs: list the blobs of file system %d: %w", f, err)
	}
	qp := k.blobQueuePrefix()
	err = meta.Scan(ctx, qp, endOf(qp), func(key, _ []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) == 0 {
			return nil
		}
		if b, ok := t[len(t)-1].([]byte); ok && len(b) == len(GUID{}) {
			blobs[GUID(b)] = true
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("fs: list the blob queue of file system %d: %w", f, err)
	}
	progress("blobs", 0, len(blobs))
	for g := range blobs {
		if err := data.DeleteBlob(ctx, g); err != nil && !errors.Is(err, ErrBlobNotFound) {
			return st, fmt.Errorf("fs: delete blob %s of file system %d: %w", g, f, err)
		}
		st.Blobs++
		progress("blobs", st.Blobs, len(blobs))
	}

	// Keys, in batches, the superblock last.
	lo, hi := k.fsRange()
	sbKey := k.superblock()
	for {
		var batch [][]byte
		err := meta.Scan(ctx, lo, hi, func(key, _ []byte) error {
			if bytes.Equal(key, sbKey) {
				return nil
			}
			batch = append(batch, bytes.Clone(key))
			if len(batch) >= maxScanBatch {
				return errBatchFull
			}
			return nil
		})
		if err != nil && !errors.Is(err, errBatchFull) {
			return st, fmt.Errorf("fs: list the keys of file system %d: %w", f, err)
		}
		if len(batch) == 0 {
			break
		}
		for i := 0; i < len(batch); i += MaxTxnValues - 1 {
			part := batch[i:min(i+MaxTxnValues-1, len(batch))]
			if err := meta.Update(ctx, func(tx MetaTxn) error {
				for _, key := range part {
					if err := tx.Delete(key); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				return st, fmt.Errorf("fs: delete keys of file system %d: %w", f, err)
			}
			st.Keys += len(part)
			progress("keys", st.Keys, 0)
		}
	}
	err = meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(sbKey) })
	if err != nil {
		return st, fmt.Errorf("fs: delete the superblock of file system %d: %w", f, err)
	}
	st.Keys++
	progress("keys", st.Keys, st.Keys)
	return st, nil
}

var errBatchFull = errors.New("fs: batch full")
