package nfs

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/fs"
)

// FileHandle is what an NFS file handle carries (FSS §8: a handle names
// its object by itself, so any gateway answers it): the file system F,
// the object (D, C), the snapshot S (0: live), and Gen, the file system's
// generation (its creation time), so a handle outlives no file system:
// a file system deleted and another made under the same number makes old
// handles stale. Objects need no generation of their own: (D, C) is never
// reused within a file system (internal/fs doc.go), so a handle whose
// object is gone answers NFS3ERR_STALE.
type FileHandle struct {
	F   uint64
	H   fs.Handle
	S   uint64
	Gen uint64
}

// handleVersion is the first byte of every handle this gateway makes;
// handleBytes the encoded length.
const (
	handleVersion = 1
	handleBytes   = 1 + 5*8
	// maxHandleBytes is NFS3_FHSIZE.
	maxHandleBytes = 64
)

var errBadHandle = errors.New("nfs: not a handle of this gateway")

// Encode returns the handle's bytes.
func (h FileHandle) Encode() []byte {
	b := make([]byte, 1, handleBytes)
	b[0] = handleVersion
	for _, v := range []uint64{h.F, h.H.D, h.H.C, h.S, h.Gen} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

// DecodeHandle parses a handle made by Encode.
func DecodeHandle(b []byte) (FileHandle, error) {
	if len(b) != handleBytes || b[0] != handleVersion {
		return FileHandle{}, fmt.Errorf("%w: %d bytes", errBadHandle, len(b))
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(b[1+8*i:]) }
	h := FileHandle{F: u(0), H: fs.Handle{D: u(1), C: u(2)}, S: u(3), Gen: u(4)}
	if h.F == 0 {
		return FileHandle{}, fmt.Errorf("%w: file system 0", errBadHandle)
	}
	return h, nil
}

// fsid is the fsid attribute of file system f at snapshot s: each
// snapshot shows as a file system of its own.
func fsid(f, s uint64) uint64 { return f ^ s<<40 }
