package extent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// Error kinds. Every error the client returns wraps exactly one of them
// (errors.Is); all but ErrAmbiguous mean the call changed nothing. The
// store never retries (FSS §8): the caller decides what to do with each.
var (
	// ErrConflict: a page's slot moved since it was read, or a block to
	// allocate is no longer free at the expected generation. Re-read and
	// decide again.
	ErrConflict = errors.New("extent: conflict")
	// ErrStale: a tagged pointer's ownership (generation, tenant, read-only
	// bit) does not match its block: the block was freed or reallocated, or
	// belongs to another tenant. Drop cached pointers into it.
	ErrStale = errors.New("extent: stale pointer")
	// ErrPrepared: a page or block is held by a prepared cross-extent
	// transaction. PreparedTxn(err) names it; Client.Recover finishes or
	// aborts it (FSS §6), after which the access can be repeated.
	ErrPrepared = errors.New("extent: held by a prepared transaction")
	// ErrAborted: a cross-extent transaction was aborted: recovery fenced
	// it, it passed its deadline, or a step of it failed before the commit
	// point.
	ErrAborted = errors.New("extent: transaction aborted")
	// ErrNoSpace: the extent has no free block.
	ErrNoSpace = errors.New("extent: no free block")
	// ErrInvalid: malformed request (more than MaxElements elements, a page
	// out of range, an oversize page, a page named twice...). One of its
	// cases has a kind of its own, ErrDeltaMismatch (delta.go): a page
	// delta that did not rebuild the page it promised.
	ErrInvalid = errors.New("extent: invalid request")
	// ErrNotFound: no such extent.
	ErrNotFound = errors.New("extent: no such extent")
	// ErrUnavailable: the call was not executed: no leader, the node is
	// down or holds no replica, the proposal was dropped. For a read: any
	// failure to answer.
	ErrUnavailable = errors.New("extent: unavailable")
	// ErrAmbiguous: a write may or may not have been applied (the reply was
	// lost, the deadline passed after it was sent).
	ErrAmbiguous = errors.New("extent: outcome unknown")
	// ErrPermissionDenied: the caller's credential may not reach what the
	// call names (a tenant naming another owner's page, block or
	// transaction: tenancy.go), or no credential was accepted; nothing
	// ran, and asking again changes nothing.
	ErrPermissionDenied = errors.New("extent: permission denied")
)

// TxnRef names a cross-extent transaction and an extent that holds a
// record of it.
type TxnRef struct {
	ID     uint64
	Extent uint64
	// Expiry, when known, is when the transaction's coordinator gives up:
	// a caller that meets the transaction before then may wait a little
	// for the coordinator instead of recovering at once (which aborts a
	// transaction still in its prepare phase).
	Expiry time.Time
}

func (r TxnRef) String() string { return fmt.Sprintf("txn %016x at extent %d", r.ID, r.Extent) }

// Error is the error type of the client: Kind is one of the error kinds
// above.
type Error struct {
	Kind   error
	Op     string
	Extent uint64
	Msg    string
	// Holder names the prepared transaction of an ErrPrepared.
	Holder *TxnRef
}

