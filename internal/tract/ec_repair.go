package tract

import (
	"context"
	"sort"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Prompt repair of a stripe acknowledged with shards missing (the package
// doc, "Acknowledgement"). Such a write reached D+1 shards or more; its
// missing shards are rebuilt when their server restarts, comes back from
// a cut-off or is replaced, each of which makes it catch up its rows. A
// server that missed a shard without any of these (its connection was
// refused or timed out while the directory did not hold it alive, and it
// then answered again) would hold it stale until the scrubber's parity
// pass (VerifyInterval). So the writer asks a member of the row that
// stored its shard (RepairStripe) to make the stripe whole: the member
// queues it and, once the write has settled (TornStripeGrace) and every
// server of the stripe is alive in the directory, runs the scrubber's
// check of that one stripe (scrubStripe), which rewrites the missing or
// stale shards conditionally on what it read. An attempt that cannot
// finish (a server still away) is retried with a growing wait; an entry
// leaves the queue when the stripe is whole, when its row changes (every
// member then catches the row up and rebuilds its own shard), or after
// VerifyInterval (the scrubber's pass covers it). The queue is in memory:
// a restarted server's queue is gone and the scrubber is the backstop.

const (
	// maxQueuedRepairs bounds the stripes a tractserver holds queued for
	// repair; past it a request is answered queued=false and the stripe
	// waits for the scrubber.
	maxQueuedRepairs = 4096
	// maxRepairsPerPass bounds the stripes one housekeeping pass repairs
	// (each reads every shard of its stripe).
	maxRepairsPerPass = 32
	// repairWaitMax bounds the wait between two attempts at a stripe.
	repairWaitMax = time.Minute
)

// stripeRepair is a queued stripe.
type stripeRepair struct {
	row        uint32
	rowVersion uint64
	queued     time.Time
	due        time.Time
	wait       time.Duration
}

// queueRepair serves RepairStripe: this server must be a member of the
// tract's row at the request's version and hold a shard of the tract.
func (d *disk) queueRepair(ctx context.Context, req *tpb.RepairStripeRequest) (*tpb.RepairStripeResponse, error) {
	k, err := checkTract(req.Guid, req.Tract, false)
	if err != nil {
		return nil, err
	}
	t, err := d.svc.currentTable()
	if err != nil {
		return nil, err
	}
	ri := t.Locate(k.guid, k.tract)
	_, row, err := d.svc.rowAt(ctx, ri, req.RowVersion)
	if err != nil {
		return nil, err
	}
	if _, pending, ok := row.RoleOf(d.id); !ok || pending {
		return nil, errorf(tpb.ErrorCode_WRONG_SERVER, "tractserver %s holds no slot of row %d at version %d", d.id, ri, row.Version)
	}
	if req.Incarnation == 0 {
		return nil, invalidf("incarnation 0: name the blob life written")
	}
	if m, ok := d.store.Get(k); !ok || m.Shard == nil || m.Incarnation != req.Incarnation {
		return nil, invalidf("tractserver %s holds no shard of tract %s of blob life %016x: ask a server that stored one", d.id, k, req.Incarnation)
	}
	now := d.svc.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.repairs == nil {
		d.repairs = map[tractKey]*stripeRepair{}
	}
	if r, ok := d.repairs[k]; ok {
		// Another degraded write of the stripe: settle after it too.
		r.rowVersion, r.due, r.wait = row.Version, now.Add(d.svc.cfg.TornStripeGrace), 0
		return &tpb.RepairStripeResponse{Queued: true}, nil
	}
	if len(d.repairs) >= maxQueuedRepairs {
		d.log.Warn("stripe repair queue full: the scrubber's parity pass will repair this stripe", "tract", k, "queued", len(d.repairs))
		return &tpb.RepairStripeResponse{}, nil
	}
	d.repairs[k] = &stripeRepair{row: uint32(ri), rowVersion: row.Version, queued: now, due: now.Add(d.svc.cfg.TornStripeGrace)}
	return &tpb.RepairStripeResponse{Queued: true}, nil
}

// queuedRepairs is how many stripes wait for repair.
func (d *disk) queuedRepairs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.repairs)
}

// repairStripes attempts the queued stripes that are due (at most
// maxRepairsPerPass, in key order).
func (d *disk) repairStripes(ctx context.Context) {
	now := d.svc.cfg.Now()
	d.mu.Lock()
	var due []tractKey
	for k, r := range d.repairs {
		if !now.Before(r.due) {
			due = append(due, k)
		}
	}
	d.mu.Unlock()
	if len(due) == 0 {
		return
	}
	sort.Slice(due, func(i, j int) bool { return due[i].less(due[j]) })
	if len(due) > maxRepairsPerPass {
		due = due[:maxRepairsPerPass]
	}
	for _, k := range due {
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		r := d.repairs[k]
		d.mu.Unlock()
		if r == nil {
			continue
		}
		done, err := d.repairStripe(ctx, k, r, now)
		d.mu.Lock()
		if d.repairs[k] == r {
			if done {
				delete(d.repairs, k)
			} else {
				r.wait = min(max(2*r.wait, time.Second), repairWaitMax)
				r.due = now.Add(r.wait)
			}
		}
		d.mu.Unlock()
		if err != nil {
			d.log.Debug("stripe repair: will try again", "tract", k, "err", err, "wait", r.wait)
		}
	}
}

// repairStripe makes one queued stripe whole; done is true when nothing
// is left to do for it here.
func (d *disk) repairStripe(ctx context.Context, k tractKey, r *stripeRepair, now time.Time) (done bool, err error) {
	t, err := d.svc.currentTable()
	if err != nil {
		return false, err
	}
	if int(r.row) >= len(t.Rows) || t.Rows[r.row].Version != r.rowVersion {
		return true, nil // the row changed: its members catch it up
	}
	if now.Sub(r.queued) > d.svc.cfg.VerifyInterval {
		d.log.Info("stripe repair given up to the scrubber's parity pass", "tract", k, "queued", r.queued)
		return true, nil
	}
	own, ok := d.store.Get(k)
	if !ok || own.Shard == nil {
		return true, nil // deleted, or no longer this server's
	}
	e := layoutOf(own.Shard.Ec)
	row := t.Rows[r.row]
	if len(row.Slots) < e.Width() {
		return true, nil
	}
	// A server the directory does not hold alive cannot take its shard:
	// wait for it without reading the stripe.
	for _, s := range row.Slots[:e.Width()] {
		if st, ok := d.svc.peers.nodeState(ctx, s.Node); !ok || st != dpb.NodeState_NODE_STATE_ALIVE {
			return false, errorf(tpb.ErrorCode_REPLICA_FAILED, "node %d of the stripe is not alive in the directory", s.Node)
		}
	}
	var res tpb.ScrubResponse
	whole, err := d.scrubStripe(ctx, k, row, e, &res)
	if err != nil || !whole {
		return false, err
	}
	d.svc.m.stripesRepaired.Add(1)
	if res.RewrittenShards > 0 {
		d.log.Info("stripe written with shards missing made whole", "tract", k, "rewritten", res.RewrittenShards,
			"after", now.Sub(r.queued).Round(time.Millisecond))
	}
	return true, nil
}

// RepairStripe implements tractpb.TractServerServer.
func (s *Service) RepairStripe(ctx context.Context, req *tpb.RepairStripeRequest) (*tpb.RepairStripeResponse, error) {
	d, err := s.disk(req.Disk)
	if err != nil {
		return nil, toStatus(ctx, err)
	}
	resp, err := d.queueRepair(ctx, req)
	return resp, toStatus(ctx, err)
}
