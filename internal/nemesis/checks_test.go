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

// TestFsckLosses: fsck's dangling-tract findings count as lost data.
func TestFsckLosses(t *testing.T) {
	out := "arbor fsck chaos: exit status 1: fsck: 2 problems\n" +
		"  tract 0000000000000001ab8c578a9efc0805/1 holds 0 bytes; its block says 16384\n" +
		"  blob 0000000000000001ab8c578a9efc0806 is missing; 3 tracts of it are referenced\n" +
		"  w2/f00001: link count 2, 1 names\n"
	got := fsckLosses(out)
	if len(got) != 2 || !strings.HasPrefix(got[0], "tract 0000000000000001ab8c578a9efc0805/1 holds 0 bytes") || !strings.HasPrefix(got[1], "blob ") {
		t.Fatalf("losses %q", got)
	}
	if got := fsckLosses("fsck: 1 problem\n  w2/f00001: link count 2, 1 names"); len(got) != 0 {
		t.Fatalf("losses in a report without lost data: %q", got)
	}
}
