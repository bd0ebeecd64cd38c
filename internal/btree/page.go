package btree

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// pageKind says what a page of a tree block holds.
type pageKind uint8

const (
	kindLeaf pageKind = iota + 1
	kindInner
	// kindBlockHeader is page 0 of every block of the tree: which of the
	// block's pages are in use.
	kindBlockHeader
	// kindFree marks a page a merge released, so a pointer still aimed at
	// it fails validation instead of finding stale keys.
	kindFree
)

// Page layout (all integers big endian):
//
//	0   magic "AB"
//	2   format version
//	3   kind
//	4   height (leaves are 0)
//	5   flags (bit 0: the high fence is +infinity)
//	6   entry count (uint16)
//	8   CRC-32C of the whole encoding with this field zero
//	12  encoded length (uint32): bytes beyond it are ignored
//	16  right link: tagged pointer to the next page of the same height
//	    (extent, page, generation, tenant: 4 x uint64), zero if none
//	48  writers: ids of the last writerHistory transactions (or structural
//	    changes) that wrote the page, newest first, zero-padded
//	80  low fence: uint16 length + bytes (inclusive)
//	    high fence: uint16 length + bytes (exclusive; empty if +infinity)
//	    entries, in increasing key order:
//	      leaf:   uint16 key length, key, uint16 value length, value
//	      inner:  uint16 key length, key, child tagged pointer (32 bytes)
//	      header: the in-use bitmap, one bit per page of the block
const (
	pageMagic0, pageMagic1 = 'A', 'B'
	pageFormatVersion      = 1
	pageHeaderBytes        = 80
	refBytes               = 32
	lenBytes               = 2
	flagHiInfinite         = 1
	offCRC                 = 8
	offLength              = 12
	offNext                = 16
	offWriters             = 48
	// writerHistory is how many writers a page remembers: enough for a
	// client whose commit reply was lost to find its own id, or the id of
	// the version it read followed only by others, after a few more
	// writes (see Txn.probe).
	writerHistory = 4
	// maxHeight bounds a tree's height; with two children per inner page
	// at the very least, it is far beyond any tree that fits in storage.
	maxHeight = 32
	// maxFieldBytes is what a uint16 length can say.
	maxFieldBytes = 1<<16 - 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errBadPage is wrapped by every decode failure: the bytes are not a page
// of this format (never written, torn by a bug, or something else's page).
var errBadPage = errors.New("not a valid tree page")

// page is a decoded tree page. Its key and value slices are never written
// in place (changes replace them), so copies of a page share them safely.
type page struct {
	kind    pageKind
	height  int
	writers [writerHistory]uint64 // newest first
	next    PageRef
	lo, hi  []byte
	hiInf   bool
	keys    [][]byte
	vals    [][]byte  // leaf
	kids    []PageRef // inner
	used    []bool    // block header: one per page of the block
}

// stamp records id as the page's newest writer.
func (p *page) stamp(id uint64) {
	copy(p.writers[1:], p.writers[:writerHistory-1])
	p.writers[0] = id
}

// writer is the id of the page's newest writer.
func (p *page) writer() uint64 { return p.writers[0] }

// wroteBy reports whether id is among the page's remembered writers, and
// its position (0: newest).
func (p *page) wroteBy(id uint64) (int, bool) {
	for i, w := range p.writers {
		if w == id && id != 0 {
			return i, true
		}
	}
	return 0, false
}

// owns reports whether k lies in the page's fences [lo, hi).
func (p *page) owns(k []byte) bool {
	return bytes.Compare(k, p.lo) >= 0 && (p.hiInf || bytes.Compare(k, p.hi) < 0)
}

// isTree reports whether the page is a leaf or inner page.
func (p *page) isTree() bool { return p.kind == kindLeaf || p.kind == kindInner }

// search returns the index of the first key >= k and whether it equals k.
func (p *page) search(k []byte) (int, bool) {
	lo, hi := 0, len(p.keys)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if bytes.Compare(p.keys[m], k) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(p.keys) && bytes.Equal(p.keys[lo], k)
}

// childIndex returns the entry of an inner page whose range holds k (k must
// be owned by the page).
func (p *page) childIndex(k []byte) int {
	i, eq := p.search(k)
	if eq {
		return i
	}
	return i - 1
}

// childHi is the high fence of child i: the next separator, or the page's.
func (p *page) childHi(i int) ([]byte, bool) {
	if i+1 < len(p.keys) {
		return p.keys[i+1], false
	}
	return p.hi, p.hiInf
}

// fenceBytes is the encoded size of the fences.
func (p *page) fenceBytes() int { return 2*lenBytes + len(p.lo) + len(p.hi) }

// entryBytes is the encoded size of entry i.
func (p *page) entryBytes(i int) int {
	if p.kind == kindInner {
		return lenBytes + len(p.keys[i]) + refBytes
	}
	return 2*lenBytes + len(p.keys[i]) + len(p.vals[i])
}

// size is the encoded size of the page.
func (p *page) size() int {
	n := pageHeaderBytes + p.fenceBytes()
	switch p.kind {
	case kindLeaf, kindInner:
		for i := range p.keys {
			n += p.entryBytes(i)
		}
	case kindBlockHeader:
		n += (len(p.used) + 7) / 8
	}
	return n
}

func (p *page) clone() *page {
	q := *p
	q.keys = append([][]byte(nil), p.keys...)
	q.vals = append([][]byte(nil), p.vals...)
	q.kids = append([]PageRef(nil), p.kids...)
	q.used = append([]bool(nil), p.used...)
	return &q
}

// encode returns the page's bytes. It checks the page first (STYLE.md §7:
// check data before it is written) and panics on an invariant broken by
// this package's own code.
func (p *page) encode() []byte {
	if err := p.validate(); err != nil {
		panic(fmt.Sprintf("btree: encoding an invalid page: %v", err))
	}
	b := make([]byte, pageHeaderBytes, p.size())
	b[0], b[1], b[2] = pageMagic0, pageMagic1, pageFormatVersion
	b[3] = byte(p.kind)
	b[4] = byte(p.height)
	if p.hiInf {
		b[5] = flagHiInfinite
	}
	count := len(p.keys)
	if p.kind == kindBlockHeader {
		count = len(p.used)
	}
	binary.BigEndian.PutUint16(b[6:], uint16(count))
	putRef(b[offNext:], p.next)
	for i, w := range p.writers {
		binary.BigEndian.PutUint64(b[offWriters+8*i:], w)
	}
	b = appendField(b, p.lo)
	b = appendField(b, p.hi)
	switch p.kind {
	case kindLeaf:
		for i := range p.keys {
			b = appendField(b, p.keys[i])
			b = appendField(b, p.vals[i])
		}
	case kindInner:
		for i := range p.keys {
			b = appendField(b, p.keys[i])
			b = append(b, make([]byte, refBytes)...)
			putRef(b[len(b)-refBytes:], p.kids[i])
		}
	case kindBlockHeader:
		bits := make([]byte, (len(p.used)+7)/8)
		for i, u := range p.used {
			if u {
				bits[i/8] |= 1 << (i % 8)
			}
		}
		b = append(b, bits...)
	}
	binary.BigEndian.PutUint32(b[offLength:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[offCRC:], crc32.Checksum(b, crcTable))
	return b
}

func appendField(b, f []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(f)))
	return append(b, f...)
}

