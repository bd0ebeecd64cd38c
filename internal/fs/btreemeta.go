package fs

import (
	"context"
	"errors"

	"github.com/arbor-storage/arbor/internal/btree"
)

// BTreeMeta adapts the distributed B-tree (internal/btree) to MetaStore.
type BTreeMeta struct {
	Tree *btree.Tree
}

var _ MetaStore = BTreeMeta{}

type btreeTxn struct{ tx *btree.Txn }

func (t btreeTxn) Get(k []byte) ([]byte, bool, error) { return t.tx.Get(k) }
func (t btreeTxn) Put(k, v []byte) error              { return t.tx.Put(k, v) }
func (t btreeTxn) Delete(k []byte) error              { return t.tx.Delete(k) }
func (t btreeTxn) Scan(from, to []byte, limit int) ([]KV, error) {
	kvs, err := t.tx.Scan(from, to, limit)
	if err != nil {
		return nil, err
	}
	out := make([]KV, len(kvs))
	for i, kv := range kvs {
		out[i] = KV{Key: kv.Key, Value: kv.Value}
	}
	return out, nil
}

func mapTreeErr(err error) error {
	if err != nil && errors.Is(err, btree.ErrAmbiguous) {
		return errors.Join(ErrAmbiguousCommit, err)
	}
	return err
}

// Update implements MetaStore.
func (b BTreeMeta) Update(ctx context.Context, fn func(MetaTxn) error) error {
	return mapTreeErr(b.Tree.Update(ctx, func(tx *btree.Txn) error { return fn(btreeTxn{tx}) }))
}

// View implements MetaStore.
func (b BTreeMeta) View(ctx context.Context, fn func(MetaTxn) error) error {
	return mapTreeErr(b.Tree.View(ctx, func(tx *btree.Txn) error { return fn(btreeTxn{tx}) }))
}

// Scan implements MetaStore.
func (b BTreeMeta) Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error {
	return b.Tree.Scan(ctx, from, to, fn)
}
