// Package raftenginetest holds test support for the state machines of the
// replication engine (internal/raftengine): MemKV, a replica's key space in
// memory, so that a state machine's deterministic core (STYLE.md §1) can
// be driven command by command without an engine, and its writes compared.
package raftenginetest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// MemKV is a raftengine.Writer (and Reader) over a map: the key space of
// one replica. Values are copied in and out. It is not safe for concurrent
// use, like the engine's Writer during one Apply.
type MemKV struct{ m map[string][]byte }

var _ raftengine.Writer = (*MemKV)(nil)

// NewMemKV returns an empty key space.
func NewMemKV() *MemKV { return &MemKV{m: map[string][]byte{}} }

// Get implements raftengine.Reader.
func (kv *MemKV) Get(key []byte) ([]byte, error) {
	v, ok := kv.m[string(key)]
	if !ok {
		return nil, raftengine.ErrNotFound
	}
	return bytes.Clone(v), nil
}

// Keys returns the keys in [start, end) in order (a nil end: to the end).
func (kv *MemKV) Keys(start, end []byte) []string {
	var ks []string
	for k := range kv.m {
		if k >= string(start) && (end == nil || k < string(end)) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// Scan implements raftengine.Reader.
func (kv *MemKV) Scan(start, end []byte, fn func(key, value []byte) error) error {
	for _, k := range kv.Keys(start, end) {
		if err := fn([]byte(k), kv.m[k]); err != nil {
			return err
		}
	}
	return nil
}

// Set implements raftengine.Writer.
func (kv *MemKV) Set(key, value []byte) error {
	kv.m[string(key)] = bytes.Clone(value)
	return nil
}

// Delete implements raftengine.Writer.
func (kv *MemKV) Delete(key []byte) error {
	delete(kv.m, string(key))
	return nil
}

// DeleteRange implements raftengine.Writer.
func (kv *MemKV) DeleteRange(start, end []byte) error {
	for _, k := range kv.Keys(start, end) {
		delete(kv.m, k)
	}
	return nil
}

// Len is the number of keys.
func (kv *MemKV) Len() int { return len(kv.m) }

// Clone returns a copy (a replica's state at this point).
func (kv *MemKV) Clone() *MemKV { return &MemKV{m: maps.Clone(kv.m)} }

// Equal reports whether two key spaces hold the same pairs.
func (kv *MemKV) Equal(o *MemKV) bool { return maps.EqualFunc(kv.m, o.m, bytes.Equal) }

// Dump is the whole key space, one key=value line each in hex, in key
// order: for comparing states and printing their difference.
func (kv *MemKV) Dump() string {
	var b strings.Builder
	for _, k := range kv.Keys(nil, nil) {
		fmt.Fprintf(&b, "%x=%x\n", k, kv.m[k])
	}
	return b.String()
}
