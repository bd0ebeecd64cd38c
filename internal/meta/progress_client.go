package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// JobProgress is how far a long request (a check, a deletion, a table
// move) got, as the server doing it counts it: step Step of Steps, named
// Phase, with Done of Total items of Unit done (Total 0: not known).
type JobProgress struct {
	Phase       string
	Step, Steps int
	Done, Total uint64
	Unit        string
	// Finished: the request is done (the last report).
	Finished bool
}

// Watch is told a long request's progress while it runs, from one
// goroutine, about every progressPoll, and once more when it ends. It must
// not block for long.
type Watch func(JobProgress)

// progressPoll is how often a watched request's server is asked how far
// it got: a bar moves smoothly enough, and the server answers from memory.
const progressPoll = 300 * time.Millisecond

// progressAskTimeout bounds one Progress question: a server too busy to
// answer in time only leaves the bar where it was.
const progressAskTimeout = time.Second

// newJobID returns a job id no other client chooses.
func newJobID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// watched runs a long request, polling the server it is sent to (send
// gives the request the job id, and its caller the server's client) for
// the progress of the job and telling w. With w nil the request carries
// no job id, as from an older client.
func (c *Client) watched(ctx context.Context, w Watch, send func(job string, to func(pb.MetaClient)) error) error {
	if w == nil {
		return send("", func(pb.MetaClient) {})
	}
	job := newJobID()
	var server atomic.Pointer[pb.MetaClient]
	ask := func() bool {
		cl := server.Load()
		if cl == nil {
			return true // not sent yet
		}
		actx, cancel := context.WithTimeout(ctx, progressAskTimeout)
		defer cancel()
		resp, err := (*cl).Progress(actx, &pb.ProgressRequest{Job: job})
		if status.Code(err) == codes.Unimplemented {
			return false // a server older than progress: nothing to show
		}
		if err == nil && resp.GetKnown() {
			w(JobProgress{Phase: resp.GetPhase(), Step: int(resp.GetStep()), Steps: int(resp.GetSteps()),
				Done: resp.GetDone(), Total: resp.GetTotal(), Unit: resp.GetUnit(), Finished: resp.GetFinished()})
		}
		return true
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var polling atomic.Bool
	polling.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if !ask() {
				polling.Store(false)
				return
			}
		}
	}()
	err := send(job, func(cl pb.MetaClient) { server.Store(&cl) })
	close(done)
	wg.Wait()
	if err == nil && polling.Load() {
		// The server keeps the finished job's record: the last report
		// shows where the work ended, however quick it was.
		ask()
	}
	return err
}

// CheckWatch is Check telling w its progress.
func (c *Client) CheckWatch(ctx context.Context, f uint64, data bool, w Watch) (*fs.CheckReport, error) {
	var rep fs.CheckReport
	err := c.watched(ctx, w, func(job string, to func(pb.MetaClient)) error {
		return c.anyServer(ctx, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
			to(cl)
			resp, err := cl.Check(ctx, &pb.CheckRequest{Fs: f, Data: data, Job: job})
			if err == nil && resp.GetError() == nil {
				if jerr := json.Unmarshal(resp.GetReportJson(), &rep); jerr != nil {
					return &pb.Error{Kind: pb.Error_POSIX, Errno: uint32(syscall.EIO), Message: "check report: " + jerr.Error()}, nil
				}
			}
			return resp.GetError(), err
		})
	})
	return &rep, err
}

// DeleteFileSystemWatch is DeleteFileSystem telling w its progress.
func (c *Client) DeleteFileSystemWatch(ctx context.Context, name string, w Watch) (*pb.DeleteFileSystemResponse, error) {
	var out *pb.DeleteFileSystemResponse
	err := c.watched(ctx, w, func(job string, to func(pb.MetaClient)) error {
		return c.anyServer(ctx, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
			to(cl)
			resp, err := cl.DeleteFileSystem(ctx, &pb.DeleteFileSystemRequest{Name: name, Job: job})
			out = resp
			return resp.GetError(), err
		})
	})
	return out, err
}

// DeleteSnapshotWatch is DeleteSnapshot telling w its progress.
func (c *Client) DeleteSnapshotWatch(ctx context.Context, f, n uint64, w Watch) (*pb.DeleteSnapshotResponse, error) {
	var out *pb.DeleteSnapshotResponse
	err := c.watched(ctx, w, func(job string, to func(pb.MetaClient)) error {
		return c.call(ctx, f, fs.RootHandle.D, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
			to(cl)
			resp, err := cl.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Fs: f, Number: n, Job: job})
			out = resp
			return resp.GetError(), err
		})
	})
	return out, err
}

// MoveTableWatch is MoveTable telling w its progress (its steps).
func (c *Client) MoveTableWatch(ctx context.Context, id, node uint64, w Watch) (epoch uint64, err error) {
	err = c.watched(ctx, w, func(job string, to func(pb.MetaClient)) error {
		return c.ownerCall(ctx, id, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
			to(cl)
			resp, err := cl.MoveTable(ctx, &pb.MoveTableRequest{Table: id, Node: node, Job: job})
			epoch = resp.GetEpoch()
			return resp.GetError(), err
		})
	})
	return epoch, err
}
