package tract

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// The decoders of outside input: the options spec, blob ids, data file
// names and the TLT the directory sends. Their seed corpora run in every
// `go test`; `go test -fuzz FuzzX` explores further.

func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{"", "tract-size=1MiB,replication=3", "sync=false,scrub=2s", "min-rows=64", "x", "tract-size=3", "scrub=-1s", "=,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		o, err := ParseOptions(spec)
		if err != nil {
			return
		}
		if o.TractSizeBytes != 0 && (o.TractSizeBytes < minTractSizeBytes || o.TractSizeBytes > maxTractSizeBytes) {
			t.Fatalf("accepted tract size %d", o.TractSizeBytes)
		}
		if o.Replication < 0 || o.Replication > maxReplication || o.MinRows < 0 || o.MinRows > maxTLTRows {
			t.Fatalf("accepted %+v", o)
		}
	})
}

func FuzzParseGUID(f *testing.F) {
	for _, s := range []string{"", NewGUID().String(), "00000000-0000-0000-0000-000000000000", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGUID(s)
		if err != nil {
			return
		}
		if back, err := ParseGUID(g.String()); err != nil || back != g {
			t.Fatalf("%q parsed to %s, which does not round-trip", s, g)
		}
	})
}

func FuzzParseFileName(f *testing.F) {
	for _, s := range []string{"", GUID{1}.String() + ".0.1.1", GUID{2}.String() + ".-1.9.9", "a.b.c.d", GUID{}.String() + ".1.2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		k, st, ok := parseFileName(name)
		if !ok {
			return
		}
		s := &Store{fs: vfs.NewMem(), dir: "d"}
		if back := s.fs.PathBase(s.fileName(k, st)); back != name {
			// Only canonical names round-trip; a name that parses must
			// at least parse to the same key again.
			if k2, st2, ok2 := parseFileName(back); !ok2 || k2 != k || !stampEqual(st, st2) {
				t.Fatalf("%q -> %v %v -> %q", name, k, st, back)
			}
		}
	})
}

func FuzzTableFromProto(f *testing.F) {
	good := &dpb.TLT{Version: 3, TractSizeBytes: 1 << 20, Replication: 2, Rows: []*dpb.TLTRow{
		{Version: 3, Slots: []*dpb.TractServer{{NodeId: 1}, {NodeId: 2}}, Pending: []*dpb.PendingEntry{{Slot: 1, Server: &dpb.TractServer{NodeId: 3}}}},
	}}
	b, _ := proto.Marshal(good)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x01, 0x10, 0x80, 0x80, 0x04})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &dpb.TLT{}
		if proto.Unmarshal(data, p) != nil {
			return
		}
		tab, err := TableFromProto(p)
		if err != nil {
			return
		}
		for i, r := range tab.Rows {
			if len(r.Slots) != tab.Replication {
				t.Fatalf("row %d: %d slots for replication %d", i, len(r.Slots), tab.Replication)
			}
			for _, pe := range r.Pending {
				if pe.Slot < 0 || pe.Slot >= tab.Replication {
					t.Fatalf("row %d: pending slot %d", i, pe.Slot)
				}
			}
			// Locating never leaves the table.
			if ri := tab.Locate(GUID{byte(i)}, int64(i)-1); ri < 0 || ri >= len(tab.Rows) {
				t.Fatalf("Locate returned row %d of %d", ri, len(tab.Rows))
			}
		}
	})
}
