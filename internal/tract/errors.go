package tract

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// grpcCode is the gRPC status code of each tract error.
func grpcCode(c tpb.ErrorCode) codes.Code {
	switch c {
	case tpb.ErrorCode_OK:
		return codes.OK
	case tpb.ErrorCode_INVALID_ARGUMENT:
		return codes.InvalidArgument
	case tpb.ErrorCode_STALE_TLT, tpb.ErrorCode_WRONG_SERVER, tpb.ErrorCode_PAST_END:
		return codes.FailedPrecondition
	case tpb.ErrorCode_TLT_BEHIND, tpb.ErrorCode_NOT_READABLE, tpb.ErrorCode_REPLICA_FAILED:
		return codes.Unavailable
	case tpb.ErrorCode_BLOB_NOT_FOUND:
		return codes.NotFound
	case tpb.ErrorCode_BLOB_EXISTS:
		return codes.AlreadyExists
	case tpb.ErrorCode_CORRUPT:
		return codes.DataLoss
	case tpb.ErrorCode_OVERLOADED:
		return codes.ResourceExhausted
	case tpb.ErrorCode_IO_ERROR:
		return codes.Internal
	case tpb.ErrorCode_PERMISSION_DENIED:
		return codes.PermissionDenied
	}
	return codes.Unknown
}

// Sentinel errors: the tract store's outcomes as errors.Is sees them.
// Every *Error matches the sentinel of its code (Error.Is), and the client
// turns a tractserver's gRPC status into an *Error once (fromWire), so the
// layers above (internal/fs) test errors.Is(err, tract.ErrBlobNotFound)
// and never look at a tractpb code or a gRPC status. CORRUPT maps to
// ErrCorrupt (store.go), the error a disk's own checksum failure wraps.
var (
	// ErrInvalidArgument: the request was malformed or out of bounds.
	ErrInvalidArgument = errors.New("tract: invalid argument")
	// ErrBlobNotFound: the blob does not exist (or was deleted and
	// created again since it was opened).
	ErrBlobNotFound = errors.New("tract: blob not found")
	// ErrBlobExists: a create named a blob that exists.
	ErrBlobExists = errors.New("tract: blob exists")
	// ErrPastEnd: a tract past the end of its blob.
	ErrPastEnd = errors.New("tract: past the end of the blob")
	// ErrUnavailable: the servers could not serve it now (the TLT moved,
	// a replica failed or is catching up, a server is overloaded); the
	// client retries these within its context before returning one.
	ErrUnavailable = errors.New("tract: unavailable")
	// ErrIO: a tractserver's disk failed.
	ErrIO = errors.New("tract: I/O error")
	// ErrPermissionDenied: the blob is another tenant's (tenancy.go).
	ErrPermissionDenied = errors.New("tract: permission denied")
)

// sentinelOf maps each wire code to its sentinel (nil for OK and codes it
// does not know).
func sentinelOf(c tpb.ErrorCode) error {
	switch c {
	case tpb.ErrorCode_INVALID_ARGUMENT:
		return ErrInvalidArgument
	case tpb.ErrorCode_BLOB_NOT_FOUND:
		return ErrBlobNotFound
	case tpb.ErrorCode_BLOB_EXISTS:
		return ErrBlobExists
	case tpb.ErrorCode_PAST_END:
		return ErrPastEnd
	case tpb.ErrorCode_CORRUPT:
		return ErrCorrupt
	case tpb.ErrorCode_STALE_TLT, tpb.ErrorCode_WRONG_SERVER, tpb.ErrorCode_TLT_BEHIND,
		tpb.ErrorCode_NOT_READABLE, tpb.ErrorCode_REPLICA_FAILED, tpb.ErrorCode_OVERLOADED:
		return ErrUnavailable
	case tpb.ErrorCode_IO_ERROR:
		return ErrIO
	case tpb.ErrorCode_PERMISSION_DENIED:
		return ErrPermissionDenied
	}
	return nil
}

// Error is a tract store error: a code, a message and, for TLT version
// errors, the server's row version. Errors from the client library and the
// tractservers' RPCs both carry one (ErrorOf extracts it).
type Error struct {
	Code       tpb.ErrorCode
	Message    string
	RowVersion uint64
}

func (e *Error) Error() string { return fmt.Sprintf("tract: %v: %s", e.Code, e.Message) }

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s := sentinelOf(e.Code)
	return s != nil && s == target
}

// GRPCStatus makes an *Error travel as a gRPC status with its detail.
func (e *Error) GRPCStatus() *status.Status {
	st := status.New(grpcCode(e.Code), e.Error())
	if d, err := st.WithDetails(&tpb.ErrorDetail{Code: e.Code, Message: e.Message, RowVersion: e.RowVersion}); err == nil {
		return d
	}
	return st
}

func errorf(code tpb.ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) *Error {
	return errorf(tpb.ErrorCode_INVALID_ARGUMENT, format, args...)
}

// ErrorOf returns the tract error err carries: an *Error in its chain, or
// the detail of a gRPC status from a tractserver. ok is false for other
// errors (transport failures, timeouts).
func ErrorOf(err error) (*Error, bool) {
	if err == nil {
		return nil, false
	}
	var te *Error
	if errors.As(err, &te) {
		return te, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*tpb.ErrorDetail); ok {
			return &Error{Code: ed.Code, Message: ed.Message, RowVersion: ed.RowVersion}, true
		}
	}
	return nil, false
}

// fromWire is where the client maps a tractserver's answer to its errors,
// once: a gRPC status carrying a tract ErrorDetail becomes that *Error
// (which errors.Is matches to its sentinel); an *Error already in the
// chain, and errors with no tract code (transport failures, timeouts),
// are returned as they are.
func fromWire(err error) error {
	var te *Error
	if err == nil || errors.As(err, &te) {
		return err
	}
	if te, ok := ErrorOf(err); ok {
		return te
	}
	return err
}

// CodeOf returns the tract error code of err: OK for nil, the code of a
// tract error, and -1 for anything else.
func CodeOf(err error) tpb.ErrorCode {
	if err == nil {
		return tpb.ErrorCode_OK
	}
	if te, ok := ErrorOf(err); ok {
		return te.Code
	}
	return -1
}

// toStatus turns a handler's error into what gRPC returns.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if te, ok := ErrorOf(err); ok {
		return te.GRPCStatus().Err()
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return errorf(tpb.ErrorCode_IO_ERROR, "%v", err).GRPCStatus().Err()
}
