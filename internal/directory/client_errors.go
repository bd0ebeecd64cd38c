package directory

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Sentinel errors: the directory's outcomes as errors.Is sees them. The
// Client maps the wire's answer to them once (clientError): a refused
// command's ErrorCode, or, for a gRPC status without one, its code. The
// layers above test errors.Is(err, directory.ErrNotFound) and never look
// at a directorypb code or a gRPC status. (The per-entry results of a
// batch reply, such as RenewDelegations', map through ResultError.)
// DECOMMISSIONED maps to ErrDecommissioned (agent.go).
var (
	// ErrInvalidArgument: the request is malformed or breaks a limit.
	ErrInvalidArgument = errors.New("directory: invalid argument")
	// ErrUnknownNode: the node id is not registered.
	ErrUnknownNode = errors.New("directory: unknown node")
	// ErrStaleEpoch: an epoch or version condition failed; the caller
	// acts on old authority.
	ErrStaleEpoch = errors.New("directory: stale epoch")
	// ErrNotFound: what was named does not exist.
	ErrNotFound = errors.New("directory: not found")
	// ErrConflict: a compare-and-set or uniqueness condition failed.
	ErrConflict = errors.New("directory: conflict")
	// ErrLeaseHeld: another holder has the lease.
	ErrLeaseHeld = errors.New("directory: lease held by another")
	// ErrExpired: the lease or delegation has expired.
	ErrExpired = errors.New("directory: expired")
	// ErrAlreadyExists: a create named something that exists.
	ErrAlreadyExists = errors.New("directory: already exists")
	// ErrNotInitialized: the cluster has not been initialised.
	ErrNotInitialized = errors.New("directory: cluster not initialised")
	// ErrNodeDead: the node was declared dead and must register again.
	ErrNodeDead = errors.New("directory: node dead")
	// ErrLimitExceeded: a table of the directory is full.
	ErrLimitExceeded = errors.New("directory: limit exceeded")
	// ErrPermissionDenied: the caller's identity may not reach what it
	// named (another tenant's file system, a method of another class).
	ErrPermissionDenied = errors.New("directory: permission denied")
)

// sentinelOf maps each ErrorCode to its sentinel (nil for OK and codes it
// does not know).
func sentinelOf(c pb.ErrorCode) error {
	switch c {
	case pb.ErrorCode_INVALID_ARGUMENT:
		return ErrInvalidArgument
	case pb.ErrorCode_UNKNOWN_NODE:
		return ErrUnknownNode
	case pb.ErrorCode_STALE_EPOCH:
		return ErrStaleEpoch
	case pb.ErrorCode_NOT_FOUND:
		return ErrNotFound
	case pb.ErrorCode_CONFLICT:
		return ErrConflict
	case pb.ErrorCode_LEASE_HELD:
		return ErrLeaseHeld
	case pb.ErrorCode_EXPIRED:
		return ErrExpired
	case pb.ErrorCode_ALREADY_EXISTS:
		return ErrAlreadyExists
	case pb.ErrorCode_NOT_INITIALIZED:
		return ErrNotInitialized
	case pb.ErrorCode_DECOMMISSIONED:
		return ErrDecommissioned
	case pb.ErrorCode_NODE_DEAD:
		return ErrNodeDead
	case pb.ErrorCode_LIMIT_EXCEEDED:
		return ErrLimitExceeded
	}
	return nil
}

// sentinelOfStatus maps a gRPC code of a status without a CommandResult
// (a check before the command was proposed, or gRPC's own refusal).
func sentinelOfStatus(c codes.Code) error {
	switch c {
	case codes.InvalidArgument:
		return ErrInvalidArgument
	case codes.NotFound:
		return ErrNotFound
	case codes.AlreadyExists:
		return ErrAlreadyExists
	case codes.PermissionDenied:
		return ErrPermissionDenied
	}
	return nil
}

// Error is a call the directory answered with an error: the method, what
// the directory said, and the sentinel it stands for (nil if none).
// errors.Is matches the sentinel; Unwrap gives the gRPC status error, for
// the package's own CodeOf, ResultOf and NotLeaderOf.
type Error struct {
	Method   string
	Message  string
	sentinel error
	wire     error
}

func (e *Error) Error() string { return fmt.Sprintf("directory: %s: %s", e.Method, e.Message) }

// Is reports whether target is the sentinel e stands for.
func (e *Error) Is(target error) bool { return e.sentinel != nil && e.sentinel == target }

// Unwrap returns the gRPC error the directory answered.
func (e *Error) Unwrap() error { return e.wire }

// clientError maps the final error of a call once: a gRPC status becomes
// an *Error matching its sentinel; other errors (the client closed, a
// dial failure) are returned as they are.
func clientError(method string, err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return err
	}
	e := &Error{Method: method, Message: strings.TrimPrefix(st.Message(), "directory: "), wire: err,
		sentinel: sentinelOfStatus(st.Code())}
	if r, ok := ResultOf(err); ok {
		e.Message, e.sentinel = r.GetMessage(), sentinelOf(r.GetCode())
		if e.sentinel == nil {
			e.Message = fmt.Sprintf("%v: %s", r.GetCode(), r.GetMessage())
		}
	}
	return e
}

// ResultError returns nil for a successful CommandResult and else an
// error matching the sentinel of its code: for the per-entry results a
// batch reply carries (RenewDelegations).
func ResultError(r *pb.CommandResult) error {
	if r.GetCode() == pb.ErrorCode_OK {
		return nil
	}
	s := sentinelOf(r.GetCode())
	if s == nil {
		return fmt.Errorf("directory: %v: %s", r.GetCode(), r.GetMessage())
	}
	return fmt.Errorf("%w: %s", s, r.GetMessage())
}

// IsRefusal reports whether err is the directory's answer to a request
// (a refused command or a request it judged bad), as opposed to no answer
// (a transport failure, a timeout, no leader): the first will not change
// by asking again as it is, the second may.
func IsRefusal(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.sentinel != nil
}
