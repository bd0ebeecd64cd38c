package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
)

// TestStallContext checks the --timeout policy's context: it ends with
// DeadlineExceeded only after a whole timeout without an answer, each
// answer starts the wait afresh, a long job suspends it, and it follows
// its parent.
func TestStallContext(t *testing.T) {
	const timeout = 150 * time.Millisecond
	ctx, cancel := withStallTimeout(context.Background(), timeout)
	defer cancel()
	child, ccancel := context.WithCancel(ctx) // as the clients derive theirs
	defer ccancel()
	start := time.Now()
	for range 6 {
		time.Sleep(timeout / 3)
		stepDone(child)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("context ended after %v of steady answers: %v", time.Since(start), err)
	}
	err := longJob(child, func() error {
		time.Sleep(2 * timeout)
		return ctx.Err()
	})
	if err != nil {
		t.Fatalf("a long job was cut short: %v", err)
	}
	select {
	case <-child.Done():
	case <-time.After(10 * timeout):
		t.Fatal("the context did not end without answers")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("errors = %v, %v; want DeadlineExceeded", ctx.Err(), child.Err())
	}

	parent, pcancel := context.WithCancel(context.Background())
	ctx, cancel = withStallTimeout(parent, time.Hour)
	defer cancel()
	pcancel()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("after the parent's cancel: %v", ctx.Err())
	}
	ctx, cancel = withStallTimeout(context.Background(), 0)
	defer cancel()
	if _, ok := ctx.Deadline(); ok || ctx.Err() != nil {
		t.Fatal("--timeout 0 bounds the command")
	}
}

// clientCommands are the leaves of the command tree that talk to the
// cluster (they take --cluster).
func clientCommands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Flags().Lookup("cluster") != nil {
			out = append(out, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// TestEveryClientCommandHasTheTimeout checks one --timeout, with one
// default and one help text, on every command that talks to the cluster.
func TestEveryClientCommandHasTheTimeout(t *testing.T) {
	ta := newTestApp()
	cmds := clientCommands(newRootCmd(&ta.app))
	if len(cmds) < 20 {
		t.Fatalf("found only %d client commands", len(cmds))
	}
	for _, c := range cmds {
		f := c.Flags().Lookup("timeout")
		if f == nil {
			t.Errorf("%s has no --timeout", c.CommandPath())
			continue
		}
		if f.DefValue != defaultTimeout.String() || f.Usage != timeoutUsage {
			t.Errorf("%s --timeout: default %s, usage %q", c.CommandPath(), f.DefValue, f.Usage)
		}
	}
}

// runCLI runs a command line as main does and returns its standard error.
func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut, func(string) string { return "" })
	return errOut.String(), code
}

// closedAddr is an address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// checkUserError checks a failed command's standard error: one
// "arbor: " line, no gRPC internals, and the words wanted.
func checkUserError(t *testing.T, stderr string, code int, want ...string) {
	t.Helper()
	if code != 1 {
		t.Fatalf("exit status %d, want 1; stderr %q", code, stderr)
	}
	if !strings.HasPrefix(stderr, "arbor: ") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("stderr %q is not one arbor: line", stderr)
	}
	for _, bad := range []string{"rpc error", "code = ", "desc = "} {
		if strings.Contains(stderr, bad) {
			t.Fatalf("stderr %q shows gRPC's %q", stderr, bad)
		}
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Fatalf("stderr %q lacks %q", stderr, w)
		}
	}
}

// TestUnreachableClusterFailsFast: with nothing listening, every kind of
// client command fails within seconds (not --timeout) and says what to do.
func TestUnreachableClusterFailsFast(t *testing.T) {
	addr := closedAddr(t)
	for _, args := range [][]string{
		{"fs", "list"},
		{"fs", "create", "x"},
		{"kv", "get", "k"},
		{"blob", "stat", "00000000000000000000000000000001"},
		{"status"},
		{"extent", "list"},
	} {
		start := time.Now()
		stderr, code := runCLI(t, append(args, "--cluster", addr, "--insecure")...)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%v took %v", args, d)
		}
		checkUserError(t, stderr, code, "connection refused", addr, "is the cluster running?", "--cluster")
	}
}