func putRef(b []byte, r PageRef) {
	binary.BigEndian.PutUint64(b[0:], r.Extent)
	binary.BigEndian.PutUint64(b[8:], r.Page)
	binary.BigEndian.PutUint64(b[16:], r.Generation)
	binary.BigEndian.PutUint64(b[24:], r.Tenant)
}

func getRef(b []byte) PageRef {
	return PageRef{
		Extent:     binary.BigEndian.Uint64(b[0:]),
		Page:       binary.BigEndian.Uint64(b[8:]),
		Generation: binary.BigEndian.Uint64(b[16:]),
		Tenant:     binary.BigEndian.Uint64(b[24:]),
	}
}

// decodePage parses and checks a page (STYLE.md §7: check data after it is
// read). Every failure wraps errBadPage. The page's keys and values alias
// b, which the caller must not change afterwards.
func decodePage(b []byte) (*page, error) {
	p, err := parsePage(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadPage, err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadPage, err)
	}
	return p, nil
}

func parsePage(b []byte) (*page, error) {
	if len(b) < pageHeaderBytes {
		return nil, fmt.Errorf("%d bytes, shorter than a header", len(b))
	}
	if b[0] != pageMagic0 || b[1] != pageMagic1 {
		return nil, errors.New("bad magic")
	}
	if b[2] != pageFormatVersion {
		return nil, fmt.Errorf("format version %d", b[2])
	}
	n := binary.BigEndian.Uint32(b[offLength:])
	if n < pageHeaderBytes || int(n) > len(b) {
		return nil, fmt.Errorf("encoded length %d outside [%d, %d]", n, pageHeaderBytes, len(b))
	}
	b = b[:n]
	want := binary.BigEndian.Uint32(b[offCRC:])
	var zero [4]byte
	crc := crc32.Update(0, crcTable, b[:offCRC])
	crc = crc32.Update(crc, crcTable, zero[:])
	crc = crc32.Update(crc, crcTable, b[offCRC+4:])
	if crc != want {
		return nil, fmt.Errorf("checksum %08x, want %08x", crc, want)
	}
	p := &page{
		kind:   pageKind(b[3]),
		height: int(b[4]),
		hiInf:  b[5]&flagHiInfinite != 0,
		next:   getRef(b[offNext:]),
	}
	for i := range p.writers {
		p.writers[i] = binary.BigEndian.Uint64(b[offWriters+8*i:])
	}
	if b[5]&^flagHiInfinite != 0 {
		return nil, fmt.Errorf("unknown flags %#x", b[5])
	}
	count := int(binary.BigEndian.Uint16(b[6:]))
	r := reader{b: b[pageHeaderBytes:]}
	p.lo = r.field()
	p.hi = r.field()
	switch p.kind {
	case kindLeaf:
		p.keys = make([][]byte, 0, count)
		p.vals = make([][]byte, 0, count)
		for range count {
			p.keys = append(p.keys, r.field())
			p.vals = append(p.vals, r.field())
		}
	case kindInner:
		p.keys = make([][]byte, 0, count)
		p.kids = make([]PageRef, 0, count)
		for range count {
			p.keys = append(p.keys, r.field())
			p.kids = append(p.kids, r.ref())
		}
	case kindBlockHeader:
		bits := r.take((count + 7) / 8)
		if r.err == nil {
			p.used = make([]bool, count)
			for i := range p.used {
				p.used[i] = bits[i/8]&(1<<(i%8)) != 0
			}
		}
	case kindFree:
		if count != 0 {
			return nil, errors.New("free page with entries")
		}
	default:
		return nil, fmt.Errorf("unknown kind %d", p.kind)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(r.b))
	}
	return p, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = fmt.Errorf("truncated: need %d bytes, have %d", n, len(r.b))
		return nil
	}
	// The result aliases the input (decodePage's caller gives up the
	// buffer); its capacity is capped so no append can reach the next
	// field.
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) field() []byte {
	l := r.take(lenBytes)
	if r.err != nil {
		return nil
	}
	return r.take(int(binary.BigEndian.Uint16(l)))
}

