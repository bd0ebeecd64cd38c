package nfs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// buildNFSFuse builds the libnfs FUSE bridge (tools/nfsfuse) into a
// temporary directory. What it needs (a C compiler, libnfs-dev,
// libfuse3-dev, /dev/fuse, root for allow_other) missing, the test fails
// under CI (scripts/install-deps.sh installs it all) and is skipped
// elsewhere.
func buildNFSFuse(t *testing.T) string {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		skip("no /dev/fuse (%v): the libnfs mount cannot run", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: the libnfs mount needs allow_other and other users' credentials")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		skip("no C compiler to build tools/nfsfuse (apt-get install gcc)")
	}
	flags, err := exec.Command("pkg-config", "--cflags", "--libs", "fuse3", "libnfs").Output()
	if err != nil {
		skip("pkg-config fuse3 libnfs: %v (apt-get install pkg-config libfuse3-dev libnfs-dev)", err)
	}
	bin := filepath.Join(t.TempDir(), "nfsfuse")
	args := append([]string{"-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, "../../../tools/nfsfuse/nfsfuse.c"}, strings.Fields(string(flags))...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building tools/nfsfuse: %v\n%s", err, out)
	}
	return bin
}

// mountNFSFuse mounts export of the gateway at addr through the bridge and
// returns the mount point; the test's cleanup unmounts it.
func mountNFSFuse(t *testing.T, bin, addr, export string) string {
	t.Helper()
	// Other users reach it: not under t.TempDir(), which is 0700.
	mnt, err := os.MkdirTemp("", "nfsfuse-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(mnt) })
	if err := os.Chmod(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "-f", libnfsURL(addr, export), mnt)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = exec.Command("fusermount3", "-u", mnt).Run()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		mounts, _ := os.ReadFile("/proc/mounts")
		if strings.Contains(string(mounts), " "+mnt+" fuse") {
			return mnt
		}
		select {
		case err := <-exited:
			t.Fatalf("nfsfuse exited: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no mount at %s after 30 s:\n%s", mnt, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// asUser runs a shell command as uid and gid and returns its error and
// output.
func asUser(uid, gid uint32, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestLibnfsMount mounts a gateway through the libnfs client library
// (tools/nfsfuse, the bridge `make pjdfstest-nfs` runs pjdfstest on) and
// checks what the bridge adds: files written and read through the mount
// are the gateway's; each process's uid and gid reach the gateway as the
// AUTH_SYS credential (another user is refused a root-only directory and
// owns what it creates); fcntl byte-range locks are NLM locks in the
// store, which a client of another gateway sees, and a blocked F_SETLKW
// gets the lock once it is released.
func TestLibnfsMount(t *testing.T) {
	bin := buildNFSFuse(t)
	locks := NewMemLocks()
	b, srv1 := startLocalWith(t, Config{Locks: locks})
	srv2, err := Start(Config{Backend: b, Locks: locks}, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv2.Close(context.Background()) })
	mnt := mountNFSFuse(t, bin, srv1.Addr(), "/default")

	data := bytes.Repeat([]byte("arbor through libnfs\n"), 50000)
	if err := os.WriteFile(filepath.Join(mnt, "a.txt"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "a.txt")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes of %d (%v), or they differ", len(got), len(data), err)
	}
	c := dialRPC(t, srv2.Addr())
	root := c.mount("/default")
	st0, fh := lookup(c, root, "a.txt")
	if st0 != OK {
		t.Fatalf("the mount's file at another gateway: %d", st0)
	}

	// Credentials: root's 0700 directory refuses uid 4242; a 1777 one
	// takes its file, owned by it.
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"private", 0o700}, {"shared", 0o777 | os.ModeSticky}} {
		if err := os.Mkdir(filepath.Join(mnt, d.name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(mnt, d.name), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := asUser(4242, 4242, "echo x > "+filepath.Join(mnt, "private", "f")); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("uid 4242 wrote into root's 0700 directory: %v %s", err, out)
	}
	if out, err := asUser(4242, 4343, "echo x > "+filepath.Join(mnt, "shared", "f")); err != nil {
		t.Fatalf("uid 4242 in a 1777 directory: %v %s", err, out)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "shared", "f"), &st); err != nil || st.Uid != 4242 || st.Gid != 4343 {
		t.Fatalf("the file uid 4242 made: %+v %v", st, err)
	}
	if out, err := asUser(4343, 4343, "rm "+filepath.Join(mnt, "shared", "f")); err == nil {
		t.Fatalf("uid 4343 removed uid 4242's file from a sticky directory: %s", out)
	}

	// Locks: two open file descriptions are two owners (OFD locks).
	p := filepath.Join(mnt, "a.txt")
	f1, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	f2, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	wr := func(start, n int64) *unix.Flock_t {
		return &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: start, Len: n}
	}
	if err := unix.FcntlFlock(f1.Fd(), unix.F_OFD_SETLK, wr(0, 10)); err != nil {
		t.Fatalf("the first lock: %v", err)
	}
	if err := unix.FcntlFlock(f2.Fd(), unix.F_OFD_SETLK, wr(5, 1)); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("a lock in the way of another owner's: %v, want EAGAIN", err)
	}
	q := wr(5, 1)
	if err := unix.FcntlFlock(f2.Fd(), unix.F_OFD_GETLK, q); err != nil || q.Type != unix.F_WRLCK || q.Start != 0 || q.Len != 10 {
		t.Fatalf("F_GETLK: %+v %v", q, err)
	}
	if err := unix.FcntlFlock(f2.Fd(), unix.F_OFD_SETLK, wr(10, 5)); err != nil {
		t.Fatalf("a lock next to it: %v", err)
	}
	// A client of the other gateway sees the mount's locks.
	if stat, h := c.nlm(nlmProcTest, nlmOwner{"elsewhere", 1}, fh, false, false, 0, 0); stat != nlm4Denied || !h.excl {
		t.Fatalf("TEST at the other gateway: %d %+v", stat, h)
	}
	// F_SETLKW waits for the lock in its way, and gets it once it is
	// released.
	got := make(chan error, 1)
	go func() { got <- unix.FcntlFlock(f2.Fd(), unix.F_OFD_SETLKW, wr(0, 10)) }()
	select {
	case err := <-got:
		t.Fatalf("F_SETLKW over a held lock returned at once: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := unix.FcntlFlock(f1.Fd(), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK, Start: 0, Len: 10}); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("F_SETLKW after the unlock: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("F_SETLKW still waiting 30 s after the lock in its way was released")
	}
	if err := unix.FcntlFlock(f1.Fd(), unix.F_OFD_SETLK, wr(0, 1)); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("the lock F_SETLKW took is not held: %v", err)
	}
}