// TestHTTPAddressIsNamed: pointing --cluster at an HTTP server (a node's
// --http address) says so at once instead of gRPC's "frame too large".
func TestHTTPAddressIsNamed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "metrics")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, args := range [][]string{{"fs", "list"}, {"kv", "get", "k"}, {"status"}} {
		start := time.Now()
		stderr, code := runCLI(t, append(args, "--cluster", addr, "--insecure")...)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%v took %v", args, d)
		}
		checkUserError(t, stderr, code, addr, "HTTP/1.1, not gRPC", "not their --http ones")
	}
}

// TestSilentClusterTimesOut: an address that accepts connections and
// never answers is given up after --timeout, with a hint.
func TestSilentClusterTimesOut(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	start := time.Now()
	stderr, code := runCLI(t, "fs", "list", "--cluster", l.Addr().String(), "--insecure", "--timeout", "1500ms")
	if d := time.Since(start); d < 1500*time.Millisecond || d > 6*time.Second {
		t.Errorf("gave up after %v, want about --timeout 1.5s", d)
	}
	checkUserError(t, stderr, code, "list file systems", "timed out", "within --timeout")

	// At --log-level debug the raw error comes first, gRPC's words and all.
	stderr, _ = runCLI(t, "fs", "list", "--cluster", l.Addr().String(), "--insecure", "--timeout", "1s", "--log-level", "debug")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(stderr, `level=DEBUG msg="command failed" err=`) || !strings.Contains(stderr, "context deadline exceeded") ||
		!strings.HasPrefix(last, "arbor: list file systems") || strings.Contains(last, "context deadline exceeded") {
		t.Fatalf("with --log-level debug:\n%s", stderr)
	}
}

// TestPlainWords checks the one mapping of gRPC status texts.
func TestPlainWords(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("open blob 1: %w", status.Error(codes.NotFound, "tract: BLOB_NOT_FOUND: blob 1 does not exist")),
			"open blob 1: tract: blob 1 does not exist"},
		{fmt.Errorf("get: %w", status.Error(codes.FailedPrecondition, "")), "get: not possible in the current state"},
		{fmt.Errorf("directory: Status: %w (last error from h:1: %v)", context.DeadlineExceeded,
			status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp h:1: connect: connection refused"`)),
			"directory: Status: timed out (last error from h:1: connection refused) (is the cluster running?"},
		{fmt.Errorf("x: %v", status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: http2: frame too large"`)),
			"x: the address answers HTTP/1.1, not gRPC (--cluster takes"},
	} {
		got := describeError(tc.err)
		if !strings.HasPrefix(got, tc.want) || strings.Contains(got, "rpc error") {
			t.Errorf("describeError(%v)\n = %q\nwant %q...", tc.err, got, tc.want)
		}
	}
}

