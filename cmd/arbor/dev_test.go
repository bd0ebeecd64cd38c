package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/server"
)

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// devRun is one `arbor dev` process.
type devRun struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan error
}

// startDev starts `arbor dev` with no stdin and waits until it says the
// cluster is up.
func startDev(t *testing.T, bin string, args ...string) *devRun {
	t.Helper()
	r := &devRun{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan error, 1)}
	r.cmd = exec.Command(bin, append([]string{"dev"}, args...)...)
	r.cmd.Stdin = nil // /dev/null: arbor dev must not need a terminal
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		// Normally already stopped; if not, make sure nothing is left.
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(30 * time.Second):
				r.cmd.Process.Kill()
			}
		}
	})
	deadline := time.After(90 * time.Second)
	// The banner ends with "running until": its lines are separate writes.
	for !strings.Contains(r.stdout.String(), "running until ") {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("arbor dev exited early (%v)\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
		case <-deadline:
			t.Fatalf("arbor dev did not come up\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return r
}

// stop sends sig and waits for arbor dev to exit; it must exit 0.
func (r *devRun) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("arbor dev exited with %v after %v\nstderr:\n%s", err, sig, r.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("arbor dev did not stop after %v\nstderr:\n%s", sig, r.stderr)
	}
}

type devLayout struct {
	ClusterID string `json:"cluster_id"`
	Nodes     []struct {
		ID       uint64   `json:"id"`
		Addr     string   `json:"addr"`
		HTTPAddr string   `json:"http_addr"`
		Roles    []string `json:"roles"`
	} `json:"nodes"`
}

func readDevLayout(t *testing.T, dir string) devLayout {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	if err != nil {
		t.Fatal(err)
	}
	var l devLayout
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// runningPIDs returns each node's pid from its pid file, checking the
// process is alive.
func runningPIDs(t *testing.T, dir string, l devLayout) []int {
	t.Helper()
	var pids []int
	for _, n := range l.Nodes {
		nodeDir := filepath.Join(dir, strings.TrimSpace(jsonNumber(n.ID)))
		pid, err := server.ReadPIDFile(nodeDir)
		if err != nil {
			t.Fatalf("node %d: %v", n.ID, err)
		}
		if syscall.Kill(pid, 0) != nil {
			t.Fatalf("node %d: pid %d is not running", n.ID, pid)
		}
		pids = append(pids, pid)
	}
	return pids
}

func jsonNumber(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// waitGone waits until none of pids runs and no node has a pid file.
func waitGone(t *testing.T, dir string, l devLayout, pids []int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && !isZombie(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("server pid %d still running", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, n := range l.Nodes {
		p := filepath.Join(dir, jsonNumber(n.ID), server.PIDFileName)
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left behind (%v): the server did not shut down cleanly", p, err)
		}
	}
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", jsonNumber(uint64(pid)), "stat"))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func TestDevCommand(t *testing.T) {
	bin := devclustertest.Binary(t)
	dir := filepath.Join(t.TempDir(), "cluster")

	first := startDev(t, bin, "--dir", dir, "--nodes", "3")
	l := readDevLayout(t, dir)
	if len(l.Nodes) != 3 || l.ClusterID == "" {
		t.Fatalf("layout = %+v", l)
	}
	clusterFile, err := os.ReadFile(filepath.Join(dir, "cluster"))
	if err != nil {
		t.Fatal(err)
	}
	addrs := strings.TrimSpace(string(clusterFile))
	if addrs != l.Nodes[0].Addr+","+l.Nodes[1].Addr+","+l.Nodes[2].Addr {
		t.Fatalf("cluster file %q does not list the three voters of %+v", addrs, l)
	}
	if !strings.Contains(first.stdout.String(), "directory: "+addrs) {
		t.Fatalf("arbor dev did not print the addresses:\n%s", first.stdout)
	}
	pids := runningPIDs(t, dir, l)

	// A client command finds the cluster through --dir.
	out, err := exec.Command(bin, "status", "--dir", dir, "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"state": "alive"`) {
		t.Fatalf("arbor status --dir: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "debug", "faults", "get", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatalf("arbor debug faults get: %v", err)
	}
	var states []map[string]any
	if err := json.Unmarshal(out, &states); err != nil || len(states) != 3 {
		t.Fatalf("debug faults get --json = %s (%v)", out, err)
	}

	first.stop(t, syscall.SIGTERM)
	waitGone(t, dir, l, pids)
	if !strings.Contains(first.stderr.String(), "cluster stopped") {
		t.Fatalf("arbor dev did not report the stop:\n%s", first.stderr)
	}

	// Again on the same dir: the same cluster, ports and node ids.
	second := startDev(t, bin, "--dir", dir)
	again := readDevLayout(t, dir)
	if again.ClusterID != l.ClusterID || len(again.Nodes) != 3 {
		t.Fatalf("layout after restart = %+v, was %+v", again, l)
	}
	for i := range l.Nodes {
		if again.Nodes[i].Addr != l.Nodes[i].Addr || again.Nodes[i].HTTPAddr != l.Nodes[i].HTTPAddr {
			t.Fatalf("node %d moved: %+v -> %+v", l.Nodes[i].ID, l.Nodes[i], again.Nodes[i])
		}
	}
	pids = runningPIDs(t, dir, again)

	// Killing arbor dev outright must not leave servers behind, and must
	// not stop the next run.
	if err := second.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-second.done
	waitGone(t, dir, again, pids)

	third := startDev(t, bin, "--dir", dir)
	pids = runningPIDs(t, dir, again)
	third.stop(t, syscall.SIGINT)
	waitGone(t, dir, again, pids)
}

func TestDevCommandNeedsDir(t *testing.T) {
	ta := newTestApp()
	if err := ta.run("dev"); err == nil || !strings.Contains(err.Error(), "--dir is required") {
		t.Fatalf("arbor dev without --dir: %v", err)
	}
	if err := ta.run("dev", "--dir", t.TempDir(), "--faults", "fail=3"); err == nil || !strings.Contains(err.Error(), "--faults") {
		t.Fatalf("arbor dev with bad --faults: %v", err)
	}
}

// TestDevMountWaitsQuietly: while a new cluster's storage is being set up,
// arbor dev --mount says once what it waits for; the internal errors of
// the failed attempts appear only at --log-level debug, and the last one
// in the error if it gives up.
func TestDevMountWaitsQuietly(t *testing.T) {
	notReady := []error{
		errors.New("kv: the cluster has no extents yet"),
		errors.New("node 1 does not lead extent 1000 (leader 0)"),
		errors.New("tract: fetch the TLT: directory: no TLT is installed"),
	}
	// flaky fails with the start-up errors, then mounts.
	flaky := func(fails int) mountFunc {
		n := 0
		return func(context.Context, clusterTarget, mountOptions, *slog.Logger) (*mounted, error) {
			if n < fails {
				n++
				return nil, notReady[(n-1)%len(notReady)]
			}
			return &mounted{debugAddr: "127.0.0.1:1"}, nil
		}
	}
	opts := mountOptions{fsName: devFileSystem, dir: "/mnt/x"}
	for _, level := range []string{"info", "debug"} {
		ta := newTestApp()
		ta.logLevel, ta.logFormat = level, "text"
		if err := ta.setUpLogging(); err != nil {
			t.Fatal(err)
		}
		m, err := mountWhenReady(context.Background(), &ta.app, flaky(2), clusterTarget{}, opts, time.Minute)
		if err != nil || m == nil {
			t.Fatalf("%s: mount = %v, %v", level, m, err)
		}
		stderr := ta.errOut.String()
		if n := strings.Count(stderr, "waiting for the cluster's storage"); n != 1 {
			t.Fatalf("%s: %d waiting lines in\n%s", level, n, stderr)
		}
		internal := strings.Contains(stderr, "no extents yet") || strings.Contains(stderr, "does not lead extent")
		if internal != (level == "debug") {
			t.Fatalf("at --log-level %s, internal errors shown: %v:\n%s", level, internal, stderr)
		}
		if !strings.Contains(ta.out.String(), `file system "default" mounted at /mnt/x`) {
			t.Fatalf("stdout = %q", ta.out.String())
		}
	}

	// Giving up says what was awaited, for how long, and the last error.
	ta := newTestApp()
	ta.logLevel, ta.logFormat = "info", "text"
	if err := ta.setUpLogging(); err != nil {
		t.Fatal(err)
	}
	_, err := mountWhenReady(context.Background(), &ta.app, flaky(1000), clusterTarget{}, opts, 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `mount file system "default" at /mnt/x: the cluster's storage was not ready after`) ||
		!strings.Contains(err.Error(), "last error: ") {
		t.Fatalf("giving up: %v", err)
	}
	if strings.Contains(ta.errOut.String(), "retrying") {
		t.Fatalf("retries logged at info:\n%s", ta.errOut.String())
	}

	// An interrupt is not reported as a failure to get ready.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := mountWhenReady(ctx, &ta.app, flaky(1000), clusterTarget{}, opts, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted: %v", err)
	}
}
