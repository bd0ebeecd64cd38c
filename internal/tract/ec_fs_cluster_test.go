package tract_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	arborfs "github.com/arbor-storage/arbor/internal/fs"
)

// The file-system part of the erasure-coded cluster test: a file system
// whose file data is ec:5+2 (arbor fs create --data), a tree of files
// written through a FUSE mount and read back through fresh mounts.

// ecMount is an `arbor mount` process.
type ecMount struct {
	dir    string
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// fuseUsable reports why FUSE mounts cannot run here ("" if they can).
func fuseUsable() string {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Sprintf("no /dev/fuse (%v)", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		return "neither root nor fusermount3"
	}
	return ""
}

// mounted reports whether dir is a mount point (in /proc/self/mounts).
func mounted(dir string) bool {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 1 && fields[1] == dir {
			return true
		}
	}
	return false
}

// mount mounts file system name and waits until it is mounted.
func (h *harness) mount(name string) *ecMount {
	h.t.Helper()
	dir := filepath.Join(h.t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	m := &ecMount{dir: dir, out: &lockedBuffer{}, exited: make(chan error, 1)}
	m.cmd = exec.Command(h.bin, "mount", name, dir, "--dir", h.c.Dir(), "--log-level=warn")
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	if err := m.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { m.exited <- m.cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	for !mounted(dir) {
		select {
		case err := <-m.exited:
			h.t.Fatalf("arbor mount exited: %v\n%s", err, m.out.String())
		case <-deadline:
			_ = m.cmd.Process.Kill()
			h.t.Fatalf("arbor mount: not mounted after 2 minutes\n%s", m.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	h.t.Cleanup(func() { m.stop(h) })
	return m
}

// stop unmounts (SIGINT: the mount flushes and exits).
func (m *ecMount) stop(h *harness) {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-m.exited:
		if err != nil {
			h.t.Errorf("arbor mount %s: %v\n%s", m.dir, err, m.out.String())
		}
	case <-time.After(2 * time.Minute):
		_ = m.cmd.Process.Kill()
		_ = exec.Command("fusermount3", "-u", "-z", m.dir).Run()
		h.t.Errorf("arbor mount %s did not stop in 2 minutes\n%s", m.dir, m.out.String())
	}
	m.cmd = nil
}

// killPair draws two distinct nodes of the 7, any two: the cluster's
// metadata (5 directory voters, 5-replica extents) survives two lost
// nodes as the ec:5+2 data does.
func (h *harness) killPair(rng *rand.Rand) (uint64, uint64) {
	a := uint64(1 + rng.IntN(7))
	b := uint64(1 + rng.IntN(6))
	if b >= a {
		b++
	}
	return a, b
}

// tryArbor runs an arbor command and returns its output and exit error.
func (h *harness) tryArbor(args ...string) (string, error) {
	cmd := exec.Command(h.bin, append(args, "--dir", h.c.Dir(), "--log-level=warn")...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ecTreeSizes are the sizes of the tree's files (with the short runs' 1
// MiB tracts, one stripe each): empty, inline-sized (kept in the
// metadata), partial stripes, whole stripes and several stripes with a
// partial last one.
var ecTreeSizes = []int{0, 1, 3000, arborfs.MaxInlineBytes, arborfs.MaxInlineBytes + 1, 70 << 10, 1 << 20, 1<<20 + 7, 5<<20 + 12345, 9 << 20}

// ecTreeTracts is the least number of tracts the tree's files outside the
// metadata take (more if their blocks start small).
func ecTreeTracts() int {
	ts := 1 << 20 // clusterTractEnv
	if long() {
		ts = 4 << 20
	}
	n := 0
	for _, size := range ecTreeSizes {
		if size > arborfs.MaxInlineBytes {
			n += (size + ts - 1) / ts
		}
	}
	return n
}

// writeECTree writes a tree of files under dir: the sizes above, in two
// directories, one of them written by appends of odd sizes (partial
// stripes patched, read-modify-write), and returns each file's SHA-256.
func writeECTree(h *harness, dir string, seed uint64) map[string]string {
	h.t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	sums := map[string]string{}
	for i, size := range ecTreeSizes {
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i%3), fmt.Sprintf("e%d", i%2))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			h.t.Fatal(err)
		}
		p := filepath.Join(sub, fmt.Sprintf("f%02d-%d", i, size))
		if i%2 == 0 {
			if err := os.WriteFile(p, data, 0o644); err != nil {
				h.t.Fatal(err)
			}
		} else {
			// Appends of odd sizes, each closed: later ones patch the
			// partial last stripe of the earlier.
			for off := 0; off < len(data) || off == 0; {
				n := min(len(data)-off, 1+rng.IntN(700<<10))
				f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					h.t.Fatal(err)
				}
				if _, err := f.Write(data[off : off+n]); err != nil {
					h.t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					h.t.Fatal(err)
				}
				off += n
				if n == 0 {
					break
				}
			}
		}
		sum := sha256.Sum256(data)
		rel, _ := filepath.Rel(dir, p)
		sums[rel] = hex.EncodeToString(sum[:])
	}
	return sums
}

// readECTree returns the SHA-256 of every file under dir.
func readECTree(h *harness, dir string) map[string]string {
	h.t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		rel, _ := filepath.Rel(dir, p)
		sums[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		h.t.Fatalf("read the tree back: %v", err)
	}
	return sums
}

// checkECTree reads the tree through a fresh mount (nothing cached) and
// compares it with want.
func (h *harness) checkECTree(name string, want map[string]string, when string) {
	h.t.Helper()
	start := time.Now()
	m := h.mount(name)
	got := readECTree(h, m.dir)
	m.stop(h)
	if len(got) != len(want) {
		h.t.Fatalf("%s: %d files read back, %d written", when, len(got), len(want))
	}
	for p, s := range want {
		if got[p] != s {
			h.t.Fatalf("%s: %s differs from what was written", when, p)
		}
	}
	h.t.Logf("%s: the tree of %d files read back identical through a new mount in %v", when, len(want), time.Since(start).Round(time.Millisecond))
}

// ecStripes returns the count of parity-checked stripes `arbor blob
// verify` reports.
func (h *harness) ecStripes() int {
	h.t.Helper()
	out := h.arbor(false, "blob", "verify", "--progress=never")
	var n int
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, " erasure-coded stripes parity-checked"); i >= 0 {
			f := strings.Fields(line[:i])
			if len(f) > 0 {
				fmt.Sscan(f[len(f)-1], &n)
			}
		}
	}
	return n
}

