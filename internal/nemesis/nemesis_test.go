package nemesis_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/nemesis"
)

// testWriter sends lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestNemesis is the short version of `make chaos` that `make test` runs:
// a five-node cluster under the whole mixed workload, a few fault cycles
// (ARBOR_CHAOS_CYCLES, default 2), every check after each, and no loss or
// other problem allowed. ARBOR_SEED replays a run's choices.
func TestNemesis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and two FUSE mounts")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse here (%v): FUSE mounts cannot run", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		t.Skip("neither root nor fusermount3: FUSE mounts cannot run")
	}
	cycles := 2
	if s := os.Getenv("ARBOR_CHAOS_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("ARBOR_CHAOS_CYCLES=%q: %v", s, err)
		}
		cycles = n
	}
	var seed uint64
	if s := os.Getenv("ARBOR_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ARBOR_SEED=%q: %v", s, err)
		}
		seed = n
	}
	runNemesis(t, nemesis.Config{Cycles: cycles, Seed: seed})
}

// TestNemesisDiskFull: a node whose disk fills up under the whole workload
// stops taking writes instead of crashing (raftengine diskfull.go), the
// cluster goes on without it, and once the disk has room again it serves
// and nothing is lost. One cycle of the disk-full fault only; needs root
// (the node's disk is a small tmpfs).
func TestNemesisDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and two FUSE mounts")
	}
	if os.Geteuid() != 0 {
		t.Skip("the disk-full fault mounts a tmpfs: needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse here (%v): FUSE mounts cannot run", err)
	}
	runNemesis(t, nemesis.Config{Cycles: 1, DiskFull: true, Faults: []string{"disk-full"}})
}

// runNemesis runs the nemesis with cfg (the binary, directory and output
// filled in) and fails the test on any problem.
func runNemesis(t *testing.T, cfg nemesis.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(max(cfg.Cycles, 1))*5*time.Minute+5*time.Minute)
	defer cancel()
	cfg.Binary = devclustertest.Binary(t)
	cfg.Dir = t.TempDir()
	// A check that has not passed a minute after recovery will not.
	cfg.CheckPatience = time.Minute
	cfg.Out = testWriter{t}
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sum, err := nemesis.Run(ctx, cfg)
	if sum != nil {
		var b strings.Builder
		sum.Print(&b)
		t.Log("\n" + b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed() {
		t.Fatalf("the nemesis found problems (seed %d; replay with ARBOR_SEED=%d)", sum.Seed, sum.Seed)
	}
}
