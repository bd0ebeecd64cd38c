package extent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
)

// Page deltas (issue 11): a write that names the slot its writer read may
// carry, instead of the new page, an edit script against the page's bytes
// at that slot. A B-tree leaf changes by a few hundred bytes per insert
// while its image is up to a page (8 KiB by default), and every byte of
// an MPSC goes through the leader's gRPC, its raft log, and two more
// replicas' logs.
//
// Why the base is unambiguous: a page's slot is the raft index of the
// entry that last wrote it, and an entry writes a page at most once
// (validate refuses a page named twice), so a non-zero slot names exactly
// one content of a page; slot 0 is the empty page (never written, or its
// block freed since, which deletes the page). A freed and reallocated
// block's pages start again at slot 0, empty, and every later write takes
// a new, larger index. The replica still checks what it rebuilt against
// the writer's length and CRC-32C, and refuses the MPSC on a difference
// (CODE_DELTA_MISMATCH, nothing written): a base that is not what the
// writer thought (a bug, a quorum-loss recovery that reused indexes)
// fails instead of writing a wrong page.
//
// Script encoding: a sequence of operations, each a uvarint header h
// followed by its operand; n = h>>1 is the operation's length in bytes,
// at least 1:
//
//	h&1 == 0  copy:   a uvarint offset follows; append base[offset:offset+n]
//	h&1 == 1  insert: n literal bytes follow; append them
//
// The operations append to an empty result in order; the result must
// come out exactly PageDelta.Length bytes long with CRC-32C PageDelta.CRC.
// ApplyDelta accepts any byte string (it is fuzzed: FuzzApplyDelta) and
// never reads outside the script or the base.

// PageDelta is a page write as an edit script against the page's bytes at
// the slot the write names.
type PageDelta struct {
	// Script is the edit script (encoding above).
	Script []byte
	// Length and CRC are the rebuilt page's length and CRC-32C
	// (Castagnoli).
	Length uint32
	CRC    uint32
}

const (
	deltaOpCopy   = 0
	deltaOpInsert = 1
	// deltaMinRun is the shortest equal run the encoder turns into a copy
	// in the middle of a page: a copy costs its header and offset (up to
	// 6 bytes for an 8 KiB page) and splits the literal around it (another
	// header), so shorter runs are cheaper left in the literal.
	deltaMinRun = 16
	// deltaMaxFractionNum/Den: a delta is sent only if its script is at
	// most that fraction of the new page; otherwise the full image is (a
	// full image cannot miss its base, and a small saving is not worth a
	// fallback's second round).
	deltaMaxFractionNum, deltaMaxFractionDen = 1, 2
)

