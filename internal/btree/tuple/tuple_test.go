package tuple

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
)

// canonical maps integers to the type Unpack returns (invariant 1).
func canonical(t Tuple) Tuple {
	out := make(Tuple, len(t))
	for i, e := range t {
		switch v := e.(type) {
		case int:
			out[i] = int64(v)
		case int32:
			out[i] = int64(v)
		case uint:
			out[i] = canonicalUint(uint64(v))
		case uint32:
			out[i] = int64(v)
		case uint64:
			out[i] = canonicalUint(v)
		case []byte:
			if v == nil {
				v = []byte{}
			}
			out[i] = v
		default:
			out[i] = e
		}
	}
	return out
}

func canonicalUint(v uint64) any {
	if v <= math.MaxInt64 {
		return int64(v)
	}
	return v
}

// interesting integers: around every byte-length boundary and the extremes.
var interestingInts = func() []int64 {
	out := []int64{0, 1, -1, math.MaxInt64, math.MinInt64, math.MinInt64 + 1}
	for shift := 7; shift < 63; shift += 8 {
		b := int64(1) << shift
		for _, d := range []int64{-1, 0, 1} {
			out = append(out, b+d, -(b + d), 2*b+d, -(2*b + d))
		}
	}
	return out
}()

func randomElement(r *rand.Rand) any {
	switch r.IntN(6) {
	case 0:
		b := make([]byte, r.IntN(5))
		for i := range b {
			b[i] = []byte{0, 1, 0xfe, 0xff, 'a'}[r.IntN(5)]
		}
		return b
	case 1:
		return string([]byte{"\x00a\xffb"[r.IntN(4)], "\x00a\xffb"[r.IntN(4)]}[:r.IntN(3)])
	case 2:
		return interestingInts[r.IntN(len(interestingInts))]
	case 3:
		return uint64(math.MaxUint64) - uint64(r.IntN(3))<<r.IntN(64)
	case 4:
		return int64(r.Uint64())
	default:
		return r.IntN(600) - 300
	}
}

func randomTuple(r *rand.Rand) Tuple {
	t := make(Tuple, r.IntN(4))
	for i := range t {
		t[i] = randomElement(r)
	}
	return t
}

