package extent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// sortedPage is a stand-in for a B-tree leaf (internal/btree page.go): an
// 80-byte header holding a count, a CRC, a length and a writer history
// that shifts by 8 bytes per write, then sorted length-prefixed entries.
func sortedPage(keys [][]byte, writer uint64, writers []uint64) []byte {
	b := make([]byte, 80)
	copy(b, "AB\x01\x01")
	binary.BigEndian.PutUint16(b[6:], uint16(len(keys)))
	for i, w := range append([]uint64{writer}, writers...) {
		if i < 4 {
			binary.BigEndian.PutUint64(b[48+8*i:], w)
		}
	}
	for _, k := range keys {
		b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint16(b, 40)
		b = append(b, bytes.Repeat(k[:1], 40)...)
	}
	binary.BigEndian.PutUint32(b[12:], uint32(len(b)))
	binary.BigEndian.PutUint32(b[8:], pageCRC(b))
	return b
}

func mustRoundTrip(t *testing.T, old, new []byte) PageDelta {
	t.Helper()
	d, ok := EncodeDelta(old, new)
	if !ok {
		t.Fatalf("no delta for %d -> %d bytes", len(old), len(new))
	}
	got, err := ApplyDelta(old, d, len(new))
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if !bytes.Equal(got, new) {
		t.Fatal("round trip differs")
	}
	return d
}

func countOps(t *testing.T, script []byte) int {
	t.Helper()
	n := 0
	for pos := 0; pos < len(script); n++ {
		h, k := binary.Uvarint(script[pos:])
		pos += k
		if h&1 == deltaOpCopy {
			_, k := binary.Uvarint(script[pos:])
			pos += k
		} else {
			pos += int(h >> 1)
		}
	}
	return n
}

// TestDeltaOfAnInsert: an insert into a sorted page (header changes, one
// entry in the middle, the tail shifted) is a handful of operations and a
// small fraction of the page.
func TestDeltaOfAnInsert(t *testing.T) {
	var keys [][]byte
	for i := range 150 {
		keys = append(keys, []byte{byte('a' + i%26), byte(i / 26), 'k', 'e', 'y'})
	}
	old := sortedPage(keys, 7, []uint64{6, 5, 4})
	for _, at := range []int{0, 1, 75, 149, 150} {
		nk := append(append(append([][]byte{}, keys[:at]...), []byte("new-key")), keys[at:]...)
		new := sortedPage(nk, 8, []uint64{7, 6, 5})
		d := mustRoundTrip(t, old, new)
		if ops := countOps(t, d.Script); ops > 10 || len(d.Script) > 160 {
			t.Errorf("insert at %d of a %d-byte page: %d ops, %d bytes", at, len(new), ops, len(d.Script))
		}
	}
	// Two inserts in one commit: the stretch between them is shifted by
	// the first.
	two := append(append(append([][]byte{}, keys[:30]...), []byte("first")), keys[30:120]...)
	two = append(append(two, []byte("second")), keys[120:]...)
	if d := mustRoundTrip(t, old, sortedPage(two, 8, []uint64{7, 6, 5})); countOps(t, d.Script) > 24 || len(d.Script) > 250 {
		t.Errorf("two inserts: %d ops, %d bytes", countOps(t, d.Script), len(d.Script))
	}
	// A split's left half with a longer header (a new fence): the kept
	// entries shifted by the fence, the rest gone.
	left := sortedPage(keys[:75], 8, []uint64{7, 6, 5})
	left = append(append(left[:80:80], []byte("\x00\x09hi-fence!")...), left[80:]...)
	if d := mustRoundTrip(t, old, left); countOps(t, d.Script) > 10 || len(d.Script) > 120 {
		t.Errorf("split's left half: %d ops, %d bytes", countOps(t, d.Script), len(d.Script))
	}
	// A delete and a same-size value change.
	del := sortedPage(append(append([][]byte{}, keys[:40]...), keys[41:]...), 8, []uint64{7, 6, 5})
	if d := mustRoundTrip(t, old, del); len(d.Script) > 100 {
		t.Errorf("delete: %d bytes", len(d.Script))
	}
	same := bytes.Clone(old)
	same[3000] ^= 1
	if d := mustRoundTrip(t, old, same); countOps(t, d.Script) != 3 {
		t.Errorf("one byte changed: %d ops", countOps(t, d.Script))
	}
	if d := mustRoundTrip(t, old, old); countOps(t, d.Script) != 1 {
		t.Errorf("no change: %d ops", countOps(t, d.Script))
	}
}

