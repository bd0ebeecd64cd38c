package server

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/faults"
)

func validConfig(t *testing.T) Config {
	return Config{
		NodeID:         1,
		ClusterID:      "test-cluster",
		DataDir:        t.TempDir(),
		ListenAddr:     "127.0.0.1:7000",
		HTTPAddr:       "127.0.0.1:7001",
		FailureDomain:  "rack-1",
		Roles:          []Role{RoleDirectory, RoleStorage},
		DirectoryPeers: []Peer{{ID: 3, Addr: "127.0.0.1:7200"}, {ID: 1, Addr: "127.0.0.1:7000"}},
		TLS:            TLSFiles{Dir: "/etc/arbor/tls"},
	}
}

func TestNormalizeFillsDefaults(t *testing.T) {
	c := validConfig(t)
	c.DataDir = "relative/dir"
	got, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(got.DataDir) || !strings.HasSuffix(got.DataDir, "relative/dir") {
		t.Errorf("DataDir = %q, want it absolute", got.DataDir)
	}
	if len(got.Disks) != 1 || got.Disks[0] != got.DataDir {
		t.Errorf("Disks = %v, want [DataDir]", got.Disks)
	}
	if got.AdvertiseAddr != "127.0.0.1:7000" {
		t.Errorf("AdvertiseAddr = %q, want the listen address", got.AdvertiseAddr)
	}
	if got.Timeouts != DefaultTimeouts() {
		t.Errorf("Timeouts = %+v, want defaults", got.Timeouts)
	}
	if got.Log.Format != "text" {
		t.Errorf("Log.Format = %q, want text", got.Log.Format)
	}
	if got.MetadataReplicas != 3 || got.MetadataGeometry().Replication != 3 {
		t.Errorf("MetadataReplicas = %d, want the extent store's default 3", got.MetadataReplicas)
	}
	if got.DirectoryPeers[0].ID != 1 || got.DirectoryPeers[1].ID != 3 {
		t.Errorf("DirectoryPeers = %v, want sorted by id", got.DirectoryPeers)
	}
	// Normalize must not write through to the caller's slices.
	if c.DirectoryPeers[0].ID != 3 {
		t.Error("Normalize sorted the caller's peer slice")
	}
	c.FailureDomain = ""
	if got, err := c.Normalize(); err != nil || got.FailureDomain == "" {
		t.Errorf("empty failure domain: got %q, %v; want the host name", got.FailureDomain, err)
	}
}

