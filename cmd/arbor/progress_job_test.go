package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/meta"
)

// TestJobBar: a server job's bar waits for the first report, then shows
// each report's phase with a percentage when the total is known and a
// count when it is not, and ends at 100% when the job finishes.
func TestJobBar(t *testing.T) {
	var buf syncBuffer
	watch, stop := startJobBar(&buf, "always", "fsck")
	if !strings.HasPrefix(buf.String(), "\rfsck     waiting for the cluster") {
		t.Fatalf("before any report: %q", buf.String())
	}
	watch(meta.JobProgress{Phase: "load", Step: 1, Steps: 3, Done: 120, Total: 300, Unit: "inodes"})
	watch(meta.JobProgress{Phase: "blobs", Step: 3, Steps: 3, Done: 7, Unit: "blobs"})
	watch(meta.JobProgress{Phase: "blobs", Step: 3, Steps: 3, Done: 9, Total: 9, Unit: "blobs", Finished: true})
	stop()
	out := buf.String()
	for _, want := range []string{
		"\rfsck     [============>                 ]  40%  120 / 300 inodes  step 1/3 load",
		"\rfsck     7 blobs  step 3/3 blobs", // no total: a count, no percentage
		"\rfsck     [==============================] 100%  9 / 9 blobs  step 3/3 blobs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in %q", want, out)
		}
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("the line did not end: %q", out)
	}

	// Rate and ETA, counted from the phase's first report.
	p := &progress{label: "delete", unit: "inodes", start: time.Now().Add(-2 * time.Second), base: 100,
		done: 300, total: 500, note: "step 2/3 sweep"}
	if got, want := p.jobLine(), "delete   [==================>           ]  60%  300 / 500 inodes  100 inodes/s  ETA 2s  step 2/3 sweep"; got != want {
		t.Errorf("job line\n got %q\nwant %q", got, want)
	}
	p.total = 0
	if got := p.jobLine(); strings.Contains(got, "ETA") || strings.Contains(got, "%") || !strings.Contains(got, "300 inodes  100 inodes/s") {
		t.Errorf("a job line without a total: %q; want its count and rate, no ETA", got)
	}

	var quiet syncBuffer
	w, stopQuiet := startJobBar(&quiet, "auto", "fsck") // not a terminal
	stopQuiet()
	if w != nil || quiet.String() != "" {
		t.Fatalf("drawn on a buffer with auto: %q", quiet.String())
	}
}

// TestFsckProgressOnDevCluster: arbor fsck with --progress always draws
// the server's progress: a bar with a percentage, ending at 100% on the
// check's last step.
func TestFsckProgressOnDevCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	flags := []string{"--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", c.AdminCredentialFile()}
	deadline := time.Now().Add(60 * time.Second)
	for {
		stderr, code := runCLI(t, append([]string{"fs", "create", "f1"}, flags...)...)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fs create never succeeded: %s", stderr)
		}
		time.Sleep(300 * time.Millisecond)
	}
	stderr, code := runCLI(t, append([]string{"fsck", "f1", "--progress", "always"}, flags...)...)
	if code != 0 {
		t.Fatalf("fsck: exit %d: %s", code, stderr)
	}
	t.Logf("fsck's stderr: %q", stderr)
	bar := regexp.MustCompile(`\rfsck     \[=+\] 100%  \d+ / \d+ blobs  step 3/3 blobs\x1b\[K\n$`)
	if !bar.MatchString(stderr) {
		t.Fatalf("fsck's progress %q does not end with a full bar of its last step", stderr)
	}
	// An old-style run without progress draws nothing.
	stderr, code = runCLI(t, append([]string{"fsck", "f1", "--progress", "never"}, flags...)...)
	if code != 0 || stderr != "" {
		t.Fatalf("fsck --progress never: exit %d, stderr %q", code, stderr)
	}
}
