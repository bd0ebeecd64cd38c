package raftengine

import (
	"bytes"
	"errors"
	"io"

	"github.com/cockroachdb/pebble/v2"
)

// pebbleReader is what DB, indexed Batch and Snapshot offer for reads.
type pebbleReader interface {
	getter
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

// prefixReader is a Reader over one group's data span.
type prefixReader struct {
	r      pebbleReader
	prefix []byte
}

func (v prefixReader) key(k []byte) []byte {
	out := make([]byte, 0, len(v.prefix)+len(k))
	return append(append(out, v.prefix...), k...)
}

func (v prefixReader) Get(key []byte) ([]byte, error) {
	val, closer, err := v.r.Get(v.key(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), val...), nil
}

func (v prefixReader) bounds(start, end []byte) (lo, hi []byte) {
	lo = v.key(start)
	if end == nil {
		hi = prefixEnd(v.prefix)
	} else {
		hi = v.key(end)
	}
	return lo, hi
}

func (v prefixReader) Scan(start, end []byte, fn func(key, value []byte) error) error {
	lo, hi := v.bounds(start, end)
	iter, err := v.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for valid := iter.First(); valid; valid = iter.Next() {
		if err := fn(iter.Key()[len(v.prefix):], iter.Value()); err != nil {
			_ = iter.Close()
			return err
		}
	}
	if err := iter.Error(); err != nil {
		_ = iter.Close()
		return err
	}
	return iter.Close()
}

// View runs fn with a Reader of one consistent point-in-time state of the
// group's key space (a pebble iterator's view), so that several reads see
// the same applied batches without checking for a commit in between. It
// costs one iterator, less than a second point read.
func (v prefixReader) View(fn func(r Reader) error) error {
	lo, hi := v.bounds(nil, nil)
	it, err := v.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	err = fn(&iterReader{it: it, prefix: v.prefix, hi: hi})
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	return err
}

// iterReader is a Reader through one iterator: every read sees its state.
type iterReader struct {
	it     *pebble.Iterator
	prefix []byte
	hi     []byte
	key    []byte // scratch for the full key
}

func (v *iterReader) full(k []byte) []byte {
	v.key = append(append(v.key[:0], v.prefix...), k...)
	return v.key
}

func (v *iterReader) Get(key []byte) ([]byte, error) {
	k := v.full(key)
	// A prefix seek consults the tables' bloom filters: most point reads
	// here are of absent keys (locks).
	if !v.it.SeekPrefixGE(k) || !bytes.Equal(v.it.Key(), k) {
		if err := v.it.Error(); err != nil {
			return nil, err
		}
		return nil, ErrNotFound
	}
	val, err := v.it.ValueAndErr()
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), val...), nil
}

// Scan iterates a clone of the iterator (same state), so that fn may Get.
func (v *iterReader) Scan(start, end []byte, fn func(key, value []byte) error) error {
	lo := append(append([]byte(nil), v.prefix...), start...)
	hi := v.hi
	if end != nil {
		hi = append(append([]byte(nil), v.prefix...), end...)
	}
	it, err := v.it.Clone(pebble.CloneOptions{})
	if err != nil {
		return err
	}
	for valid := it.SeekGE(lo); valid && bytes.Compare(it.Key(), hi) < 0; valid = it.Next() {
		val, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key()[len(v.prefix):], val)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Error(); err != nil {
		_ = it.Close()
		return err
	}
	return it.Close()
}

// prefixWriter is the Writer handed to Apply: an indexed batch, so that
// reads see the writes of earlier commands in the same batch.
type prefixWriter struct {
	prefixReader
	b *pebble.Batch
}

func newPrefixWriter(b *pebble.Batch, prefix []byte) prefixWriter {
	return prefixWriter{prefixReader: prefixReader{r: b, prefix: prefix}, b: b}
}

func (w prefixWriter) Set(key, value []byte) error { return w.b.Set(w.key(key), value, nil) }
func (w prefixWriter) Delete(key []byte) error     { return w.b.Delete(w.key(key), nil) }
func (w prefixWriter) DeleteRange(start, end []byte) error {
	lo, hi := w.bounds(start, end)
	return w.b.DeleteRange(lo, hi, nil)
}

var (
	_ Reader    = prefixReader{}
	_ Writer    = prefixWriter{}
	_ io.Closer = (*pebble.Batch)(nil)
)