// TestDeltaFallsBack: unrelated pages, and pages too small to gain, get
// no delta.
func TestDeltaFallsBack(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a, b := make([]byte, 8192), make([]byte, 8192)
	for i := range a {
		a[i], b[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	if _, ok := EncodeDelta(a, b); ok {
		t.Error("delta between random pages")
	}
	if _, ok := EncodeDelta(nil, []byte("x")); ok {
		t.Error("delta of a one-byte page")
	}
	if _, ok := EncodeDelta(a, nil); ok {
		t.Error("delta of an empty page")
	}
	// Half of the page rewritten: just over the limit.
	c := bytes.Clone(a)
	copy(c[1000:], b[:4200])
	if _, ok := EncodeDelta(a, c); ok {
		t.Error("delta for a page rewritten by more than half")
	}
}

// TestApplyDeltaRefuses: every way a script can be wrong is an error, not
// a panic and not a page.
func TestApplyDeltaRefuses(t *testing.T) {
	base := []byte("0123456789abcdef")
	good, ok := EncodeDelta(base, []byte("0123456789abcdeX"))
	if !ok {
		// 16 bytes: a delta is not worth it; build one by hand.
		good = PageDelta{Script: []byte{15 << 1, 0, 1<<1 | 1, 'X'}, Length: 16, CRC: pageCRC([]byte("0123456789abcdeX"))}
	}
	if got, err := ApplyDelta(base, good, 16); err != nil || string(got) != "0123456789abcdeX" {
		t.Fatalf("good script: %q %v", got, err)
	}
	for name, d := range map[string]PageDelta{
		"wrong crc":        {Script: good.Script, Length: 16, CRC: good.CRC ^ 1},
		"short result":     {Script: []byte{15 << 1, 0}, Length: 16, CRC: good.CRC},
		"long result":      {Script: append(bytes.Clone(good.Script), 1<<1|1, 'Y'), Length: 16, CRC: good.CRC},
		"copy past base":   {Script: []byte{16 << 1, 1}, Length: 16, CRC: good.CRC},
		"offset past base": {Script: []byte{1 << 1, 17}, Length: 1, CRC: 0},
		"huge offset":      {Script: []byte{1 << 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, Length: 1},
		"huge length":      {Script: []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0}, Length: 16},
		"zero length op":   {Script: []byte{0, 0}, Length: 0},
		"insert past end":  {Script: []byte{5<<1 | 1, 'a'}, Length: 5},
		"truncated header": {Script: []byte{0x80}, Length: 1},
		"truncated offset": {Script: []byte{1 << 1}, Length: 1},
		"over the limit":   {Script: good.Script, Length: 17, CRC: good.CRC},
		"empty script":     {Length: 1},
	} {
		if got, err := ApplyDelta(base, d, 16); err == nil {
			t.Errorf("%s: accepted, built %q", name, got)
		} else if !errors.Is(err, errDeltaScript) {
			t.Errorf("%s: error %v does not wrap errDeltaScript", name, err)
		}
	}
	// An empty script builds the empty page (CRC-32C of nothing is 0).
	if got, err := ApplyDelta(base, PageDelta{}, 16); err != nil || len(got) != 0 {
		t.Errorf("empty page: %q %v", got, err)
	}
}

// TestDeltaRandomEdits: random edits of random pages round-trip, and
// every delta the encoder gives is at most half the new page.
func TestDeltaRandomEdits(t *testing.T) {
	seed := testseed.Seed(t)
	r := rand.New(rand.NewPCG(seed, 11))
	for range 2000 {
		old, new := randomPagePair(r)
		d, ok := EncodeDelta(old, new)
		if !ok {
			continue
		}
		if len(d.Script) > len(new)/2 {
			t.Fatalf("seed %d: a %d-byte delta for a %d-byte page", seed, len(d.Script), len(new))
		}
		got, err := ApplyDelta(old, d, len(new))
		if err != nil || !bytes.Equal(got, new) {
			t.Fatalf("seed %d: round trip: %v", seed, err)
		}
	}
}

// randomPagePair is a page and an edit of it: a few inserts, deletes and
// overwrites of random sizes.
func randomPagePair(r *rand.Rand) (old, new []byte) {
	old = make([]byte, r.IntN(4096))
	for i := range old {
		old[i] = byte(r.IntN(4)) // few symbols: many accidental runs
	}
	new = bytes.Clone(old)
	for range r.IntN(5) {
		at := 0
		if len(new) > 0 {
			at = r.IntN(len(new) + 1)
		}
		n := r.IntN(64)
		switch r.IntN(3) {
		case 0:
			lit := make([]byte, n)
			for i := range lit {
				lit[i] = byte(r.Uint32())
			}
			new = append(new[:at:at], append(lit, new[at:]...)...)
		case 1:
			new = append(new[:at:at], new[min(at+n, len(new)):]...)
		default:
			for i := at; i < min(at+n, len(new)); i++ {
				new[i] = byte(r.Uint32())
			}
		}
	}
	return old, new
}

// FuzzApplyDelta: arbitrary scripts against arbitrary bases never panic
// and never build anything but a page of the promised length and CRC;
// and the encoder's deltas between a base and any edit of it round-trip.
func FuzzApplyDelta(f *testing.F) {
	base := sortedPage([][]byte{[]byte("alpha"), []byte("beta"), []byte("gamma")}, 2, []uint64{1})
	next := sortedPage([][]byte{[]byte("alpha"), []byte("bet"), []byte("beta"), []byte("gamma")}, 3, []uint64{2, 1})
	d, _ := EncodeDelta(base, next)
	f.Add(base, d.Script, uint32(len(next)), d.CRC, next)
	f.Add([]byte("0123456789"), []byte{10 << 1, 0}, uint32(10), pageCRC([]byte("0123456789")), []byte("0123"))
	f.Add([]byte{}, []byte{0x80, 0x80}, uint32(3), uint32(0), []byte{})
	f.Add([]byte("abc"), []byte{1<<1 | 1}, uint32(1), uint32(0), []byte("abcd"))
	f.Fuzz(func(t *testing.T, base, script []byte, length, crc uint32, edit []byte) {
		got, err := ApplyDelta(base, PageDelta{Script: script, Length: length, CRC: crc}, 1<<16)
		if err == nil && (uint32(len(got)) != length || pageCRC(got) != crc) {
			t.Fatalf("accepted a script that built %d bytes with CRC %08x, promised %d and %08x", len(got), pageCRC(got), length, crc)
		}
		if len(base) > maxPageSizeBytes || len(edit) > maxPageSizeBytes {
			return
		}
		// The round trip: edit as the new page, and edit spliced into
		// base (an insert in the middle of the page).
		mid := len(base) / 2
		spliced := append(append(bytes.Clone(base[:mid]), edit...), base[mid:]...)
		for _, new := range [][]byte{edit, spliced} {
			if len(new) > maxPageSizeBytes {
				continue
			}
			d, ok := EncodeDelta(base, new)
			if !ok {
				continue
			}
			got, err := ApplyDelta(base, d, len(new))
			if err != nil || !bytes.Equal(got, new) {
				t.Fatalf("round trip of %d -> %d bytes: %v", len(base), len(new), err)
			}
		}
	})
}

// TestDeltaWritesInTheStateMachine: a delta at the slot it names writes
// the rebuilt page; a delta at a moved slot is a conflict (its base is
// stale); a delta whose script does not rebuild the promised page (a
// wrong base at the right slot, a bad CRC, a wrong length) refuses the
// whole MPSC with DELTA_MISMATCH and changes nothing.
func TestDeltaWritesInTheStateMachine(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	p, q := blk.WithPage(1), blk.WithPage(2)
	v1 := bytes.Repeat([]byte("0123456789abcdef"), 30)
	s1 := h.mustCommit(Write(p, 0, v1), Write(q, 0, []byte("other")))[0].Slot

	v2 := bytes.Clone(v1)
	copy(v2[100:], "CHANGED")
	d, ok := EncodeDelta(v1, v2)
	if !ok {
		t.Fatal("no delta")
	}
	s2 := h.mustCommit(WriteDelta(p, s1, d))[0].Slot
	if pg, _ := h.read(p); !bytes.Equal(pg.Data, v2) || pg.Slot != s2 {
		t.Fatalf("after the delta: slot %d (want %d), page equal %v", pg.Slot, s2, bytes.Equal(pg.Data, v2))
	}

	// Stale base: the same delta again names s1, which moved.
	if res := h.commit(WriteDelta(p, s1, d)); res.Code != pb.Code_CODE_CONFLICT {
		t.Fatalf("delta at a moved slot: %v %s", res.Code, res.Message)
	}

	// The right slot, but a script made against another base (what a
	// client whose cached bytes were wrong would send): the CRC of the
	// rebuilt page differs.
	wrongBase := bytes.Clone(v2)
	wrongBase[300] ^= 0xff
	v3 := bytes.Clone(wrongBase)
	copy(v3[200:], "AGAIN")
	bad, ok := EncodeDelta(wrongBase, v3)
	if !ok {
		t.Fatal("no delta")
	}
	refusals := h.sm.Stats().DeltaMismatches
	before := h.kv.Clone()
	for name, el := range map[string]Element{
		"wrong base":   WriteDelta(p, s2, bad),
		"bad crc":      WriteDelta(p, s2, PageDelta{Script: d.Script, Length: d.Length, CRC: d.CRC ^ 1}),
		"wrong length": WriteDelta(p, s2, PageDelta{Script: d.Script, Length: d.Length + 1, CRC: d.CRC}),
	} {
		// With a good write of another page beside it: all or nothing.
		res := h.commit(Write(q, s1, []byte("must not land")), el)
		if res.Code != pb.Code_CODE_DELTA_MISMATCH {
			t.Fatalf("%s: %v %s", name, res.Code, res.Message)
		}
		if !errors.Is(&Error{Kind: kindOf(res.Code)}, ErrDeltaMismatch) || !errors.Is(&Error{Kind: kindOf(res.Code)}, ErrInvalid) {
			t.Fatalf("%s: code %v is not an ErrDeltaMismatch and an ErrInvalid", name, res.Code)
		}
	}
	if got := h.sm.Stats().DeltaMismatches - refusals; got != 3 {
		t.Errorf("DeltaMismatches counted %d, want 3", got)
	}
	if !h.kv.Equal(before) {
		t.Fatalf("a refused delta changed the state:\n%s\nwas\n%s", h.kv.Dump(), before.Dump())
	}
	if pg, _ := h.read(q); string(pg.Data) != "other" {
		t.Fatalf("page q is %q", pg.Data)
	}

	// Slot 0 names the empty page: a delta of pure inserts builds a
	// fresh page; after a free and a reallocation, the same.
	fresh := bytes.Repeat([]byte{'z'}, 100)
	lit := PageDelta{Script: append(binary.AppendUvarint(nil, 100<<1|deltaOpInsert), fresh...), Length: 100, CRC: pageCRC(fresh)}
	h.mustCommit(WriteDelta(blk.WithPage(3), 0, lit))
	h.mustCommit(Free(blk))
	again := h.mustCommit(Allocate(testExtent, 7))[0].Block
	if again.Page != blk.Page || again.Generation == blk.Generation {
		t.Fatalf("reallocated %v after %v", again, blk)
	}
	// A delta copying from the old generation's page finds no base.
	copyOld := PageDelta{Script: []byte{10 << 1, 0}, Length: 10, CRC: pageCRC(v2[:10])}
	if res := h.commit(WriteDelta(again.WithPage(1), 0, copyOld)); res.Code != pb.Code_CODE_DELTA_MISMATCH {
		t.Fatalf("delta against a freed page's old bytes: %v %s", res.Code, res.Message)
	}
	// Free and delta in one MPSC: the base is the emptied page.
	h.mustCommit(Write(again.WithPage(1), 0, v1))
	if res := h.commit(Free(again), Allocate(testExtent, 7), WriteDelta(again.WithPage(1), 0, copyOld)); res.Code == pb.Code_CODE_OK {
		t.Fatalf("delta against a page freed earlier in its MPSC: %v", res.Code)
	}
}

// TestDeltaInCrossExtentPrepare: a prepared part keeps the rebuilt page
// in its record, not the script, and decide-and-release writes it; a
// mismatch refuses the prepare.
func TestDeltaInCrossExtentPrepare(t *testing.T) {
	h := newSMHarness(t, testExtent, smallGeometry())
	blk := h.mustCommit(Allocate(testExtent, 7))[0].Block
	p := blk.WithPage(1)
	v1 := bytes.Repeat([]byte("page bytes, "), 40)
	s1 := h.mustCommit(Write(p, 0, v1))[0].Slot
	v2 := bytes.Clone(v1)
	v2 = append(v2[:200:200], append([]byte("INSERTED"), v2[200:]...)...)
	d, ok := EncodeDelta(v1, v2)
	if !ok {
		t.Fatal("no delta")
	}
	expiry := h.now + 10_000

	bad := PageDelta{Script: d.Script, Length: d.Length, CRC: d.CRC + 1}
	if res := h.step(pb.StepKind_STEP_KIND_PREPARE, 77, 0, testExtent+1, expiry, WriteDelta(p, s1, bad)); res.Code != pb.Code_CODE_DELTA_MISMATCH {
		t.Fatalf("prepare with a bad delta: %v %s", res.Code, res.Message)
	}
	if res := h.step(pb.StepKind_STEP_KIND_PREPARE, 78, 0, testExtent+1, expiry, WriteDelta(p, s1, d)); res.Code != pb.Code_CODE_OK {
		t.Fatalf("prepare: %v %s", res.Code, res.Message)
	}
	v, err := h.kv.Get(txnKey(78))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := DecodeTxnRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	w, ok := rec.Elements[0].Op.(*pb.Element_Write)
	if !ok || !bytes.Equal(w.Write.Data, v2) || w.Write.ExpectedSlot != s1 {
		t.Fatalf("the record keeps %T, not the rebuilt page", rec.Elements[0].Op)
	}
	res := h.step(pb.StepKind_STEP_KIND_DECIDE_RELEASE, 78, 0, 0, expiry)
	if res.Code != pb.Code_CODE_OK {
		t.Fatalf("decide: %v %s", res.Code, res.Message)
	}
	if pg, _ := h.read(p); !bytes.Equal(pg.Data, v2) || pg.Slot != h.index {
		t.Fatalf("after decide: slot %d, page equal %v", pg.Slot, bytes.Equal(pg.Data, v2))
	}
	// A record carrying a delta is refused by the decoder.
	rec.Elements[0] = WriteDelta(p, s1, d).toProto()
	b, _ := encodeTxnRecord(rec)
	if _, err := DecodeTxnRecord(b); err == nil {
		t.Fatal("a record with a page delta decoded")
	}
}

// BenchmarkEncodeDelta: an insert into an 8 KiB sorted page.
func BenchmarkEncodeDelta(b *testing.B) {
	var keys [][]byte
	for i := range 150 {
		keys = append(keys, []byte{byte('a' + i%26), byte(i / 26), 'k', 'e', 'y'})
	}
	old := sortedPage(keys, 7, []uint64{6, 5, 4})
	new := sortedPage(append(append(append([][]byte{}, keys[:75]...), []byte("new-key")), keys[75:]...), 8, []uint64{7, 6, 5})
	b.SetBytes(int64(len(new)))
	for b.Loop() {
		d, _ := EncodeDelta(old, new)
		if _, err := ApplyDelta(old, d, len(new)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDeltaTenancy: a tenant's page delta is held to the tenancy rule of
// every write (tenancy.go): only its own pages.
func TestDeltaTenancy(t *testing.T) {
	own := uint64(77)
	d := PageDelta{Script: []byte{1<<1 | deltaOpInsert, 'x'}, Length: 1, CRC: pageCRC([]byte("x"))}
	mine := WriteDelta(Pointer{Extent: testExtent, Page: 1, Generation: 1, Tenant: own}, 5, d).toProto()
	theirs := WriteDelta(Pointer{Extent: testExtent, Page: 1, Generation: 1, Tenant: own + 1}, 5, d).toProto()
	if err := ownElements([]*pb.Element{mine}, own, "t"); err != nil {
		t.Errorf("own page refused: %v", err)
	}
	if err := ownElements([]*pb.Element{mine, theirs}, own, "t"); err == nil {
		t.Error("a delta to another tenant's page allowed")
	}
}
