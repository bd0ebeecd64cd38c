package nemesis

import (
	"os"
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
