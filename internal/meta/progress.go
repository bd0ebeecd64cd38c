package meta

import (
	"context"
	"fmt"
	"sync"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Progress of long requests. A Check, a file system or snapshot deletion
// and a table move are each one unary request that can run for minutes.
// The client names the request with a job id of its choosing; the server
// keeps, under that id, counters the work itself advances (keys loaded,
// keys swept, blobs deleted, steps of a move), and the Progress RPC reads
// them while the request runs. The record lives in memory only: a server
// that restarts forgets it, and the client then shows no progress, which
// is all that is lost.

// Bounds of the job table: it holds at most maxJobs records, and one not
// advanced for jobExpiry goes (the client stopped asking long before).
const (
	maxJobs   = 256
	jobExpiry = 5 * time.Minute
)

// jobTable is a server's records of the long requests under way. Its zero
// value is ready to use.
type jobTable struct {
	mu   sync.Mutex
	jobs map[string]*job
}

// job is the progress of one long request. A nil *job records nothing, so
// that requests without a job id take the same code path.
type job struct {
	mu       sync.Mutex
	phase    string
	step     int
	steps    int
	done     uint64
	total    uint64
	unit     string
	finished bool
	updated  time.Time
	// owners: the other servers working for this request (a snapshot
	// deletion's sweeps), whose records of the same id Progress adds up.
	owners []uint64
}

// start returns the record of job id, made new (a client that retries a
// request on the same server starts its count again); nil if id is empty.
func (t *jobTable) start(id string) *job {
	if id == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.jobs == nil {
		t.jobs = map[string]*job{}
	}
	for k, j := range t.jobs {
		if now.Sub(j.lastUpdate()) > jobExpiry {
			delete(t.jobs, k)
		}
	}
	if len(t.jobs) >= maxJobs {
		// Full of live jobs: the one not advanced for the longest goes.
		var oldest string
		var at time.Time
		for k, j := range t.jobs {
			if u := j.lastUpdate(); oldest == "" || u.Before(at) {
				oldest, at = k, u
			}
		}
		delete(t.jobs, oldest)
	}
	j := &job{updated: now}
	t.jobs[id] = j
	return j
}

// get returns job id's record, or nil.
func (t *jobTable) get(id string) *job {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.jobs[id]
}

func (j *job) lastUpdate() time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.updated
}

// phaseStart begins step step of steps, counting in unit towards total
// (0: not known).
func (j *job) phaseStart(phase string, step, steps int, unit string, total uint64) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.phase, j.step, j.steps, j.unit = phase, step, steps, unit
	j.done, j.total = 0, total
	j.owners = nil // a phase others worked on is over
	j.updated = time.Now()
}

// set records done of the phase, and its total if known (total 0 keeps
// the one recorded). An estimated total that the count passes grows with
// it: the bar never shows more than all.
func (j *job) set(done, total uint64) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if total > 0 {
		j.total = total
	}
	j.done = done
	if j.total > 0 && j.done > j.total {
		j.total = j.done
	}
	j.updated = time.Now()
}

// phaseDone ends the phase: its total is what it counted.
func (j *job) phaseDone() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.total = j.done
	j.updated = time.Now()
}

// finish marks the request done.
func (j *job) finish() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.finished = true
	j.updated = time.Now()
}

// addOwner records that node works for this request too.
func (j *job) addOwner(node uint64) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.owners = append(j.owners, node)
}

func (j *job) toPB() (*pb.ProgressResponse, []uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return &pb.ProgressResponse{Known: true, Phase: j.phase, Step: uint32(j.step), Steps: uint32(j.steps),
		Done: j.done, Total: j.total, Unit: j.unit, Finished: j.finished}, append([]uint64(nil), j.owners...)
}

// sweepJob is the id under which a table owner records its sweep for the
// coordinator's job id (the coordinator may own tables itself: the two
// records must not be one).
func sweepJob(id string) string {
	if id == "" {
		return ""
	}
	return id + "/sweep"
}

// progressPeerTimeout bounds the question to another server in Progress:
// a slow owner leaves its share out of this answer rather than stall the
// client's bar.
const progressPeerTimeout = 250 * time.Millisecond

