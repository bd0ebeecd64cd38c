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
// other problem allowed. ARBOR_SEED replays a run's choices. A node that
// panics on a full disk (Summary.Known) is logged in the summary and does
// not fail it; a loss or any checker's problem does, as in `arbor debug
// nemesis`.
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cycles)*5*time.Minute+5*time.Minute)
	defer cancel()
	sum, err := nemesis.Run(ctx, nemesis.Config{
		Binary: devclustertest.Binary(t),
		Dir:    t.TempDir(),
		Cycles: cycles,
		Seed:   seed,
		// A check that has not passed a minute after recovery will not.
		CheckPatience: time.Minute,
		Out:           testWriter{t},
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
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
