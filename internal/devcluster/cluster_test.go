package devcluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/server"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// processAlive reports whether pid runs and is not a zombie.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func healthz(t *testing.T, n devcluster.Node) int {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkRunning checks that node n runs as the cluster says: alive, its pid
// file names it, and it answers /healthz.
func checkRunning(t *testing.T, n devcluster.Node) {
	t.Helper()
	if !n.Running || n.PID <= 0 || !processAlive(n.PID) {
		t.Fatalf("node %d not running: %+v", n.ID, n)
	}
	pid, err := server.ReadPIDFile(n.Dir)
	if err != nil || pid != n.PID {
		t.Fatalf("node %d: pid file says %d (%v), process is %d", n.ID, pid, err, n.PID)
	}
	if code := healthz(t, n); code != http.StatusOK {
		t.Fatalf("node %d: /healthz = %d", n.ID, code)
	}
}

func blocked(t *testing.T, c *devcluster.Cluster, id uint64) []uint64 {
	t.Helper()
	st, err := c.Faults(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return st.GetBlocked()
}

func TestClusterLifeCycle(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	c := devclustertest.Start(t, devcluster.Options{Dir: dir, Nodes: 3})

	nodes := c.Nodes()
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	ports := map[string]bool{}
	for i, n := range nodes {
		if n.ID != uint64(i+1) || n.Dir != filepath.Join(dir, strconv.Itoa(i+1)) {
			t.Fatalf("node %d: %+v", i+1, n)
		}
		if !slices.Equal(n.Roles, []string{"directory", "storage", "meta", "gateway"}) || n.NFSAddr == "" {
			t.Fatalf("node %d roles = %v (NFS at %q), want all four as directory voters", n.ID, n.Roles, n.NFSAddr)
		}
		checkRunning(t, n)
		for _, a := range []string{n.Addr, n.HTTPAddr} {
			if !strings.HasPrefix(a, "127.0.0.1:") || ports[a] {
				t.Fatalf("address %s is not a distinct 127.0.0.1 port", a)
			}
			ports[a] = true
		}
		if _, err := os.Stat(n.LogPath); err != nil {
			t.Fatalf("node %d log: %v", n.ID, err)
		}
	}
	clusterFile, err := os.ReadFile(filepath.Join(dir, devcluster.ClusterFileName))
	if err != nil {
		t.Fatal(err)
	}
	want := nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr + "\n"
	if string(clusterFile) != want {
		t.Fatalf("cluster file = %q, want %q", clusterFile, want)
	}

	// A crash: the process is gone at once, its pid file is left behind.
	killed := nodes[1]
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	if processAlive(killed.PID) {
		t.Fatal("killed node still alive")
	}
	if n, _ := c.Node(2); n.Running {
		t.Fatal("killed node reported running")
	}
	if pid, err := server.ReadPIDFile(killed.Dir); err != nil || pid != killed.PID {
		t.Fatalf("pid file after kill = %d, %v; want the stale %d", pid, err, killed.PID)
	}
	// The stale pid file does not stop a restart, on the same ports.
	if err := c.StartNode(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	restarted, _ := c.Node(2)
	checkRunning(t, restarted)
	if restarted.PID == killed.PID || restarted.Addr != killed.Addr || restarted.HTTPAddr != killed.HTTPAddr {
		t.Fatalf("restarted node = %+v, was %+v", restarted, killed)
	}

	// Partitions through the Admin service, kept across a restart.
	if err := c.Partition(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := blocked(t, c, 1); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("node 1 blocks %v, want [2 3]", got)
	}
	if got := blocked(t, c, 3); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("node 3 blocks %v, want [1]", got)
	}
	if err := c.Restart(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if got := blocked(t, c, 3); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("after restart node 3 blocks %v, want [1]", got)
	}
	if err := c.SetFaults(ctx, 2, "fail=0.5,seed=7"); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Faults(ctx, 2); err != nil || st.GetConfig() != "fail=0.5,seed=7" {
		t.Fatalf("node 2 faults = %v, %v", st, err)
	}
	if err := c.SetFaults(ctx, 2, "fail=7"); err == nil {
		t.Fatal("an invalid fault spec was accepted")
	}
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if got := blocked(t, c, id); len(got) != 0 {
			t.Fatalf("after heal node %d blocks %v", id, got)
		}
	}

	// A clean stop: every process exits 0 and removes its pid file.
	before := c.Nodes()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, n := range before {
		if processAlive(n.PID) {
			t.Fatalf("node %d (pid %d) still alive after Stop", n.ID, n.PID)
		}
		if _, err := os.Stat(filepath.Join(n.Dir, server.PIDFileName)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("node %d left its pid file: %v", n.ID, err)
		}
	}

	// The same directory brings back the same cluster.
	id := c.ClusterID()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	again := devclustertest.Start(t, devcluster.Options{Dir: dir})
	if again.ClusterID() != id {
		t.Fatalf("cluster id %q became %q", id, again.ClusterID())
	}
	for i, n := range again.Nodes() {
		if n.Addr != before[i].Addr || n.HTTPAddr != before[i].HTTPAddr {
			t.Fatalf("node %d moved from %s to %s although its ports were free", n.ID, before[i].Addr, n.Addr)
		}
		checkRunning(t, n)
	}
}

