package fuse_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/fuse"
)

// These tests run a dev cluster of real arbor processes and mount its
// file system through the kernel with real `arbor mount` processes.

// env is a running cluster and the arbor binary.
type env struct {
	t   *testing.T
	bin string
	c   *devcluster.Cluster
}

func needFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse here (%v): FUSE mounts cannot run", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		t.Skip("neither root nor fusermount3: FUSE mounts cannot run")
	}
}

func startEnv(t *testing.T) *env {
	needFUSE(t)
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Binary: bin})
	return &env{t: t, bin: bin, c: c}
}

// arbor runs one arbor client command against the cluster.
func (e *env) arbor(args ...string) (string, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, append(args, "--dir", e.c.Dir())...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) mustArbor(args ...string) string {
	e.t.Helper()
	out, err := e.arbor(args...)
	if err != nil {
		e.t.Fatalf("arbor %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// createFS waits until the cluster's storage takes a file system (extents
// and the TLT exist some seconds after the nodes are healthy) and creates
// it.
func (e *env) createFS(name string) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := e.arbor("fs", "create", name)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("arbor fs create %s: %v\n%s", name, err, out)
		}
		time.Sleep(time.Second)
	}
}

// mount is a running `arbor mount` process.
type mount struct {
	dir    string
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan error
	once   sync.Once
}

func (e *env) mount(fsName string, extra ...string) *mount {
	e.t.Helper()
	dir := filepath.Join(e.t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	args := append([]string{"mount", fsName, dir, "--dir", e.c.Dir()}, extra...)
	cmd := exec.Command(e.bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &syncWriter{w: &out}, &syncWriter{w: &out}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan error, 1)
	m := &mount{dir: dir, cmd: cmd, out: &out, exited: exited}
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	for !fuse.Mounted(dir) {
		select {
		case err := <-exited:
			e.t.Fatalf("arbor mount exited: %v\n%s", err, out.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			e.t.Fatalf("arbor mount: not mounted after 2 minutes\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	e.t.Cleanup(func() { m.stop(e.t) })
	return m
}

// kill kills the mount process with SIGKILL (a crash) and detaches its
// dead mount.
func (m *mount) kill(t *testing.T) {
	m.once.Do(func() {
		_ = m.cmd.Process.Kill()
		select {
		case <-m.exited:
		case <-time.After(time.Minute):
			t.Errorf("arbor mount %s did not die", m.dir)
		}
		_ = exec.Command("fusermount3", "-u", "-z", m.dir).Run()
	})
}

// stop unmounts by SIGINT (once) and checks the process exits cleanly.
func (m *mount) stop(t *testing.T) { m.once.Do(func() { m.doStop(t) }) }

func (m *mount) doStop(t *testing.T) {
	exited := m.exited
	_ = m.cmd.Process.Signal(syscall.SIGINT)
	defer func() {
		if t.Failed() {
			t.Logf("arbor mount %s said:\n%s", m.dir, m.out.String())
		}
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("arbor mount %s: %v\n%s", m.dir, err, m.out.String())
		}
	case <-time.After(time.Minute):
		_ = m.cmd.Process.Kill()
		_ = exec.Command("fusermount3", "-u", "-z", m.dir).Run()
		t.Errorf("arbor mount %s did not stop in a minute\n%s", m.dir, m.out.String())
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
}

func sum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// tree lists every path under dir with its type and, for files, the
// checksum of its content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("f %o %x", info.Mode().Perm(), sha256.Sum256(b))
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "l " + target
		default:
			out[rel] = fmt.Sprintf("d %o", info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMountCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	e := startEnv(t)
	e.createFS("default")
	a := e.mount("default")
	b := e.mount("default")

	t.Run("posix", func(t *testing.T) { posixSmoke(t, a.dir) })
	t.Run("two-mounts", func(t *testing.T) { twoMounts(t, a.dir, b.dir) })
	t.Run("bad-input", func(t *testing.T) { badInput(t, e, a.dir) })
	t.Run("snapshot", func(t *testing.T) { snapshotDuringWrites(t, e, a.dir) })
	t.Run("stress", func(t *testing.T) { stress(t, e, a.dir, b.dir) })
	t.Run("btree-metrics", func(t *testing.T) { btreeMetrics(t, e) })
	t.Run("cli", func(t *testing.T) { cliLifecycle(t, e) })
	t.Run("kill-storage-node", func(t *testing.T) { killStorageNode(t, e, a) })
}

// stressWorkerEnv, set to "W:DIR", makes the test binary a stress worker
// process (TestMain): worker W runs its operations in DIR and exits.
const stressWorkerEnv = "ARBOR_FUSE_STRESS_WORKER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(stressWorkerEnv); spec != "" {
		os.Exit(stressWorkerProcess(spec))
	}
	if spec := os.Getenv(crashWriterEnv); spec != "" {
		os.Exit(crashWriterProcess(spec))
	}
	os.Exit(m.Run())
}

// stress runs worker processes on both mounts doing random operations on
// one shared directory (creates, writes, renames over each other, links,
// unlinks, mkdir and rmdir), then checks that every file reads whole and
// that fsck finds nothing wrong. The workers are separate processes (this
// test binary run again), so the kernel sees independent callers.
func stress(t *testing.T, e *env, a, b string) {
	const workers = 4
	if err := os.Mkdir(filepath.Join(a, "stress"), 0o755); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range workers {
		mnt := a
		if w%2 == 1 {
			mnt = b
		}
		d := filepath.Join(mnt, "stress")
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s", stressWorkerEnv, w, d))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("stress worker %d (pid %d): %v\n%s", w, cmd.Process.Pid, err, out)
			}
		})
	}
	wg.Wait()
	tree(t, filepath.Join(a, "stress"))
	e.mustArbor("fsck", "default")
}