func (r *reader) ref() PageRef {
	b := r.take(refBytes)
	if r.err != nil {
		return PageRef{}
	}
	return getRef(b)
}

// validate checks the page's own invariants: kind and height agree, fences
// are ordered, keys strictly increase inside the fences, an inner page's
// first key is its low fence and its children are real pointers.
func (p *page) validate() error {
	if p.height < 0 || p.height > maxHeight {
		return fmt.Errorf("height %d outside [0, %d]", p.height, maxHeight)
	}
	if len(p.lo) > maxFieldBytes || len(p.hi) > maxFieldBytes {
		return errors.New("fence too long")
	}
	switch p.kind {
	case kindLeaf:
		if p.height != 0 {
			return fmt.Errorf("leaf at height %d", p.height)
		}
		if len(p.vals) != len(p.keys) {
			return errors.New("keys and values differ in number")
		}
	case kindInner:
		if p.height == 0 {
			return errors.New("inner page at height 0")
		}
		if len(p.kids) != len(p.keys) || len(p.keys) == 0 {
			return fmt.Errorf("inner page with %d keys and %d children", len(p.keys), len(p.kids))
		}
		if !bytes.Equal(p.keys[0], p.lo) {
			return errors.New("inner page's first key is not its low fence")
		}
		for _, k := range p.kids {
			if k.IsZero() {
				return errors.New("inner page with a null child")
			}
		}
	case kindBlockHeader:
		if len(p.used) == 0 || len(p.used) > maxFieldBytes || !p.used[0] {
			return errors.New("block header must have pages and mark itself used")
		}
		return nil
	case kindFree:
		if len(p.keys) != 0 {
			return errors.New("free page with entries")
		}
		return nil
	default:
		return fmt.Errorf("unknown kind %d", p.kind)
	}
	if len(p.keys) > maxFieldBytes {
		return errors.New("too many entries")
	}
	if p.hiInf && len(p.hi) != 0 {
		return errors.New("infinite high fence with bytes")
	}
	if !p.hiInf && bytes.Compare(p.lo, p.hi) >= 0 {
		return fmt.Errorf("fences [%q, %q) empty or reversed", p.lo, p.hi)
	}
	for i, k := range p.keys {
		if len(k) > maxFieldBytes || (p.kind == kindLeaf && len(p.vals[i]) > maxFieldBytes) {
			return errors.New("entry too long")
		}
		if !p.owns(k) {
			return fmt.Errorf("key %q outside fences [%q, %q)", k, p.lo, p.hi)
		}
		if i > 0 && bytes.Compare(p.keys[i-1], k) >= 0 {
			return fmt.Errorf("keys %q and %q out of order", p.keys[i-1], k)
		}
	}
	return nil
}

// separator returns the shortest key s with a < s <= b (a < b), used as the
// fence between two leaves so inner pages hold short keys.
func separator(a, b []byte) []byte {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return bytes.Clone(b[:n+1])
}