// TestCLIOnDevCluster: typical failures against real arbor processes
// print one plain line each, without gRPC's texts; the long jobs show
// they are under way with --progress always.
func TestCLIOnDevCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	flags := []string{"--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", c.AdminCredentialFile()}
	// The kv store needs the first extents, made once the storage nodes
	// have registered, and the blob store its TLT.
	deadline := time.Now().Add(60 * time.Second)
	for {
		stderr, code := runCLI(t, append([]string{"kv", "put", "present", "1"}, flags...)...)
		bstderr, _ := runCLI(t, append([]string{"blob", "stat", "00000000000000000000000000000001"}, flags...)...)
		if code == 0 && strings.Contains(bstderr, "does not exist") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster never became ready: %s%s", stderr, bstderr)
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"snapshot", "list", "nosuch"}, []string{`no file system named "nosuch"`}},
		{[]string{"fsck", "nosuch"}, []string{`no file system named "nosuch"`}},
		{[]string{"blob", "stat", "0123456789abcdef0123456789abcdef"}, []string{"0123456789abcdef0123456789abcdef", "does not exist"}},
		{[]string{"blob", "get", "0123456789abcdef0123456789abcdef", "-"}, []string{"does not exist"}},
		{[]string{"kv", "get", "absent"}, []string{`"absent"`, "not found"}},
		{[]string{"fs", "create", ".."}, []string{`".."`}},
		// Three metadata replicas survive one lost node; ec:1+2 survives two.
		{[]string{"fs", "create", "wide", "--data", "ec:1+2"}, []string{"data layout ec:1+2 survives 2 lost nodes, but this cluster's metadata survives 1"}},
		{[]string{"extent", "show", "999999"}, []string{"999999"}},
	} {
		stderr, code := runCLI(t, append(tc.args, flags...)...)
		t.Logf("%v: %s", tc.args, strings.TrimSpace(stderr))
		checkUserError(t, stderr, code, tc.want...)
	}

	for _, tc := range []struct {
		args    []string
		waiting string // the waiting line's start, "" for none
	}{
		{[]string{"fs", "create", "f1"}, ""},
		// The cluster's default layout named explicitly is what f1 got.
		{[]string{"fs", "create", "f2", "--data", "replicas:3"}, ""},
		{[]string{"snapshot", "create", "f1", "s1"}, ""},
		{[]string{"fsck", "f1", "--progress", "always"}, "\rfsck     waiting for the cluster"},
		{[]string{"snapshot", "delete", "f1", "s1", "--progress", "always"}, "\rdelete   waiting for the cluster"},
		{[]string{"fs", "delete", "f1", "--progress", "never"}, ""},
	} {
		stderr, code := runCLI(t, append(tc.args, flags...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, stderr)
		}
		if tc.waiting != "" && !strings.HasPrefix(stderr, tc.waiting) || tc.waiting == "" && stderr != "" {
			t.Fatalf("%v: stderr %q, want the waiting line %q", tc.args, stderr, tc.waiting)
		}
	}

	// Decommissioning reads the TLT first: with every row in sync on the
	// other members it goes ahead (a row caught up late may refuse it for
	// a while, saying why).
	deadline = time.Now().Add(30 * time.Second)
	for {
		stderr, code := runCLI(t, append([]string{"nodes", "decommission", "3"}, flags...)...)
		if code == 0 {
			break
		}
		if !strings.Contains(stderr, "only complete copy on node 3") || time.Now().After(deadline) {
			t.Fatalf("nodes decommission 3: exit %d: %s", code, stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestNamesRefusedBeforeConnecting: a snapshot or file system name the
// metadata service would refuse is refused by the CLI at once, without
// reaching for the cluster (nothing listens at the address given).
func TestNamesRefusedBeforeConnecting(t *testing.T) {
	addr := closedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"snapshot", "create", "default", ".."}, `".." cannot name a snapshot`},
		{[]string{"snapshot", "create", "default", "."}, `"." cannot name a snapshot`},
		{[]string{"snapshot", "create", "default", "a b"}, `snapshot name "a b" contains ' '`},
		{[]string{"snapshot", "create", "default", "bad\xff"}, "is not UTF-8"},
		{[]string{"snapshot", "create", "default", strings.Repeat("n", 300)}, "a snapshot name of 300 bytes"},
		{[]string{"fs", "create", ".."}, `".." cannot name a file system`},
		{[]string{"fs", "create", "a\tb"}, `contains '\t'`},
	} {
		stderr, code := runCLI(t, append(tc.args, "--cluster", addr)...)
		checkUserError(t, stderr, code, tc.want)
		if strings.Contains(stderr, "connection refused") {
			t.Errorf("%v reached for the cluster: %s", tc.args, stderr)
		}
	}
}
