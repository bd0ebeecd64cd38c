package devcluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseAddrs(t *testing.T) {
	got, err := ParseAddrs(" 127.0.0.1:1,,[::1]:2 ,127.0.0.1:1\n")
	if err != nil || strings.Join(got, ",") != "127.0.0.1:1,[::1]:2" {
		t.Fatalf("ParseAddrs = %v, %v", got, err)
	}
	for _, bad := range []string{"", " , ", "host", "a:1,b"} {
		if got, err := ParseAddrs(bad); err == nil {
			t.Errorf("ParseAddrs(%q) = %v, want error", bad, got)
		}
	}
}

func TestLayoutRoundTripAndValidation(t *testing.T) {
	dir := t.TempDir()
	l := &layout{FormatVersion: layoutFormatVersion, ClusterID: "dev-x"}
	for i := 1; i <= 4; i++ {
		n := newNodeLayout(uint64(i), i <= 3)
		n.Addr, n.HTTPAddr = "127.0.0.1:"+strconv.Itoa(7000+i), "127.0.0.1:"+strconv.Itoa(8000+i)
		l.Nodes = append(l.Nodes, n)
	}
	if err := l.save(dir); err != nil {
		t.Fatal(err)
	}
	got, ok, err := loadLayout(dir)
	if err != nil || !ok {
		t.Fatalf("loadLayout: %v, %v", ok, err)
	}
	if got.directoryPeers() != "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003" || len(got.Nodes) != 4 || got.Nodes[3].isVoter() {
		t.Fatalf("loaded layout = %+v", got)
	}

	for name, mutate := range map[string]func(l *layout){
		"version":     func(l *layout) { l.FormatVersion = 9 },
		"cluster id":  func(l *layout) { l.ClusterID = "" },
		"ids":         func(l *layout) { l.Nodes[1].ID = 7 },
		"address":     func(l *layout) { l.Nodes[0].HTTPAddr = "nowhere" },
		"no voters":   func(l *layout) { l.Nodes = l.Nodes[3:]; l.Nodes[0].ID = 1 },
		"empty nodes": func(l *layout) { l.Nodes = nil },
	} {
		bad := *got
		bad.Nodes = append([]nodeLayout(nil), got.Nodes...)
		mutate(&bad)
		if err := bad.validate(); err == nil {
			t.Errorf("%s: validate accepted %+v", name, bad)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, layoutFileName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadLayout(dir); err == nil {
		t.Fatal("loadLayout accepted a torn file")
	}
}

func TestReadInfo(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadInfo(dir); err == nil || !strings.Contains(err.Error(), "has arbor dev started a cluster there?") {
		t.Fatalf("ReadInfo of an empty dir: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ClusterFileName), []byte("127.0.0.1:1,127.0.0.1:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := ReadInfo(dir)
	if err != nil || len(info.DirectoryAddrs) != 2 || info.ClusterID != "" || len(info.Nodes) != 0 {
		t.Fatalf("ReadInfo without dev.json = %+v, %v", info, err)
	}
	l := &layout{FormatVersion: layoutFormatVersion, ClusterID: "dev-y", Nodes: []nodeLayout{newNodeLayout(1, true)}}
	l.Nodes[0].Addr, l.Nodes[0].HTTPAddr = "127.0.0.1:1", "127.0.0.1:3"
	if err := l.save(dir); err != nil {
		t.Fatal(err)
	}
	info, err = ReadInfo(dir)
	if err != nil || info.ClusterID != "dev-y" || len(info.Nodes) != 1 || info.Nodes[0].HTTPAddr != "127.0.0.1:3" {
		t.Fatalf("ReadInfo = %+v, %v", info, err)
	}
}

func TestIsArborServerRejectsOtherProcesses(t *testing.T) {
	dir := t.TempDir()
	// This test binary is alive but is no arbor server.
	if isArborServer(os.Getpid(), dir) {
		t.Fatal("the test process was taken for an arbor server")
	}
	if err := os.WriteFile(filepath.Join(dir, "arbor.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid := arborServerPID(dir); pid != 0 {
		t.Fatalf("arborServerPID = %d for a non-arbor process", pid)
	}
	if err := os.WriteFile(filepath.Join(dir, "arbor.pid"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid := arborServerPID(dir); pid != 0 {
		t.Fatalf("arborServerPID = %d for a garbage pid file", pid)
	}
	if alive(1 << 30) {
		t.Fatal("a pid that cannot exist is alive")
	}
}

// TestMetadataReplicas: a new cluster keeps the metadata replicas it was
// opened with (and gives them to every server), an existing one refuses
// another value, and bad values are refused with nothing saved.
func TestMetadataReplicas(t *testing.T) {
	for _, x := range []struct {
		r, nodes int
		want     string
	}{
		{2, 5, "use an odd number"}, {-1, 5, "want 1 to 7"}, {9, 9, "want 1 to 7"}, {5, 3, "5 metadata replicas for 3 nodes"},
	} {
		dir := t.TempDir()
		_, err := Open(Options{Dir: dir, Binary: "/bin/true", Nodes: x.nodes, MetadataReplicas: x.r, Insecure: true})
		if err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("%d metadata replicas on %d nodes: %v, want %q", x.r, x.nodes, err, x.want)
		}
		if _, ok, _ := loadLayout(dir); ok {
			t.Errorf("%d metadata replicas on %d nodes: refused, yet a layout was saved", x.r, x.nodes)
		}
	}
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, Binary: "/bin/true", Nodes: 7, MetadataReplicas: 5, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.serverArgs(c.layout.Nodes[6]), " ")
	c.lock.Close()
	if !strings.Contains(args, "--metadata-replicas=5") {
		t.Fatalf("server args %q lack --metadata-replicas=5", args)
	}
	for _, r := range []int{0, 5} {
		c, err := Open(Options{Dir: dir, Binary: "/bin/true", MetadataReplicas: r, Insecure: true})
		if err != nil {
			t.Fatalf("reopen with %d metadata replicas: %v", r, err)
		}
		if got := c.layout.metadataReplicas(); got != 5 {
			t.Fatalf("reopened with %d: %d metadata replicas, want the saved 5", r, got)
		}
		c.lock.Close()
	}
	if _, err := Open(Options{Dir: dir, Binary: "/bin/true", MetadataReplicas: 3, Insecure: true}); err == nil || !strings.Contains(err.Error(), "holds a cluster with 5 metadata replicas, not 3") {
		t.Fatalf("reopen with 3 metadata replicas: %v", err)
	}
	// A default cluster passes nothing (the server's default, 3).
	dir = t.TempDir()
	if c, err = Open(Options{Dir: dir, Binary: "/bin/true", Nodes: 3, Insecure: true}); err != nil {
		t.Fatal(err)
	}
	defer c.lock.Close()
	if args := strings.Join(c.serverArgs(c.layout.Nodes[0]), " "); strings.Contains(args, "--metadata-replicas") || c.layout.metadataReplicas() != 3 {
		t.Fatalf("default cluster: args %q, %d metadata replicas", args, c.layout.metadataReplicas())
	}
}
