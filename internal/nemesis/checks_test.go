package nemesis

import (
	"os"
	"strings"
	"testing"
)

// TestOpenMountFiles: the guard of the nemesis's rule that it holds no
// file of a mount open when it forks a node sees a file held open under a
// mount's directory, and nothing else.
func TestOpenMountFiles(t *testing.T) {
	dir := t.TempDir()
	r := &run{mounts: []*mount{{dir: dir + "/mnt1"}}}
	if err := os.Mkdir(dir+"/mnt1", 0o755); err != nil {
		t.Fatal(err)
	}
	if open := r.openMountFiles(); len(open) != 0 {
		t.Fatalf("open files before opening any: %v", open)
	}
	f, err := os.Create(dir + "/mnt1/f")
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Create(dir + "/mnt10")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if open := r.openMountFiles(); len(open) != 1 || open[0] != dir+"/mnt1/f" {
		t.Fatalf("open files = %v, want [%s/mnt1/f]", open, dir)
	}
	f.Close()
	if open := r.openMountFiles(); len(open) != 0 {
		t.Fatalf("open files after close: %v", open)
	}
}

// TestFsckLosses: fsck's lost-data findings, read from its JSON report,
// count as lost data; its other problems do not.
func TestFsckLosses(t *testing.T) {
	out := []byte(`{"Lost": 3, "Dangling": 0, "LinkCount": 1,
		"LostData": ["tract 0000000000000001ab8c578a9efc0805/1 holds 0 bytes; its block says 16384",
			"blob 0000000000000001ab8c578a9efc0806 is missing; 3 tracts of it are referenced"],
		"Problems": ["tract 0000000000000001ab8c578a9efc0805/1 holds 0 bytes; its block says 16384",
			"blob 0000000000000001ab8c578a9efc0806 is missing; 3 tracts of it are referenced",
			"w2/f00001: link count 2, 1 names"]}`)
	rep, err := fsckReport(out)
	if err != nil {
		t.Fatal(err)
	}
	got := fsckLosses(rep)
	if len(got) != 3 || !strings.HasPrefix(got[0], "tract 0000000000000001ab8c578a9efc0805/1 holds 0 bytes") ||
		!strings.HasPrefix(got[1], "blob ") || got[2] != "and 1 more blocks' data" {
		t.Fatalf("losses %q", got)
	}
	rep, err = fsckReport([]byte(`{"LinkCount": 1, "Problems": ["w2/f00001: link count 2, 1 names"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := fsckLosses(rep); len(got) != 0 {
		t.Fatalf("losses in a report without lost data: %q", got)
	}
	if _, err := fsckReport([]byte("fsck: connection refused")); err == nil {
		t.Fatal("a report that is no JSON decoded")
	}
}

// TestDataLayoutConfig: an erasure-coded run needs D+P nodes and room for
// 2P+1 directory voters and metadata replicas; anything else is refused
// before a cluster starts.
func TestDataLayoutConfig(t *testing.T) {
	for _, x := range []struct {
		data  string
		nodes int
		want  string // "" for accepted
	}{
		{"ec:5+2", 7, ""}, {"ec", 7, ""}, {"ec:4+1", 5, ""},
		{"ec:5+2", 6, "needs 7 nodes"}, {"replicas:3", 5, "only an erasure code"}, {"ec:9+9", 9, "--data"}, {"bogus", 7, "--data"},
	} {
		c := Config{Binary: "/bin/true", Dir: t.TempDir(), Nodes: x.nodes, Data: x.data}
		err := c.normalize()
		switch {
		case x.want == "" && (err != nil || c.Data == x.data && x.data == "ec"):
			t.Errorf("--data %s on %d nodes: %v (canonical %q)", x.data, x.nodes, err, c.Data)
		case x.want != "" && (err == nil || !strings.Contains(err.Error(), x.want)):
			t.Errorf("--data %s on %d nodes: %v, want %q", x.data, x.nodes, err, x.want)
		}
	}
}
