// Package tuple is the order-preserving key encoding shared by the B-tree's
// users: the ordered KV API and the file-system schema (DESIGN.md §2.6, FSS
// §4 Figure 5). A tuple is a sequence of elements, each an integer
// (int64 or uint64), a string or a byte string; Pack turns it into bytes whose
// lexicographic order (bytes.Compare) is the tuple order, so a B-tree that
// sorts raw bytes sorts tuples.
//
// The tuple order compares element by element; a tuple that is a prefix of
// another sorts first. Elements of different kinds sort by kind: byte
// strings, then strings, then integers (the kind's type code decides). Two
// integers compare by value, whatever their Go type.
//
// # Encoding
//
// Each element is a type code followed by its body:
//
//	0x01 bytes    the bytes, with each 0x00 written as 0x00 0xFF, then 0x00
//	0x02 string   the UTF-8 bytes, escaped and terminated the same way
//	0x0c..0x13    a negative integer of 8..1 bytes: the big-endian one's
//	              complement of its magnitude, in as few bytes as hold it
//	0x14          zero
//	0x15..0x1c    a positive integer of 1..8 bytes, big endian, minimal
//
// The escaping keeps the terminator the smallest byte sequence, so a string
// that is a prefix of another sorts first; the integer codes grow with
// magnitude, so a longer positive integer sorts after a shorter one and a
// longer negative one before.
//
// # Invariants
//
//  1. Pack is injective and Unpack(Pack(t)) equals t up to the integer type:
//     a decoded integer is an int64 when it fits one, else a uint64.
//  2. Compare(a, b) == bytes.Compare(Pack(a), Pack(b)) for all tuples a, b.
//  3. Pack(p) is a byte prefix of Pack(t) exactly when p is a prefix of t,
//     so PrefixRange(Pack(p)) covers exactly the tuples that extend p.
//  4. Unpack refuses malformed input with an error; it never panics and
//     never accepts a non-canonical encoding (so decode-then-encode is the
//     identity on everything it accepts).
package tuple
