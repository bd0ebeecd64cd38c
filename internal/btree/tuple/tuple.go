package tuple

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
)

// Type codes (see the package doc). Their order is the order of kinds.
const (
	codeBytes   byte = 0x01
	codeString  byte = 0x02
	codeIntNeg  byte = 0x0c // 8-byte negative; 0x13 is 1-byte negative
	codeIntZero byte = 0x14
	codeIntPos8 byte = 0x1c // 8-byte positive; 0x15 is 1-byte positive

	escapeByte byte = 0xff
)

// ErrMalformed is wrapped by every Unpack error.
var ErrMalformed = errors.New("tuple: malformed encoding")

// Tuple is a sequence of elements: int64, uint64, string or []byte (Pack
// also takes int, int32, uint and uint32, which it packs as integers).
type Tuple []any

// Pack encodes t. It fails only on an element of an unsupported type.
func Pack(t Tuple) ([]byte, error) {
	return Append(nil, t...)
}

// MustPack is Pack for tuples whose element types are fixed in the code;
// it panics on an unsupported type, which is a programming error.
func MustPack(t Tuple) []byte {
	b, err := Pack(t)
	if err != nil {
		panic(err)
	}
	return b
}

// Append appends the encoding of elems to dst.
func Append(dst []byte, elems ...any) ([]byte, error) {
	for i, e := range elems {
		switch v := e.(type) {
		case []byte:
			dst = AppendBytes(dst, v)
		case string:
			dst = AppendString(dst, v)
		case int64:
			dst = AppendInt(dst, v)
		case int:
			dst = AppendInt(dst, int64(v))
		case int32:
			dst = AppendInt(dst, int64(v))
		case uint64:
			dst = AppendUint(dst, v)
		case uint:
			dst = AppendUint(dst, uint64(v))
		case uint32:
			dst = AppendUint(dst, uint64(v))
		default:
			return nil, fmt.Errorf("tuple: element %d has unsupported type %T", i, e)
		}
	}
	return dst, nil
}

// AppendBytes appends a byte-string element.
func AppendBytes(dst, b []byte) []byte {
	dst = append(dst, codeBytes)
	return appendEscaped(dst, b)
}

// AppendString appends a string element.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, codeString)
	for i := 0; i < len(s); i++ {
		dst = append(dst, s[i])
		if s[i] == 0 {
			dst = append(dst, escapeByte)
		}
	}
	return append(dst, 0)
}

func appendEscaped(dst, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, c)
		if c == 0 {
			dst = append(dst, escapeByte)
		}
	}
	return append(dst, 0)
}

// AppendUint appends a non-negative integer element.
func AppendUint(dst []byte, v uint64) []byte {
	if v == 0 {
		return append(dst, codeIntZero)
	}
	n := byteLen(v)
	dst = append(dst, codeIntZero+byte(n))
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(v>>(8*i)))
	}
	return dst
}

// AppendInt appends an integer element.
func AppendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return AppendUint(dst, uint64(v))
	}
	mag := uint64(-(v + 1)) + 1 // |v| without overflowing at MinInt64
	n := byteLen(mag)
	dst = append(dst, codeIntZero-byte(n))
	comp := ^mag
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(comp>>(8*i)))
	}
	return dst
}

// byteLen is the number of bytes that hold v > 0.
func byteLen(v uint64) int {
	n := 0
	for v > 0 {
		n++
		v >>= 8
	}
	return n
}

// Unpack decodes a packed tuple. It refuses trailing garbage, unknown type
// codes, unterminated strings, non-minimal integers and integers outside
// [math.MinInt64, math.MaxUint64].
func Unpack(b []byte) (Tuple, error) {
	var t Tuple
	for len(b) > 0 {
		e, rest, err := decodeElement(b)
		if err != nil {
			return nil, fmt.Errorf("%w: element %d: %v", ErrMalformed, len(t), err)
		}
		t = append(t, e)
		b = rest
	}
	return t, nil
}

// Next decodes the first element of a packed tuple and returns it with
// the rest of b: a reader that needs only a key's leading elements decodes
// no more. It fails on empty input and on what Unpack refuses.
func Next(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("%w: no element", ErrMalformed)
	}
	e, rest, err := decodeElement(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return e, rest, nil
}

