package extent

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// txnRecordSeeds are well-formed records of every state and some broken
// ones: the seed corpus of FuzzDecodeTxnRecord, run by plain `go test`.
func txnRecordSeeds(t testing.TB) [][]byte {
	ptr := &pb.Pointer{ExtentId: 1001, Page: 4, Generation: 2, Tenant: 9}
	recs := []*pb.TxnRecord{
		{TxnId: 1, ExtentId: 1000, NextExtent: 1001, State: pb.TxnState_TXN_STATE_PREPARED, ExpiryUnixMs: 5,
			Elements: []*pb.Element{Write(pointerFromProto(ptr), 3, []byte("x")).toProto(), Allocate(1000, 7).toProto()},
			Reserved: []*pb.ElementResult{{}, {Block: ptr}}},
		{TxnId: 2, ExtentId: 1001, PrevExtent: 1000, State: pb.TxnState_TXN_STATE_DECIDED, ExpiryUnixMs: 5},
		{TxnId: 3, ExtentId: 1001, PrevExtent: 1000, NextExtent: 1002, State: pb.TxnState_TXN_STATE_COMMITTED},
		{TxnId: 4, ExtentId: 1001, State: pb.TxnState_TXN_STATE_ABORTED},
		{TxnId: 5, ExtentId: 1001, State: pb.TxnState_TXN_STATE_PREPARED},                  // no next, no part
		{TxnId: 6, ExtentId: 1001, NextExtent: 1001, State: pb.TxnState_TXN_STATE_ABORTED}, // self pointer
		{TxnId: 7, ExtentId: 5, State: pb.TxnState_TXN_STATE_ABORTED},                      // system group id
		{ExtentId: 1001, State: pb.TxnState_TXN_STATE_ABORTED},                             // no id
		{TxnId: 8, ExtentId: 1001, NextExtent: 1002, State: pb.TxnState_TXN_STATE_DECIDED}, // decided with next
		{TxnId: 9, ExtentId: 1001, State: pb.TxnState_TXN_STATE_COMMITTED, Reserved: []*pb.ElementResult{{}}},
	}
	var out [][]byte
	for _, r := range recs {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return append(out, nil, []byte{0x08}, []byte{0xff, 0xff, 0xff})
}

// FuzzDecodeTxnRecord: the decoder never panics, and what it accepts is a
// well-formed record that survives a round trip.
func FuzzDecodeTxnRecord(f *testing.F) {
	for _, s := range txnRecordSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := DecodeTxnRecord(b)
		if err != nil {
			return
		}
		if err := checkTxnRecord(rec); err != nil {
			t.Fatalf("accepted a record that fails its check: %v", err)
		}
		again, err := encodeTxnRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		rec2, err := DecodeTxnRecord(again)
		if err != nil || !proto.Equal(rec, rec2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func TestTxnRecordSeedsClassified(t *testing.T) {
	seeds := txnRecordSeeds(t)
	for i, s := range seeds {
		_, err := DecodeTxnRecord(s)
		if wantOK := i < 4; (err == nil) != wantOK {
			t.Errorf("seed %d: err %v, want accepted %v", i, err, wantOK)
		}
	}
}

func FuzzDecodePointer(f *testing.F) {
	f.Add(Pointer{Extent: 1000, Page: 3, Generation: 1, Tenant: 2}.AppendBinary(nil))
	f.Add(Pointer{ReadOnly: true}.AppendBinary(nil))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePointer(b)
		if err != nil {
			return
		}
		if !bytes.Equal(p.AppendBinary(nil), b) {
			t.Fatalf("decode(%x) = %v re-encodes differently", b, p)
		}
	})
}

// FuzzApply feeds arbitrary commands to a replica that holds some state:
// Apply never fails, and a command it refuses changes nothing.
func FuzzApply(f *testing.F) {
	seedCmds := []*pb.Command{
		commitCmd(Write(Pointer{Extent: testExtent, Page: 1, Generation: 1, Tenant: 1}, 0, []byte("w"))),
		commitCmd(Allocate(testExtent, 2), Free(Pointer{Extent: testExtent, Generation: 1, Tenant: 1})),
		{Op: &pb.Command_Prepare{Prepare: &pb.PrepareCmd{TxnId: 3, NextExtent: testExtent + 1, ExpiryUnixMs: 2_000_000,
			Elements: []*pb.Element{Check(Pointer{Extent: testExtent, Page: 2, Generation: 1, Tenant: 1}, 0).toProto()}}}},
		{Op: &pb.Command_DecideRelease{DecideRelease: &pb.TxnCmd{TxnId: 3}}},
		{Op: &pb.Command_Fence{Fence: &pb.TxnCmd{TxnId: 4, ExpiryUnixMs: 1_000_500}}},
		{Op: &pb.Command_Abort{Abort: &pb.TxnCmd{TxnId: 3, ExpiryUnixMs: 1_000_500}}},
	}
	for _, c := range seedCmds {
		b, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newSMHarness(t, testExtent, smallGeometry())
		h.mustCommit(Allocate(testExtent, 1))
		before := h.kv.Dump()
		res := h.applyRaw(data)
		if res.Code != pb.Code_CODE_OK && h.kv.Dump() != before {
			t.Fatalf("refused command (%v: %s) changed the state", res.Code, res.Message)
		}
		if res.Code == pb.Code_CODE_OK {
			// The state stays readable: every record decodes.
			if _, _, err := h.sm.Info(); err != nil {
				t.Fatalf("state unreadable after an accepted command: %v", err)
			}
		}
	})
}
