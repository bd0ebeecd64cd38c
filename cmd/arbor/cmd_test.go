package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/server"
)

// testApp runs commands in-process with fake effects.
type testApp struct {
	app
	out, errOut bytes.Buffer
	env         map[string]string
	served      []server.Config
	targets     []clusterTarget
	view        ClusterView
}

func newTestApp() *testApp {
	ta := &testApp{env: map[string]string{}}
	ta.app = app{
		stdout: &ta.out,
		stderr: &ta.errOut,
		getenv: func(k string) string { return ta.env[k] },
		runServer: func(_ context.Context, cfg server.Config) error {
			ta.served = append(ta.served, cfg)
			return nil
		},
		fetchView: func(_ context.Context, t clusterTarget) (ClusterView, error) {
			ta.targets = append(ta.targets, t)
			return ta.view, nil
		},
		decommission: func(_ context.Context, t clusterTarget, id uint64, _ bool) error {
			ta.targets = append(ta.targets, t)
			if id == 404 {
				return errors.New("no such node")
			}
			return nil
		},
	}
	return ta
}

func (ta *testApp) run(args ...string) error {
	root := newRootCmd(&ta.app)
	root.SetArgs(args)
	return root.ExecuteContext(context.Background())
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const peers3 = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"

func TestServerFlagsBuildConfig(t *testing.T) {
	ta := newTestApp()
	ta.env[faultsEnv] = "dup=0.5,seed=3"
	dir := t.TempDir()
	err := ta.run("server", "--node-id=2", "--cluster-id=prod", "--data-dir="+dir,
		"--listen=127.0.0.1:7002", "--http=127.0.0.1:8002", "--domain=rack-2",
		"--roles=directory,storage", "--directory-peers="+peers3, "--disks=/d1,/d2",
		"--heartbeat-interval=500ms", "--log-format=json", "--log-level=debug", "--tls-dir=/etc/arbor/tls", "--pprof", "--metadata-replicas=5")
	if err != nil {
		t.Fatal(err)
	}
	if len(ta.served) != 1 {
		t.Fatalf("server ran %d times", len(ta.served))
	}
	c := ta.served[0]
	if c.NodeID != 2 || c.ClusterID != "prod" || c.DataDir != dir || c.AdvertiseAddr != "127.0.0.1:7002" ||
		c.HTTPAddr != "127.0.0.1:8002" || c.FailureDomain != "rack-2" || len(c.DirectoryPeers) != 3 ||
		!c.HasRole(server.RoleDirectory) || len(c.Disks) != 2 || c.Disks[1] != "/d2" {
		t.Fatalf("config = %+v", c)
	}
	if c.Timeouts.Heartbeat != 500*time.Millisecond || c.Timeouts.NodeDead != server.DefaultTimeouts().NodeDead {
		t.Fatalf("timeouts = %+v", c.Timeouts)
	}
	if c.Faults.String() != "dup=0.5,seed=3" {
		t.Fatalf("faults from $%s = %q", faultsEnv, c.Faults.String())
	}
	if c.Log.Format != "json" || c.Log.Level.String() != "DEBUG" {
		t.Fatalf("log = %+v", c.Log)
	}
	if c.TLS.CertFile != "/etc/arbor/tls/node.crt" || c.TLS.KeyFile != "/etc/arbor/tls/node.key" || c.TLS.CAFile != "/etc/arbor/tls/ca.crt" ||
		c.Insecure || !c.PProf {
		t.Fatalf("tls = %+v, insecure %v, pprof %v", c.TLS, c.Insecure, c.PProf)
	}
	if c.MetadataReplicas != 5 || c.MetadataGeometry().Replication != 5 {
		t.Fatalf("metadata replicas = %d", c.MetadataReplicas)
	}
}

func TestServerConfigFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, content string }{
		{"node.yaml", `
node-id: 3
cluster-id: prod
data-dir: ` + dir + `
listen: 127.0.0.1:7003
http: 127.0.0.1:8003
domain: rack-3
roles: [directory, storage]
directory-peers: ` + peers3 + `
tls-dir: /etc/arbor/tls
faults: fail=0.01
node-dead-timeout: 30s
log-level: warn
`},
		{"node.json", `{"node-id": 3, "cluster-id": "prod", "data-dir": "` + dir + `",
 "listen": "127.0.0.1:7003", "http": "127.0.0.1:8003", "domain": "rack-3",
 "roles": ["directory", "storage"], "directory-peers": "` + peers3 + `", "tls-dir": "/etc/arbor/tls",
 "faults": "fail=0.01", "node-dead-timeout": "30s", "log-level": "warn"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestApp()
			path := writeFile(t, tc.name, tc.content)
			// The command line wins over the file.
			if err := ta.run("server", "--config", path, "--domain=rack-9"); err != nil {
				t.Fatal(err)
			}
			c := ta.served[0]
			if c.NodeID != 3 || c.ClusterID != "prod" || c.FailureDomain != "rack-9" || c.Faults.FailRate != 0.01 ||
				c.Timeouts.NodeDead != 30*time.Second || c.Log.Level.String() != "WARN" || len(c.Roles) != 2 {
				t.Fatalf("config = %+v", c)
			}
		})
	}
}

func TestServerConfigErrors(t *testing.T) {
	dir := t.TempDir()
	base := []string{"server", "--node-id=1", "--cluster-id=c", "--data-dir=" + dir, "--listen=127.0.0.1:7001",
		"--roles=directory,storage", "--directory-peers=" + peers3}
	for _, tc := range []struct {
		name    string
		args    []string
		env     string
		wantErr string
	}{
		{"unknown key", []string{"server", "--config", writeFile(t, "a.yaml", "node-idd: 1\n")}, "", `unknown key "node-idd"`},
		{"bad value", []string{"server", "--config", writeFile(t, "b.yaml", "node-id: minus one\n")}, "", "node-id"},
		{"bad yaml", []string{"server", "--config", writeFile(t, "c.yaml", "node-id: [\n")}, "", "config file"},
		{"map value", []string{"server", "--config", writeFile(t, "d.json", `{"roles": {"a": 1}}`)}, "", "unsupported value"},
		{"missing file", []string{"server", "--config", filepath.Join(dir, "nope.yaml")}, "", "no such file"},
		{"bad role", append(append([]string{}, base...), "--roles=chef"), "", `--roles: unknown role "chef"`},
		{"bad peers", append(append([]string{}, base...), "--directory-peers=1"), "", "--directory-peers"},
		{"bad env faults", base, "fail=2", "$ARBOR_FAULTS"},
		{"bad flag faults", append(append([]string{}, base...), "--faults=nope"), "", "--faults"},
		{"invalid config", []string{"server", "--data-dir=" + dir}, "", "node id (--node-id) must be a positive integer"},
		{"bad log level", append(append([]string{}, base...), "--log-level=loud"), "", "--log-level"},
		{"bad metadata replicas", append(append([]string{}, base...), "--metadata-replicas=8"), "", "metadata replicas (--metadata-replicas) 8: must be in [1, 7]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestApp()
			if tc.env != "" {
				ta.env[faultsEnv] = tc.env
			}
			err := ta.run(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
			if len(ta.served) != 0 {
				t.Fatal("the server ran despite the error")
			}
		})
	}
}

func TestClusterResolution(t *testing.T) {
	devDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(devDir, "cluster"), []byte("127.0.0.1:9001,127.0.0.1:9002\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		args      []string
		env       string
		wantAddrs string
		wantErr   string
	}{
		{"flag", []string{"--cluster", "a:1, b:2"}, "c:3", "a:1,b:2", ""},
		{"dir", []string{"--dir", devDir}, "c:3", "127.0.0.1:9001,127.0.0.1:9002", ""},
		{"env", nil, "c:3,c:3", "c:3", ""},
		{"both", []string{"--cluster", "a:1", "--dir", devDir}, "", "", "not both"},
		{"none", nil, "", "", "no cluster given"},
		{"bad flag", []string{"--cluster", "a"}, "", "", `"a" is not host:port`},
		{"bad env", nil, "x", "", "$ARBOR_CLUSTER"},
		{"dir without cluster file", []string{"--dir", t.TempDir()}, "", "", "has arbor dev started a cluster there?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ta := newTestApp()
			if tc.env != "" {
				ta.env[clusterEnv] = tc.env
			}
			// --insecure: this is about addresses; TestCredentialResolution
			// is about credentials.
			err := ta.run(append([]string{"status", "--insecure"}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(ta.targets[0].Addrs, ","); got != tc.wantAddrs {
				t.Fatalf("addresses = %q, want %q", got, tc.wantAddrs)
			}
		})
	}
}

func TestStatusAndNodesCommands(t *testing.T) {
	ta := newTestApp()
	ta.view = fiveNodes
	if err := ta.run("status", "--cluster", "a:1", "--insecure"); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := writeStatus(&want, fiveNodes); err != nil {
		t.Fatal(err)
	}
	if ta.out.String() != want.String() {
		t.Fatalf("status printed\n%s\nwant\n%s", ta.out.String(), want.String())
	}

	ta.out.Reset()
	if err := ta.run("nodes", "--json", "--cluster", "a:1", "--insecure"); err != nil {
		t.Fatal(err)
	}
	var nodes struct{ Nodes []NodeView }
	if err := json.Unmarshal(ta.out.Bytes(), &nodes); err != nil || len(nodes.Nodes) != 5 {
		t.Fatalf("nodes --json = %s (%v)", ta.out.String(), err)
	}

	ta.out.Reset()
	if err := ta.run("nodes", "decommission", "4", "--cluster", "a:1", "--insecure"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ta.out.String(), "node 4 is being decommissioned") {
		t.Fatalf("decommission printed %q", ta.out.String())
	}
	if err := ta.run("nodes", "decommission", "404", "--cluster", "a:1", "--insecure"); err == nil || !strings.Contains(err.Error(), "no such node") {
		t.Fatalf("decommission of a missing node: %v", err)
	}
	if err := ta.run("nodes", "decommission", "zero", "--cluster", "a:1", "--insecure"); err == nil {
		t.Fatal("decommission of a non-number succeeded")
	}
}

func TestVersionCommand(t *testing.T) {
	ta := newTestApp()
	if err := ta.run("version"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ta.out.String(), "arbor ") {
		t.Fatalf("version printed %q", ta.out.String())
	}
	ta.out.Reset()
	if err := ta.run("version", "--json"); err != nil {
		t.Fatal(err)
	}
	var info struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal(ta.out.Bytes(), &info); err != nil || info.Version == "" || info.GoVersion == "" {
		t.Fatalf("version --json = %s (%v)", ta.out.String(), err)
	}
}
