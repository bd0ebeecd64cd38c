package fs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
)

// KV is one key-value pair of the metadata store.
type KV struct {
	Key, Value []byte
}

// MetaStore is what the file system needs of its metadata store: atomic
// transactions over ordered keys (DESIGN §2.5). *btree.Tree fits it through
// BTreeMeta; MemMeta is its in-memory twin.
//
// Contract:
//   - Update runs fn against a transaction and commits it atomically,
//     running fn again after conflicts (fn must have no effect outside its
//     Txn); an error fn returns aborts the transaction and is returned as is.
//     A transaction touches at most MaxTxnValues values (see MetaTxn).
//   - View runs fn against a read-only transaction whose reads are
//     consistent with each other.
//   - Scan calls fn with every pair in [from, to) in key order (to nil: no
//     bound). It is not atomic: each pair is read linearizably, but pairs
//     changed during the scan may be seen before or after the change.
//   - An error wrapping ErrAmbiguousCommit means the transaction may or may
//     not have been applied.
type MetaStore interface {
	Update(ctx context.Context, fn func(MetaTxn) error) error
	View(ctx context.Context, fn func(MetaTxn) error) error
	Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error
}

// MetaTxn is one attempt of a transaction. It is charged one value per
// distinct key read or written and one per leaf page a Scan reads that the
// transaction has not read yet; past MaxTxnValues every call fails. Its
// errors stick: once one failed, the attempt will not commit.
type MetaTxn interface {
	Get(k []byte) ([]byte, bool, error)
	Put(k, v []byte) error
	Delete(k []byte) error
	// Scan returns up to limit pairs (all if limit <= 0) in [from, to).
	Scan(from, to []byte, limit int) ([]KV, error)
}

// ErrAmbiguousCommit is wrapped by a store error when a commit's outcome is
// unknown.
var ErrAmbiguousCommit = errors.New("fs: metadata commit outcome unknown")

// ErrForeign is wrapped by a store error when a transaction touches keys
// its store does not serve (a metadata server asked about a table it does
// not own). Nothing was changed; the caller takes the operation where the
// keys are served.
var ErrForeign = errors.New("fs: keys served elsewhere")

// GUID names a blob of the data store (a tract store blob).
type GUID [16]byte

func (g GUID) String() string { return hex.EncodeToString(g[:]) }

// IsZero reports whether g is the zero GUID (no blob).
func (g GUID) IsZero() bool { return g == GUID{} }

// DataStore is what the file system needs of its data store: blobs of
// fixed-size tracts (FDS §2.1, DESIGN §2.3). The tract store's client fits
// it through TractData; MemData is its in-memory twin.
//
// Contract:
//   - TractSize is the most bytes a tract holds; a shorter write stores
//     (and costs) only its length.
//   - CreateBlob creates an empty blob; creating one that exists succeeds.
//     DeleteBlob deletes one; deleting a missing one succeeds.
//   - Extend adds n tracts to the blob atomically and returns the index of
//     the first: the caller owns [first, first+n); concurrent extends never
//     overlap.
//   - WriteTract replaces tract i (inside the blob) with data.
//   - ReadTract returns what the last write of tract i stored (empty if it
//     was never written).
//   - BlobTracts returns the blob's length in tracts, and ok=false if the
//     blob does not exist (fsck).
type DataStore interface {
	TractSize() int
	CreateBlob(ctx context.Context, g GUID) error
	DeleteBlob(ctx context.Context, g GUID) error
	Extend(ctx context.Context, g GUID, n uint64) (first uint64, err error)
	WriteTract(ctx context.Context, g GUID, i uint64, data []byte) error
	ReadTract(ctx context.Context, g GUID, i uint64) ([]byte, error)
	BlobTracts(ctx context.Context, g GUID) (n uint64, ok bool, err error)
}

// BlobSizer is implemented by a DataStore that can create a blob already
// n tracts long (one round instead of a create and an extend):
// CreateSized returns the first tract the caller owns, [first, first+n),
// which is 0 unless the blob existed (then it is extended).
type BlobSizer interface {
	CreateSized(ctx context.Context, g GUID, n uint64) (first uint64, err error)
}

// ErrBlobNotFound is wrapped by a DataStore error for a blob that does not
// exist.
var ErrBlobNotFound = errors.New("fs: blob not found")

func storeErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