func TestOneOwnerPerDirectory(t *testing.T) {
	dir := t.TempDir()
	devclustertest.Open(t, devcluster.Options{Dir: dir, Nodes: 1})
	_, err := devcluster.Open(devcluster.Options{Dir: dir, Binary: devclustertest.Binary(t)})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("in use by another arbor dev or test (pid %d)", os.Getpid())) {
		t.Fatalf("second Open: %v", err)
	}
}

func TestLayoutChanges(t *testing.T) {
	dir := t.TempDir()
	bin := devclustertest.Binary(t)
	c, err := devcluster.Open(devcluster.Options{Dir: dir, Binary: bin, Nodes: 3, DirectoryVoters: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := c.Nodes()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts    devcluster.Options
		wantErr string
	}{
		{devcluster.Options{Nodes: 2}, "cannot shrink"},
		{devcluster.Options{DirectoryVoters: 3}, "with 1 directory voters, not 3"},
		{devcluster.Options{Nodes: 4, DirectoryVoters: 2}, "odd number"},
		{devcluster.Options{Nodes: 1, DirectoryVoters: 3}, "3 directory voters for 1 nodes"},
	} {
		tc.opts.Dir, tc.opts.Binary = dir, bin
		if _, err := devcluster.Open(tc.opts); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Open(%+v) = %v, want %q", tc.opts, err, tc.wantErr)
		}
	}
	// Growing adds storage nodes and keeps the others.
	c, err = devcluster.Open(devcluster.Options{Dir: dir, Binary: bin, Nodes: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodes := c.Nodes()
	if len(nodes) != 4 || !slices.Equal(nodes[3].Roles, []string{"storage", "meta", "gateway"}) || nodes[3].Addr == "" {
		t.Fatalf("grown cluster = %+v", nodes)
	}
	for i := range first {
		if nodes[i].Addr != first[i].Addr || !slices.Equal(nodes[i].Roles, first[i].Roles) {
			t.Fatalf("node %d changed: %+v -> %+v", i+1, first[i], nodes[i])
		}
	}
	if got := c.DirectoryAddrs(); !slices.Equal(got, []string{first[0].Addr}) {
		t.Fatalf("directory addresses = %v", got)
	}
}

func TestStalePIDOfAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	c := devclustertest.Open(t, devcluster.Options{Dir: dir, Nodes: 1, DirectoryVoters: 1})
	// A pid file naming a live process that is not an arbor server (a pid
	// reused after a crash) must be ignored, and that process left alone.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	nodeDir := filepath.Join(dir, "1")
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nodeDir, server.PIDFileName), []byte(strconv.Itoa(sleeper.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	n, _ := c.Node(1)
	checkRunning(t, n)
	if !processAlive(sleeper.Process.Pid) {
		t.Fatal("the unrelated process named by the stale pid file was stopped")
	}
}

func TestOrphanedServerIsReplaced(t *testing.T) {
	dir := t.TempDir()
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Dir: dir, Nodes: 1, DirectoryVoters: 1})
	n, _ := c.Node(1)
	args := strings.Fields(strings.SplitN(firstLogLine(t, n.LogPath), ": "+bin+" ", 2)[1])
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// An orphan: the same server, started by an owner that died.
	orphan := exec.Command(bin, args...)
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	orphanDone := make(chan error, 1)
	go func() { orphanDone <- orphan.Wait() }()
	t.Cleanup(func() { orphan.Process.Kill() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pid, err := server.ReadPIDFile(n.Dir); err == nil && pid == orphan.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("orphan did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}

	c = devclustertest.Start(t, devcluster.Options{Dir: dir})
	select {
	case err := <-orphanDone:
		if err != nil {
			t.Fatalf("orphan did not exit cleanly on SIGTERM: %v", err)
		}
	default:
		t.Fatal("the orphaned server is still running")
	}
	n, _ = c.Node(1)
	checkRunning(t, n)
}

func firstLogLine(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return line
}

func TestStartReportsACrashingNode(t *testing.T) {
	c := devclustertest.Open(t, devcluster.Options{Nodes: 1, DirectoryVoters: 1, ServerArgs: []string{"--faults=bogus=1"}})
	err := c.Start(testCtx(t))
	if err == nil || !strings.Contains(err.Error(), "node 1 exited") || !strings.Contains(err.Error(), `unknown key "bogus"`) {
		t.Fatalf("Start = %v, want the node's exit and its log", err)
	}
}

func TestPluggableHealthCheck(t *testing.T) {
	calls := 0
	ready := func(ctx context.Context, c *devcluster.Cluster) error {
		if err := devcluster.HTTPHealthy(ctx, c); err != nil {
			return err
		}
		if calls++; calls < 3 {
			return fmt.Errorf("directory has no leader yet (call %d)", calls)
		}
		return nil
	}
	devclustertest.Start(t, devcluster.Options{Nodes: 1, DirectoryVoters: 1, Health: ready})
	if calls != 3 {
		t.Fatalf("health check called %d times, want 3", calls)
	}

	never := func(context.Context, *devcluster.Cluster) error { return errors.New("never healthy") }
	c := devclustertest.Open(t, devcluster.Options{Nodes: 1, DirectoryVoters: 1, Health: never, StartTimeout: 500 * time.Millisecond})
	if err := c.Start(testCtx(t)); err == nil || !strings.Contains(err.Error(), "never healthy") {
		t.Fatalf("Start = %v, want the health check's error", err)
	}
}

func TestTwoClustersNeverTalk(t *testing.T) {
	a := devclustertest.Start(t, devcluster.Options{Nodes: 1, DirectoryVoters: 1})
	b := devclustertest.Start(t, devcluster.Options{Nodes: 1, DirectoryVoters: 1})
	na, _ := a.Node(1)
	nb, _ := b.Node(1)
	if a.ClusterID() == b.ClusterID() {
		t.Fatalf("two clusters share the id %q", a.ClusterID())
	}
	if na.Addr == nb.Addr || na.HTTPAddr == nb.HTTPAddr {
		t.Fatalf("two clusters share ports: %+v and %+v", na, nb)
	}
	// A tool of cluster b pointed at a's node is refused in the TLS
	// handshake: b's certificate is not signed by a's CA (nor a's node's
	// by b's).
	call := func(opts []grpc.DialOption) error {
		cc, err := grpc.NewClient(na.Addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = faultspb.NewAdminClient(cc).GetFaults(testCtx(t), &faultspb.GetFaultsRequest{})
		return err
	}
	if err := call(b.DialOptions()); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("call from cluster %s to a node of %s: %v, want a failed handshake", b.ClusterID(), a.ClusterID(), err)
	}
	// With a's credentials but b's cluster id the cluster check refuses.
	if err := call(client.DialOptions(b.ClusterID(), a.Credentials())); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("call for cluster %s to a node of %s: %v, want FailedPrecondition", b.ClusterID(), a.ClusterID(), err)
	}
	// Each cluster's own connection works.
	if _, err := a.Faults(testCtx(t), 1); err != nil {
		t.Fatal(err)
	}
}
