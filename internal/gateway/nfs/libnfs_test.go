package nfs

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// NeedLibnfs returns the path of libnfs's tool (Debian libnfs-utils, which
// scripts/install-deps.sh installs): missing, the test fails under CI and
// is skipped elsewhere.
func needLibnfs(t testing.TB, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found: scripts/install-deps.sh installs libnfs-utils", tool)
		}
		t.Skipf("%s not found (apt-get install libnfs-utils)", tool)
	}
	return p
}

// libnfsURL is the URL of path on a gateway at addr for libnfs's tools.
func libnfsURL(addr, path string) string {
	host, port, _ := strings.Cut(addr, ":")
	return fmt.Sprintf("nfs://%s%s?nfsport=%s&mountport=%s", host, path, port, port)
}

func runTool(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, needLibnfs(t, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestLibnfsTools drives the gateway with a client no one here wrote:
// libnfs's nfs-cp, nfs-cat and nfs-ls copy files in and out (one of
// several megabytes, past the write buffer's tract size) and list them.
func TestLibnfsTools(t *testing.T) {
	needLibnfs(t, "nfs-cp")
	_, srv := startLocal(t)
	dir := t.TempDir()
	big := make([]byte, 5<<20+12345)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	src := filepath.Join(dir, "big")
	if err := os.WriteFile(src, big, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "nfs-cp", src, libnfsURL(srv.Addr(), "/default/big"))
	back := filepath.Join(dir, "back")
	runTool(t, "nfs-cp", libnfsURL(srv.Addr(), "/default/big"), back)
	got, err := os.ReadFile(back)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("copied back %d bytes of %d (err %v), or they differ", len(got), len(big), err)
	}
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("hello, nfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "nfs-cp", small, libnfsURL(srv.Addr(), "/default/small.txt"))
	if out := runTool(t, "nfs-cat", libnfsURL(srv.Addr(), "/default/small.txt")); out != "hello, nfs\n" {
		t.Fatalf("nfs-cat: %q", out)
	}
	ls := runTool(t, "nfs-ls", libnfsURL(srv.Addr(), "/default"))
	for _, want := range []string{"big", "small.txt", fmt.Sprint(len(big))} {
		if !strings.Contains(ls, want) {
			t.Fatalf("nfs-ls lacks %q:\n%s", want, ls)
		}
	}
}
