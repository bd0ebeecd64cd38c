package extent

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/security"
)

// Tenancy (issue 15; FSS §3: the tenant in every block's ownership record
// is the caller's authenticated tenant). A caller whose certificate names
// tenant T reaches only pages, blocks and transactions of its own:
//
//  1. Every pointer it sends must carry security.ExtentTenant(T) (the
//     state machine then compares it with the block's own, as for every
//     access) and every block it allocates is allocated for that owner
//     (checkTenancy, before the request runs or is forwarded).
//  2. A transaction step that names only a transaction id (DECIDE_RELEASE,
//     RELEASE, ABORT, FENCE) and a QueryTxn are checked against the
//     transaction's record at the extent's leader, after a linearizable
//     read, just before the step is proposed (checkTenantTxn): a record
//     holding a part (PREPARED: the only state that has one) must hold
//     only elements of T's own (as 1), or the call is refused. A follower
//     does not forward such a call of a tenant (the leader would see the
//     follower's node identity, not T): it answers NOT_LEADER naming the
//     leader, where the client sends it again. A record without a part
//     (none, DECIDED, or a COMMITTED or ABORTED tombstone) is open to the
//     step: on it a step can only leave the FSS §6 fence of a transaction
//     id (an ABORTED tombstone), which a tenant's own recovery needs where
//     its transaction never prepared, or turn a DECIDED record into the
//     COMMITTED tombstone it becomes anyway; neither touches a page.
//     Transaction ids are 64 random bits (randomID) that no answer to
//     another tenant shows (3), so a tenant cannot aim such a fence at
//     another's transaction but by guessing; the window between the check
//     and the step's apply is open only to the same guess.
//  3. Answers carry no other owner's identities (refusalForTenant): a
//     refusal because a prepared transaction holds a page or block names
//     the holder (its id, extent, expiry: what recovery needs) only if the
//     holder's part is all T's own at the answering node, and otherwise
//     says only that another owner's transaction holds it; a refusal of a
//     pointer whose tag does not match its block (CODE_STALE) does not
//     show the block's generation or owner.
//
// Refusals are codes.PermissionDenied and change nothing. Nodes and
// administrators reach every block and transaction (the metadata servers
// keep file systems' metadata in blocks of the cluster's own, which no
// tenant can name).

// serviceDesc is the Extent service with its tenancy guard.
func (s *Server) serviceDesc() *grpc.ServiceDesc {
	return security.GuardService(&pb.Extent_ServiceDesc, security.Guard{Check: checkTenancy, FilterError: s.refusalForTenant})
}

// checkTenancy refuses a tenant's request naming a page or block of
// another owner (rule 1).
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
		// The steps that name only an id are checked against the
		// transaction's record by the leader (checkTenantTxn).
		return ownElements(r.GetElements(), own, t)
	case *pb.QueryTxnRequest:
		// Checked against the record by the leader (checkTenantTxn).
		return nil
	case *pb.FreeBlocksRequest, *pb.InfoRequest, *pb.ReplicaStatusRequest:
		// No page's data, no transaction's.
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
		case *pb.Element_WriteDelta:
			err = ownPointer(op.WriteDelta.GetPage(), own, t)
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

// stepNamesOnlyID reports whether a transaction step of kind carries no
// part of its own, only the transaction's id: its tenancy is the
// record's (rule 2).
func stepNamesOnlyID(kind pb.StepKind) bool {
	switch kind {
	case pb.StepKind_STEP_KIND_PREPARE, pb.StepKind_STEP_KIND_PREPARE_DECIDE:
		return false
	}
	return true
}

// tenantNotForwarded is the answer of a follower to a tenant's call that
// only the leader can check (rule 2): NOT_LEADER naming the leader, where
// the client sends the call again.
func (s *Server) tenantNotForwarded(id, leader uint64, what string) error {
	return statusError(&pb.Error{Code: pb.Code_CODE_NOT_LEADER, ExtentId: id, LeaderId: leader,
		Message: fmt.Sprintf("node %d does not lead extent %d: a tenant's %s is checked and served by the leader, node %d", s.self, id, what, leader)})
}

// checkTenantTxn refuses tenant t transaction txn of extent id (this node
// leads it, sm is its replica) if the transaction's record holds a part
// that is not all t's (rule 2). It reads the record after a linearizable
// read, so it sees every step committed before the call.
func (s *Server) checkTenantTxn(ctx context.Context, sm *StateMachine, id, txn uint64, t string) error {
	if err := s.linearize(ctx, id); err != nil {
		return err
	}
	rec, err := sm.record(txn)
	if err != nil {
		return statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: id, Message: err.Error()})
	}
	if rec != nil && ownElements(rec.GetElements(), security.ExtentTenant(t), t) != nil {
		return security.PermissionDenied("transaction %016x at extent %d is not tenant %q's", txn, id, t)
	}
	return nil
}

// ownsTxn reports whether this node's replica of extent id holds a
// prepared part of transaction txn made only of tenant t's elements.
func (s *Server) ownsTxn(id, txn uint64, t string) bool {
	sm, _, err := s.localReplica(id)
	if err != nil {
		return false
	}
	rec, err := sm.record(txn)
	if err != nil || rec == nil || rec.GetState() != pb.TxnState_TXN_STATE_PREPARED || len(rec.GetElements()) == 0 {
		return false
	}
	return ownElements(rec.GetElements(), security.ExtentTenant(t), t) == nil
}

// refusalForTenant drops other owners' identities from a refusal answered
// to a tenant (rule 3).
func (s *Server) refusalForTenant(ctx context.Context, _ string, err error) error {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return err
	}
	d, ok := detailOf(err)
	if !ok {
		return err
	}
	switch {
	case d.GetHolder() != nil:
		if s.ownsTxn(d.GetHolder().GetExtentId(), d.GetHolder().GetTxnId(), t) {
			return err
		}
		d = proto.CloneOf(d)
		d.Holder = nil
		d.Message = "what the request names is held by a prepared transaction of another owner; try again when it has ended"
	case d.GetCode() == pb.Code_CODE_STALE:
		d = proto.CloneOf(d)
		d.Message = "a pointer does not match its block's ownership (generation, owner or read-only bit): it is stale or not the caller's"
	default:
		return err
	}
	return statusError(d)
}
