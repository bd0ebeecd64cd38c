// Package xdr encodes and decodes External Data Representation (RFC 4506),
// the wire format of ONC RPC and NFSv3 (DESIGN.md §2.7, FSS §8's Orca
// presentation servers). Only what NFSv3 and MOUNT v3 use is here:
// 32- and 64-bit integers, booleans, fixed and variable opaque data and
// strings, all padded to four bytes.
//
// Invariants:
//  1. A Reader never reads past its buffer and never allocates more than
//     the bytes left in it: every length is checked against both the
//     caller's bound and the remaining input before it is used, so a
//     malformed message costs at most its own size (fuzzed: FuzzReader).
//  2. The first error sticks: after it every read returns zero values and
//     Err reports it, so a decoder checks once at the end.
//  3. A Writer appends to one growing buffer and cannot fail.
package xdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrShort says the input ended before the value did.
var ErrShort = errors.New("xdr: input too short")

// ErrTooLong says a length exceeded the caller's bound.
var ErrTooLong = errors.New("xdr: length past its bound")

// ErrBadBool says a boolean was neither 0 nor 1.
var ErrBadBool = errors.New("xdr: boolean not 0 or 1")

// Reader decodes XDR values from a byte slice.
type Reader struct {
	buf []byte
	off int
	err error
}

// NewReader returns a Reader over b (which it does not copy: slices it
// returns alias b).
func NewReader(b []byte) *Reader { return &Reader{buf: b} }

// Err returns the first error met, or nil.
func (r *Reader) Err() error { return r.err }

// Remaining returns how many bytes are left.
func (r *Reader) Remaining() int { return len(r.buf) - r.off }

// Rest returns the bytes not read yet (aliasing the input).
func (r *Reader) Rest() []byte { return r.buf[r.off:] }

// Fail records err (if none was recorded yet).
func (r *Reader) Fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *Reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.buf)-r.off {
		r.err = fmt.Errorf("%w: need %d bytes at offset %d, have %d", ErrShort, n, r.off, len(r.buf)-r.off)
		return nil
	}
	b := r.buf[r.off : r.off+n]
	r.off += n
	return b
}

// Uint32 reads an unsigned 32-bit integer.
func (r *Reader) Uint32() uint32 {
	b := r.take(4)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// Int32 reads a signed 32-bit integer.
func (r *Reader) Int32() int32 { return int32(r.Uint32()) }

// Uint64 reads an unsigned 64-bit integer (hyper).
func (r *Reader) Uint64() uint64 {
	b := r.take(8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// Bool reads a boolean; anything but 0 or 1 is an error.
func (r *Reader) Bool() bool {
	v := r.Uint32()
	if v > 1 {
		r.Fail(fmt.Errorf("%w: %d", ErrBadBool, v))
		return false
	}
	return v == 1
}

// Fixed reads n bytes of fixed-length opaque data and its padding.
func (r *Reader) Fixed(n int) []byte {
	b := r.take(n)
	r.take(pad(n))
	if r.err != nil {
		return nil
	}
	return b
}

// Opaque reads variable-length opaque data of at most max bytes.
func (r *Reader) Opaque(max int) []byte {
	n := r.Uint32()
	if r.err != nil {
		return nil
	}
	if uint64(n) > uint64(max) {
		r.Fail(fmt.Errorf("%w: %d bytes, bound %d", ErrTooLong, n, max))
		return nil
	}
	return r.Fixed(int(n))
}

// String reads a string of at most max bytes.
func (r *Reader) String(max int) string { return string(r.Opaque(max)) }

func pad(n int) int { return (4 - n%4) % 4 }

// Writer encodes XDR values into a growing buffer.
type Writer struct {
	buf []byte
}

// NewWriter returns a Writer appending to b.
func NewWriter(b []byte) *Writer { return &Writer{buf: b} }

// Bytes returns what was written.
func (w *Writer) Bytes() []byte { return w.buf }

// Len returns how many bytes were written.
func (w *Writer) Len() int { return len(w.buf) }

// Uint32 writes an unsigned 32-bit integer.
func (w *Writer) Uint32(v uint32) { w.buf = binary.BigEndian.AppendUint32(w.buf, v) }

// Int32 writes a signed 32-bit integer.
func (w *Writer) Int32(v int32) { w.Uint32(uint32(v)) }

// Uint64 writes an unsigned 64-bit integer (hyper).
func (w *Writer) Uint64(v uint64) { w.buf = binary.BigEndian.AppendUint64(w.buf, v) }

// Bool writes a boolean.
func (w *Writer) Bool(v bool) {
	if v {
		w.Uint32(1)
	} else {
		w.Uint32(0)
	}
}

// Fixed writes fixed-length opaque data and its padding.
func (w *Writer) Fixed(b []byte) {
	w.buf = append(w.buf, b...)
	w.buf = append(w.buf, make([]byte, pad(len(b)))...)
}

// Opaque writes variable-length opaque data.
func (w *Writer) Opaque(b []byte) {
	w.Uint32(uint32(len(b)))
	w.Fixed(b)
}

// String writes a string.
func (w *Writer) String(s string) {
	w.Uint32(uint32(len(s)))
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, make([]byte, pad(len(s)))...)
}

// Raw appends bytes already encoded.
func (w *Writer) Raw(b []byte) { w.buf = append(w.buf, b...) }
