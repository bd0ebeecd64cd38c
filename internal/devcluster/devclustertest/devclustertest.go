// Package devclustertest starts real arbor clusters from tests (DESIGN §4:
// whole-cluster tests start real processes, kill them, restart them and
// cut them off). Every cluster a test starts is stopped at the test's
// cleanup; if the test process dies first, the kernel sends its servers
// SIGTERM (see devcluster).
//
//	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
//	c.Kill(2)
//	c.Restart(ctx, 2)
//	c.Partition(ctx, 1)
package devclustertest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
)

// BinaryEnv names an environment variable holding a prebuilt arbor binary
// for the tests to use instead of building one (`make test` sets it to the
// binary it has just built).
const BinaryEnv = "ARBOR_BINARY"

// buildTimeout bounds building the binary.
const buildTimeout = 5 * time.Minute

// Binary returns the path of an arbor binary built from the current
// source: $ARBOR_BINARY if set, else `go build` into a directory under the
// temporary directory per user and source tree (so tests of two checkouts,
// such as git worktrees, never run each other's binary), which is quick
// when it is up to date.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(BinaryEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatalf("%s: %v", BinaryEnv, err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("%s=%s: %v", BinaryEnv, p, err)
		}
		return abs
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("arbor-test-bin-%d-%s", os.Getuid(), sourceTreeID(t)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "arbor")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	if err := devcluster.BuildBinary(ctx, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sourceTreeID names the module the test runs in: a hash of the directory
// holding its go.mod, found from the working directory (a test runs in its
// package's directory).
func sourceTreeID(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("devclustertest: no go.mod above the working directory")
		}
		dir = parent
	}
	h := fnv.New32a()
	h.Write([]byte(dir))
	return fmt.Sprintf("%08x", h.Sum32())
}

// Open opens a cluster (without starting it) in opts.Dir, or in a fresh
// temporary directory if that is empty, with the test's arbor binary and
// progress logged through t.Log. The cluster is closed at cleanup.
func Open(t testing.TB, opts devcluster.Options) *devcluster.Cluster {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Binary == "" {
		opts.Binary = Binary(t)
	}
	if opts.Logger == nil {
		w := &testWriter{t: t}
		// Registered before Close's cleanup, so it runs after it: the
		// cluster may log while closing, never once the test is over.
		t.Cleanup(w.stop)
		opts.Logger = slog.New(slog.NewTextHandler(w, nil))
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 10 * time.Second
	}
	c, err := devcluster.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before Close's cleanup, so it runs after it and finds the
	// logs complete (and before the temporary directory is removed).
	t.Cleanup(func() { keepLogs(t, c) })
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the cluster: %v", err)
		}
	})
	return c
}

// Start opens a cluster like Open and starts it, failing the test if it
// does not become healthy.
func Start(t testing.TB, opts devcluster.Options) *devcluster.Cluster {
	t.Helper()
	c := Open(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// ArtifactsEnv names a directory where tests leave files for a human (CI
// uploads it). A failed cluster test copies its nodes' logs there, since
// its cluster directory is removed with the test's temporary directory.
const ArtifactsEnv = "ARBOR_TEST_ARTIFACTS"

// keepLogs copies the logs of c's nodes to $ARBOR_TEST_ARTIFACTS/<test>/cluster-*/
// if t failed: what the servers did is most of what a flaky run's failure
// has to say, and a rerun rarely says it again.
func keepLogs(t testing.TB, c *devcluster.Cluster) {
	dir := os.Getenv(ArtifactsEnv)
	if !t.Failed() || dir == "" {
		return
	}
	// One directory per failed run: a rerun (-count) or a second cluster
	// of the test must not overwrite the logs of the first.
	dir = filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keeping the nodes' logs: %v", err)
		return
	}
	dir, err := os.MkdirTemp(dir, "cluster-")
	if err != nil {
		t.Logf("keeping the nodes' logs: %v", err)
		return
	}
	for _, n := range c.Nodes() {
		b, err := os.ReadFile(n.LogPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("node-%d.log", n.ID)), b, 0o644)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Logf("keeping node %d's log: %v", n.ID, err)
		}
	}
	t.Logf("the nodes' logs are in %s", dir)
}

// testWriter sends log lines to t.Log until the test ends; t.Log after
// that would panic, and a node can exit (and be logged) at any time.
type testWriter struct {
	t       testing.TB
	mu      sync.Mutex
	stopped bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(string(trimNewline(p)))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}
