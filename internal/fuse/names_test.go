package fuse_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestNonUTF8NameRefused creates names that are not UTF-8 through the
// kernel: POSIX allows any bytes but the metadata wire carries names as
// protobuf strings, so each is refused with EINVAL at once (not retried
// until the operation's deadline and failed as EIO), and the mount keeps
// working.
func TestNonUTF8NameRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	e := startEnv(t)
	e.createFS("default")
	m := e.mount("default")
	bad := filepath.Join(m.dir, "latin1-\xe9t\xe9")
	start := time.Now()
	_, err := os.Create(bad)
	wantErrno(t, err, syscall.EINVAL)
	wantErrno(t, os.Mkdir(bad, 0o755), syscall.EINVAL)
	good := filepath.Join(m.dir, "good")
	if err := os.WriteFile(good, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, os.Rename(good, bad), syscall.EINVAL)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("three refusals took %v: they were retried", took)
	}
	if b, err := os.ReadFile(good); err != nil || string(b) != "x" {
		t.Fatalf("read back %q: %q, %v", good, b, err)
	}
}
