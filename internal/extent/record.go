package extent

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// maxTxnRecordBytes bounds an encoded transaction record: a part of
// MaxElements full pages plus framing.
const maxTxnRecordBytes = MaxElements*(maxPageSizeBytes+256) + 4096

// DecodeTxnRecord decodes a transaction record (from disk or from a reply)
// and checks that it is well formed: what a record of each state must and
// must not carry (FSS §6: a PREPARED record has its part and a next
// pointer; DECIDED is the last of the list; tombstones carry no part).
func DecodeTxnRecord(b []byte) (*pb.TxnRecord, error) {
	if len(b) > maxTxnRecordBytes {
		return nil, fmt.Errorf("%w: transaction record of %d bytes, limit %d", errCorrupt, len(b), maxTxnRecordBytes)
	}
	var rec pb.TxnRecord
	if err := proto.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("%w: transaction record: %v", errCorrupt, err)
	}
	if err := checkTxnRecord(&rec); err != nil {
		return nil, fmt.Errorf("%w: transaction record: %v", errCorrupt, err)
	}
	return &rec, nil
}

func encodeTxnRecord(rec *pb.TxnRecord) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(rec)
}

func checkTxnRecord(rec *pb.TxnRecord) error {
	switch {
	case rec.TxnId == 0:
		return fmt.Errorf("no transaction id")
	case checkExtentID(rec.ExtentId) != nil:
		return checkExtentID(rec.ExtentId)
	case rec.PrevExtent == rec.ExtentId || rec.NextExtent == rec.ExtentId:
		return fmt.Errorf("extent %d points at itself", rec.ExtentId)
	case rec.PrevExtent != 0 && rec.PrevExtent == rec.NextExtent:
		return fmt.Errorf("prev and next are both extent %d", rec.PrevExtent)
	}
	for _, id := range []uint64{rec.PrevExtent, rec.NextExtent} {
		if id != 0 {
			if err := checkExtentID(id); err != nil {
				return err
			}
		}
	}
	switch rec.State {
	case pb.TxnState_TXN_STATE_PREPARED:
		if rec.NextExtent == 0 {
			return fmt.Errorf("prepared record without a next extent")
		}
		if len(rec.Elements) == 0 || len(rec.Elements) > MaxElements {
			return fmt.Errorf("prepared record with %d elements", len(rec.Elements))
		}
		if len(rec.Reserved) != len(rec.Elements) {
			return fmt.Errorf("%d reservations for %d elements", len(rec.Reserved), len(rec.Elements))
		}
		for i, e := range rec.Elements {
			if err := checkElementShape(e); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
			if _, ok := e.Op.(*pb.Element_WriteDelta); ok {
				return fmt.Errorf("element %d: a page delta (records keep the rebuilt page)", i)
			}
			_, isAlloc := e.Op.(*pb.Element_Allocate)
			if isAlloc != (rec.Reserved[i].GetBlock() != nil) {
				return fmt.Errorf("element %d: reservation does not match the element", i)
			}
		}
	case pb.TxnState_TXN_STATE_DECIDED:
		if rec.NextExtent != 0 {
			return fmt.Errorf("decided record with a next extent")
		}
		fallthrough
	case pb.TxnState_TXN_STATE_COMMITTED, pb.TxnState_TXN_STATE_ABORTED:
		if len(rec.Elements) != 0 || len(rec.Reserved) != 0 {
			return fmt.Errorf("%v record carries a part", rec.State)
		}
	default:
		return fmt.Errorf("state %v", rec.State)
	}
	return nil
}

// checkElementShape checks what can be checked without the extent's
// geometry.
func checkElementShape(e *pb.Element) error {
	switch op := e.GetOp().(type) {
	case *pb.Element_Write:
		if op.Write.Page == nil {
			return fmt.Errorf("write without a page")
		}
		if len(op.Write.Data) > maxPageSizeBytes {
			return fmt.Errorf("write of %d bytes exceeds the largest page size %d", len(op.Write.Data), maxPageSizeBytes)
		}
	case *pb.Element_WriteDelta:
		if op.WriteDelta.Page == nil {
			return fmt.Errorf("page delta without a page")
		}
		if n := max(uint64(op.WriteDelta.Length), uint64(len(op.WriteDelta.Script))); n > maxPageSizeBytes {
			return fmt.Errorf("page delta of %d bytes building %d exceeds the largest page size %d", len(op.WriteDelta.Script), op.WriteDelta.Length, maxPageSizeBytes)
		}
	case *pb.Element_Check:
		if op.Check.Page == nil {
			return fmt.Errorf("check without a page")
		}
	case *pb.Element_Allocate:
		if op.Allocate.Tenant == 0 {
			return fmt.Errorf("allocation for tenant 0 (tenant 0 owns nothing)")
		}
		if op.Allocate.AnyBlock != (op.Allocate.Block == nil) {
			return fmt.Errorf("allocation must name either any_block or a block")
		}
	case *pb.Element_Free:
		if op.Free.Block == nil {
			return fmt.Errorf("free without a block")
		}
	default:
		return fmt.Errorf("element without an operation")
	}
	return nil
}
