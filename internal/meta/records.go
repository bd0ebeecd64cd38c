package meta

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
	"github.com/arbor-storage/arbor/internal/fs"
)

// A table's own records live in the B-tree at the start of its range
// (fs.TableRecordKey(F, lo, ...)), next to the keys of its first
// directory id: they share its pages, so an owner's transaction reaches
// them without another extent (doc.go, Tables).
//
//	F, 1, lo, -1                     header: owner, delegation epoch, W, frozen, clean
//	F, 1, lo, -1, 1, session, slot   reply record of a session's request slot

const (
	recordFormat = 1
	replyRecords = 1 // second element of a reply record key
)

var errCorruptRecord = errors.New("meta: corrupt table record")

// tableHeader is a table's header record. Every owner transaction checks
// it (the header's leaf is in every commit's read set): a new owner writes
// its delegation epoch here, which fences any transaction of an old owner
// still in flight; a snapshot writes Frozen here, which fences every
// transaction until it writes the new W and clears Frozen.
type tableHeader struct {
	Table  uint64 // the delegation map's table id
	Epoch  uint64 // the delegation epoch of the owner that wrote it
	Owner  uint64 // that owner's node id
	Lo, Hi uint64 // the table's range of directory ids (Hi 0: to the end)
	// W is the write epoch the table's writes are at (fs doc.go,
	// Snapshots); Frozen, if non-zero, is the snapshot being taken: no
	// write commits until it is cleared.
	W, Frozen uint64
	// Clean says its owner handed it over with nothing lost: every write
	// it answered is durable (a move, split or borrow drained it). A new
	// owner clears it; one that finds it unset lets sessions replay what
	// the old owner answered early before serving anyone (doc.go, Early
	// replies).
	Clean bool
}

// headerFormat is the header's encoding: recordFormat with seven fields
// (no Clean), headerFormat with eight.
const headerFormat = 2

func (h *tableHeader) encode() []byte {
	b := []byte{headerFormat}
	var clean uint64
	if h.Clean {
		clean = 1
	}
	for _, v := range []uint64{h.Table, h.Epoch, h.Owner, h.Lo, h.Hi, h.W, h.Frozen, clean} {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func decodeHeader(b []byte) (*tableHeader, error) {
	n := 7
	if len(b) > 0 && b[0] == headerFormat {
		n, b = 8, append([]byte{recordFormat}, b[1:]...)
	}
	vs, err := decodeUvarints(b, n, "header")
	if err != nil {
		return nil, err
	}
	h := &tableHeader{Table: vs[0], Epoch: vs[1], Owner: vs[2], Lo: vs[3], Hi: vs[4], W: vs[5], Frozen: vs[6]}
	if n == 8 {
		if vs[7] > 1 {
			return nil, fmt.Errorf("%w: header clean flag %d", errCorruptRecord, vs[7])
		}
		h.Clean = vs[7] == 1
	}
	if h.Table == 0 || h.W == 0 || (h.Hi != 0 && h.Hi <= h.Lo) {
		return nil, fmt.Errorf("%w: header %+v", errCorruptRecord, *h)
	}
	return h, nil
}

// replyRecord says which request of a session's slot was applied last
// (FSS §8: the duplicate-request record lives in the store, so a retry
// sent to the next owner after a failover is recognised).
type replyRecord struct {
	Seq uint64
}

func (r *replyRecord) encode() []byte {
	return binary.AppendUvarint([]byte{recordFormat}, r.Seq)
}

func decodeReply(b []byte) (*replyRecord, error) {
	vs, err := decodeUvarints(b, 1, "reply")
	if err != nil {
		return nil, err
	}
	return &replyRecord{Seq: vs[0]}, nil
}

// decodeUvarints decodes a format byte and exactly n uvarints.
func decodeUvarints(b []byte, n int, what string) ([]uint64, error) {
	if len(b) == 0 || b[0] != recordFormat {
		return nil, fmt.Errorf("%w: %s record of %d bytes with format %v", errCorruptRecord, what, len(b), b[:min(1, len(b))])
	}
	b = b[1:]
	out := make([]uint64, n)
	for i := range out {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%w: %s record: field %d", errCorruptRecord, what, i)
		}
		out[i], b = v, b[k:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %s record: %d trailing bytes", errCorruptRecord, what, len(b))
	}
	return out, nil
}

func headerKey(f, lo uint64) []byte { return fs.TableRecordKey(f, lo) }

func replyKey(f, lo, session, slot uint64) []byte {
	return fs.TableRecordKey(f, lo, replyRecords, session, slot)
}

// replyKeySlot parses a reply record key (replyKey) for its session and
// slot.
func replyKeySlot(k []byte) (session, slot uint64, err error) {
	t, err := tuple.Unpack(k)
	if err == nil && len(t) == 7 {
		s, ok1 := tupleUint(t[5])
		l, ok2 := tupleUint(t[6])
		if ok1 && ok2 {
			return s, l, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: reply record key %x", errCorruptRecord, k)
}

// tupleUint reads a non-negative integer element (the tuple decoding
// gives int64 up to MaxInt64, uint64 above).
func tupleUint(e any) (uint64, bool) {
	switch v := e.(type) {
	case int64:
		return uint64(v), v >= 0
	case uint64:
		return v, true
	}
	return 0, false
}
