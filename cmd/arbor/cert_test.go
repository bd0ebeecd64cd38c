package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/server"
)

// testPKI is a CA made with `arbor cert`, a node's credentials for
// 127.0.0.1 (nodeDir, for --tls-dir) and the credential files of an
// administrator and of tenant "t1".
type testPKI struct {
	caDir, nodeDir string
	admin, tenant  string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	root := t.TempDir()
	p := testPKI{caDir: filepath.Join(root, "ca"), nodeDir: filepath.Join(root, "node")}
	for _, args := range [][]string{
		{"cert", "ca", "--out", p.caDir},
		{"cert", "node", "--ca", p.caDir, "--name", "node-1", "--host", "127.0.0.1,localhost", "--out", p.nodeDir},
		{"cert", "client", "--ca", p.caDir, "--name", "root", "--admin", "--out", filepath.Join(root, "clients")},
		{"cert", "client", "--ca", p.caDir, "--name", "t1-app", "--tenant", "t1", "--out", filepath.Join(root, "clients")},
	} {
		if err := newTestApp().run(args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	p.admin = filepath.Join(root, "clients", "root.pem")
	p.tenant = filepath.Join(root, "clients", "t1-app.pem")
	return p
}

func TestCertCommands(t *testing.T) {
	p := newTestPKI(t)
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Join(p.caDir, security.CAKeyFile), 0o600},
		{filepath.Join(p.caDir, security.CACertFile), 0o644},
		{filepath.Join(p.nodeDir, server.NodeKeyFileName), 0o600},
		{filepath.Join(p.nodeDir, server.NodeCertFileName), 0o644},
		{filepath.Join(p.nodeDir, server.CAFileName), 0o644},
		{p.admin, 0o600},
		{p.tenant, 0o600},
	} {
		st, err := os.Stat(f.path)
		if err != nil || st.Mode().Perm() != f.mode {
			t.Errorf("%s: %v, %v; want mode %v", f.path, st, err, f.mode)
		}
	}
	node, err := security.LoadFiles(filepath.Join(p.nodeDir, server.NodeCertFileName), filepath.Join(p.nodeDir, server.NodeKeyFileName), filepath.Join(p.nodeDir, server.CAFileName))
	if err != nil || node.Identity != security.Node("node-1") || len(node.Leaf.IPAddresses) != 1 || len(node.Leaf.DNSNames) != 1 {
		t.Fatalf("node credentials: %+v, %v", node, err)
	}
	for path, want := range map[string]security.Identity{p.admin: security.Admin(), p.tenant: security.Tenant("t1")} {
		c, err := security.LoadCredentialFile(path)
		if err != nil || c.Identity != want {
			t.Errorf("%s: %v, %v; want %v", path, c, err, want)
		}
	}
}

// TestCertBadInputChangesNothing: every refused command writes nothing.
func TestCertBadInputChangesNothing(t *testing.T) {
	p := newTestPKI(t)
	out := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cert", "ca"}, "--out is required"},
		{[]string{"cert", "ca", "--out", p.caDir}, "exists"},
		{[]string{"cert", "ca", "--out", out, "--name", "a b"}, "must be 1 to"},
		{[]string{"cert", "node", "--ca", p.caDir, "--name", "n2", "--out", out}, "at least one host"},
		{[]string{"cert", "node", "--ca", out, "--name", "n2", "--host", "h", "--out", out}, "no such file"},
		{[]string{"cert", "node", "--ca", p.caDir, "--name", "n2", "--host", "h", "--out", out, "--valid-for", "-1h"}, "must be positive"},
		{[]string{"cert", "node", "--ca", p.caDir, "--name", "node-1", "--host", "h", "--out", p.nodeDir}, "exists"},
		{[]string{"cert", "client", "--ca", p.caDir, "--name", "x", "--out", out}, "exactly one of --tenant"},
		{[]string{"cert", "client", "--ca", p.caDir, "--name", "x", "--admin", "--tenant", "t", "--out", out}, "exactly one of --tenant"},
		{[]string{"cert", "client", "--ca", p.caDir, "--name", "../x", "--admin", "--out", out}, "must be 1 to"},
		{[]string{"cert", "client", "--ca", p.caDir, "--name", "x", "--tenant", "a/b", "--out", out}, "must be 1 to"},
		{[]string{"cert", "client", "--ca", p.caDir, "--name", "x", "--admin", "--out", out, "--valid-for", "200000h"}, "after the CA's"},
	} {
		err := newTestApp().run(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("refused commands created %s: %v", out, err)
	}
	// A second node of another CA into the first node's directory: its
	// ca.crt is another CA's, so nothing is written.
	other := filepath.Join(t.TempDir(), "ca2")
	if err := newTestApp().run("cert", "ca", "--out", other); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(p.nodeDir, server.NodeCertFileName))
	err := newTestApp().run("cert", "node", "--ca", other, "--name", "n9", "--host", "h", "--out", p.nodeDir)
	if err == nil || !strings.Contains(err.Error(), "another CA") {
		t.Fatalf("node of another CA into a node dir: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(p.nodeDir, server.NodeCertFileName))
	if string(before) != string(after) {
		t.Fatal("the node's certificate changed")
	}
}

func TestCredentialResolution(t *testing.T) {
	p := newTestPKI(t)
	devDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(devDir, "cluster"), []byte("127.0.0.1:9001\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(devDir, "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The dev cluster's admin files, as arbor dev writes them.
	if err := newTestApp().run("cert", "client", "--ca", p.caDir, "--name", "admin", "--admin", "--out", tlsDir); err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(filepath.Join(p.caDir, security.CACertFile))
	if err := os.WriteFile(filepath.Join(tlsDir, security.CACertFile), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string
		want    security.Kind
		wantErr string
	}{
		{"flag", []string{"--cluster", "a:1", "--credentials", p.tenant}, p.admin, security.KindTenant, ""},
		{"env", []string{"--cluster", "a:1"}, p.tenant, security.KindTenant, ""},
		{"dir", []string{"--dir", devDir}, p.tenant, security.KindAdmin, ""},
		{"dir and flag", []string{"--dir", devDir, "--credentials", p.tenant}, "", security.KindTenant, ""},
		{"insecure", []string{"--cluster", "a:1", "--insecure"}, p.tenant, security.KindNone, ""},
		{"none", []string{"--cluster", "a:1"}, "", 0, "no credentials"},
		{"both", []string{"--cluster", "a:1", "--insecure", "--credentials", p.admin}, "", 0, "not both"},
		{"missing file", []string{"--cluster", "a:1", "--credentials", filepath.Join(devDir, "nope.pem")}, "", 0, "--credentials"},
		{"not a credential", []string{"--cluster", "a:1", "--credentials", filepath.Join(devDir, "cluster")}, "", 0, "no PEM blocks"},
		{"bad env", []string{"--cluster", "a:1"}, filepath.Join(p.caDir, security.CACertFile), 0, "$" + credentialsEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestApp()
			if tc.env != "" {
				ta.env[credentialsEnv] = tc.env
			}
			err := ta.run(append([]string{"status"}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := security.KindNone
			if c := ta.targets[0].Credentials; c != nil {
				got = c.Identity.Kind
			}
			if got != tc.want {
				t.Fatalf("credentials of %v, want %v", got, tc.want)
			}
		})
	}
}
