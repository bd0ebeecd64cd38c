package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Files in a node's data directory.
const (
	// lockFileName is flocked for the lifetime of the server.
	lockFileName = "LOCK"
	// PIDFileName holds the server's process id while it runs. It is
	// informational (for tools such as arbor dev); the lock is what keeps
	// two servers out of one directory.
	PIDFileName = "arbor.pid"
	// dbDirName is the pebble database.
	dbDirName = "db"
	// dataDirPerm keeps the node's data private to its user.
	dataDirPerm = 0o750
)

// dataDirLock is an exclusive lock on a data directory.
type dataDirLock struct {
	dir  string
	file *os.File
}

// lockDataDir creates dir if needed, takes an exclusive, non-blocking flock
// on dir/LOCK and writes dir/arbor.pid. The kernel drops the flock when the
// process dies, so a killed server never leaves a lock behind; a stale pid
// file is simply overwritten.
func lockDataDir(dir string) (*dataDirLock, error) {
	if err := os.MkdirAll(dir, dataDirPerm); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := ReadPIDFile(dir); perr == nil {
				holder = fmt.Sprintf("another arbor server (pid %d)", pid)
			}
			return nil, fmt.Errorf("data dir %s is in use by %s", dir, holder)
		}
		return nil, fmt.Errorf("data dir %s: lock: %w", dir, err)
	}
	l := &dataDirLock{dir: dir, file: f}
	if err := writeFileAtomic(filepath.Join(dir, PIDFileName), []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		l.release()
		return nil, fmt.Errorf("data dir: pid file: %w", err)
	}
	return l, nil
}

// release removes the pid file (if it is still ours) and drops the lock.
func (l *dataDirLock) release() error {
	var errs []error
	if pid, err := ReadPIDFile(l.dir); err == nil && pid == os.Getpid() {
		if err := os.Remove(filepath.Join(l.dir, PIDFileName)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.file.Close(); err != nil { // closing drops the flock
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ReadPIDFile returns the pid recorded in dir/arbor.pid.
func ReadPIDFile(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, PIDFileName))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q is not a pid", filepath.Join(dir, PIDFileName), strings.TrimSpace(string(b)))
	}
	return pid, nil
}

// writeFileAtomic writes path through a synced temporary file and a
// rename, so readers see the old or the new content, never a torn one.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
