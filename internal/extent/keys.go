package extent

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Key layout of an extent in its raft group's key space (keys relative to
// the group; the engine adds its prefix). Integers are big-endian so that
// scans go in numeric order.
//
//	m                       Meta: applied index, clock, counters
//	b <block:8>             block ownership: generation:8 tenant:8 flags:1
//	                        (absent: never allocated, generation 0)
//	p <page:8>              page: slot:8 then the data (absent: empty, slot 0)
//	l <page:8>              txn id:8 of the prepared transaction holding the page
//	                        (0 or absent: free)
//	k <block:8>             txn id:8 of the prepared transaction holding the block
//	                        (0 or absent: free)
//	t <txn:8>               TxnRecord of a cross-extent transaction
//	x <gc time:8> <txn:8>   tombstone t<txn> may be deleted at gc time (ms)
//	r <request:8>           remembered reply of a request (replies.go)
//	y <expiry:8> <request:8> index of the remembered replies by expiry
var (
	keyMeta = []byte{'m'}
)

const (
	prefixBlock     = 'b'
	prefixPage      = 'p'
	prefixPageLock  = 'l'
	prefixBlockLock = 'k'
	prefixTxn       = 't'
	prefixGC        = 'x'
)

// freeLock is a released lock's value. A released lock is overwritten,
// not deleted: a key locked and released over and over would otherwise
// leave its newest version a deletion, and every point read of it (each
// prepare and page read checks its locks) would walk all its older
// versions in the memtable to learn it is absent.
var freeLock = make([]byte, 8)

func u64Key(prefix byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefix}, v)
}

func blockKey(b uint64) []byte     { return u64Key(prefixBlock, b) }
func pageKey(p uint64) []byte      { return u64Key(prefixPage, p) }
func pageLockKey(p uint64) []byte  { return u64Key(prefixPageLock, p) }
func blockLockKey(b uint64) []byte { return u64Key(prefixBlockLock, b) }
func txnKey(id uint64) []byte      { return u64Key(prefixTxn, id) }

func gcKey(at int64, id uint64) []byte {
	return binary.BigEndian.AppendUint64(u64Key(prefixGC, uint64(max(at, 0))), id)
}

// block ownership flags.
const (
	flagAllocated = 1 << 0
	flagReadOnly  = 1 << 1
	blockRecBytes = 17
)

// blockRec is a block's ownership (FSS §3). A never-allocated block is the
// zero blockRec.
type blockRec struct {
	generation uint64
	tenant     uint64
	allocated  bool
	readOnly   bool
}

func (b blockRec) encode() []byte {
	out := make([]byte, 0, blockRecBytes)
	out = binary.BigEndian.AppendUint64(out, b.generation)
	out = binary.BigEndian.AppendUint64(out, b.tenant)
	var f byte
	if b.allocated {
		f |= flagAllocated
	}
	if b.readOnly {
		f |= flagReadOnly
	}
	return append(out, f)
}

var errCorrupt = errors.New("extent: corrupt record")

func decodeBlockRec(v []byte) (blockRec, error) {
	if len(v) != blockRecBytes || v[16]&^(flagAllocated|flagReadOnly) != 0 {
		return blockRec{}, fmt.Errorf("%w: block record of %d bytes", errCorrupt, len(v))
	}
	return blockRec{
		generation: binary.BigEndian.Uint64(v),
		tenant:     binary.BigEndian.Uint64(v[8:]),
		allocated:  v[16]&flagAllocated != 0,
		readOnly:   v[16]&flagReadOnly != 0,
	}, nil
}

// owns reports whether p's ownership tag matches the block exactly (FSS
// §3: generation, tenant and read-only bit must all match).
func (b blockRec) owns(p Pointer) bool {
	return b.allocated && b.generation == p.Generation && b.tenant == p.Tenant && b.readOnly == p.ReadOnly
}

func encodePage(slot uint64, data []byte) []byte {
	out := make([]byte, 0, 8+len(data))
	return append(binary.BigEndian.AppendUint64(out, slot), data...)
}

func decodePage(v []byte) (slot uint64, data []byte, err error) {
	if len(v) < 8 {
		return 0, nil, fmt.Errorf("%w: page record of %d bytes", errCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), v[8:], nil
}

func decodeTxnID(v []byte) (uint64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: lock of %d bytes", errCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}
