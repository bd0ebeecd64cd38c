package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
)

// testNodeConfig is a storage-only node on free 127.0.0.1 ports; its
// directory peer (node 99) does not exist, which is fine while no module
// talks to the directory.
func testNodeConfig(t *testing.T, id uint64, cluster, dir string) Config {
	t.Helper()
	return Config{
		NodeID:         id,
		ClusterID:      cluster,
		DataDir:        dir,
		ListenAddr:     "127.0.0.1:0",
		HTTPAddr:       "127.0.0.1:0",
		FailureDomain:  fmt.Sprintf("test-%d", id),
		Roles:          []Role{RoleStorage},
		DirectoryPeers: []Peer{{ID: 99, Addr: "127.0.0.1:1"}},
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Timeouts:       Timeouts{Shutdown: 5 * time.Second},
		TLS:            TLSFiles{Dir: sharedPKI(t).dir},
		Policy:         testPolicy(),
	}
}

// testPolicy is the cluster's policy with the gRPC test service (the
// stand-in modules of these tests) open to every identity.
func testPolicy() security.Policy {
	p := security.DefaultPolicy()
	for _, m := range testpb.TestService_ServiceDesc.Methods {
		p["/"+testpb.TestService_ServiceDesc.ServiceName+"/"+m.MethodName] = security.ClassAny
	}
	for _, m := range testpb.TestService_ServiceDesc.Streams {
		p["/"+testpb.TestService_ServiceDesc.ServiceName+"/"+m.StreamName] = security.ClassAny
	}
	return p
}

func startNode(t *testing.T, cfg Config, modules ...Module) *Node {
	t.Helper()
	n, err := Start(context.Background(), cfg, modules)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func toolConn(t *testing.T, addr, clusterID string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, client.DialOptions(clusterID, sharedPKI(t).admin)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestNodeServesAndShutsDown(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, testNodeConfig(t, 1, "c1", dir))

	if pid, err := ReadPIDFile(dir); err != nil || pid != os.Getpid() {
		t.Fatalf("pid file = %d, %v; want %d", pid, err, os.Getpid())
	}
	code, body := httpGet(t, "http://"+n.HTTPAddr()+"/healthz")
	var report HealthReport
	if err := json.Unmarshal([]byte(body), &report); err != nil {
		t.Fatalf("healthz body %q: %v", body, err)
	}
	if code != http.StatusOK || !report.Healthy || report.NodeID != 1 || report.ClusterID != "c1" || report.Phase != phaseServing {
		t.Fatalf("healthz = %d %+v", code, report)
	}
	_, metrics := httpGet(t, "http://"+n.HTTPAddr()+"/metrics")
	for _, want := range []string{`arbor_faults_injected_total{kind="request_lost"} 0`, "arbor_build_info{", `arbor_node_info{cluster_id="c1",domain="test-1",node_id="1"} 1`, "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	ctx := context.Background()
	st, err := faultspb.NewAdminClient(toolConn(t, n.Addr(), "c1")).GetFaults(ctx, &faultspb.GetFaultsRequest{})
	if err != nil || st.GetNodeId() != 1 || st.GetConfig() != "off" {
		t.Fatalf("GetFaults = %v, %v", st, err)
	}
	// A tool need not name the cluster...
	if _, err := faultspb.NewAdminClient(toolConn(t, n.Addr(), "")).GetFaults(ctx, &faultspb.GetFaultsRequest{}); err != nil {
		t.Fatalf("GetFaults without cluster id: %v", err)
	}
	// ...but if it names another, it is refused,
	_, err = faultspb.NewAdminClient(toolConn(t, n.Addr(), "c2")).GetFaults(ctx, &faultspb.GetFaultsRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `belongs to cluster "c1"`) {
		t.Fatalf("GetFaults for another cluster: %v, want FailedPrecondition", err)
	}
	// and a node must name it.
	nodeCtx := metadata.AppendToOutgoingContext(ctx, faults.NodeMetadataKey, "5")
	_, err = faultspb.NewAdminClient(toolConn(t, n.Addr(), "")).GetFaults(nodeCtx, &faultspb.GetFaultsRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("GetFaults from a node without cluster id: %v, want FailedPrecondition", err)
	}

	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, PIDFileName)); !os.IsNotExist(err) {
		t.Fatalf("pid file still there after shutdown: %v", err)
	}
	if _, err := http.Get("http://" + n.HTTPAddr() + "/healthz"); err == nil {
		t.Fatal("HTTP server still answers after shutdown")
	}
	// The lock is released: the same node starts again on the same dir.
	startNode(t, testNodeConfig(t, 1, "c1", dir))
}