// stressWorkerProcess runs one stress worker; it prints what went wrong
// and returns the exit status.
func stressWorkerProcess(spec string) int {
	const ops, names = 60, 12
	ws, d, ok := strings.Cut(spec, ":")
	w, err := strconv.Atoi(ws)
	if !ok || err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want W:DIR\n", stressWorkerEnv, spec)
		return 2
	}
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	name := func() string { return filepath.Join(d, fmt.Sprintf("n%02d", rng.IntN(names))) }
	status := 0
	for range ops {
		p := name()
		var err error
		switch rng.IntN(7) {
		case 0, 1:
			// Whole-file writes of a recognizable pattern: a reader must
			// never see a mix of two writers.
			n := 1 + rng.IntN(200_000)
			err = os.WriteFile(p, bytes.Repeat([]byte{byte('a' + w)}, n), 0o644)
		case 2:
			err = os.Rename(p, name())
		case 3:
			err = os.Link(p, name())
		case 4:
			err = os.Remove(p)
		case 5:
			err = os.Mkdir(p, 0o755)
		case 6:
			var bs []byte
			bs, err = os.ReadFile(p)
			// Concurrent truncating writers may interleave (as on any
			// file system), leaving holes, but no byte nobody wrote.
			if err == nil && len(bytes.Trim(bs, "\x00abcd")) != 0 {
				fmt.Fprintf(os.Stderr, "%s holds bytes no writer wrote\n", p)
				status = 1
			}
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrExist) &&
			!errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.ENOTDIR) && !errors.Is(err, syscall.ENOTEMPTY) &&
			!errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.ESTALE) {
			// ESTALE: the other mount removed and reclaimed a file this
			// one had open (open-after-unlink holds only within one
			// mount, as with NFS).
			fmt.Fprintf(os.Stderr, "worker %d: %v\n", w, err)
			return 1
		}
	}
	return status
}

