package meta

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/RaduBerinde/btreemap"

	"github.com/arbor-storage/arbor/internal/fs"
)

// txn is one attempt of a View or Update over the store. Keys of owned
// tables are read from the cache (a unit not loaded fails the attempt with
// a missError, and the store runs it again after loading); other keys are
// read from the tree in a View, and refused in an Update. Writes are
// buffered and applied by the store when fn returns. The store's lock is
// held throughout. Errors stick.
type txn struct {
	s     *store
	ctx   context.Context
	write bool
	err   error
	// session is the operation's (fs.WithSession): its own writes not yet
	// durable are read without waiting for them. durable: the engine asked
	// for a durable answer (fs.DurableTxn).
	session uint64
	durable bool

	writes map[string]*bufWrite
	order  []string // written keys, first write first
	// tables are the owned tables the writes touch; seen is the newest
	// pending write of another session read (the transaction's answer
	// waits for it to be durable: doc.go, Early replies).
	tables []*table
	seen   *pending
}

type bufWrite struct {
	key     string
	val     []byte
	deleted bool
	d       uint64 // its unit (owned keys)
	owned   bool
}

var _ fs.MetaTxn = (*txn)(nil)
var _ fs.EpochTxn = (*txn)(nil)
var _ fs.DurableTxn = (*txn)(nil)

// RequireDurable implements fs.DurableTxn.
func (tx *txn) RequireDurable() { tx.durable = true }

func (tx *txn) fail(err error) error {
	if tx.err == nil {
		tx.err = err
	}
	return tx.err
}

// WriteEpoch implements fs.EpochTxn: the W every owned table writes at.
// The commit checks each touched table's header still says it.
func (tx *txn) WriteEpoch() (uint64, error) {
	w, ok := tx.s.writeEpochLocked()
	if !ok {
		return 0, errWait
	}
	if w == 0 {
		return 0, tx.fail(fmt.Errorf("%w: file system %d", errNotOwner, tx.s.f))
	}
	return w, nil
}

// access classifies k for a read or write and checks it may be made here.
func (tx *txn) access(k []byte, write bool) (keyClass, uint64, *table, error) {
	if tx.err != nil {
		return 0, 0, nil, tx.err
	}
	class, d, t, err := tx.s.classify(k)
	if err != nil {
		return 0, 0, nil, tx.fail(err)
	}
	switch class {
	case classForeign:
		if tx.write {
			return 0, 0, nil, tx.fail(&ForeignError{FS: tx.s.f, D: []uint64{d}})
		}
	case classOwned:
		u := tx.s.units[d]
		if u == nil {
			return 0, 0, nil, tx.fail(&missError{d: d})
		}
		tx.s.touch(u)
	case classShared:
		if tx.write && !write {
			// Shared records are read outside the tables' transactions: a
			// read in an update could not be checked at its commit.
			return 0, 0, nil, tx.fail(fmt.Errorf("meta: read of shared record %x in an update", k))
		}
	}
	return class, d, t, nil
}

// Get implements fs.MetaTxn.
func (tx *txn) Get(k []byte) ([]byte, bool, error) {
	if w, ok := tx.writes[string(k)]; ok {
		if w.deleted {
			return nil, false, nil
		}
		return bytes.Clone(w.val), true, nil
	}
	class, _, _, err := tx.access(k, false)
	if err != nil {
		return nil, false, err
	}
	if class != classOwned {
		v, ok, err := tx.s.tree.Get(tx.ctx, k)
		if err != nil {
			return nil, false, tx.fail(err)
		}
		return v, ok, nil
	}
	_, e, ok := tx.s.kv.Get(string(k))
	if !ok {
		return nil, false, nil
	}
	tx.saw(e)
	if e.deleted {
		return nil, false, nil
	}
	return bytes.Clone(e.val), true, nil
}

// saw notes that the transaction read e: a write of another session not
// yet durable must be before the transaction's answer. The session's own
// need not: it holds them itself until they are (an early answer), or
// waits for them in its own operation.
func (tx *txn) saw(e *entry) {
	p := e.pending
	if p == nil || (p.session != 0 && p.session == tx.session) {
		return
	}
	if tx.seen == nil || p.seq > tx.seen.seq {
		tx.seen = p
	}
}