func decodeElement(b []byte) (any, []byte, error) {
	code := b[0]
	b = b[1:]
	switch {
	case code == codeBytes:
		body, rest, err := unescape(b)
		return body, rest, err
	case code == codeString:
		body, rest, err := unescape(b)
		return string(body), rest, err
	case code == codeIntZero:
		return int64(0), b, nil
	case code > codeIntZero && code <= codeIntPos8:
		n := int(code - codeIntZero)
		if len(b) < n {
			return nil, nil, fmt.Errorf("integer needs %d bytes, has %d", n, len(b))
		}
		if b[0] == 0 {
			return nil, nil, errors.New("integer is not minimal")
		}
		var v uint64
		for _, c := range b[:n] {
			v = v<<8 | uint64(c)
		}
		if v <= math.MaxInt64 {
			return int64(v), b[n:], nil
		}
		return v, b[n:], nil
	case code >= codeIntNeg && code < codeIntZero:
		n := int(codeIntZero - code)
		if len(b) < n {
			return nil, nil, fmt.Errorf("integer needs %d bytes, has %d", n, len(b))
		}
		if b[0] == 0xff {
			return nil, nil, errors.New("integer is not minimal")
		}
		var comp uint64
		for _, c := range b[:n] {
			comp = comp<<8 | uint64(c)
		}
		// Only the low n bytes of ^mag were stored.
		mag := ^comp
		if n < 8 {
			mag &= 1<<(8*n) - 1
		}
		if mag > 1<<63 {
			return nil, nil, errors.New("negative integer below MinInt64")
		}
		return -int64(mag-1) - 1, b[n:], nil
	default:
		return nil, nil, fmt.Errorf("unknown type code %#02x", code)
	}
}

// unescape reads an escaped, terminated body.
func unescape(b []byte) (body, rest []byte, err error) {
	out := []byte{}
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			out = append(out, b[i])
			continue
		}
		if i+1 < len(b) && b[i+1] == escapeByte {
			out = append(out, 0)
			i++
			continue
		}
		return out, b[i+1:], nil
	}
	return nil, nil, errors.New("unterminated string")
}

// Compare orders tuples as their encodings sort (invariant 2), without
// encoding them. It panics on an element of an unsupported type.
func Compare(a, b Tuple) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareElements(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// kind ranks element kinds in encoding order.
func kind(e any) int {
	switch e.(type) {
	case []byte:
		return 0
	case string:
		return 1
	case int, int32, int64, uint, uint32, uint64:
		return 2
	}
	panic(fmt.Sprintf("tuple: unsupported element type %T", e))
}

func compareElements(x, y any) int {
	kx, ky := kind(x), kind(y)
	if kx != ky {
		return cmp.Compare(kx, ky)
	}
	switch kx {
	case 0:
		return bytes.Compare(x.([]byte), y.([]byte))
	case 1:
		return cmp.Compare(x.(string), y.(string))
	}
	xneg, xmag := integer(x)
	yneg, ymag := integer(y)
	switch {
	case xneg && !yneg:
		return -1
	case !xneg && yneg:
		return 1
	case xneg:
		return cmp.Compare(ymag, xmag)
	}
	return cmp.Compare(xmag, ymag)
}

// integer splits an integer element into sign and magnitude.
func integer(e any) (neg bool, mag uint64) {
	var v int64
	switch n := e.(type) {
	case uint64:
		return false, n
	case uint:
		return false, uint64(n)
	case uint32:
		return false, uint64(n)
	case int:
		v = int64(n)
	case int32:
		v = int64(n)
	case int64:
		v = n
	}
	if v < 0 {
		return true, uint64(-(v + 1)) + 1
	}
	return false, uint64(v)
}

// PrefixEnd returns the smallest key greater than every key that starts
// with prefix, or nil when there is none (prefix is empty or all 0xff).
func PrefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for len(end) > 0 {
		if end[len(end)-1] != 0xff {
			end[len(end)-1]++
			return end
		}
		end = end[:len(end)-1]
	}
	return nil
}

// PrefixRange returns [begin, end) holding exactly the keys that start with
// prefix; end is nil when the range runs to the end of the key space.
func PrefixRange(prefix []byte) (begin, end []byte) {
	return bytes.Clone(prefix), PrefixEnd(prefix)
}
