package sunrpc

import (
	"bytes"
	"errors"
	"testing"
)

func TestCallRoundTrip(t *testing.T) {
	cred := SysCred{Stamp: 1, MachineName: "m", Uid: 1000, Gid: 100, Gids: []uint32{4, 5}}
	msg := EncodeCall(Call{Xid: 9, Prog: 100003, Vers: 3, Proc: 1, Cred: Auth{Flavor: AuthSys, Body: EncodeSysCred(cred)}, Args: []byte{0, 0, 0, 4}})
	c, err := ParseCall(msg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Xid != 9 || c.Prog != 100003 || c.Vers != 3 || c.Proc != 1 || c.Sys == nil || c.Sys.Uid != 1000 || len(c.Sys.Gids) != 2 || !bytes.Equal(c.Args, []byte{0, 0, 0, 4}) {
		t.Fatalf("parsed %+v", c)
	}
}

func TestRecords(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteRecord(&buf, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	// Two fragments make one record.
	buf.Write([]byte{0, 0, 0, 2, 'a', 'b', 0x80, 0, 0, 1, 'c'})
	if r, err := ReadRecord(&buf, 100); err != nil || string(r) != "hello" {
		t.Fatalf("%q %v", r, err)
	}
	if r, err := ReadRecord(&buf, 100); err != nil || string(r) != "abc" {
		t.Fatalf("%q %v", r, err)
	}
	// A record past the bound is refused before it is read.
	buf.Write([]byte{0x80, 0, 1, 0})
	if _, err := ReadRecord(&buf, 100); !errors.Is(err, ErrRecordTooLong) {
		t.Fatalf("long record: %v", err)
	}
}

// FuzzParseCall parses arbitrary messages as calls: no panic, and a
// message that parses re-encodes to one that parses the same (padding
// bytes aside, which a reader ignores).
func FuzzParseCall(f *testing.F) {
	f.Add(EncodeCall(Call{Xid: 1, Prog: 100003, Vers: 3, Proc: 0}))
	f.Add(EncodeCall(Call{Xid: 2, Prog: 100005, Vers: 3, Proc: 1, Cred: Auth{Flavor: AuthSys, Body: EncodeSysCred(SysCred{MachineName: "h", Gids: []uint32{1}})}, Args: []byte{0, 0, 0, 1, '/', 0, 0, 0}}))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, msg []byte) {
		c, err := ParseCall(msg)
		if err != nil {
			return
		}
		again, err := ParseCall(EncodeCall(c))
		if err != nil || again.Xid != c.Xid || again.Prog != c.Prog || again.Vers != c.Vers || again.Proc != c.Proc ||
			!bytes.Equal(again.Cred.Body, c.Cred.Body) || !bytes.Equal(again.Args, c.Args) || (again.Sys == nil) != (c.Sys == nil) {
			t.Fatalf("re-encoded call differs: %+v, %+v (%v)", again, c, err)
		}
	})
}

// FuzzReadRecord reads arbitrary streams as records: no panic, nothing
// longer than the bound.
func FuzzReadRecord(f *testing.F) {
	f.Add([]byte{0x80, 0, 0, 1, 'x'})
	f.Add([]byte{0, 0, 0, 1, 'x', 0x80, 0, 0, 0})
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			rec, err := ReadRecord(r, 64)
			if err != nil {
				return
			}
			if len(rec) > 64 {
				t.Fatalf("record of %d bytes past the bound", len(rec))
			}
		}
	})
}
