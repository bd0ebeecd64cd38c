package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Conversions between the file system's types and the wire's. Decoders of
// what a peer sent check it: a malformed field is an error, never a panic.

func handleToPB(h fs.Handle) *pb.Handle { return &pb.Handle{D: h.D, C: h.C} }

func handleFromPB(h *pb.Handle) fs.Handle { return fs.Handle{D: h.GetD(), C: h.GetC()} }

func guidFromPB(b []byte) (fs.GUID, error) {
	var g fs.GUID
	if len(b) == 0 {
		return g, nil
	}
	if len(b) != len(g) {
		return g, fmt.Errorf("blob id of %d bytes, want %d", len(b), len(g))
	}
	copy(g[:], b)
	return g, nil
}

func attrToPB(a fs.Attr) *pb.Attr {
	out := &pb.Attr{
		Handle: handleToPB(a.Handle), Ino: a.Ino, Mode: a.Mode, Nlink: a.Nlink, Uid: a.Uid, Gid: a.Gid,
		Size: a.Size, Blocks: a.Blocks, Rdev: a.Rdev, AtimeNs: a.Atime.UnixNano(), MtimeNs: a.Mtime.UnixNano(),
		CtimeNs: a.Ctime.UnixNano(), BtimeNs: a.Btime.UnixNano(), DataGen: a.DataGen, BlobExists: a.BlobExists,
		Xattrs: a.Xattrs,
	}
	if !a.Blob.IsZero() {
		out.Blob = a.Blob[:]
	}
	return out
}

func attrFromPB(a *pb.Attr) (fs.Attr, error) {
	if a == nil {
		return fs.Attr{}, errors.New("no attributes in the reply")
	}
	blob, err := guidFromPB(a.GetBlob())
	if err != nil {
		return fs.Attr{}, err
	}
	return fs.Attr{
		Handle: handleFromPB(a.GetHandle()), Ino: a.GetIno(), Mode: a.GetMode(), Nlink: a.GetNlink(),
		Uid: a.GetUid(), Gid: a.GetGid(), Size: a.GetSize(), Blocks: a.GetBlocks(), Rdev: a.GetRdev(),
		Atime: time.Unix(0, a.GetAtimeNs()), Mtime: time.Unix(0, a.GetMtimeNs()), Ctime: time.Unix(0, a.GetCtimeNs()),
		Btime: time.Unix(0, a.GetBtimeNs()), DataGen: a.GetDataGen(), Blob: blob, BlobExists: a.GetBlobExists(),
		Xattrs: a.GetXattrs(),
	}, nil
}

func blockToPB(b fs.BlockRef) *pb.BlockRef {
	return &pb.BlockRef{Found: b.Found, S: b.S, Tract: b.Tract, Length: b.Length, Inline: b.Inline}
}

func blockFromPB(b *pb.BlockRef) fs.BlockRef {
	out := fs.BlockRef{Found: b.GetFound(), S: b.GetS(), Tract: b.GetTract(), Length: b.GetLength()}
	if b.GetInline() != nil {
		out.Inline = b.GetInline()
		if out.Inline == nil {
			out.Inline = []byte{}
		}
	}
	return out
}

// errorToPB turns an operation's error into the wire's answer (nil for
// success). Only the kinds the client acts on are told apart; anything
// else is EIO with its message.
func errorToPB(err error) *pb.Error {
	if err == nil {
		return nil
	}
	var foreign *ForeignError
	switch {
	case errors.Is(err, errNotOwner), errors.As(err, &foreign):
		return &pb.Error{Kind: pb.Error_NOT_OWNER, Errno: uint32(syscall.EAGAIN), Message: err.Error()}
	case errors.Is(err, fs.ErrAmbiguousCommit):
		return &pb.Error{Kind: pb.Error_AMBIGUOUS, Errno: uint32(syscall.EIO), Message: err.Error()}
	case errors.Is(err, errRetry):
		return &pb.Error{Kind: pb.Error_RETRY, Errno: uint32(syscall.EAGAIN), Message: err.Error()}
	case errors.Is(err, fs.ErrRaced):
		return &pb.Error{Kind: pb.Error_RACED, Errno: uint32(syscall.EAGAIN), Message: err.Error()}
	case errors.Is(err, errInvalid):
		return &pb.Error{Kind: pb.Error_INVALID, Errno: uint32(syscall.EINVAL), Message: err.Error()}
	}
	return &pb.Error{Kind: pb.Error_POSIX, Errno: uint32(fs.Errno(err)), Message: err.Error()}
}

// errInvalid marks a malformed request.
var errInvalid = errors.New("meta: malformed request")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// RemoteError is an error a metadata server answered: the errno it
// carries is the POSIX answer (fs.Errno finds it).
type RemoteError struct {
	Kind    pb.Error_Kind
	Errno   syscall.Errno
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

// Unwrap gives the errno (and fs.ErrRaced for a raced block commit).
func (e *RemoteError) Unwrap() []error {
	errs := []error{e.Errno}
	if e.Kind == pb.Error_RACED {
		errs = append(errs, fs.ErrRaced)
	}
	return errs
}

// requestError is where the client maps a Meta RPC's gRPC error (a call
// that got no pb.Error answer), once. Most mean no answer (the server is
// down or unreachable, its tables move) and are worth asking again: nil.
// A few refuse the request itself, and asking again would only wait for
// the caller's deadline: those return the POSIX error the caller gets, in
// words. gRPC's own refusals are told by their text, as gRPC gives no
// other mark.
func requestError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	switch msg := st.Message(); st.Code() {
	case codes.Internal:
		// Proto strings must be UTF-8; POSIX names need not be.
		if what, ok := strings.CutPrefix(msg, "grpc: error while marshaling: "); ok {
			return fmt.Errorf("meta: the request cannot be sent (%s; names must be UTF-8): %w", what, syscall.EINVAL)
		}
	case codes.Unimplemented:
		return fmt.Errorf("meta: the metadata server does not serve this request (another version?): %s: %w", msg, syscall.ENOTSUP)
	case codes.PermissionDenied:
		// Another tenant's file system, or a method not open to the
		// caller (tenancy.go): asking again changes nothing.
		return fmt.Errorf("meta: %s: %w", strings.TrimPrefix(msg, "permission denied: "), syscall.EACCES)
	}
	return nil
}

func errorFromPB(e *pb.Error) error {
	if e == nil {
		return nil
	}
	errno := syscall.Errno(e.GetErrno())
	if errno == 0 {
		errno = syscall.EIO
	}
	return &RemoteError{Kind: e.GetKind(), Errno: errno, Message: e.GetMessage()}
}

// Table ranges in the delegation map are directory ids, 8 bytes
// big-endian; an empty end is the end of the ids.

func rangeToKeys(r fs.DRange) (start, end []byte) {
	start = binary.BigEndian.AppendUint64(nil, r.Lo)
	if r.Hi != 0 {
		end = binary.BigEndian.AppendUint64(nil, r.Hi)
	}
	return start, end
}

func rangeFromKeys(start, end []byte) (fs.DRange, error) {
	if len(start) != 8 || (len(end) != 0 && len(end) != 8) {
		return fs.DRange{}, fmt.Errorf("table range [%x, %x) is not of directory ids", start, end)
	}
	r := fs.DRange{Lo: binary.BigEndian.Uint64(start)}
	if len(end) == 8 {
		r.Hi = binary.BigEndian.Uint64(end)
		if r.Hi <= r.Lo {
			return fs.DRange{}, fmt.Errorf("table range [%#x, %#x) is empty", r.Lo, r.Hi)
		}
	}
	return r, nil
}
