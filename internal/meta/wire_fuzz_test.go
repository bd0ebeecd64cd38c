package meta

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Fuzz targets for the decoders of wire.go: what a peer sends (a metadata
// server's replies, the directory's delegation map) never panics a
// decoder, and what decodes re-encodes to something that decodes to the
// same value. Run one with
//
//	go test -run '^$' -fuzz FuzzAttrFromPB -fuzztime 20s ./internal/meta/

// FuzzGUIDFromPB: a blob id is empty (no blob) or 16 bytes; anything
// else is an error.
func FuzzGUIDFromPB(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Add(bytes.Repeat([]byte{0xab}, 16))
	f.Add(bytes.Repeat([]byte{1}, 15))
	f.Add(bytes.Repeat([]byte{1}, 17))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := guidFromPB(b)
		switch {
		case len(b) == 0:
			if err != nil || !g.IsZero() {
				t.Fatalf("empty blob id: %v, %v", g, err)
			}
		case len(b) == len(g):
			if err != nil || !bytes.Equal(g[:], b) {
				t.Fatalf("blob id %x: %v, %v", b, g, err)
			}
		default:
			if err == nil {
				t.Fatalf("blob id of %d bytes decoded to %v", len(b), g)
			}
		}
	})
}

// FuzzAttrFromPB: any Attr message decodes or is refused; what decodes
// is encoded (attrToPB) and decoded again to the same attributes.
func FuzzAttrFromPB(f *testing.F) {
	at := time.Unix(1700000000, 123456789)
	blob := fs.GUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, a := range []fs.Attr{
		{},
		{Handle: fs.RootHandle, Ino: 1, Mode: 0o40755, Nlink: 2, Atime: at, Mtime: at, Ctime: at, Btime: at},
		{Handle: fs.Handle{D: 7, C: 9}, Ino: 99, Mode: 0o100644, Nlink: 1, Uid: 1000, Gid: 1000, Size: 1 << 40, Blocks: 8,
			Atime: at, Mtime: at.Add(time.Second), Ctime: at.Add(2 * time.Second), Btime: at, DataGen: 5, Blob: blob, BlobExists: true},
		{Handle: fs.Handle{D: math.MaxUint64, C: math.MaxUint64}, Mode: 0o20600, Rdev: 0x0801,
			Atime: time.Unix(0, math.MinInt64), Mtime: time.Unix(0, math.MaxInt64)},
	} {
		b, err := proto.Marshal(attrToPB(a))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	bad, _ := proto.Marshal(&pb.Attr{Blob: []byte{1, 2, 3}})
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &pb.Attr{}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		a, err := attrFromPB(m)
		if err != nil {
			if n := len(m.GetBlob()); n == 0 || n == len(fs.GUID{}) {
				t.Fatalf("attributes with a blob id of %d bytes refused: %v", n, err)
			}
			return
		}
		if n := len(m.GetBlob()); n != 0 && n != len(fs.GUID{}) {
			t.Fatalf("attributes with a blob id of %d bytes decoded", n)
		}
		// The decoded value is what the message says.
		if a.Handle != (fs.Handle{D: m.GetHandle().GetD(), C: m.GetHandle().GetC()}) || a.Size != m.GetSize() ||
			a.Mode != m.GetMode() || a.Mtime.UnixNano() != m.GetMtimeNs() || a.BlobExists != m.GetBlobExists() {
			t.Fatalf("%v decoded to %+v", m, a)
		}
		again, err := attrFromPB(attrToPB(a))
		if err != nil {
			t.Fatalf("re-encoded %+v does not decode: %v", a, err)
		}
		if !attrsEqual(a, again) {
			t.Fatalf("round trip: %+v became %+v", a, again)
		}
	})
}

func attrsEqual(a, b fs.Attr) bool {
	times := func(x fs.Attr) [4]int64 {
		return [4]int64{x.Atime.UnixNano(), x.Mtime.UnixNano(), x.Ctime.UnixNano(), x.Btime.UnixNano()}
	}
	ta, tb := times(a), times(b)
	a.Atime, a.Mtime, a.Ctime, a.Btime = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	b.Atime, b.Mtime, b.Ctime, b.Btime = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b && ta == tb
}

// TestAttrFromPBNil: a reply without attributes is an error, not a panic.
func TestAttrFromPBNil(t *testing.T) {
	if _, err := attrFromPB(nil); err == nil {
		t.Fatal("no attributes decoded")
	}
}

// FuzzHandleBlockFromPB: handles and block references carry no invariant
// of their own; any message decodes and round-trips.
func FuzzHandleBlockFromPB(f *testing.F) {
	for _, m := range []proto.Message{
		handleToPB(fs.RootHandle), handleToPB(fs.Handle{D: 1 << 40, C: 3}),
		blockToPB(fs.BlockRef{}), blockToPB(fs.BlockRef{Found: true, S: 4, Tract: 17, Length: 65536}),
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h := &pb.Handle{}
		if proto.Unmarshal(b, h) == nil {
			x := handleFromPB(h)
			if y := handleFromPB(handleToPB(x)); x != y || x.D != h.GetD() || x.C != h.GetC() {
				t.Fatalf("handle %v: %v, then %v", h, x, y)
			}
		}
		r := &pb.BlockRef{}
		if proto.Unmarshal(b, r) == nil {
			x := blockFromPB(r)
			if y := blockFromPB(blockToPB(x)); !reflect.DeepEqual(x, y) || x.Tract != r.GetTract() || x.Length != r.GetLength() || !bytes.Equal(x.Inline, r.GetInline()) {
				t.Fatalf("block %v: %+v, then %+v", r, x, y)
			}
		}
	})
}

