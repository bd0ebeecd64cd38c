package fs

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors are syscall.Errno values wrapped with what failed, so
// errors.As(err, &errno) gives the POSIX error a caller returns (FUSE,
// NFS). An error that wraps no Errno is an I/O failure (EIO): the store was
// unavailable, gave up, or found corrupt metadata.

// errnoOf returns the errno an error stands for.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// Errno returns the POSIX error number err stands for (EIO when it wraps
// none), and 0 for nil.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return errnoOf(err)
}

func errf(errno syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errno)
}

// errStaleSnapshots aborts a transaction that read a superblock whose
// epoch or generation differs from the cached snapshot set.
var errStaleSnapshots = errors.New("fs: snapshot set changed")