func TestDataDirHasOneServer(t *testing.T) {
	dir := t.TempDir()
	startNode(t, testNodeConfig(t, 1, "c1", dir))
	_, err := Start(context.Background(), testNodeConfig(t, 1, "c1", dir), nil)
	want := fmt.Sprintf("data dir %s is in use by another arbor server (pid %d)", dir, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second Start on one dir: %v\nwant %q", err, want)
	}
	// The failed start left the running node's pid file alone.
	if pid, err := ReadPIDFile(dir); err != nil || pid != os.Getpid() {
		t.Fatalf("pid file = %d, %v after the refused start", pid, err)
	}
}

func TestStalePIDFileDoesNotBlockStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, PIDFileName), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startNode(t, testNodeConfig(t, 1, "c1", dir))
	if pid, err := ReadPIDFile(dir); err != nil || pid != os.Getpid() {
		t.Fatalf("pid file = %d, %v; want it overwritten with %d", pid, err, os.Getpid())
	}
}

func TestIdentityIsCheckedOnRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, testNodeConfig(t, 1, "c1", dir))
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id      uint64
		cluster string
	}{{2, "c1"}, {1, "c2"}} {
		_, err := Start(context.Background(), testNodeConfig(t, tc.id, tc.cluster, dir), nil)
		want := `belongs to node 1 of cluster "c1"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Start as node %d of %q: %v, want %q", tc.id, tc.cluster, err, want)
		}
	}
	startNode(t, testNodeConfig(t, 1, "c1", dir))
}

// recorder is a module that logs its life cycle into a shared list.
type recorder struct {
	name              string
	events            *[]string
	mu                *sync.Mutex
	failInit, failRun bool
}

func (r recorder) record(ev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.events = append(*r.events, r.name+":"+ev)
}

func (r recorder) Name() string { return r.name }
func (r recorder) Init(_ context.Context, env *Env) error {
	r.record("init")
	if r.failInit {
		return fmt.Errorf("%s refuses", r.name)
	}
	return nil
}
func (r recorder) Start(context.Context) error {
	r.record("start")
	if r.failRun {
		return fmt.Errorf("%s cannot start", r.name)
	}
	return nil
}
func (r recorder) Stop(context.Context) error { r.record("stop"); return nil }

func TestModuleLifeCycle(t *testing.T) {
	var mu sync.Mutex
	var events []string
	mods := func(failInit, failStart string) []Module {
		var ms []Module
		for _, name := range []string{"a", "b", "c"} {
			ms = append(ms, recorder{name: name, events: &events, mu: &mu, failInit: name == failInit, failRun: name == failStart})
		}
		return ms
	}
	check := func(want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(events, want) {
			t.Fatalf("events = %v\nwant     %v", events, want)
		}
		events = nil
	}

	dir := t.TempDir()
	n, err := Start(context.Background(), testNodeConfig(t, 1, "c1", dir), mods("", ""))
	if err != nil {
		t.Fatal(err)
	}
	check("a:init", "b:init", "c:init", "a:start", "b:start", "c:start")
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("c:stop", "b:stop", "a:stop")

	_, err = Start(context.Background(), testNodeConfig(t, 1, "c1", dir), mods("b", ""))
	if err == nil || !strings.Contains(err.Error(), "init b: b refuses") {
		t.Fatalf("Start with failing Init: %v", err)
	}
	check("a:init", "b:init", "a:stop")

	_, err = Start(context.Background(), testNodeConfig(t, 1, "c1", dir), mods("", "b"))
	if err == nil || !strings.Contains(err.Error(), "start b: b cannot start") {
		t.Fatalf("Start with failing Start: %v", err)
	}
	check("a:init", "b:init", "c:init", "a:start", "b:start", "c:stop", "b:stop", "a:stop")

	// Every failed start released the data dir.
	startNode(t, testNodeConfig(t, 1, "c1", dir))
}

func TestHealthChecksAndModuleHTTP(t *testing.T) {
	var mu sync.Mutex
	failing := true
	mod := ModuleFuncs{ModuleName: "checked", InitFunc: func(_ context.Context, env *Env) error {
		env.HTTP.HandleFunc("GET /debug/checked", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })
		return env.Health.AddCheck("leader", func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return fmt.Errorf("no leader yet")
			}
			return nil
		})
	}}
	n := startNode(t, testNodeConfig(t, 1, "c1", t.TempDir()), mod)
	code, body := httpGet(t, "http://"+n.HTTPAddr()+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"leader": "no leader yet"`) {
		t.Fatalf("healthz with failing check = %d %s", code, body)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	if code, body := httpGet(t, "http://"+n.HTTPAddr()+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"leader": "ok"`) {
		t.Fatalf("healthz with passing check = %d %s", code, body)
	}
	if code, body := httpGet(t, "http://"+n.HTTPAddr()+"/debug/checked"); code != http.StatusOK || body != "hello" {
		t.Fatalf("module handler = %d %q", code, body)
	}
}

// echoModule serves the gRPC test service, standing in for a real module's
// service.
type echoService struct {
	testpb.UnimplementedTestServiceServer
}

func (echoService) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func echoModule() Module {
	return ModuleFuncs{ModuleName: "echo", InitFunc: func(_ context.Context, env *Env) error {
		testpb.RegisterTestServiceServer(env.GRPC, echoService{})
		return nil
	}}
}

func TestNodeToNodeCallsCarryIdentity(t *testing.T) {
	a := startNode(t, testNodeConfig(t, 1, "c1", t.TempDir()), echoModule())
	b := startNode(t, testNodeConfig(t, 2, "c1", t.TempDir()), echoModule())
	stranger := startNode(t, testNodeConfig(t, 3, "c2", t.TempDir()), echoModule())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	call := func(from, to *Node) error {
		cc, err := from.Env().Dialer.Conn(to.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, err = testpb.NewTestServiceClient(cc).EmptyCall(ctx, &testpb.Empty{})
		return err
	}
	if err := call(a, b); err != nil {
		t.Fatalf("a -> b: %v", err)
	}
	if err := call(a, stranger); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a -> node of another cluster: %v, want FailedPrecondition", err)
	}
	if err := call(stranger, b); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("node of another cluster -> b: %v, want FailedPrecondition", err)
	}
	// Partition a from b on b's side: b refuses a, still serves others.
	if err := b.Env().Faults.Block(1); err != nil {
		t.Fatal(err)
	}
	if err := call(a, b); status.Code(err) != codes.Unavailable {
		t.Fatalf("a -> b while b blocks a: %v, want Unavailable", err)
	}
	if err := call(stranger, a); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stranger -> a: %v", err)
	}
	if err := b.Env().Faults.Unblock(1); err != nil {
		t.Fatal(err)
	}
	if err := call(a, b); err != nil {
		t.Fatalf("a -> b after heal: %v", err)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, testNodeConfig(t, 1, "c1", dir)) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if pid, err := ReadPIDFile(dir); err == nil && pid == os.Getpid() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run did not write its pid file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(filepath.Join(dir, PIDFileName)); !os.IsNotExist(err) {
		t.Fatalf("pid file left behind: %v", err)
	}
}

// startedService fails the test's call if it runs before its module
// started: the handler of a module that is not running must never run.
type startedService struct {
	testpb.UnimplementedTestServiceServer
	started *atomic.Bool
	early   *atomic.Int64
}

func (s startedService) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	if !s.started.Load() {
		s.early.Add(1)
	}
	return &testpb.Empty{}, nil
}

// TestNoRPCReachesAModuleBeforeItStarts calls a module's service in a loop
// while the module's Start is held: every call is refused Unavailable (the
// handler never runs early) until Start returns, then calls are served;
// once shutdown begins they are refused again. The faults Admin service,
// owned by no module, answers throughout. (Issue 13 item 5: a
// Directory/Register reached the raft engine before it started.)
func TestNoRPCReachesAModuleBeforeItStarts(t *testing.T) {
	var started atomic.Bool
	var early atomic.Int64
	addrs := make(chan string, 1)
	release := make(chan struct{})
	stopping := make(chan struct{})
	stopRelease := make(chan struct{})
	mod := ModuleFuncs{ModuleName: "slow",
		InitFunc: func(_ context.Context, env *Env) error {
			testpb.RegisterTestServiceServer(env.GRPC, startedService{started: &started, early: &early})
			addrs <- env.AdvertiseAddr
			return nil
		},
		StartFunc: func(context.Context) error {
			<-release
			started.Store(true)
			return nil
		},
		StopFunc: func(context.Context) error {
			started.Store(false)
			close(stopping)
			<-stopRelease
			return nil
		},
	}
	type result struct {
		n   *Node
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := Start(context.Background(), testNodeConfig(t, 1, "c1", t.TempDir()), []Module{mod})
		done <- result{n, err}
	}()
	addr := <-addrs
	cc := toolConn(t, addr, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func() error {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err := testpb.NewTestServiceClient(cc).EmptyCall(cctx, &testpb.Empty{})
		return err
	}
	// The gRPC server serves while Start is held: wait until a call gets
	// the gate's answer (not a connection error), then make many more.
	for {
		err := call()
		if err == nil {
			t.Fatal("a call was served before the module started")
		}
		if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "not serving") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no refusal from the gate: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 50 {
		if err := call(); status.Code(err) != codes.Unavailable {
			t.Fatalf("call before Start returned: %v, want Unavailable", err)
		}
	}
	if _, err := faultspb.NewAdminClient(cc).GetFaults(ctx, &faultspb.GetFaultsRequest{}); err != nil {
		t.Fatalf("Admin service while modules start: %v", err)
	}
	close(release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := call(); err != nil {
		t.Fatalf("call after Start: %v", err)
	}
	shut := make(chan error, 1)
	go func() { shut <- r.n.Shutdown(context.Background()) }()
	<-stopping
	if err := call(); status.Code(err) != codes.Unavailable {
		t.Fatalf("call while the module stops: %v, want Unavailable", err)
	}
	close(stopRelease)
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if n := early.Load(); n != 0 {
		t.Fatalf("%d calls reached the module while it was not running", n)
	}
}

// panicService panics with its message on every call.
type panicService struct {
	testpb.UnimplementedTestServiceServer
	msg *atomic.Value
}

func (s panicService) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	panic(s.msg.Load().(panicValue).v)
}

// panicValue boxes what panicService panics with (an atomic.Value holds
// one concrete type).
type panicValue struct{ v any }

// TestStoreFatalIsTyped: only the store's own panic value, possibly
// wrapped, is a store failure; a panic whose text merely looks like
// pebble's, or any other value, is a bug answered Internal.
func TestStoreFatalIsTyped(t *testing.T) {
	sf := &raftengine.StoreFatalError{Msg: "pebble: fatal commit error: write db/000004.log: no space left on device"}
	for _, tc := range []struct {
		r    any
		want bool
	}{
		{sf, true},
		{fmt.Errorf("commit: %w", sf), true},
		{"pebble: fatal commit error: write db/000004.log: no space left on device", false},
		{errors.New("pebble: fatal commit error"), false},
		{42, false},
		{nil, false},
	} {
		if got := storeFatal(tc.r); got != tc.want {
			t.Errorf("storeFatal(%#v) = %v, want %v", tc.r, got, tc.want)
		}
	}
}

// TestStoreFatalCrashesTheNode: a handler's ordinary panic (even one whose
// text looks like pebble's) is answered Internal and the node serves on; a
// panic of the store (raftengine.StoreFatalError, pebble's fatal error, as
// a full disk gives) crashes the process instead of leaving the
// node serving on a store it can no longer write (the nemesis's disk-full
// fault left such a node registered but unable to serve for minutes). The
// node runs in a child test process, which must die.
func TestStoreFatalCrashesTheNode(t *testing.T) {
	if os.Getenv("ARBOR_SERVER_CRASH_CHILD") == "1" {
		runPanickyNode(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreFatalCrashesTheNode$", "-test.v")
	cmd.Env = append(os.Environ(), "ARBOR_SERVER_CRASH_CHILD=1")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || !strings.Contains(string(out), "no space left on device") || strings.Contains(string(out), "CHILD SURVIVED") {
		t.Fatalf("child with a failed store: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ordinary panic answered") {
		t.Fatalf("the child did not get as far as the store's failure:\n%s", out)
	}
}

// runPanickyNode is the child of TestStoreFatalCrashesTheNode.
func runPanickyNode(t *testing.T) {
	var msg atomic.Value
	msg.Store(panicValue{"pebble: a bug's message that only looks like the store's"})
	mod := ModuleFuncs{ModuleName: "panicky", InitFunc: func(_ context.Context, env *Env) error {
		testpb.RegisterTestServiceServer(env.GRPC, panicService{msg: &msg})
		return nil
	}}
	n := startNode(t, testNodeConfig(t, 1, "c1", t.TempDir()), mod)
	cc := toolConn(t, n.Addr(), "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := testpb.NewTestServiceClient(cc).EmptyCall(ctx, &testpb.Empty{}); status.Code(err) != codes.Internal {
		t.Fatalf("call that panics: %v, want Internal", err)
	}
	fmt.Println("ordinary panic answered; the node serves on")
	msg.Store(panicValue{&raftengine.StoreFatalError{Msg: "pebble: fatal commit error: write db/000004.log: no space left on device"}})
	_, _ = testpb.NewTestServiceClient(cc).EmptyCall(ctx, &testpb.Empty{})
	time.Sleep(5 * time.Second)
	fmt.Println("CHILD SURVIVED")
}