// ErrDeltaMismatch is the kind of a write refused because its edit script
// did not rebuild the page it promised: the base the writer had was not
// the page at the slot it named. It is an ErrInvalid (errors.Is holds for
// both); nothing changed, and the writer should send the full image.
var ErrDeltaMismatch = fmt.Errorf("%w: page delta does not rebuild the promised page", ErrInvalid)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pageCRC is the CRC-32C a PageDelta carries.
func pageCRC(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// EncodeDelta returns the edit script that turns old into new: the common
// prefix and suffix (so an insert or delete in the middle keeps the
// shifted tail as one copy); between them, equal runs at the same offset
// (a page header whose count, length and checksum change), and runs found
// elsewhere in old through a small hash index of its 8-byte strings (the
// stretch between two inserts of one commit, shifted by the first; the
// entries a split keeps, shifted by a new fence) copied; the rest
// inserted. An insert into a sorted B-tree page encodes in a handful of
// operations. ok is false when the script would not be much smaller than
// new (more than deltaMaxFraction of it): send the full image then.
// EncodeDelta keeps no reference to old or new.
func EncodeDelta(old, new []byte) (d PageDelta, ok bool) {
	limit := len(new) * deltaMaxFractionNum / deltaMaxFractionDen
	if len(new) > maxPageSizeBytes || limit == 0 {
		return PageDelta{}, false
	}
	return encodeDelta(old, new, limit)
}

// Anchors: positions of old, every anchorStride bytes, indexed by a hash
// of the anchorBytes bytes there. A run of at least deltaMinRun equal
// bytes holds an indexed position, where the lookup finds it; the match
// is then extended both ways.
const (
	anchorBytes     = 8
	anchorStride    = 4
	anchorTableBits = 12
)

type anchorTable [1 << anchorTableBits]int32 // position+1; 0: none

var anchorTables = sync.Pool{New: func() any { return new(anchorTable) }}

func anchorHash(b []byte) uint32 {
	return uint32((binary.LittleEndian.Uint64(b) * 0x9E3779B97F4A7C15) >> (64 - anchorTableBits))
}

// encodeDelta is EncodeDelta with the script's size limit given (tests
// force deltas of tiny pages with a large one).
func encodeDelta(old, new []byte, limit int) (d PageDelta, ok bool) {
	prefix := equalPrefix(old, new)
	suffix := equalSuffix(old[prefix:], new[prefix:])
	end, oldEnd := len(new)-suffix, len(old)-suffix // the middles are new[prefix:end], old[prefix:oldEnd]
	e := deltaEncoder{script: make([]byte, 0, 64)}
	e.copy(0, prefix)
	var anchors *anchorTable // built when the same offset first fails
	defer func() {
		if anchors != nil {
			anchorTables.Put(anchors)
		}
	}()
	lit := prefix // start of the pending literal
	for i := prefix; i < end; {
		if i < len(old) && old[i] == new[i] {
			j := i + equalPrefix(old[i:], new[i:end])
			if j-i >= deltaMinRun {
				e.insert(new[lit:i])
				e.copy(i, j-i)
				lit = j
			}
			i = j
			continue
		}
		if end-i >= anchorBytes && oldEnd-prefix >= anchorBytes {
			if anchors == nil {
				anchors = anchorTables.Get().(*anchorTable)
				clear(anchors[:])
				for j := prefix; j+anchorBytes <= oldEnd; j += anchorStride {
					anchors[anchorHash(old[j:])] = int32(j + 1)
				}
			}
			if j := int(anchors[anchorHash(new[i:])]) - 1; j >= 0 {
				n := equalPrefix(old[j:], new[i:end])
				back := 0
				for back < i-lit && back < j && old[j-back-1] == new[i-back-1] {
					back++
				}
				if n+back >= deltaMinRun {
					e.insert(new[lit : i-back])
					e.copy(j-back, n+back)
					i += n
					lit = i
					continue
				}
			}
		}
		i++
		if len(e.script)+(i-lit) > limit {
			return PageDelta{}, false
		}
	}
	e.insert(new[lit:end])
	e.copy(len(old)-suffix, suffix)
	e.flush()
	if len(e.script) > limit {
		return PageDelta{}, false
	}
	return PageDelta{Script: e.script, Length: uint32(len(new)), CRC: pageCRC(new)}, true
}

// deltaEncoder appends operations, merging a copy that continues the
// previous one.
type deltaEncoder struct {
	script          []byte
	copyOff, copyN  int // pending copy, not yet appended (copyN 0: none)
	pendingCopyNext int // base offset right after the pending copy
}

func (e *deltaEncoder) copy(off, n int) {
	if n == 0 {
		return
	}
	if e.copyN > 0 && off == e.pendingCopyNext {
		e.copyN += n
		e.pendingCopyNext += n
		return
	}
	e.flush()
	e.copyOff, e.copyN, e.pendingCopyNext = off, n, off+n
}

func (e *deltaEncoder) insert(b []byte) {
	if len(b) == 0 {
		return
	}
	e.flush()
	e.script = binary.AppendUvarint(e.script, uint64(len(b))<<1|deltaOpInsert)
	e.script = append(e.script, b...)
}

func (e *deltaEncoder) flush() {
	if e.copyN == 0 {
		return
	}
	e.script = binary.AppendUvarint(e.script, uint64(e.copyN)<<1|deltaOpCopy)
	e.script = binary.AppendUvarint(e.script, uint64(e.copyOff))
	e.copyN = 0
}

// equalPrefix is the length of the longest common prefix of a and b.
func equalPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && binary.LittleEndian.Uint64(a[i:]) == binary.LittleEndian.Uint64(b[i:]) {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// equalSuffix is the length of the longest common suffix of a and b.
func equalSuffix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && binary.LittleEndian.Uint64(a[len(a)-i-8:]) == binary.LittleEndian.Uint64(b[len(b)-i-8:]) {
		i += 8
	}
	for i < n && a[len(a)-i-1] == b[len(b)-i-1] {
		i++
	}
	return i
}

// errDeltaScript is wrapped by every reason ApplyDelta refuses a script.
var errDeltaScript = errors.New("page delta")

// ApplyDelta rebuilds a page from base and d: a new slice (base is only
// read) of d.Length bytes, which must be at most maxBytes. It fails,
// without panicking or reading out of range, on any script that is
// malformed, reads outside base, or does not produce exactly d.Length
// bytes with CRC-32C d.CRC.
func ApplyDelta(base []byte, d PageDelta, maxBytes int) ([]byte, error) {
	if uint64(d.Length) > uint64(max(maxBytes, 0)) {
		return nil, fmt.Errorf("%w: result of %d bytes exceeds %d", errDeltaScript, d.Length, maxBytes)
	}
	want := uint64(d.Length)
	out := make([]byte, 0, want)
	s := d.Script
	for pos := 0; pos < len(s); {
		h, k := binary.Uvarint(s[pos:])
		if k <= 0 {
			return nil, fmt.Errorf("%w: bad operation header at script byte %d", errDeltaScript, pos)
		}
		pos += k
		n := h >> 1
		if n == 0 || n > want-uint64(len(out)) {
			return nil, fmt.Errorf("%w: operation of %d bytes at script byte %d: %d of %d written", errDeltaScript, n, pos-k, len(out), want)
		}
		switch h & 1 {
		case deltaOpCopy:
			off, k := binary.Uvarint(s[pos:])
			if k <= 0 {
				return nil, fmt.Errorf("%w: bad copy offset at script byte %d", errDeltaScript, pos)
			}
			pos += k
			if off > uint64(len(base)) || n > uint64(len(base))-off {
				return nil, fmt.Errorf("%w: copy of [%d, +%d) from a base of %d bytes", errDeltaScript, off, n, len(base))
			}
			out = append(out, base[off:off+n]...)
		case deltaOpInsert:
			if n > uint64(len(s)-pos) {
				return nil, fmt.Errorf("%w: insert of %d bytes with %d left in the script", errDeltaScript, n, len(s)-pos)
			}
			out = append(out, s[pos:pos+int(n)]...)
			pos += int(n)
		}
	}
	if uint64(len(out)) != want {
		return nil, fmt.Errorf("%w: rebuilt %d bytes, not %d", errDeltaScript, len(out), want)
	}
	if got := pageCRC(out); got != d.CRC {
		return nil, fmt.Errorf("%w: rebuilt page has CRC-32C %08x, not %08x", errDeltaScript, got, d.CRC)
	}
	return out, nil
}