// Progress implements pb.MetaServer: how far the long request with the
// given job id got here. A request whose work other servers do (their
// sweeps) counts theirs in.
func (s *Server) Progress(ctx context.Context, req *pb.ProgressRequest) (*pb.ProgressResponse, error) {
	j := s.jobs.get(req.GetJob())
	if j == nil {
		return &pb.ProgressResponse{}, nil
	}
	resp, owners := j.toPB()
	if len(owners) == 0 {
		return resp, nil
	}
	// The owners' sweeps are the phase: their counts replace the
	// coordinator's own.
	resp.Done, resp.Total = 0, 0
	for _, o := range owners {
		var r *pb.ProgressResponse
		if o == s.cfg.Node {
			if oj := s.jobs.get(sweepJob(req.GetJob())); oj != nil {
				r, _ = oj.toPB()
			}
		} else {
			pctx, cancel := context.WithTimeout(ctx, progressPeerTimeout)
			c, err := s.peers.client(pctx, o)
			if err == nil {
				r, err = c.Progress(pctx, &pb.ProgressRequest{Job: sweepJob(req.GetJob())})
			}
			cancel()
			if err != nil {
				s.log.Debug("an owner's share of a job's progress", "job", req.GetJob(), "node", o, "err", err)
			}
		}
		resp.Done += r.GetDone()
		resp.Total += r.GetTotal()
	}
	if resp.Total < resp.Done {
		resp.Total = resp.Done
	}
	return resp, nil
}

// tableOwners returns the nodes owning tabs.
func tableOwners(tabs []*dpb.Delegation) map[uint64]bool {
	owners := map[uint64]bool{}
	for _, d := range tabs {
		if o := d.GetOwnerNode(); o != 0 {
			owners[o] = true
		}
	}
	return owners
}

// checkStages are fs.Check's stages in order, with what each counts.
var checkStages = []struct{ name, unit string }{{"load", "inodes"}, {"views", "views"}, {"blobs", "blobs"}}

// checkProgress returns fs.CheckOptions.Progress recording into j, inodes
// the file system's inodes as its servers count them (the load stage's
// total, 0: not known), pass the check's pass (a recheck starts its
// stages again).
func checkProgress(j *job, inodes uint64, pass int) func(stage string, done, total int) {
	if j == nil {
		return nil
	}
	cur := ""
	return func(stage string, done, total int) {
		if stage != cur {
			cur = stage
			step, unit, est := 0, "", uint64(0)
			for i, st := range checkStages {
				if st.name == stage {
					step, unit = i+1, st.unit
				}
			}
			if stage == "load" {
				est = inodes
			}
			phase := stage
			if pass > 0 {
				phase = fmt.Sprintf("%s (recheck %d)", stage, pass)
			}
			j.phaseStart(phase, step, len(checkStages), unit, est)
		}
		j.set(uint64(done), uint64(total))
	}
}

// destroyProgress returns fs.DestroyProgress's progress recording into j
// as steps 2 (blobs) and 3 (keys) of a file system's deletion.
func destroyProgress(j *job) func(stage string, done, total int) {
	if j == nil {
		return nil
	}
	cur := ""
	return func(stage string, done, total int) {
		if stage != cur {
			cur = stage
			step := 2
			if stage == "keys" {
				step = 3
			}
			j.phaseStart("delete "+stage, step, 3, stage, 0)
		}
		j.set(uint64(done), uint64(total))
	}
}

// fsInodeEstimate returns the inodes of file system f as its tables'
// owners count them (incrementally, in their caches): the total a bar
// shows until the walk counts them all (0: no server answered). The
// walk may count more (inodes only snapshots keep, units not cached);
// the job's total then grows with its count.
func (s *Server) fsInodeEstimate(ctx context.Context, f uint64) uint64 {
	nodes, err := s.peers.list(ctx, false)
	if err != nil {
		return 0
	}
	var inodes uint64
	for _, n := range metaNodes(nodes) {
		var resp *pb.TableStatsResponse
		if n.GetId() == s.cfg.Node {
			resp, err = s.TableStats(ctx, &pb.TableStatsRequest{})
		} else {
			pctx, cancel := context.WithTimeout(ctx, progressPeerTimeout)
			var c pb.MetaClient
			if c, err = s.peers.clientAt(n.GetAddress()); err == nil {
				resp, err = c.TableStats(pctx, &pb.TableStatsRequest{})
			}
			cancel()
		}
		if err != nil {
			continue // its tables' inodes are left out of the estimate
		}
		for _, t := range resp.GetTables() {
			if t.GetFs() == f {
				inodes += t.GetInodes()
			}
		}
	}
	return inodes
}