func TestValidateReportsEachProblem(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantErr string
	}{
		{"no node id", func(c *Config) { c.NodeID = 0 }, "node id (--node-id) must be a positive integer"},
		{"no cluster id", func(c *Config) { c.ClusterID = "" }, "cluster id (--cluster-id) must be set"},
		{"bad cluster id", func(c *Config) { c.ClusterID = "a b" }, `cluster id "a b" must be`},
		{"long cluster id", func(c *Config) { c.ClusterID = strings.Repeat("a", 65) }, "cluster id"},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "data dir (--data-dir) must be set"},
		{"bad listen", func(c *Config) { c.ListenAddr = "nope" }, "listen address (--listen)"},
		{"unspecified advertise", func(c *Config) { c.ListenAddr = "0.0.0.0:7000" }, "needs an explicit --advertise"},
		{"port 0 advertise", func(c *Config) { c.AdvertiseAddr = "127.0.0.1:0" }, "port 0"},
		{"no http", func(c *Config) { c.HTTPAddr = "" }, "http address (--http): must be set"},
		{"bad domain", func(c *Config) { c.FailureDomain = "rack/1" }, "failure domain (--domain)"},
		{"duplicate disk", func(c *Config) { c.Disks = []string{"/a", "/a"} }, `"/a" listed twice`},
		{"no roles", func(c *Config) { c.Roles = nil }, "roles (--roles) must name at least one"},
		{"unknown role", func(c *Config) { c.Roles = append(c.Roles, "chef") }, `unknown role "chef"`},
		{"no peers", func(c *Config) { c.DirectoryPeers = nil }, "directory peers (--directory-peers) must list"},
		{"duplicate peer", func(c *Config) {
			c.DirectoryPeers = append(c.DirectoryPeers, Peer{ID: 3, Addr: "127.0.0.1:7300"})
		}, "node 3 listed twice"},
		{"shared peer address", func(c *Config) {
			c.DirectoryPeers = append(c.DirectoryPeers, Peer{ID: 4, Addr: "127.0.0.1:7200"})
		}, "address 127.0.0.1:7200 listed twice"},
		{"peer address differs", func(c *Config) { c.AdvertiseAddr = "127.0.0.1:7999" }, "directory peers list node 1 at 127.0.0.1:7000, but it advertises 127.0.0.1:7999"},
		{"peer without role", func(c *Config) { c.Roles = []Role{RoleStorage} }, `node 1 is a directory peer (--directory-peers) but lacks the "directory" role`},
		{"role without peer", func(c *Config) { c.NodeID = 2 }, `node 2 has the "directory" role but is not in the directory peers`},
		{"join without role", func(c *Config) { c.NodeID, c.Roles, c.DirectoryJoin = 2, []Role{RoleStorage}, true }, "--directory-join is for directory peers; node 2 lacks"},
		{"bad log format", func(c *Config) { c.Log.Format = "xml" }, "log format (--log-format)"},
		{"tiny timeout", func(c *Config) { c.Timeouts.RPC = time.Microsecond }, "rpc timeout (--rpc-timeout)"},
		{"dead before heartbeats", func(c *Config) {
			c.Timeouts.Heartbeat = time.Second
			c.Timeouts.NodeDead = 2 * time.Second
		}, "at least 3 heartbeat intervals"},
		{"bad faults", func(c *Config) { c.Faults = faults.Config{FailRate: 2} }, "faults (--faults)"},
		{"negative metadata replicas", func(c *Config) { c.MetadataReplicas = -1 }, "metadata replicas (--metadata-replicas) -1: must be in [1, 7]"},
		{"too many metadata replicas", func(c *Config) { c.MetadataReplicas = 9 }, "metadata replicas (--metadata-replicas) 9: must be in [1, 7]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t)
			tc.mutate(&c)
			_, err := c.Normalize()
			if err == nil {
				t.Fatalf("Normalize accepted %+v", c)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %q\nwant it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateJoinsAllProblems(t *testing.T) {
	_, err := Config{}.Normalize()
	if err == nil {
		t.Fatal("zero config accepted")
	}
	for _, want := range []string{"node id", "cluster id", "data dir", "listen address", "http address", "roles", "directory peers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestParsePeers(t *testing.T) {
	peers, err := ParsePeers(" 3=127.0.0.1:7003, 1=localhost:7001,2=[::1]:7002,")
	if err != nil {
		t.Fatal(err)
	}
	want := []Peer{{1, "localhost:7001"}, {2, "[::1]:7002"}, {3, "127.0.0.1:7003"}}
	if len(peers) != len(want) {
		t.Fatalf("peers = %v, want %v", peers, want)
	}
	for i := range want {
		if peers[i] != want[i] {
			t.Fatalf("peers = %v, want %v", peers, want)
		}
	}
	if s := FormatPeers(peers); s != "1=localhost:7001,2=[::1]:7002,3=127.0.0.1:7003" {
		t.Fatalf("FormatPeers = %q", s)
	}
	for _, bad := range []string{"1", "x=127.0.0.1:1", "0=127.0.0.1:1", "1=127.0.0.1", "1=0.0.0.0:5", "1=h:0", "1=a:1,1=b:2", "1=a:99999"} {
		if p, err := ParsePeers(bad); err == nil {
			t.Errorf("ParsePeers(%q) = %v, want error", bad, p)
		}
	}
}

func TestParseRoles(t *testing.T) {
	roles, err := ParseRoles("storage, directory")
	if err != nil || len(roles) != 2 || roles[0] != RoleStorage || roles[1] != RoleDirectory {
		t.Fatalf("ParseRoles = %v, %v", roles, err)
	}
	for _, bad := range []string{"storage,storage", "nfs"} {
		if r, err := ParseRoles(bad); err == nil {
			t.Errorf("ParseRoles(%q) = %v, want error", bad, r)
		}
	}
}

func TestParseLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		got, err := ParseLogLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseLogLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseLogLevel("loud"); err == nil {
		t.Error(`ParseLogLevel("loud") succeeded`)
	}
}

// FuzzParsePeers checks that ParsePeers never panics and that what it
// accepts survives FormatPeers.
func FuzzParsePeers(f *testing.F) {
	for _, s := range []string{"1=127.0.0.1:7001,2=127.0.0.1:7002", "3=[::1]:9", "1=a:1,1=b:2", "0=x:1", " 7=h:65535 ,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		peers, err := ParsePeers(s)
		if err != nil {
			return
		}
		again, err := ParsePeers(FormatPeers(peers))
		if err != nil {
			t.Fatalf("FormatPeers(%v) = %q does not parse: %v", peers, FormatPeers(peers), err)
		}
		if len(again) != len(peers) {
			t.Fatalf("round trip of %q: %v became %v", s, peers, again)
		}
		for i := range peers {
			if peers[i] != again[i] || peers[i].ID == 0 || (i > 0 && peers[i-1].ID >= peers[i].ID) {
				t.Fatalf("round trip of %q: %v became %v", s, peers, again)
			}
		}
	})
}
