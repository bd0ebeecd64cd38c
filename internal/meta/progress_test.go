package meta

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// progressFiles is how many files the progress tests make: enough keys
// for the walks to report many times (fs.Check reports every 64 keys).
const progressFiles = 300

// fillForProgress makes progressFiles files in x, takes a snapshot, and
// writes every file again, so that the snapshot holds versions a deletion
// of it sweeps. It returns the snapshot's number.
func fillForProgress(t *testing.T, ctx context.Context, x *clusterFS) uint64 {
	t.Helper()
	hs := make([]fs.Handle, progressFiles)
	for i := range hs {
		a, err := x.main.Create(ctx, fs.RootHandle, fmt.Sprintf("f%03d", i), 0o644, fs.Cred{})
		if err != nil {
			t.Fatalf("create file %d: %v", i, err)
		}
		hs[i] = a.Handle
		if _, err := x.main.Write(ctx, a.Handle, 0, []byte("first version")); err != nil {
			t.Fatalf("write file %d: %v", i, err)
		}
		if err := x.main.Release(ctx, a.Handle); err != nil {
			t.Fatalf("close file %d: %v", i, err)
		}
	}
	if err := x.main.SyncAll(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := x.CreateSnapshot(ctx, "before")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for i, h := range hs {
		if _, err := x.main.Open(ctx, h); err != nil {
			t.Fatalf("open file %d: %v", i, err)
		}
		if _, err := x.main.Write(ctx, h, 0, []byte("second version, longer")); err != nil {
			t.Fatalf("rewrite file %d: %v", i, err)
		}
		if err := x.main.Release(ctx, h); err != nil {
			t.Fatalf("close file %d: %v", i, err)
		}
	}
	if err := x.main.SyncAll(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// pollProgress asks srv how far job got, as fast as it answers, until
// stop closes, and returns every answer that knew the job.
func pollProgress(ctx context.Context, srv *Server, job string, stop <-chan struct{}) []*pb.ProgressResponse {
	var seen []*pb.ProgressResponse
	for {
		select {
		case <-stop:
			return seen
		default:
		}
		if r, err := srv.Progress(ctx, &pb.ProgressRequest{Job: job}); err == nil && r.GetKnown() {
			seen = append(seen, r)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// checkMonotonic fails t unless the reports never go back: the step never
// decreases, and within a step done never does.
func checkMonotonic(t *testing.T, what string, seen []*pb.ProgressResponse) {
	t.Helper()
	for i := 1; i < len(seen); i++ {
		a, b := seen[i-1], seen[i]
		if b.GetStep() < a.GetStep() || (b.GetStep() == a.GetStep() && b.GetDone() < a.GetDone()) {
			t.Fatalf("%s: progress went back from step %d (%s) done %d to step %d (%s) done %d",
				what, a.GetStep(), a.GetPhase(), a.GetDone(), b.GetStep(), b.GetPhase(), b.GetDone())
		}
		if b.GetTotal() != 0 && b.GetDone() > b.GetTotal() {
			t.Fatalf("%s: done %d past total %d in %s", what, b.GetDone(), b.GetTotal(), b.GetPhase())
		}
	}
}

// runWatched runs call (a long request carrying job) on srv while polling
// its progress, and returns what the polls saw and the last record.
func runWatched(t *testing.T, ctx context.Context, srv *Server, job string, call func() error) ([]*pb.ProgressResponse, *pb.ProgressResponse) {
	t.Helper()
	stop := make(chan struct{})
	var seen []*pb.ProgressResponse
	var wg sync.WaitGroup
	wg.Go(func() { seen = pollProgress(ctx, srv, job, stop) })
	err := call()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	last, err := srv.Progress(ctx, &pb.ProgressRequest{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	return seen, last
}

// TestProgressOfCheckAndSnapshotDeletion: fsck and a snapshot deletion
// over a few hundred files report progress counted by their walks, which
// never goes back and ends with done == total; requests without a job id
// leave no record.
func TestProgressOfCheckAndSnapshotDeletion(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("progress")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	snap := fillForProgress(t, ctx, x)
	srv := c.servers[1].srv

	// fsck.
	var rep *pb.CheckResponse
	seen, last := runWatched(t, ctx, srv, "check-1", func() (err error) {
		rep, err = srv.Check(ctx, &pb.CheckRequest{Fs: x.f, Data: true, Job: "check-1"})
		if err == nil {
			err = errorFromPB(rep.GetError())
		}
		return err
	})
	t.Logf("check: %d reports, last %v", len(seen), last)
	checkMonotonic(t, "check", append(seen, last))
	if !last.GetFinished() || last.GetStep() != 3 || last.GetSteps() != 3 || last.GetPhase() != "blobs" || last.GetDone() != last.GetTotal() {
		t.Fatalf("check's last progress: %v; want blobs, step 3 of 3, finished, done == total", last)
	}
	for _, r := range seen {
		if r.GetPhase() == "load" && r.GetTotal() == 0 {
			t.Errorf("check's load phase without a total (the tables' inode counts): %v", r)
		}
	}
	// Polls may miss a quick stage's end; the walk's own reports do not:
	// each stage ends at done == total, the load having counted every
	// file's inode.
	st, err := srv.fsOf(ctx, x.f)
	if err != nil {
		t.Fatal(err)
	}
	type stageEnd struct{ done, total int }
	var stages []string
	ends := map[string]stageEnd{}
	if _, err := st.direct.Check(ctx, fs.CheckOptions{Progress: func(stage string, done, total int) {
		if len(stages) == 0 || stages[len(stages)-1] != stage {
			stages = append(stages, stage)
		}
		ends[stage] = stageEnd{done, total}
	}}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(stages) != "[load views blobs]" {
		t.Fatalf("check's stages: %v", stages)
	}
	for stage, e := range ends {
		if e.done != e.total {
			t.Errorf("check's stage %s ended at %d of %d", stage, e.done, e.total)
		}
	}
	if ends["load"].done < progressFiles {
		t.Errorf("check's load counted %d inodes, want at least %d", ends["load"].done, progressFiles)
	}

	// The same through the client: its watch ends on the last record.
	var watched []JobProgress
	if _, err := c.client.CheckWatch(ctx, x.f, false, func(p JobProgress) { watched = append(watched, p) }); err != nil {
		t.Fatal(err)
	}
	if len(watched) == 0 {
		t.Fatal("CheckWatch reported no progress")
	}
	if w := watched[len(watched)-1]; !w.Finished || w.Done != w.Total || w.Step != 3 {
		t.Fatalf("CheckWatch's last report: %+v; want finished at step 3 with done == total", w)
	}

	// Snapshot deletion.
	seen, last = runWatched(t, ctx, srv, "delete-1", func() error {
		resp, err := srv.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Fs: x.f, Number: snap, Job: "delete-1"})
		if err == nil {
			err = errorFromPB(resp.GetError())
		}
		return err
	})
	t.Logf("deletion: %d reports, last %v", len(seen), last)
	checkMonotonic(t, "snapshot deletion", append(seen, last))
	if !last.GetFinished() || last.GetStep() != 3 || last.GetSteps() != 3 || last.GetDone() != last.GetTotal() {
		t.Fatalf("deletion's last progress: %v; want step 3 of 3, finished, done == total", last)
	}
	sweep := srv.jobs.get(sweepJob("delete-1"))
	if sweep == nil {
		t.Fatal("the table owner kept no record of its sweep")
	}
	sr, _ := sweep.toPB()
	if !sr.GetFinished() || sr.GetDone() != sr.GetTotal() || sr.GetDone() < progressFiles {
		t.Fatalf("the owner's sweep: %v; want finished, done == total, and at least %d inodes", sr, progressFiles)
	}
	sawSweep := false
	for _, r := range seen {
		if r.GetPhase() == "sweep" && r.GetDone() > sr.GetDone() {
			t.Fatalf("a poll saw the sweep at %d inodes, past the %d it swept", r.GetDone(), sr.GetDone())
		}
		// The coordinator shows its owners' counts (here, its own sweep's).
		sawSweep = sawSweep || (r.GetPhase() == "sweep" && r.GetTotal() >= progressFiles)
	}
	if !sawSweep {
		t.Errorf("no poll saw the sweep with the file system's inodes as its total (%d polls)", len(seen))
	}

	// An old client's request (no job id) leaves no record.
	before := len(srv.jobs.jobs)
	if resp, err := srv.Check(ctx, &pb.CheckRequest{Fs: x.f}); err != nil || resp.GetError() != nil {
		t.Fatalf("check without a job id: %v %v", err, resp.GetError())
	}
	if n := len(srv.jobs.jobs); n != before {
		t.Fatalf("a check without a job id made a record: %d jobs, was %d", n, before)
	}
}

// TestProgressJobTableBounded: the table of jobs keeps at most maxJobs,
// dropping the one not advanced for the longest.
func TestProgressJobTableBounded(t *testing.T) {
	var jt jobTable
	first := jt.start("job-0")
	first.updated = time.Now().Add(-time.Minute)
	for i := 1; i <= maxJobs; i++ {
		jt.start(fmt.Sprintf("job-%d", i)).set(uint64(i), 0)
	}
	if len(jt.jobs) != maxJobs {
		t.Fatalf("%d jobs kept, want %d", len(jt.jobs), maxJobs)
	}
	if jt.get("job-0") != nil {
		t.Fatal("the stalest job was kept")
	}
	if j := jt.get(fmt.Sprintf("job-%d", maxJobs)); j == nil || j.done != maxJobs {
		t.Fatalf("the newest job: %+v", j)
	}
	if jt.start("") != nil {
		t.Fatal("an empty job id made a record")
	}
}

// TestProgressOfTableMove: a move reports its steps, ending at the last
// with done == total.
func TestProgressOfTableMove(t *testing.T) {
	c := newTestCluster(t, 2)
	x := c.newFS("moving")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	from := c.owner(ctx, x.f, fs.RootHandle.D)
	to := 3 - from
	srv := c.servers[from].srv
	tabs, err := srv.tablesOf(ctx, x.f)
	if err != nil || len(tabs) != 1 {
		t.Fatalf("tables: %v %v", tabs, err)
	}
	seen, last := runWatched(t, ctx, srv, "move-1", func() error {
		resp, err := srv.MoveTable(ctx, &pb.MoveTableRequest{Table: tabs[0].GetTableId(), Node: to, Job: "move-1"})
		if err == nil {
			err = errorFromPB(resp.GetError())
		}
		return err
	})
	checkMonotonic(t, "move", append(seen, last))
	if !last.GetFinished() || last.GetStep() != 4 || last.GetSteps() != 4 || last.GetDone() != 4 || last.GetTotal() != 4 || last.GetPhase() != "drop" {
		t.Fatalf("move's last progress: %v; want drop, step 4 of 4, done 4 of 4, finished", last)
	}
}

// TestProgressOfFileSystemDeletion: a deletion reports its blobs and then
// its keys as it deletes them, ending with done == total.
func TestProgressOfFileSystemDeletion(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("doomed")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fillForProgress(t, ctx, x)
	srv := c.servers[1].srv
	var resp *pb.DeleteFileSystemResponse
	seen, last := runWatched(t, ctx, srv, "delete-fs", func() (err error) {
		resp, err = srv.DeleteFileSystem(ctx, &pb.DeleteFileSystemRequest{Name: "doomed", Job: "delete-fs"})
		if err == nil {
			err = errorFromPB(resp.GetError())
		}
		return err
	})
	checkMonotonic(t, "file system deletion", append(seen, last))
	if !last.GetFinished() || last.GetPhase() != "delete keys" || last.GetStep() != 3 || last.GetDone() != last.GetTotal() || last.GetDone() != resp.GetKeys() {
		t.Fatalf("deletion's last progress: %v; want delete keys, step 3, finished, done == total == the %d keys deleted", last, resp.GetKeys())
	}
}
