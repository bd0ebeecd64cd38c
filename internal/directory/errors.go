package directory

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// grpcCode is the gRPC status code of each command outcome.
func grpcCode(c pb.ErrorCode) codes.Code {
	switch c {
	case pb.ErrorCode_OK:
		return codes.OK
	case pb.ErrorCode_INVALID_ARGUMENT:
		return codes.InvalidArgument
	case pb.ErrorCode_UNKNOWN_NODE, pb.ErrorCode_NOT_FOUND:
		return codes.NotFound
	case pb.ErrorCode_STALE_EPOCH, pb.ErrorCode_LEASE_HELD, pb.ErrorCode_EXPIRED,
		pb.ErrorCode_NOT_INITIALIZED, pb.ErrorCode_DECOMMISSIONED, pb.ErrorCode_NODE_DEAD:
		return codes.FailedPrecondition
	case pb.ErrorCode_CONFLICT:
		return codes.Aborted
	case pb.ErrorCode_ALREADY_EXISTS:
		return codes.AlreadyExists
	case pb.ErrorCode_LIMIT_EXCEEDED:
		return codes.ResourceExhausted
	}
	return codes.Unknown
}

// resultError turns a failed command into a gRPC error carrying the
// CommandResult as a detail.
func resultError(res *pb.CommandResult) error {
	st := status.New(grpcCode(res.Code), fmt.Sprintf("directory: %v: %s", res.Code, res.Message))
	if withDetail, err := st.WithDetails(res); err == nil {
		st = withDetail
	}
	return st.Err()
}

func invalidArgument(format string, args ...any) error {
	return resultError(failf(pb.ErrorCode_INVALID_ARGUMENT, format, args...))
}

func notFound(format string, args ...any) error {
	return resultError(failf(pb.ErrorCode_NOT_FOUND, format, args...))
}

// ResultOf returns the CommandResult a directory error carries: the outcome
// of a refused command (its code, message and payload, such as the current
// holder of a lease).
func ResultOf(err error) (*pb.CommandResult, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if r, ok := d.(*pb.CommandResult); ok {
			return r, true
		}
	}
	return nil, false
}

// CodeOf returns the directory's error code of err: OK for nil, the code of
// a refused command, and -1 for other errors (transport, timeout).
func CodeOf(err error) pb.ErrorCode {
	if err == nil {
		return pb.ErrorCode_OK
	}
	if r, ok := ResultOf(err); ok {
		return r.Code
	}
	return -1
}

// IsNotFound reports whether err says that what was asked for does not
// exist: ErrNotFound, or a gRPC NotFound or the directory's NOT_FOUND that
// did not come through the Client.
func IsNotFound(err error) bool {
	return errors.Is(err, ErrNotFound) || status.Code(err) == codes.NotFound || CodeOf(err) == pb.ErrorCode_NOT_FOUND
}

// NotLeaderOf returns the leader hint of an error from a replica that is not
// the leader.
func NotLeaderOf(err error) (*pb.NotLeader, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return nil, false
	}
	for _, d := range st.Details() {
		if nl, ok := d.(*pb.NotLeader); ok {
			return nl, true
		}
	}
	return nil, false
}

// engineError maps a replication engine error to a gRPC error.
func (s *Service) engineError(err error) error {
	if nl, ok := raftengine.IsNotLeader(err); ok {
		return s.notLeader(nl.Leader)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, raftengine.ErrProposalDropped), errors.Is(err, raftengine.ErrDiskFull):
		return status.Errorf(codes.Unavailable, "directory: %v; retry", err)
	case errors.Is(err, raftengine.ErrStopped), errors.Is(err, raftengine.ErrGroupNotFound):
		return s.notLeader(0)
	case errors.Is(err, raftengine.ErrTooLarge):
		return invalidArgument("%v", err)
	}
	return status.Errorf(codes.Internal, "directory: %v", err)
}

// notLeader is the error a replica that cannot serve returns: Unavailable
// with a NotLeader detail naming the leader it knows of (if any).
func (s *Service) notLeader(leader uint64) error {
	hint := &pb.NotLeader{}
	msg := "directory: this replica is not the leader and knows none"
	if leader != 0 && leader != s.cfg.NodeID {
		hint.LeaderId, hint.LeaderAddress = leader, s.addressOf(leader)
		msg = fmt.Sprintf("directory: not the leader; the leader is node %d at %q", leader, hint.LeaderAddress)
	}
	st := status.New(codes.Unavailable, msg)
	if withDetail, err := st.WithDetails(hint); err == nil {
		st = withDetail
	}
	return st.Err()
}