// FuzzErrorFromPB: any Error message decodes to an error that carries a
// non-zero errno (the message's, EIO for none) and its text, and which
// the server encodes again with the same errno and text.
func FuzzErrorFromPB(f *testing.F) {
	for _, err := range []error{
		errNotOwner, fs.ErrAmbiguousCommit, errRetry, fs.ErrRaced, invalidf("bad %d", 1),
		syscall.ENOENT, errors.New("anything"),
	} {
		b, merr := proto.Marshal(errorToPB(err))
		if merr != nil {
			f.Fatal(merr)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &pb.Error{}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		err := errorFromPB(m)
		if err == nil {
			t.Fatal("an Error message decoded to success")
		}
		var re *RemoteError
		if !errors.As(err, &re) {
			t.Fatalf("%v decoded to %T", m, err)
		}
		want := syscall.Errno(m.GetErrno())
		if want == 0 {
			want = syscall.EIO
		}
		if re.Errno != want || fs.Errno(err) != want || !errors.Is(err, want) {
			t.Fatalf("%v decoded to errno %d (fs.Errno %d), want %d", m, re.Errno, fs.Errno(err), want)
		}
		if re.Kind != m.GetKind() || err.Error() != m.GetMessage() {
			t.Fatalf("%v decoded to kind %v, message %q", m, re.Kind, err.Error())
		}
		if errors.Is(err, fs.ErrRaced) != (m.GetKind() == pb.Error_RACED) {
			t.Fatalf("%v: errors.Is(ErrRaced) = %v", m, errors.Is(err, fs.ErrRaced))
		}
		// A server that passes a peer's error on keeps its text, and its
		// errno unless it is a raced block commit (told apart by kind,
		// with EAGAIN).
		again := errorToPB(err)
		if m.GetKind() == pb.Error_RACED {
			want = syscall.EAGAIN
		}
		if again == nil || syscall.Errno(again.GetErrno()) != want || again.GetMessage() != m.GetMessage() ||
			(again.GetKind() == pb.Error_RACED) != (m.GetKind() == pb.Error_RACED) {
			t.Fatalf("%v re-encoded to %v", m, again)
		}
		if back := errorFromPB(again); fs.Errno(back) != want || back.Error() != m.GetMessage() {
			t.Fatalf("%v re-encoded and decoded to %v (errno %d)", m, back, fs.Errno(back))
		}
	})
}

// FuzzRangeFromKeys: a delegation's keys decode to a non-empty range of
// directory ids, or are refused; what decodes encodes back to the same
// keys (an empty end: to the end of the ids).
func FuzzRangeFromKeys(f *testing.F) {
	for _, r := range []fs.DRange{fs.AllD, {Lo: 0, Hi: 1}, {Lo: 1 << 32, Hi: 1 << 33}, {Lo: math.MaxUint64 - 1, Hi: math.MaxUint64}, {Lo: 5}} {
		s, e := rangeToKeys(r)
		f.Add(s, e)
	}
	f.Add([]byte{1, 2, 3}, []byte{})
	f.Add(make([]byte, 8), make([]byte, 8))
	f.Fuzz(func(t *testing.T, start, end []byte) {
		r, err := rangeFromKeys(start, end)
		if err != nil {
			return
		}
		if len(start) != 8 || (len(end) != 0 && len(end) != 8) {
			t.Fatalf("[%x, %x) decoded to %v", start, end, r)
		}
		if r.Hi != 0 && r.Hi <= r.Lo {
			t.Fatalf("[%x, %x) decoded to the empty range %v", start, end, r)
		}
		s2, e2 := rangeToKeys(r)
		if !bytes.Equal(s2, start) || !bytes.Equal(e2, end) {
			t.Fatalf("[%x, %x) -> %v -> [%x, %x)", start, end, r, s2, e2)
		}
		r2, err := rangeFromKeys(s2, e2)
		if err != nil || r2 != r {
			t.Fatalf("%v re-encoded decodes to %v, %v", r, r2, err)
		}
	})
}

// FuzzTableRecords: the table records an owner reads from the tree
// (records.go; not a peer's, but bytes of the store) never panic their
// decoders, and round-trip.
func FuzzTableRecords(f *testing.F) {
	f.Add((&tableHeader{Table: 1, Epoch: 2, Owner: 3, Lo: 0, Hi: 0, W: 1}).encode())
	f.Add((&tableHeader{Table: math.MaxUint64, Epoch: 9, Owner: 1, Lo: 10, Hi: 20, W: 4, Frozen: 3}).encode())
	f.Add((&replyRecord{Seq: 42}).encode())
	f.Add(replyKey(7, 0, 99, 3))
	f.Add([]byte{})
	f.Add([]byte{recordFormat, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := decodeHeader(b); err == nil {
			if h2, err := decodeHeader(h.encode()); err != nil || *h2 != *h {
				t.Fatalf("header %+v round-trips to %+v, %v", *h, h2, err)
			}
		}
		if r, err := decodeReply(b); err == nil {
			if r2, err := decodeReply(r.encode()); err != nil || *r2 != *r {
				t.Fatalf("reply %+v round-trips to %+v, %v", *r, r2, err)
			}
		}
		if s, l, err := replyKeySlot(b); err == nil {
			if s2, l2, err := replyKeySlot(replyKey(7, 0, s, l)); err != nil || s2 != s || l2 != l {
				t.Fatalf("reply key (%d, %d) round-trips to (%d, %d), %v", s, l, s2, l2, err)
			}
		}
	})
}
