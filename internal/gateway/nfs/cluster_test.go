package nfs_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/fuse"
	. "github.com/arbor-storage/arbor/internal/gateway/nfs"
)

// clusterEnv is a running dev cluster (a gateway on every node) and the
// arbor binary.
type clusterEnv struct {
	t   *testing.T
	bin string
	c   *devcluster.Cluster
}

func startCluster(t *testing.T) *clusterEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3, Binary: bin})
	e := &clusterEnv{t: t, bin: bin, c: c}
	// The storage takes a file system some seconds after the nodes are
	// healthy (extents, TLT).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := e.arbor("fs", "create", "default")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("arbor fs create default: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	if n := len(c.NFSAddrs()); n != 3 {
		t.Fatalf("%d gateways in a 3-node dev cluster", n)
	}
	b, err := os.ReadFile(filepath.Join(c.Dir(), devcluster.NFSFileName))
	if err != nil || strings.Fields(string(b))[0] != c.NFSAddrs()[0] {
		t.Fatalf("%s: %q %v", devcluster.NFSFileName, b, err)
	}
	return e
}

func (e *clusterEnv) arbor(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, append(args, "--dir", e.c.Dir())...).CombinedOutput()
	return string(out), err
}

// standaloneGateway starts `arbor gateway nfs` on a free port and returns
// its process and address.
func (e *clusterEnv) standaloneGateway() (*exec.Cmd, string) {
	e.t.Helper()
	cmd := exec.Command(e.bin, "gateway", "nfs", "--listen", "127.0.0.1:0", "--dir", e.c.Dir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(line, "serving NFSv3 on ")
	if err != nil || !ok {
		e.t.Fatalf("arbor gateway nfs said %q (%v)\n%s", line, err, stderr.String())
	}
	addr, _, _ = strings.Cut(addr, ";")
	return cmd, addr
}

// mountFUSE mounts the file system with `arbor mount` (if this machine
// can) and returns its directory, or "" if it cannot.
func (e *clusterEnv) mountFUSE() string {
	e.t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		e.t.Logf("no /dev/fuse (%v): the FUSE comparison is left out", err)
		return ""
	}
	dir := filepath.Join(e.t.TempDir(), "mnt")
	cmd := exec.Command(e.bin, "mount", "default", dir, "--dir", e.c.Dir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			_ = exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
	})
	deadline := time.After(2 * time.Minute)
	for !fuse.Mounted(dir) {
		select {
		case err := <-exited:
			e.t.Fatalf("arbor mount exited: %v\n%s", err, out.String())
		case <-deadline:
			e.t.Fatalf("arbor mount: not mounted after 2 minutes\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return dir
}

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestGatewaysShareOneView writes a file through one gateway of a real
// cluster with libnfs's nfs-cp, and reads it back identical through the
// two other gateways (nfs-cp, nfs-cat) and through a FUSE mount; a file
// written on the mount reads identically through a gateway; and every
// gateway is in arbor status --json.
func TestGatewaysShareOneView(t *testing.T) {
	NeedLibnfs(t, "nfs-cp")
	e := startCluster(t)
	gws := e.c.NFSAddrs()
	dir := t.TempDir()
	data := randomBytes(9<<20+333, 1)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	RunTool(t, "nfs-cp", src, LibnfsURL(gws[0], "/default/one.bin"))
	for i, gw := range gws[1:] {
		back := filepath.Join(dir, "back"+string(rune('0'+i)))
		RunTool(t, "nfs-cp", LibnfsURL(gw, "/default/one.bin"), back)
		if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through gateway %s: %d bytes of %d (%v), or they differ", gw, len(got), len(data), err)
		}
	}
	mnt := e.mountFUSE()
	if mnt != "" {
		if got, err := os.ReadFile(filepath.Join(mnt, "one.bin")); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through the FUSE mount: %d bytes of %d (%v), or they differ", len(got), len(data), err)
		}
		if err := os.WriteFile(filepath.Join(mnt, "from-fuse.txt"), []byte("written on the mount\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := RunTool(t, "nfs-cat", LibnfsURL(gws[2], "/default/from-fuse.txt")); out != "written on the mount\n" {
			t.Fatalf("nfs-cat of a file written on the mount: %q", out)
		}
	}
	out, err := e.arbor("status", "--json")
	if err != nil {
		t.Fatalf("arbor status --json: %v\n%s", err, out)
	}
	for _, gw := range gws {
		if !strings.Contains(out, `"address": "`+gw+`"`) {
			t.Fatalf("arbor status --json lacks gateway %s:\n%s", gw, out)
		}
	}
	if strings.Contains(out, `"state": "down"`) {
		t.Fatalf("a gateway is down:\n%s", out)
	}
}

// TestGatewayKilledMidCopy kills a gateway (kill -9) in the middle of a
// copy. First with a client that follows RFC 1813: its exclusive CREATE
// retransmitted to another gateway is answered with the same file (not
// applied twice); it writes 1 MiB UNSTABLE writes and COMMITs every
// 4 MiB; after the kill it goes on at another gateway with the handles it
// had (any gateway answers any handle), sees the write verifier change
// and resends what it had not committed. A byte-range lock (NLM) taken
// through the killed gateway is still held, seen and released through the
// others. Then with libnfs's nfs-cp: killed at some
// point of its copy, the copy is made again through another gateway.
// Both files must read back identical through a third gateway.
func TestGatewayKilledMidCopy(t *testing.T) {
	NeedLibnfs(t, "nfs-cp")
	e := startCluster(t)
	gws := e.c.NFSAddrs()
	gwCmd, gwAddr := e.standaloneGateway()

	const chunk, perCommit, chunks = 1 << 20, 4, 14
	data := randomBytes(chunks*chunk+777, 2)
	a := DialTest(t, gwAddr)
	root := a.Mount("/default")
	cverf := []byte("create-1")
	st, fh := a.Create(root, "killed.bin", CreateExclusive, 0, cverf)
	if st != OK {
		t.Fatalf("exclusive CREATE: %d", st)
	}
	// The reply may be lost: the client retransmits the CREATE, here to
	// another gateway, which finds the verifier and answers the same
	// file instead of creating another or failing EXIST.
	if st, fh2 := DialTest(t, gws[1]).Create(root, "killed.bin", CreateExclusive, 0, cverf); st != OK || !bytes.Equal(fh2, fh) {
		t.Fatalf("the retransmitted exclusive CREATE: %d, same file %v", st, bytes.Equal(fh2, fh))
	}
	committed := 0 // chunks known stable
	var verf []byte
	writeChunk := func(c *TestClient, i int) {
		t.Helper()
		end := min((i+1)*chunk, len(data))
		st, _, v := c.Write(fh, uint64(i*chunk), data[i*chunk:end], Unstable)
		if st != OK {
			t.Fatalf("WRITE of chunk %d: %d", i, st)
		}
		if verf == nil {
			verf = v
		}
		if !bytes.Equal(v, verf) {
			t.Fatalf("verifier changed within one gateway's life: %x then %x", verf, v)
		}
	}
	commit := func(c *TestClient) []byte {
		t.Helper()
		st, v := c.Commit(fh)
		if st != OK {
			t.Fatalf("COMMIT: %d", st)
		}
		return v
	}
	i := 0
	for ; i < 10; i++ {
		writeChunk(a, i)
		if (i+1)%perCommit == 0 {
			if v := commit(a); !bytes.Equal(v, verf) {
				t.Fatalf("COMMIT verifier %x, writes' %x", v, verf)
			}
			committed = i + 1
		}
	}
	// A byte-range lock taken through this gateway (NLM) is kept in the
	// KV store, not in the gateway.
	if st, _ := a.NLM(NLMLock, "client-a", 1, fh, true, 0, 1<<20); st != NLM4Granted {
		t.Fatalf("NLM LOCK: %d", st)
	}
	// Chunks 8 and 9 are unstable at the gateway: kill it.
	if err := gwCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = gwCmd.Wait()

	b := DialTest(t, gws[1])
	// The lock outlived its gateway, and another gateway sees it.
	if st, svid := b.NLM(NLMTest, "client-b", 2, fh, false, 100, 1); st != NLM4Denied || svid != 1 {
		t.Fatalf("NLM TEST at another gateway after the kill: %d (holder %d), want DENIED by the lock of svid 1", st, svid)
	}
	if st, _ := b.NLM(NLMUnlock, "client-a", 1, fh, false, 0, 0); st != NLM4Granted {
		t.Fatalf("NLM UNLOCK at another gateway: %d", st)
	}
	if st, _ := DialTest(t, gws[2]).NLM(NLMLock, "client-b", 2, fh, true, 0, 0); st != NLM4Granted {
		t.Fatalf("NLM LOCK at a third gateway after the unlock: %d", st)
	}
	verf = nil
	for j := committed; j < i; j++ { // resend what was not committed
		writeChunk(b, j)
	}
	if v := commit(b); bytes.Equal(v, []byte("create-1")) || v == nil {
		t.Fatal("no verifier")
	}
	for ; i*chunk < len(data); i++ {
		writeChunk(b, i)
	}
	if v := commit(b); !bytes.Equal(v, verf) {
		t.Fatalf("the second gateway's verifier changed with no failure: %x then %x", verf, v)
	}
	dir := t.TempDir()
	back := filepath.Join(dir, "back")
	RunTool(t, "nfs-cp", LibnfsURL(gws[2], "/default/killed.bin"), back)
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the kill, read %d bytes of %d (%v), or they differ", len(got), len(data), err)
	}

	// nfs-cp through a gateway killed at some point of the copy, redone
	// through another.
	big := randomBytes(48<<20, 3)
	src := filepath.Join(dir, "big")
	if err := os.WriteFile(src, big, 0o644); err != nil {
		t.Fatal(err)
	}
	gwCmd, gwAddr = e.standaloneGateway()
	cp := exec.Command(NeedLibnfs(t, "nfs-cp"), src, LibnfsURL(gwAddr, "/default/big.bin"))
	var cpOut bytes.Buffer
	cp.Stdout, cp.Stderr = &cpOut, &cpOut
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	_ = gwCmd.Process.Kill()
	_ = gwCmd.Wait()
	// libnfs reconnects to the same server for ever: a copy that did not
	// finish before the kill is stopped, and the client made to switch.
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Wait() }()
	select {
	case err := <-cpDone:
		t.Logf("nfs-cp through the killed gateway ended: %v %s", err, cpOut.String())
	case <-time.After(5 * time.Second):
		_ = cp.Process.Kill()
		t.Logf("nfs-cp through the killed gateway was still retrying it 5 s after the kill: stopped (%v)", <-cpDone)
	}
	// nfs-cp does not overwrite (its CREATE is GUARDED): remove what the
	// first copy left, as a user would, and copy again. The REMOVE is
	// retransmitted to another gateway (same xid): the duplicate-request
	// cache in the KV store answers it, so it is not applied twice (which
	// would answer NOENT).
	if st := DialTest(t, gws[0]).RemoveXid(7777, root, "big.bin"); st != OK && st != ErrNoEnt {
		t.Fatalf("REMOVE of the partial copy: %d", st)
	} else if st2 := DialTest(t, gws[1]).RemoveXid(7777, root, "big.bin"); st2 != st {
		t.Fatalf("the REMOVE retransmitted to another gateway answered %d, the first %d", st2, st)
	}
	RunTool(t, "nfs-cp", src, LibnfsURL(gws[0], "/default/big.bin"))
	back = filepath.Join(dir, "back-big") // nfs-cp does not overwrite local files either
	RunTool(t, "nfs-cp", LibnfsURL(gws[2], "/default/big.bin"), back)
	got, err := os.ReadFile(back)
	if err != nil || sha256.Sum256(got) != sha256.Sum256(big) {
		t.Fatalf("redone copy: %d bytes of %d (%v), or they differ", len(got), len(big), err)
	}
	ls := RunTool(t, "nfs-ls", LibnfsURL(gws[1], "/default"))
	if strings.Count(ls, "big.bin") != 1 || strings.Count(ls, "killed.bin") != 1 {
		t.Fatalf("listing after the kills:\n%s", ls)
	}
}
