package btree

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
)

func samplePages() []*page {
	ref := PageRef{Extent: 1000, Page: 9, Generation: 3, Tenant: 7}
	return []*page{
		{kind: kindLeaf, lo: []byte{}, hi: []byte{}, hiInf: true},
		{kind: kindLeaf, lo: []byte("a"), hi: []byte("m"), writers: [writerHistory]uint64{42, 41, 0, 7}, next: ref,
			keys: [][]byte{[]byte("a"), []byte("b\x00"), []byte("l")}, vals: [][]byte{{}, []byte("v"), bytes.Repeat([]byte{0xff}, 100)}},
		{kind: kindInner, height: 2, lo: []byte("c"), hi: []byte("x"), keys: [][]byte{[]byte("c"), []byte("f")}, kids: []PageRef{ref, {Extent: 1001, Page: 1, Generation: 1, Tenant: 7}}},
		func() *page { h := newBlockHeader(32); h.used[5] = true; h.used[31] = true; return h }(),
		{kind: kindFree, lo: []byte{}, hi: []byte{}, hiInf: true},
	}
}

func TestPageRoundTrip(t *testing.T) {
	for _, p := range samplePages() {
		b := p.encode()
		if len(b) != p.size() {
			t.Errorf("kind %d: encoded %d bytes, size() says %d", p.kind, len(b), p.size())
		}
		q, err := decodePage(b)
		if err != nil {
			t.Fatalf("kind %d: %v", p.kind, err)
		}
		if !reflect.DeepEqual(normalize(p), normalize(q)) {
			t.Errorf("round trip:\n got %+v\nwant %+v", q, p)
		}
		// Bytes beyond the encoded length (a page read whole) are ignored.
		if _, err := decodePage(append(b, 0, 0, 0)); err != nil {
			t.Errorf("padding refused: %v", err)
		}
	}
}

// normalize makes nil and empty slices compare equal.
func normalize(p *page) *page {
	q := p.clone()
	fix := func(b []byte) []byte {
		if b == nil {
			return []byte{}
		}
		return b
	}
	q.lo, q.hi = fix(q.lo), fix(q.hi)
	for i := range q.keys {
		q.keys[i] = fix(q.keys[i])
	}
	for i := range q.vals {
		q.vals[i] = fix(q.vals[i])
	}
	if len(q.keys) == 0 {
		q.keys = nil
	}
	if len(q.vals) == 0 {
		q.vals = nil
	}
	if len(q.kids) == 0 {
		q.kids = nil
	}
	if len(q.used) == 0 {
		q.used = nil
	}
	return q
}

func TestDecodeRefusesDamage(t *testing.T) {
	good := samplePages()[1].encode()
	cases := map[string][]byte{
		"empty":     {},
		"truncated": good[:len(good)-1],
		"bad magic": append([]byte{'X'}, good[1:]...),
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)-2] ^= 1
	cases["bit flip"] = flipped
	for name, b := range cases {
		if _, err := decodePage(b); !errors.Is(err, errBadPage) {
			t.Errorf("%s: %v, want errBadPage", name, err)
		}
	}
}

func TestValidateRefusesBrokenPages(t *testing.T) {
	bad := []*page{
		{kind: kindLeaf, height: 1, lo: []byte{}, hiInf: true},
		{kind: kindLeaf, lo: []byte("b"), hi: []byte("a")},
		{kind: kindLeaf, lo: []byte("a"), hi: []byte("c"), keys: [][]byte{[]byte("d")}, vals: [][]byte{{}}},
		{kind: kindLeaf, lo: []byte{}, hiInf: true, keys: [][]byte{[]byte("b"), []byte("a")}, vals: [][]byte{{}, {}}},
		{kind: kindInner, height: 1, lo: []byte("a"), hiInf: true, keys: [][]byte{[]byte("b")}, kids: []PageRef{{Extent: 1}}},
		{kind: kindInner, height: 1, lo: []byte{}, hiInf: true, keys: [][]byte{{}}, kids: []PageRef{{}}},
	}
	for i, p := range bad {
		if err := p.validate(); err == nil {
			t.Errorf("case %d: %+v validated", i, p)
		}
	}
}

func TestSeparatorIsShortestBetween(t *testing.T) {
	cases := []struct{ a, b, want string }{
		{"abc", "abd", "abd"},
		{"abc", "abzzz", "abz"},
		{"ab", "abc", "abc"},
		{"", "x", "x"},
		{"a\xff", "b", "b"},
	}
	for _, c := range cases {
		got := separator([]byte(c.a), []byte(c.b))
		if string(got) != c.want {
			t.Errorf("separator(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
		if bytes.Compare(got, []byte(c.a)) <= 0 || bytes.Compare(got, []byte(c.b)) > 0 {
			t.Errorf("separator(%q, %q) = %q not in (a, b]", c.a, c.b, got)
		}
	}
}

// FuzzDecodePage: decodePage never panics, and what it accepts validates
// and re-encodes to the same page.
func FuzzDecodePage(f *testing.F) {
	for _, p := range samplePages() {
		f.Add(p.encode())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Try the input as is and with its length and CRC fields made
		// right, so the fuzzer reaches the parser behind the checksum.
		checkDecoded(t, b)
		checkDecoded(t, withValidCRC(b))
	})
}

func withValidCRC(b []byte) []byte {
	if len(b) < pageHeaderBytes {
		return b
	}
	b = bytes.Clone(b)
	binary.BigEndian.PutUint32(b[offLength:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[offCRC:], 0)
	binary.BigEndian.PutUint32(b[offCRC:], crc32.Checksum(b, crcTable))
	return b
}

func checkDecoded(t *testing.T, b []byte) {
	t.Helper()
	p, err := decodePage(b)
	if err != nil {
		return
	}
	if err := p.validate(); err != nil {
		t.Fatalf("decoded page does not validate: %v", err)
	}
	q, err := decodePage(p.encode())
	if err != nil {
		t.Fatalf("re-encoded page does not decode: %v", err)
	}
	if !reflect.DeepEqual(normalize(p), normalize(q)) {
		t.Fatalf("re-encoding changed the page")
	}
}