func posixSmoke(t *testing.T, mnt string) {
	d := filepath.Join(mnt, "posix")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// Mode 0 stays 0 (go-fuse used to show 0644 and 0755).
	zf, zd := filepath.Join(d, "mode0"), filepath.Join(d, "mode0.d")
	if fd, err := syscall.Open(zf, syscall.O_CREAT|syscall.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	} else {
		syscall.Close(fd)
	}
	if err := syscall.Mkdir(zd, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{zf, zd} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0 {
			t.Fatalf("%s created with mode 0: %v, %v", p, st.Mode(), err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(zf); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(zd); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(d, "f")
	data := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // 1.6 MB: several blocks
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(data))
	}
	// Overwrite in the middle, then extend with a hole.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XYZ"), 500_000); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 3_000_000); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(data[500_000:], "XYZ")
	data = append(data, make([]byte, 3_000_000-len(data))...)
	data = append(data, "end"...)
	if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
		t.Fatalf("after overwrite and hole: %d bytes, differ", len(got))
	}
	// Truncate down and up.
	if err := os.Truncate(p, 10); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 20); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, data[:10]...), make([]byte, 10)...)
	if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
		t.Fatalf("after truncates: %q", got)
	}
	// posix_fallocate extends; KEEP_SIZE and hole punching do not.
	f, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, 40); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 1, 0, 1000); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, syscall.Fallocate(int(f.Fd()), 0x3, 0, 10), syscall.EOPNOTSUPP)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != 40 {
		t.Fatalf("size after fallocate: %v %v", fi, err)
	}
	if err := os.Truncate(p, 20); err != nil {
		t.Fatal(err)
	}
	// Metadata.
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	if err := os.Chtimes(p, mt, mt); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o600 || st.Uid != 1234 || st.Gid != 5678 || st.Size != 20 || st.Mtim.Nano() != mt.UnixNano() {
		t.Fatalf("stat %+v", st)
	}
	// Links, symlinks, rename, xattrs.
	if err := os.Link(p, filepath.Join(d, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(p, &st); err != nil || st.Nlink != 2 {
		t.Fatalf("nlink %d (%v), want 2", st.Nlink, err)
	}
	if err := os.Symlink("f", filepath.Join(d, "sym")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(d, "sym")); !bytes.Equal(got, want) {
		t.Fatal("reading through the symlink")
	}
	if err := os.Mkdir(filepath.Join(d, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(d, "hard"), filepath.Join(d, "sub", "moved")); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, os.Rename(d, filepath.Join(d, "sub", "inside")), syscall.EINVAL)
	wantErrno(t, syscall.Rmdir(filepath.Join(d, "sub")), syscall.ENOTEMPTY)
	if err := syscall.Setxattr(p, "user.color", []byte("blue"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(p, "user.color", buf)
	if err != nil || string(buf[:n]) != "blue" {
		t.Fatalf("getxattr %q %v", buf[:n], err)
	}
	// Many entries: readdir across batches.
	many := filepath.Join(d, "many")
	if err := os.Mkdir(many, 0o755); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 700 {
		name := fmt.Sprintf("e%04d", i)
		names = append(names, name)
		if err := os.WriteFile(filepath.Join(many, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(many)
	if err != nil {
		t.Fatal(err)
	}
	var gotNames []string
	for _, en := range ents {
		gotNames = append(gotNames, en.Name())
	}
	slices.Sort(gotNames)
	if !slices.Equal(gotNames, names) {
		t.Fatalf("readdir: %d names, want %d", len(gotNames), len(names))
	}
	// A file open after its unlink stays readable.
	g, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(d, "sub", "moved")); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(g); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after unlink: %q %v", got, err)
	}
	g.Close()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat after unlink: %v", err)
	}
}

func readAll(f *os.File) ([]byte, error) {
	var out bytes.Buffer
	_, err := out.ReadFrom(bufio.NewReader(f))
	return out.Bytes(), err
}

func twoMounts(t *testing.T, a, b string) {
	d := "two"
	if err := os.Mkdir(filepath.Join(a, d), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		data := []byte(strings.Repeat(strconv.Itoa(i), 1000*(i+1)))
		// A writes and closes; B opens and reads (close-to-open).
		if err := os.WriteFile(filepath.Join(a, d, "x"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(b, d, "x")); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round %d: B read %d bytes (%v), want %d", i, len(got), err, len(data))
		}
		// And back.
		data = append(data, "b"...)
		if err := os.WriteFile(filepath.Join(b, d, "x"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(a, d, "x")); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round %d: A read %d bytes (%v), want %d", i, len(got), err, len(data))
		}
	}
	// Names: a file B creates is found by A at once (no negative caching),
	// and one B removes is gone from A within the attribute timeout.
	if err := os.WriteFile(filepath.Join(b, d, "new"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a, d, "new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b, d, "new")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.ReadFile(filepath.Join(a, d, "new"))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A still sees a file B removed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func badInput(t *testing.T, e *env, mnt string) {
	d := filepath.Join(mnt, "bad")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := tree(t, d)
	_, err := os.Create(filepath.Join(d, strings.Repeat("n", 256)))
	wantErrno(t, err, syscall.ENAMETOOLONG)
	wantErrno(t, os.Mkdir(filepath.Join(d, strings.Repeat("n", 256)), 0o755), syscall.ENAMETOOLONG)
	wantErrno(t, os.Rename(filepath.Join(d, "keep"), filepath.Join(d, strings.Repeat("n", 256))), syscall.ENAMETOOLONG)
	// 255 bytes is fine.
	long := filepath.Join(d, strings.Repeat("n", 255))
	if err := os.WriteFile(long, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(long); err != nil {
		t.Fatal(err)
	}
	// Writes and truncates past the size bound (16 TiB).
	f, err := os.OpenFile(filepath.Join(d, "keep"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("x"), 1<<44)
	wantErrno(t, err, syscall.EFBIG)
	wantErrno(t, f.Truncate(1<<44+1), syscall.EFBIG)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Paths with NUL never reach the file system: the kernel refuses them.
	_, err = os.Create(filepath.Join(d, "a\x00b"))
	if err == nil {
		t.Fatal("a name with NUL was accepted")
	}
	if after := tree(t, d); !mapsEqual(before, after) {
		t.Fatalf("bad input changed the tree:\nbefore %v\nafter  %v", before, after)
	}
	// An unknown file system: a clear error, nothing mounted.
	dir := t.TempDir()
	out, err := e.arbor("mount", "nosuchfs", dir)
	if err == nil || !strings.Contains(out, `no file system named "nosuchfs"`) {
		t.Fatalf("mount of an unknown file system: %v\n%s", err, out)
	}
	if fuse.Mounted(dir) {
		t.Fatal("an unknown file system was mounted")
	}
	out, err = e.arbor("snapshot", "create", "nosuchfs", "s")
	if err == nil || !strings.Contains(out, `no file system named "nosuchfs"`) {
		t.Fatalf("snapshot of an unknown file system: %v\n%s", err, out)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// snapshotDuringWrites takes a snapshot while a writer runs and checks
// that it holds the state of one instant of the writer's sequence, and
// that it does not change afterwards.
func snapshotDuringWrites(t *testing.T, e *env, mnt string) {
	d := filepath.Join(mnt, "snap")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// Step i: create f<i> holding i, then write "last" holding i. At any
	// instant: f0..f(m-1) exist (f(m-1) maybe still empty), and last is
	// m-1 or m-2.
	stop := make(chan struct{})
	done := make(chan error, 1)
	var steps int
	var progress atomic.Int64
	go func() {
		for i := 0; ; i++ {
			progress.Store(int64(i))
			select {
			case <-stop:
				steps = i
				done <- nil
				return
			default:
			}
			v := []byte(strconv.Itoa(i))
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), v, 0o644); err != nil {
				done <- err
				return
			}
			if err := os.WriteFile(filepath.Join(d, "last"), v, 0o644); err != nil {
				done <- err
				return
			}
		}
	}()
	// Snapshot once the writer is well under way, and let it go on after
	// (however slow the machine).
	waitSteps := func(n int64) {
		deadline := time.Now().Add(2 * time.Minute)
		for progress.Load() < n && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(time.Second)
	waitSteps(3)
	e.mustArbor("snapshot", "create", "default", "during")
	after := progress.Load()
	time.Sleep(time.Second)
	waitSteps(after + 3)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("the writer made %d steps", steps)
	s := e.mount("default", "--snapshot", "during")
	view := tree(t, filepath.Join(s.dir, "snap"))
	checkInstant(t, filepath.Join(s.dir, "snap"), view, steps)
	// The live file system moved on.
	if live := tree(t, d); len(live) <= len(view) {
		t.Fatalf("live has %d entries, the snapshot %d: the writer went on after it", len(live), len(view))
	}
	// Writing more changes nothing in the snapshot.
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), []byte("changed"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(d, "last")); err != nil {
		t.Fatal(err)
	}
	s2 := e.mount("default", "--snapshot", "during")
	if again := tree(t, filepath.Join(s2.dir, "snap")); !mapsEqual(view, again) {
		t.Fatal("the snapshot changed after later writes")
	}
	err := os.WriteFile(filepath.Join(s.dir, "snap", "x"), nil, 0o644)
	wantErrno(t, err, syscall.EROFS)
}

func checkInstant(t *testing.T, dir string, view map[string]string, steps int) {
	t.Helper()
	m := 0
	for {
		if _, ok := view[fmt.Sprintf("f%05d", m)]; !ok {
			break
		}
		m++
	}
	if m == 0 || m >= steps {
		t.Fatalf("snapshot holds %d files of %d steps: not taken during the writes", m, steps)
	}
	if len(view) != m+2 && len(view) != m+1 { // ".", f*, maybe last
		t.Fatalf("snapshot holds %d entries, want f00000..f%05d, '.' and last", len(view), m-1)
	}
	for i := range m {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != strconv.Itoa(i) && !(i == m-1 && len(b) == 0) {
			t.Fatalf("f%05d holds %q in the snapshot", i, b)
		}
	}
	last, err := os.ReadFile(filepath.Join(dir, "last"))
	if err != nil {
		if m == 1 && errors.Is(err, os.ErrNotExist) {
			return
		}
		t.Fatal(err)
	}
	n, err := strconv.Atoi(string(last))
	if err != nil && len(last) != 0 {
		t.Fatalf("last holds %q", last)
	}
	if len(last) != 0 && n != m-1 && n != m-2 {
		t.Fatalf("snapshot: f00000..f%05d exist but last is %d: not one instant", m-1, n)
	}
}

// killStorageNode kills -9 a storage node (not a directory voter) while
// files are written and read, and checks every file and fsck afterwards.
func killStorageNode(t *testing.T, e *env, a *mount) {
	d := filepath.Join(a.dir, "kill")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	sums := map[string]string{}
	var mu sync.Mutex
	write := func(i int) error {
		size := 1 + rng.IntN(3<<20)
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		name := fmt.Sprintf("w%04d", i)
		if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		mu.Lock()
		sums[name] = fmt.Sprintf("%x", sha256.Sum256(b))
		mu.Unlock()
		return nil
	}
	i := 0
	for ; i < 10; i++ {
		if err := write(i); err != nil {
			t.Fatal(err)
		}
	}
	victim := uint64(5)
	if err := e.c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed node %d after %d files", victim, i)
	start := time.Now()
	for ; i < 30; i++ {
		if err := write(i); err != nil {
			t.Fatalf("after the kill (%v): %v", time.Since(start), err)
		}
	}
	t.Logf("20 files written in %v after the kill", time.Since(start))
	for name, want := range sums {
		if got := sum(t, filepath.Join(d, name)); got != want {
			t.Fatalf("%s: checksum %s, want %s", name, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.c.StartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	out := e.mustArbor("fsck", "default")
	t.Log(out)
}

// TestDevMount runs `arbor dev --mount DIR` as make dev does: the file
// system "default" is created and mounted once the cluster is healthy,
// and SIGINT unmounts it and stops the cluster; run again on the same
// directory, the files are still there.
func TestDevMount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	needFUSE(t)
	bin := devclustertest.Binary(t)
	dir := t.TempDir()
	mnt := filepath.Join(t.TempDir(), "mnt") // created by arbor dev
	run := func(check func()) {
		cmd := exec.Command(bin, "dev", "--dir", filepath.Join(dir, "cluster"), "--mount", mnt)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &syncWriter{w: &out}, &syncWriter{w: &out}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.After(3 * time.Minute)
		for !strings.Contains(out.String(), "mounted at "+mnt) {
			select {
			case err := <-exited:
				t.Fatalf("arbor dev exited: %v\n%s", err, out.String())
			case <-deadline:
				_ = cmd.Process.Kill()
				t.Fatalf("arbor dev: no mount after 3 minutes\n%s", out.String())
			case <-time.After(100 * time.Millisecond):
			}
		}
		check()
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("arbor dev: %v\n%s", err, out.String())
			}
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("arbor dev did not stop\n%s", out.String())
		}
		if fuse.Mounted(mnt) {
			t.Fatalf("still mounted after arbor dev stopped\n%s", out.String())
		}
	}
	run(func() {
		if err := os.WriteFile(filepath.Join(mnt, "hello"), []byte("world"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	run(func() {
		if b, err := os.ReadFile(filepath.Join(mnt, "hello")); err != nil || string(b) != "world" {
			t.Fatalf("after a restart: %q %v", b, err)
		}
	})
}

// cliLifecycle drives the file-system and snapshot commands through a
// second file system's whole life.
func cliLifecycle(t *testing.T, e *env) {
	e.mustArbor("fs", "create", "other")
	if out, err := e.arbor("fs", "create", "other"); err == nil || !strings.Contains(out, "exists") {
		t.Fatalf("creating an existing file system: %v\n%s", err, out)
	}
	if out := e.mustArbor("fs", "list"); !strings.Contains(out, "other") || !strings.Contains(out, "default") {
		t.Fatalf("fs list:\n%s", out)
	}
	m := e.mount("other")
	if err := os.WriteFile(filepath.Join(m.dir, "f"), bytes.Repeat([]byte("x"), 100_000), 0o644); err != nil {
		t.Fatal(err)
	}
	e.mustArbor("snapshot", "create", "other", "one")
	if err := os.WriteFile(filepath.Join(m.dir, "f"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := e.mustArbor("snapshot", "list", "other"); !strings.Contains(out, "one") {
		t.Fatalf("snapshot list:\n%s", out)
	}
	if out, err := e.arbor("snapshot", "create", "other", "one"); err == nil {
		t.Fatalf("a second snapshot of one name was accepted:\n%s", out)
	}
	out := e.mustArbor("snapshot", "delete", "other", "one")
	if !strings.Contains(out, "1 tracts") && !strings.Contains(out, "tracts") {
		t.Fatalf("snapshot delete:\n%s", out)
	}
	if out := e.mustArbor("snapshot", "list", "other"); strings.Contains(out, "one") {
		t.Fatalf("snapshot list after delete:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(m.dir, "f")); err != nil || string(b) != "y" {
		t.Fatalf("live file after the snapshot's deletion: %q %v", b, err)
	}
	e.mustArbor("fsck", "other")
	m.stop(t)
	e.mustArbor("fs", "delete", "other")
	if out := e.mustArbor("fs", "list"); strings.Contains(out, "other") {
		t.Fatalf("fs list after delete:\n%s", out)
	}
	if out, err := e.arbor("fsck", "other"); err == nil || !strings.Contains(out, `no file system named "other"`) {
		t.Fatalf("fsck of a deleted file system: %v\n%s", err, out)
	}
}
