package directory

import (
	"bytes"
	"maps"
	"slices"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// memKV is an in-memory raftengine.Writer: the key space of one replica.
type memKV struct{ m map[string][]byte }

func newMemKV() *memKV { return &memKV{m: map[string][]byte{}} }

func (kv *memKV) Get(key []byte) ([]byte, error) {
	v, ok := kv.m[string(key)]
	if !ok {
		return nil, raftengine.ErrNotFound
	}
	return bytes.Clone(v), nil
}

func (kv *memKV) Scan(start, end []byte, fn func(key, value []byte) error) error {
	for _, k := range slices.Sorted(maps.Keys(kv.m)) {
		if k < string(start) || (end != nil && k >= string(end)) {
			continue
		}
		if err := fn([]byte(k), kv.m[k]); err != nil {
			return err
		}
	}
	return nil
}

func (kv *memKV) Set(key, value []byte) error {
	kv.m[string(key)] = bytes.Clone(value)
	return nil
}

func (kv *memKV) Delete(key []byte) error {
	delete(kv.m, string(key))
	return nil
}

func (kv *memKV) DeleteRange(start, end []byte) error {
	for k := range kv.m {
		if k >= string(start) && (end == nil || k < string(end)) {
			delete(kv.m, k)
		}
	}
	return nil
}

func (kv *memKV) clone() *memKV { return &memKV{m: maps.Clone(kv.m)} }

func (kv *memKV) equal(o *memKV) bool {
	return maps.EqualFunc(kv.m, o.m, bytes.Equal)
}
