package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/server"
)

// startTestNode runs a node in this process, for commands that talk to
// one, with the node credentials of pki (testPKI).
func startTestNode(t *testing.T, id uint64, cluster string, pki testPKI) *server.Node {
	t.Helper()
	n, err := server.Start(context.Background(), server.Config{
		NodeID: id, ClusterID: cluster, DataDir: t.TempDir(),
		ListenAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", FailureDomain: "test",
		Roles: []server.Role{server.RoleStorage}, DirectoryPeers: []server.Peer{{ID: 99, Addr: "127.0.0.1:1"}},
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Timeouts: server.Timeouts{Shutdown: 5 * time.Second},
		TLS:      server.TLSFiles{Dir: pki.nodeDir},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	return n
}

func TestDebugFaultsCommand(t *testing.T) {
	pki := newTestPKI(t)
	n1 := startTestNode(t, 1, "c1", pki)
	n2 := startTestNode(t, 2, "c1", pki)
	addrs := n1.Addr() + "," + n2.Addr()

	ta := newTestApp()
	ta.env[credentialsEnv] = pki.admin
	if err := ta.run("debug", "faults", "set", "fail=0.25,seed=9", "--addr", addrs); err != nil {
		t.Fatal(err)
	}
	if err := ta.run("debug", "faults", "block", "3,4", "--addr", n1.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := ta.run("debug", "faults", "unblock", "3", "--addr", n1.Addr(), "--cluster-id", "c1"); err != nil {
		t.Fatal(err)
	}
	if got := n1.Env().Faults.Blocked(); len(got) != 1 || got[0] != 4 {
		t.Fatalf("node 1 blocks %v, want [4]", got)
	}
	for _, n := range []*server.Node{n1, n2} {
		if got := n.Env().Faults.Config().String(); got != "fail=0.25,seed=9" {
			t.Fatalf("node faults = %q", got)
		}
	}
	ta.out.Reset()
	if err := ta.run("debug", "faults", "get", "--addr", n1.Addr()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"node 1", "faults:   fail=0.25,seed=9", "blocked:  4"} {
		if !strings.Contains(ta.out.String(), want) {
			t.Fatalf("get printed\n%s\nwithout %q", ta.out.String(), want)
		}
	}
	if err := ta.run("debug", "faults", "heal", "--addr", addrs); err != nil {
		t.Fatal(err)
	}
	if n1.Env().Faults.Config().Enabled() || len(n1.Env().Faults.Blocked()) != 0 {
		t.Fatal("heal left faults or partitions on node 1")
	}

	// Errors: a bad spec changes nothing; a wrong cluster id is refused.
	err := ta.run("debug", "faults", "set", "fail=2", "--addr", n1.Addr())
	if err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("bad spec: %v", err)
	}
	err = ta.run("debug", "faults", "get", "--addr", n1.Addr(), "--cluster-id", "other")
	if err == nil || !strings.Contains(err.Error(), "FailedPrecondition") {
		t.Fatalf("wrong cluster id: %v", err)
	}
	for _, args := range [][]string{
		{"debug", "faults", "get"},
		{"debug", "faults", "block", "0", "--addr", n1.Addr()},
		{"debug", "faults", "block", "x", "--addr", n1.Addr()},
		{"debug", "faults", "get", "--addr", n1.Addr(), "--dir", t.TempDir()},
	} {
		if err := ta.run(args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}
