package meta

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Releases. A session tells a table's owner when it no longer holds a file
// open (its last close of it), so that a file unlinked while open can be
// reclaimed (fs doc.go, Orphans). That was a Release request per file, one
// RPC in ten of an untar, although nothing waits for it: a release only
// allows a reclaim, and a late one only delays it. So FSClient.Release
// queues it, and the next request the session sends to the owner of the
// file's table carries it (Header.releases); if none goes there within
// releaseDelay, a Release request carries the table's queue.
//
// Rules that keep it sound (a release that arrives after an open of the
// same file would undo the open, and the file could be reclaimed while
// held):
//
//   - Open takes a queued release of the file back (the open says the
//     session holds it, as before the release), and one in flight is
//     answered before the open is sent.
//   - A request carries only releases of its own table, as the session's
//     map has it; a server that does not serve one of them in that table
//     records none and answers NOT_OWNER (releasesOf), and the request
//     goes again with the map reread.
//   - Releases a request carried go back to the queue unless its answer
//     says the server got past them (delivered): no answer, NOT_OWNER,
//     RETRY or AMBIGUOUS. Sent twice, a release is harmless, as the file
//     is not open (Open waits for the first).
//   - The session's SyncOpens lists what it holds open, without what it
//     queued: a table's new owner may reclaim those, as they were closed.
//   - Close sends what is queued before it ends the session. A client
//     that dies loses its queue as it loses its opens: the session
//     expires and its orphans are reclaimed (fs.ReclaimOrphans).

// releaseDelay is how long a queued release waits for a request to the
// file's table before a Release request of its own carries it.
const releaseDelay = 100 * time.Millisecond

// maxReleasesSent bounds the releases one request carries (the server
// takes up to maxReleasesPerRequest).
const maxReleasesSent = 256

// releaseQueue holds a session's releases not yet told (queued) and those
// a request carries now (sent: closed when its answer came).
type releaseQueue struct {
	mu     sync.Mutex
	queued map[fs.Handle]bool
	sent   map[fs.Handle]chan struct{}
	// kick wakes the sender when a release is queued.
	kick chan struct{}
}

func newReleaseQueue() *releaseQueue {
	return &releaseQueue{queued: map[fs.Handle]bool{}, sent: map[fs.Handle]chan struct{}{}, kick: make(chan struct{}, 1)}
}

// add queues a release of h.
func (q *releaseQueue) add(h fs.Handle) {
	q.mu.Lock()
	q.queued[h] = true
	q.mu.Unlock()
	q.wake()
}

// wake wakes the sender.
func (q *releaseQueue) wake() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// releaseBatch is the releases one request carries.
type releaseBatch struct {
	hs   []fs.Handle
	done chan struct{}
}

// take moves up to maxReleasesSent queued releases of files in range r to
// sent, for one request.
func (q *releaseQueue) take(r fs.DRange) releaseBatch {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b releaseBatch
	for h := range q.queued {
		if len(b.hs) == maxReleasesSent {
			break
		}
		if r.Contains(h.D) {
			b.hs = append(b.hs, h)
		}
	}
	if len(b.hs) == 0 {
		return b
	}
	b.done = make(chan struct{})
	for _, h := range b.hs {
		delete(q.queued, h)
		q.sent[h] = b.done
	}
	return b
}

// finish ends batch b's request: delivered, or queued again.
func (q *releaseQueue) finish(b releaseBatch, delivered bool) {
	if len(b.hs) == 0 {
		return
	}
	q.mu.Lock()
	for _, h := range b.hs {
		delete(q.sent, h)
		if !delivered {
			q.queued[h] = true
		}
	}
	q.mu.Unlock()
	close(b.done)
	if !delivered {
		q.wake()
	}
}

// cancel takes back h's release (an open of h is about to be sent):
// dropped if queued, and waited for if a request carries it now, so that
// it never reaches the server after the open.
func (q *releaseQueue) cancel(ctx context.Context, h fs.Handle) (dropped bool, err error) {
	for {
		q.mu.Lock()
		if _, ok := q.queued[h]; ok {
			dropped = true
			delete(q.queued, h)
		}
		done := q.sent[h]
		q.mu.Unlock()
		if done == nil {
			return dropped, nil
		}
		select {
		case <-done:
			// Answered, or queued again (then dropped on the next turn).
		case <-ctx.Done():
			return dropped, ctx.Err()
		}
	}
}

// queuedHandles returns the queued releases.
func (q *releaseQueue) queuedHandles() []fs.Handle {
	q.mu.Lock()
	defer q.mu.Unlock()
	hs := make([]fs.Handle, 0, len(q.queued))
	for h := range q.queued {
		hs = append(hs, h)
	}
	return hs
}

// isQueued reports whether h's release is queued.
func (q *releaseQueue) isQueued(h fs.Handle) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued[h]
}

// releasesDelivered reports whether a request's answer (e, err: its error
// and the call's) says the server got past the releases it carried. A
// malformed request (INVALID) counts as delivered too: sent again, the
// same releases would fail every request they rode on.
func releasesDelivered(e *pb.Error, err error) bool {
	if err != nil {
		return false
	}
	if e == nil {
		return true
	}
	switch e.GetKind() {
	case pb.Error_NOT_OWNER, pb.Error_RETRY, pb.Error_AMBIGUOUS:
		return false
	}
	return true
}

// sendReleases sends a Release request for each table with queued
// releases (each carries the table's queue), until none is queued or ctx
// ends.
func (m *FSClient) sendReleases(ctx context.Context) error {
	for {
		hs := m.rel.queuedHandles()
		if len(hs) == 0 {
			return nil
		}
		for _, h := range hs {
			if !m.rel.isQueued(h) {
				continue // carried by the request of another
			}
			err := m.call(ctx, h.D, func(ctx context.Context, cl pb.MetaClient, hdr *pb.Header) (*pb.Error, error) {
				body := handleToPB(h)
				if !carries(hdr, h) {
					// An open took h back (or another request carried it)
					// since the check above: naming it here would release
					// that open. Send only what the header carries.
					if len(hdr.GetReleases()) == 0 {
						return nil, nil
					}
					body = hdr.Releases[0]
				}
				resp, err := cl.Release(ctx, &pb.OpenRequest{Header: hdr, Handle: body})
				return resp.GetError(), err
			})
			if err != nil {
				return err
			}
		}
	}
}

// sendQueuedReleases runs until the session stops: releaseDelay after a
// release is queued, it sends what no other request carried meanwhile.
func (m *FSClient) sendQueuedReleases() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-m.rel.kick:
		}
		select {
		case <-m.stop:
			return
		case <-time.After(m.releaseDelay):
		}
		ctx, cancel := context.WithTimeout(context.Background(), openCheck)
		if err := m.sendReleases(ctx); err != nil && !m.stopped() {
			m.c.log.Debug("sending releases; trying again", "fs", m.f, "session", m.session, "err", err)
			m.rel.wake()
		}
		cancel()
	}
}

// carries reports whether a request's header names h among its releases.
func carries(hdr *pb.Header, h fs.Handle) bool {
	return slices.ContainsFunc(hdr.GetReleases(), func(x *pb.Handle) bool { return handleFromPB(x) == h })
}

// handlesToPB converts hs (nil for none).
func handlesToPB(hs []fs.Handle) []*pb.Handle {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*pb.Handle, len(hs))
	for i, h := range hs {
		out[i] = handleToPB(h)
	}
	return out
}
