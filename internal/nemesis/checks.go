package nemesis

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/retry"
)

// checkAll runs every check (the workload is paused): acknowledged data,
// the bank, the CLI checkers, and the nodes' logs. final marks the checks
// after the last cycle.
func (r *run) checkAll(ctx context.Context, cycle int, final bool) {
	// The mounts cache names and attributes for a second (internal/fuse):
	// let the other mount's cache expire before reading through it.
	_ = retry.Sleep(ctx, 1500*time.Millisecond)
	files := 0
	for _, w := range r.fs {
		lost, odd, n := w.verify(ctx, final)
		files += n
		for _, l := range lost {
			r.sum.lose(cycle, "file", l)
		}
		for _, o := range odd {
			r.sum.fail(cycle, "file", o)
		}
	}
	lost, blobs := r.blob.verify(ctx, final)
	for _, l := range lost {
		r.sum.lose(cycle, "blob", l)
	}
	lost, keys := r.kv.verify(ctx, final)
	for _, l := range lost {
		r.sum.lose(cycle, "kv", l)
	}
	problems, ops := r.bank.endSegment(ctx)
	for _, p := range problems {
		r.sum.fail(cycle, "bank", p)
	}
	r.sum.checked(files, blobs, keys, ops)

	r.cliCheck(ctx, cycle, "fsck", "fsck", fileSystem, "--json")
	r.cliCheck(ctx, cycle, "kv check", "kv", "check")
	r.cliCheck(ctx, cycle, "blob verify", "blob", "verify")
	r.scanLogs(cycle)
}

// finalChecks runs the checks once more after the last cycle, with every
// node up and no fault.
func (r *run) finalChecks(ctx context.Context) {
	if err := r.cluster.Heal(ctx); err != nil {
		r.log.Warn("heal", "err", err)
	}
	_ = r.setFaultsAll(ctx, "off")
	if err := r.cluster.WaitHealthy(ctx); err != nil {
		r.sum.fail(r.cfg.Cycles, "final", fmt.Sprintf("cluster not healthy at the end: %v", err))
	}
	start := time.Now()
	r.checkAll(ctx, r.cfg.Cycles, true)
	fmt.Fprintf(r.cfg.Out, "final checks: %v; %s\n", time.Since(start).Round(time.Millisecond), r.sum.brief())
}

// cliCheck runs an arbor checker until it passes or CheckPatience ends:
// right after a recovery a checker may see replicas still being copied.
func (r *run) cliCheck(ctx context.Context, cycle int, name string, args ...string) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CheckPatience)
	defer cancel()
	var (
		last   error
		stdout []byte
	)
	for attempt := 0; ; attempt++ {
		var err error
		stdout, err = r.cli(ctx, 5*time.Minute, args...)
		if err == nil {
			r.sum.check(name, attempt == 0, time.Since(start))
			return
		}
		last = err
		r.log.Info("check failed; retrying", "check", name, "attempt", attempt+1, "err", err)
		if ctx.Err() != nil {
			break
		}
		_ = retry.Sleep(ctx, 2*time.Second)
	}
	r.sum.check(name, false, time.Since(start))
	failed := fmt.Sprintf("%s still fails after %v: %v", name, time.Since(start).Round(time.Second), last)
	if name != "fsck" {
		r.sum.fail(cycle, "check", failed)
		return
	}
	rep, err := fsckReport(stdout)
	if err != nil {
		r.sum.fail(cycle, "check", failed)
		return
	}
	r.sum.fail(cycle, "check", fmt.Sprintf("%s; %d problems:\n  %s", failed, rep.ProblemCount(), strings.Join(rep.Problems, "\n  ")))
	for _, l := range fsckLosses(rep) {
		r.sum.lose(cycle, "file", "fsck: "+l)
	}
}

// fsckReport decodes the report `arbor fsck --json` prints.
func fsckReport(stdout []byte) (*fs.CheckReport, error) {
	var rep fs.CheckReport
	if err := json.Unmarshal(stdout, &rep); err != nil {
		return nil, fmt.Errorf("fsck's report: %w", err)
	}
	return &rep, nil
}

// fsckLosses lists fsck's findings of acknowledged file data that is gone
// (a tract shorter than its block, a blob missing under referenced
// tracts): lost even while a mount's tract cache still serves the file
// (issue 13), so they count as loss, not only as a failed check.
func fsckLosses(rep *fs.CheckReport) []string {
	lost := append([]string(nil), rep.LostData...)
	if n := rep.Lost - len(rep.LostData); n > 0 {
		lost = append(lost, fmt.Sprintf("and %d more blocks' data", n))
	}
	return lost
}

// cli runs `arbor ARGS --dir CLUSTER` and returns its standard output;
// an error carries the last lines of its standard error.
func (r *run) cli(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args = append(args, "--dir", r.cluster.Dir())
	cmd := exec.CommandContext(ctx, r.cfg.Binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("arbor %s: %w: %s", strings.Join(args, " "), err, lastLines(stderr.Bytes(), 15))
	}
	return stdout.Bytes(), nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// scanLogs reports panics in the nodes' logs written since the last scan.
func (r *run) scanLogs(cycle int) {
	if r.logOffsets == nil {
		r.logOffsets = map[uint64]int64{}
	}
	for _, n := range r.cluster.Nodes() {
		f, err := os.Open(n.LogPath)
		if err != nil {
			continue
		}
		if _, err := f.Seek(r.logOffsets[n.ID], 0); err != nil {
			f.Close()
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var read int64
		for sc.Scan() {
			line := sc.Bytes()
			read += int64(len(line)) + 1
			if bytes.Contains(line, []byte("panic")) {
				r.sum.fail(cycle, "panic", fmt.Sprintf("node %d logged: %s", n.ID, truncate(string(line), 2000)))
			}
		}
		r.logOffsets[n.ID] += read
		f.Close()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