// createECFS creates an ec:5+2 file system, after checking that a layout
// wider than the cluster's failure domains is refused, and one that
// survives more lost nodes than the cluster's metadata (replicas:6 on
// 5-replica extents), and that fs list shows the layout.
func (h *harness) createECFS(name string) {
	h.t.Helper()
	out := h.arbor(true, "fs", "create", name, "--data", "ec:6+2")
	if !strings.Contains(out, "ec:6+2 needs 8 tractservers") {
		h.t.Fatalf("fs create --data ec:6+2 on 7 failure domains:\n%s", out)
	}
	// replicas:6, not the cluster's default replicas:7 (rows of 7), which
	// every file system naming no layout has and is always accepted.
	out = h.arbor(true, "fs", "create", name, "--data", "replicas:6")
	if !strings.Contains(out, "data layout replicas:6 survives 5 lost nodes, but this cluster's metadata survives 2") {
		h.t.Fatalf("fs create --data replicas:6 on 5-replica metadata:\n%s", out)
	}
	h.arbor(false, "fs", "create", name, "--data", "ec:5+2")
	var list []struct {
		Name string `json:"name"`
		Data string `json:"data"`
	}
	if err := json.Unmarshal([]byte(h.arbor(false, "fs", "list", "--json")), &list); err != nil {
		h.t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != name || list[0].Data != "ec:5+2" {
		h.t.Fatalf("fs list: %+v; want only %s with data ec:5+2 (the refused layouts made nothing)", list, name)
	}
}