// waitSeen waits for the pending writes the transaction read to be
// durable.
func (tx *txn) waitSeen(ctx context.Context) error {
	if tx.seen == nil {
		return nil
	}
	return tx.seen.wait(ctx)
}

// Put implements fs.MetaTxn.
func (tx *txn) Put(k, v []byte) error { return tx.buffer(k, bytes.Clone(v), false) }

// Delete implements fs.MetaTxn.
func (tx *txn) Delete(k []byte) error { return tx.buffer(k, nil, true) }

func (tx *txn) buffer(k, v []byte, del bool) error {
	if !tx.write {
		return tx.fail(fmt.Errorf("meta: write in a read-only transaction"))
	}
	ks := string(k)
	if w, ok := tx.writes[ks]; ok {
		w.val, w.deleted = v, del
		return nil
	}
	class, d, t, err := tx.access(k, true)
	if err != nil {
		return err
	}
	if len(tx.order) >= maxWrittenKeys {
		return tx.fail(fmt.Errorf("%w: more than %d keys written in one transaction", fs.ErrTooManyValues, maxWrittenKeys))
	}
	if tx.writes == nil {
		tx.writes = map[string]*bufWrite{}
	}
	tx.writes[ks] = &bufWrite{key: ks, val: v, deleted: del, d: d, owned: class == classOwned}
	tx.order = append(tx.order, ks)
	if t != nil && !slices.Contains(tx.tables, t) {
		tx.tables = append(tx.tables, t)
	}
	return nil
}

// Scan implements fs.MetaTxn: pairs of one unit (the file system's
// transactions scan the versions of one key), with the transaction's own
// writes.
func (tx *txn) Scan(from, to []byte, limit int) ([]fs.KV, error) {
	class, d, _, err := tx.access(from, false)
	if err != nil {
		return nil, err
	}
	if class != classOwned {
		kvs, err := tx.scanTree(from, to, limit)
		return kvs, err
	}
	r := fs.DirRanges(tx.s.f, d)
	var hi []byte
	for _, rr := range r {
		if bytes.Compare(from, rr[0]) >= 0 && bytes.Compare(from, rr[1]) < 0 {
			hi = rr[1]
		}
	}
	if to == nil || bytes.Compare(to, hi) > 0 {
		// Past its unit: a scan the file system never makes in a
		// transaction.
		return nil, tx.fail(fmt.Errorf("meta: transaction scan [%x, %x) leaves directory %#x", from, to, d))
	}
	var out []fs.KV
	// Cached pairs merged with the buffered writes.
	var mine []string
	for k := range tx.writes {
		if k >= string(from) && k < string(to) {
			mine = append(mine, k)
		}
	}
	slices.Sort(mine)
	emit := func(k string, v []byte) bool {
		out = append(out, fs.KV{Key: []byte(k), Value: bytes.Clone(v)})
		return limit <= 0 || len(out) < limit
	}
	tx.s.kv.AscendFunc(btreemap.GE(string(from)), btreemap.LT(string(to)), func(k string, e *entry) bool {
		for len(mine) > 0 && mine[0] < k {
			w := tx.writes[mine[0]]
			mine = mine[1:]
			if !w.deleted && !emit(w.key, w.val) {
				return false
			}
		}
		if len(mine) > 0 && mine[0] == k {
			w := tx.writes[k]
			mine = mine[1:]
			if w.deleted {
				return true
			}
			return emit(k, w.val)
		}
		tx.saw(e)
		if e.deleted {
			return true
		}
		return emit(k, e.val)
	})
	for _, k := range mine {
		if limit > 0 && len(out) >= limit {
			break
		}
		if w := tx.writes[k]; !w.deleted {
			emit(k, w.val)
		}
	}
	return out, nil
}

func (tx *txn) scanTree(from, to []byte, limit int) ([]fs.KV, error) {
	var out []fs.KV
	stop := fmt.Errorf("stop")
	err := tx.s.tree.Scan(tx.ctx, from, to, func(k, v []byte) error {
		out = append(out, fs.KV{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		if limit > 0 && len(out) >= limit {
			return stop
		}
		return nil
	})
	if err != nil && err != stop {
		return nil, tx.fail(err)
	}
	return out, nil
}
