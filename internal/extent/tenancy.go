package extent

import (
	"context"

	"google.golang.org/grpc"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/security"
)

// Tenancy (issue 15; FSS §3: the tenant in every block's ownership record
// is the caller's authenticated tenant). A caller whose certificate names
// tenant T reaches only pages and blocks owned by security.ExtentTenant(T):
// every pointer it sends must carry that owner (the state machine then
// compares it with the block's own, as for every access) and every block
// it allocates is allocated for that owner. Anything else is refused with
// codes.PermissionDenied before the request runs or is forwarded to the
// leader. A transaction record answered to a tenant (TxnStep, QueryTxn)
// must name only its own pages. Nodes and administrators reach every
// block (the metadata servers keep file systems' metadata in blocks of the
// cluster's own, which no tenant can name).

// serviceDesc is the Extent service with its tenancy guard.
func serviceDesc() *grpc.ServiceDesc {
	return security.GuardService(&pb.Extent_ServiceDesc, security.Guard{Check: checkTenancy, Filter: filterForTenant})
}

// checkTenancy refuses a tenant's request naming a page or block of
// another owner.
func checkTenancy(ctx context.Context, method string, req any) error {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return nil
	}
	own := security.ExtentTenant(t)
	switch r := req.(type) {
	case *pb.ReadRequest:
		return ownPointer(r.GetPage(), own, t)
	case *pb.CommitRequest:
		return ownElements(r.GetElements(), own, t)
	case *pb.CheckRequest:
		return ownElements(r.GetElements(), own, t)
	case *pb.TxnStepRequest:
		return ownElements(r.GetElements(), own, t)
	case *pb.QueryTxnRequest, *pb.FreeBlocksRequest, *pb.InfoRequest, *pb.ReplicaStatusRequest:
		// No page's data: a transaction's record is checked in its
		// answer (filterForTenant).
		return nil
	}
	return security.PermissionDenied("%s is not open to tenants", method)
}

func ownPointer(p *pb.Pointer, own uint64, t string) error {
	if p.GetTenant() != own {
		return security.PermissionDenied("page %d of extent %d is not tenant %q's", p.GetPage(), p.GetExtentId(), t)
	}
	return nil
}

func ownElements(es []*pb.Element, own uint64, t string) error {
	for _, e := range es {
		var err error
		switch op := e.GetOp().(type) {
		case *pb.Element_Write:
			err = ownPointer(op.Write.GetPage(), own, t)
		case *pb.Element_Check:
			err = ownPointer(op.Check.GetPage(), own, t)
		case *pb.Element_Free:
			err = ownPointer(op.Free.GetBlock(), own, t)
		case *pb.Element_Allocate:
			if op.Allocate.GetTenant() != own {
				err = security.PermissionDenied("tenant %q may allocate blocks only for itself", t)
			}
		default:
			err = security.PermissionDenied("an element of unknown kind")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// filterForTenant refuses a tenant the record of another owner's
// transaction.
func filterForTenant(ctx context.Context, _ string, resp any) (any, error) {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return resp, nil
	}
	var rec *pb.TxnRecord
	switch r := resp.(type) {
	case *pb.TxnStepResponse:
		rec = r.GetRecord()
	case *pb.QueryTxnResponse:
		rec = r.GetRecord()
	}
	if err := ownElements(rec.GetElements(), security.ExtentTenant(t), t); err != nil {
		return nil, err
	}
	return resp, nil
}