func TestKnownEncodings(t *testing.T) {
	cases := []struct {
		t    Tuple
		want []byte
	}{
		{Tuple{}, nil},
		{Tuple{int64(0)}, []byte{0x14}},
		{Tuple{1}, []byte{0x15, 0x01}},
		{Tuple{255}, []byte{0x15, 0xff}},
		{Tuple{256}, []byte{0x16, 0x01, 0x00}},
		{Tuple{-1}, []byte{0x13, 0xfe}},
		{Tuple{-255}, []byte{0x13, 0x00}},
		{Tuple{-256}, []byte{0x12, 0xfe, 0xff}},
		{Tuple{uint64(math.MaxUint64)}, []byte{0x1c, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{Tuple{int64(math.MinInt64)}, []byte{0x0c, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{Tuple{"a\x00b"}, []byte{0x02, 'a', 0x00, 0xff, 'b', 0x00}},
		{Tuple{[]byte{}}, []byte{0x01, 0x00}},
		{Tuple{uint64(7), 1, "x"}, []byte{0x15, 7, 0x15, 1, 0x02, 'x', 0}},
	}
	for _, c := range cases {
		got, err := Pack(c.t)
		if err != nil {
			t.Fatalf("Pack(%v): %v", c.t, err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("Pack(%v) = %x, want %x", c.t, got, c.want)
		}
		back, err := Unpack(got)
		if err != nil {
			t.Fatalf("Unpack(%x): %v", got, err)
		}
		if len(back) != 0 || len(c.t) != 0 {
			if !reflect.DeepEqual(back, canonical(c.t)) {
				t.Errorf("Unpack(Pack(%v)) = %#v", c.t, back)
			}
		}
	}
}

func TestRoundTripAndOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tuples []Tuple
	for range 5000 {
		tu := randomTuple(r)
		tuples = append(tuples, tu)
		enc, err := Pack(tu)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Unpack(enc)
		if err != nil {
			t.Fatalf("Unpack(Pack(%v)) = %v", tu, err)
		}
		if len(tu) > 0 && !reflect.DeepEqual(back, canonical(tu)) {
			t.Fatalf("round trip of %#v gave %#v", tu, back)
		}
	}
	for i := 0; i+1 < len(tuples); i++ {
		a, b := tuples[i], tuples[i+1]
		if got, want := bytes.Compare(MustPack(a), MustPack(b)), Compare(a, b); got != want {
			t.Fatalf("order of %#v and %#v: encoded %d, tuple %d", a, b, got, want)
		}
	}
	// Sorting by encoding and by Compare give the same sequence.
	byBytes := append([]Tuple(nil), tuples...)
	sort.SliceStable(byBytes, func(i, j int) bool { return bytes.Compare(MustPack(byBytes[i]), MustPack(byBytes[j])) < 0 })
	for i := 0; i+1 < len(byBytes); i++ {
		if Compare(byBytes[i], byBytes[i+1]) > 0 {
			t.Fatalf("%#v sorts before %#v by bytes but after by Compare", byBytes[i], byBytes[i+1])
		}
	}
}

func TestIntegerOrderAcrossBoundaries(t *testing.T) {
	ints := append([]int64(nil), interestingInts...)
	sort.Slice(ints, func(i, j int) bool { return ints[i] < ints[j] })
	for i := 0; i+1 < len(ints); i++ {
		a, b := AppendInt(nil, ints[i]), AppendInt(nil, ints[i+1])
		want := 0
		if ints[i] < ints[i+1] {
			want = -1
		}
		if got := bytes.Compare(a, b); got != want {
			t.Fatalf("%d (%x) vs %d (%x): %d", ints[i], a, ints[i+1], b, got)
		}
	}
	// uint64 beyond MaxInt64 sorts after every int64.
	if bytes.Compare(AppendInt(nil, math.MaxInt64), AppendUint(nil, math.MaxInt64+1)) >= 0 {
		t.Fatal("MaxInt64 does not sort before MaxInt64+1")
	}
}

func TestPrefixRange(t *testing.T) {
	fs := MustPack(Tuple{uint64(3), 1})
	begin, end := PrefixRange(fs)
	inside := [][]byte{MustPack(Tuple{uint64(3), 1}), MustPack(Tuple{uint64(3), 1, uint64(9), 0, 3, "name"})}
	outside := [][]byte{MustPack(Tuple{uint64(3), 0}), MustPack(Tuple{uint64(3), 2}), MustPack(Tuple{uint64(4)})}
	for _, k := range inside {
		if bytes.Compare(k, begin) < 0 || bytes.Compare(k, end) >= 0 {
			t.Errorf("%x outside [%x, %x)", k, begin, end)
		}
	}
	for _, k := range outside {
		if bytes.Compare(k, begin) >= 0 && bytes.Compare(k, end) < 0 {
			t.Errorf("%x inside [%x, %x)", k, begin, end)
		}
	}
	if PrefixEnd([]byte{0xff, 0xff}) != nil || PrefixEnd(nil) != nil {
		t.Error("PrefixEnd of an all-0xff prefix must be nil")
	}
	if got := PrefixEnd([]byte{1, 0xff}); !bytes.Equal(got, []byte{2}) {
		t.Errorf("PrefixEnd(01ff) = %x", got)
	}
}

func TestUnpackRefusesMalformed(t *testing.T) {
	bad := [][]byte{
		{0x01, 'a'},        // unterminated
		{0x02},             // unterminated
		{0x15},             // short integer
		{0x16, 0x00, 0x01}, // non-minimal positive
		{0x12, 0xff, 0x00}, // non-minimal negative
		{0x0c, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, // below MinInt64
		{0x30},       // unknown code
		{0x14, 0x00}, // trailing garbage (0x00 is no type code)
	}
	for _, b := range bad {
		if _, err := Unpack(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("Unpack(%x) = %v, want ErrMalformed", b, err)
		}
	}
	if _, err := Pack(Tuple{1.5}); err == nil {
		t.Error("Pack accepted a float")
	}
}

// FuzzUnpack checks invariant 4: Unpack never panics, and what it accepts
// re-encodes to exactly the input.
func FuzzUnpack(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 32 {
		f.Add(MustPack(randomTuple(r)))
	}
	f.Add([]byte{0x01, 0x00, 0xff, 0x00})
	f.Add([]byte{0x0c, 0x80, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		tu, err := Unpack(b)
		if err != nil {
			return
		}
		again, err := Pack(tu)
		if err != nil {
			t.Fatalf("Pack(Unpack(%x)): %v", b, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("Unpack(%x) re-encodes to %x", b, again)
		}
	})
}

// FuzzOrder checks invariant 2 on pairs of decodable inputs.
func FuzzOrder(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 16 {
		f.Add(MustPack(randomTuple(r)), MustPack(randomTuple(r)))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ta, errA := Unpack(a)
		tb, errB := Unpack(b)
		if errA != nil || errB != nil {
			return
		}
		if got, want := Compare(ta, tb), bytes.Compare(a, b); got != want {
			t.Fatalf("Compare(%#v, %#v) = %d, bytes say %d", ta, tb, got, want)
		}
	})
}