func (e *Error) Error() string {
	s := "extent: " + e.Op
	if e.Extent != 0 {
		s += fmt.Sprintf(" (extent %d)", e.Extent)
	}
	s += ": " + e.Kind.Error()
	if e.Holder != nil {
		s += " (" + e.Holder.String() + ")"
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Unwrap makes errors.Is(err, kind) work.
func (e *Error) Unwrap() error { return e.Kind }

// PreparedTxn returns the transaction an ErrPrepared names.
func PreparedTxn(err error) (TxnRef, bool) {
	var e *Error
	if errors.As(err, &e) && e.Holder != nil {
		return *e.Holder, true
	}
	return TxnRef{}, false
}

// kindOf maps a result code to an error kind.
func kindOf(c pb.Code) error {
	switch c {
	case pb.Code_CODE_INVALID_ARGUMENT:
		return ErrInvalid
	case pb.Code_CODE_DELTA_MISMATCH:
		return ErrDeltaMismatch
	case pb.Code_CODE_CONFLICT:
		return ErrConflict
	case pb.Code_CODE_STALE:
		return ErrStale
	case pb.Code_CODE_PREPARED:
		return ErrPrepared
	case pb.Code_CODE_ABORTED:
		return ErrAborted
	case pb.Code_CODE_NO_SPACE:
		return ErrNoSpace
	case pb.Code_CODE_NOT_LEADER, pb.Code_CODE_NO_REPLICA, pb.Code_CODE_UNAVAILABLE:
		return ErrUnavailable
	}
	return ErrAmbiguous // AMBIGUOUS, INTERNAL, unknown codes
}

// grpcCode is the gRPC status code a result code travels under. Clients
// read the Error detail, not this code.
func grpcCode(c pb.Code) codes.Code {
	switch c {
	case pb.Code_CODE_OK:
		return codes.OK
	case pb.Code_CODE_INVALID_ARGUMENT, pb.Code_CODE_DELTA_MISMATCH:
		return codes.InvalidArgument
	case pb.Code_CODE_CONFLICT, pb.Code_CODE_PREPARED, pb.Code_CODE_ABORTED:
		return codes.Aborted
	case pb.Code_CODE_STALE:
		return codes.FailedPrecondition
	case pb.Code_CODE_NO_SPACE:
		return codes.ResourceExhausted
	case pb.Code_CODE_NOT_LEADER, pb.Code_CODE_NO_REPLICA, pb.Code_CODE_UNAVAILABLE:
		return codes.Unavailable
	case pb.Code_CODE_AMBIGUOUS:
		return codes.DeadlineExceeded
	}
	return codes.Internal
}

// statusError is the gRPC error of a refused call.
func statusError(d *pb.Error) error {
	st := status.New(grpcCode(d.Code), fmt.Sprintf("extent %d: %v: %s", d.ExtentId, d.Code, d.Message))
	if with, err := st.WithDetails(d); err == nil {
		st = with
	}
	return st.Err()
}

// detailOf returns the Error detail of a gRPC error the service made.
func detailOf(err error) (*pb.Error, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok {
			return e, true
		}
	}
	return nil, false
}

// rpcError turns the error of one call into the client's Error. A refusal
// the service made carries its code; anything else (the network, an
// injected fault, the deadline) leaves a write's outcome unknown, while
// interceptors' refusals (cluster check) happen before any work.
func rpcError(op string, extent uint64, err error, write bool) *Error {
	if d, ok := detailOf(err); ok {
		e := &Error{Kind: kindOf(d.Code), Op: op, Extent: extent, Msg: d.Message}
		if d.Code == pb.Code_CODE_PREPARED && d.Holder != nil {
			e.Holder = &TxnRef{ID: d.Holder.TxnId, Extent: d.Holder.ExtentId}
			if ms := d.Holder.ExpiryUnixMs; ms > 0 {
				e.Holder.Expiry = time.UnixMilli(ms)
			}
		}
		return e
	}
	if refused(err) {
		return &Error{Kind: ErrPermissionDenied, Op: op, Extent: extent, Msg: status.Convert(err).Message()}
	}
	kind := ErrUnavailable
	if write {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal, codes.Aborted:
			kind = ErrAmbiguous
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			kind = ErrAmbiguous
		}
	}
	return &Error{Kind: kind, Op: op, Extent: extent, Msg: err.Error()}
}

// refused reports whether err is a node's refusal of the caller (its
// interceptors' or tenancy checks', before the call ran): PermissionDenied
// or Unauthenticated, without the service's detail.
func refused(err error) bool {
	c := status.Code(err)
	return c == codes.PermissionDenied || c == codes.Unauthenticated
}

func newError(kind error, op string, extent uint64, format string, args ...any) *Error {
	return &Error{Kind: kind, Op: op, Extent: extent, Msg: fmt.Sprintf(format, args...)}
}
