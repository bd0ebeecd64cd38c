package directory

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// ErrInvalidCommand is wrapped by every DecodeCommand error.
var ErrInvalidCommand = errors.New("directory: invalid command")

// DecodeCommand decodes one entry of the directory's log. It checks the
// envelope only (size, encoding, an operation and a time are present); Apply
// validates the operation's fields against the state.
func DecodeCommand(data []byte) (*pb.Command, error) {
	if len(data) > maxCommandBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidCommand, len(data), maxCommandBytes)
	}
	var cmd pb.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		// protobuf's error text varies from run to run by design; the
		// length is what helps find the entry.
		return nil, fmt.Errorf("%w: %d bytes are not a Command encoding", ErrInvalidCommand, len(data))
	}
	if cmd.Op == nil {
		return nil, fmt.Errorf("%w: no operation", ErrInvalidCommand)
	}
	if cmd.NowUnixMs <= 0 || cmd.NowUnixMs > maxUnixMs {
		return nil, fmt.Errorf("%w: time %d out of range", ErrInvalidCommand, cmd.NowUnixMs)
	}
	return &cmd, nil
}

// maxUnixMs keeps every sum of a time and a duration far from overflow
// (year 2500).
const maxUnixMs = 16725225600000

// EncodeCommand encodes cmd for proposal. It refuses what DecodeCommand would
// refuse, so a bad command never reaches the log.
func EncodeCommand(cmd *pb.Command) ([]byte, error) {
	if cmd.GetOp() == nil {
		return nil, fmt.Errorf("%w: no operation", ErrInvalidCommand)
	}
	if cmd.NowUnixMs <= 0 || cmd.NowUnixMs > maxUnixMs {
		return nil, fmt.Errorf("%w: time %d out of range", ErrInvalidCommand, cmd.NowUnixMs)
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("directory: encode command: %w", err)
	}
	if len(data) > maxCommandBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidCommand, len(data), maxCommandBytes)
	}
	return data, nil
}

// addMs adds a duration in milliseconds to a time, saturating.
func addMs(t, d int64) int64 {
	if d > 0 && t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}
