package xdr

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	w := NewWriter(nil)
	w.Uint32(7)
	w.Int32(-3)
	w.Uint64(1 << 40)
	w.Bool(true)
	w.Opaque([]byte("abcde"))
	w.String("xy")
	w.Fixed([]byte{1, 2, 3})
	if w.Len()%4 != 0 {
		t.Fatalf("encoding of %d bytes is not padded to 4", w.Len())
	}
	r := NewReader(w.Bytes())
	if r.Uint32() != 7 || r.Int32() != -3 || r.Uint64() != 1<<40 || !r.Bool() ||
		!bytes.Equal(r.Opaque(5), []byte("abcde")) || r.String(2) != "xy" || !bytes.Equal(r.Fixed(3), []byte{1, 2, 3}) {
		t.Fatal("values read back differ")
	}
	if r.Err() != nil || r.Remaining() != 0 {
		t.Fatalf("err %v, %d bytes left", r.Err(), r.Remaining())
	}
}

func TestBounds(t *testing.T) {
	w := NewWriter(nil)
	w.Opaque(make([]byte, 10))
	if r := NewReader(w.Bytes()); r.Opaque(9) != nil || !errors.Is(r.Err(), ErrTooLong) {
		t.Fatalf("opaque past its bound: %v", r.Err())
	}
	if r := NewReader(w.Bytes()[:8]); r.Opaque(10) != nil || !errors.Is(r.Err(), ErrShort) {
		t.Fatalf("opaque cut short: %v", r.Err())
	}
	if r := NewReader([]byte{0, 0, 0, 2}); r.Bool() || !errors.Is(r.Err(), ErrBadBool) {
		t.Fatalf("bool 2: %v", r.Err())
	}
	// The first error sticks: later reads give zero values.
	r := NewReader([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1})
	r.Opaque(16)
	if r.Uint32() != 0 || r.Err() == nil {
		t.Fatal("a read after an error returned a value")
	}
}

// FuzzReader reads arbitrary input as every kind of value: no panic, no
// read past the input, and an allocation no larger than the input.
func FuzzReader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(b)
		for r.Err() == nil && r.Remaining() > 0 {
			switch r.Remaining() % 5 {
			case 0:
				r.Uint64()
			case 1:
				if o := r.Opaque(1 << 20); len(o) > len(b) {
					t.Fatal("opaque longer than the input")
				}
			case 2:
				r.Bool()
			case 3:
				r.String(8)
			default:
				r.Uint32()
			}
		}
		if r.Remaining() < 0 {
			t.Fatal("read past the input")
		}
	})
}
