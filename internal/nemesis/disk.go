package nemesis

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// diskFullBytes is the size of the small disk (a tmpfs) the last node runs
// on with Config.DiskFull.
const diskFullBytes = 1 << 30

// smallDisk is a node's data directory on a file system of its own, small
// enough to fill: a tmpfs of diskFullBytes (root only). fill takes all its
// free space with one file; free gives it back.
type smallDisk struct {
	node uint64
	dir  string
}

// mountSmallDisk mounts a tmpfs at dir (the node's data dir, before its
// first start).
func mountSmallDisk(node uint64, dir string) (*smallDisk, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("nemesis: the disk-full fault needs root (it mounts a small tmpfs for a node)")
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(diskFullBytes)); err != nil {
		return nil, fmt.Errorf("nemesis: mount a tmpfs at %s: %w", dir, err)
	}
	return &smallDisk{node: node, dir: dir}, nil
}

func (d *smallDisk) filler() string { return filepath.Join(d.dir, "nemesis-filler") }

// fill allocates every free byte of the disk.
func (d *smallDisk) fill() error {
	var st unix.Statfs_t
	if err := unix.Statfs(d.dir, &st); err != nil {
		return err
	}
	f, err := os.OpenFile(d.filler(), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	free := int64(st.Bavail) * int64(st.Bsize)
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free); err != nil && !errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("fill %s: %w", d.dir, err)
	}
	return nil
}

// free removes the filler.
func (d *smallDisk) free() error {
	if err := os.Remove(d.filler()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// unmount unmounts the tmpfs (the node must be stopped); lazily if busy.
func (d *smallDisk) unmount() {
	if err := unix.Unmount(d.dir, 0); err != nil {
		_ = exec.Command("umount", "-l", d.dir).Run()
	}
}
