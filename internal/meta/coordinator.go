package meta

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// The delegation coordinator (Ursa Minor §3.1, §3.7): one metadata server,
// the holder of the directory lease "meta/coordinator", gives every table
// without a live owner to a live metadata server. A table's lease runs out
// when its owner dies or is cut off (it can no longer renew); the
// coordinator then reassigns it with require_expired, so the directory
// refuses while the old owner may still serve reads. The new owner's
// header write fences any commit the old one still has in flight.

// coordinatorHold is how long the coordinator lease is taken for; it is
// renewed (or, by the other servers, asked for) every coordinatorRenew,
// while the coordinator looks for tables to reassign every
// coordinatorCheck: a table whose owner died waits for its lease to run
// out, and then for no more than that.
const (
	coordinatorHold  = 3 * time.Second
	coordinatorRenew = time.Second
	coordinatorCheck = 200 * time.Millisecond
)

type coordinatorState struct {
	mu       sync.Mutex
	epoch    uint64
	deadline time.Time
	asked    time.Time // when the lease was last taken or renewed
}

// holdCoordinator takes or renews the coordinator lease (at most every
// coordinatorRenew) and reports whether this server holds it.
func (s *Server) holdCoordinator(ctx context.Context) bool {
	c := &s.coord
	c.mu.Lock()
	defer c.mu.Unlock()
	sent := time.Now()
	if sent.Sub(c.asked) < coordinatorRenew {
		return c.epoch != 0 && sent.Before(c.deadline)
	}
	c.asked = sent
	ms := coordinatorHold.Milliseconds()
	if c.epoch != 0 && sent.Before(c.deadline) {
		if _, err := s.cfg.Directory.RenewLease(ctx, &dpb.RenewLeaseRequest{Name: coordinatorLease, HolderNode: s.cfg.Node, LeaseEpoch: c.epoch, DurationMs: ms}); err == nil {
			c.deadline = directory.HolderDeadline(sent, ms)
			return true
		}
		c.epoch = 0
	}
	l, err := s.cfg.Directory.GrantLease(ctx, &dpb.GrantLeaseRequest{Name: coordinatorLease, HolderNode: s.cfg.Node, HolderEpoch: s.cfg.NodeEpoch(), DurationMs: ms})
	if err != nil {
		return false
	}
	c.epoch, c.deadline = l.GetEpoch(), directory.HolderDeadline(sent, ms)
	s.log.Info("this server is the delegation coordinator", "lease_epoch", c.epoch)
	return true
}

// coordinate gives every table whose owner is gone to a live metadata
// server, the least loaded first.
func (s *Server) coordinate(ctx context.Context) {
	if !s.holdCoordinator(ctx) {
		return
	}
	dm, err := s.cfg.Directory.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{})
	if err != nil {
		return
	}
	nodes, err := s.peers.list(ctx, true)
	if err != nil {
		return
	}
	live := metaNodes(nodes)
	if len(live) == 0 {
		return
	}
	load := map[uint64]int{}
	for _, n := range live {
		load[n.GetId()] = 0
	}
	for _, d := range dm.GetDelegations() {
		if _, ok := load[d.GetOwnerNode()]; ok {
			load[d.GetOwnerNode()]++
		}
	}
	now := time.Now().UnixMilli()
	told := map[uint64]bool{}
	for _, d := range dm.GetDelegations() {
		_, ownerLive := load[d.GetOwnerNode()]
		if d.GetOwnerNode() != 0 && ownerLive && d.GetLeaseExpiryUnixMs() > now {
			continue
		}
		if d.GetOwnerNode() != 0 && d.GetLeaseExpiryUnixMs() > now {
			continue // not expired yet: the directory would refuse
		}
		target := leastLoaded(load, d.GetOwnerNode())
		nd, err := s.cfg.Directory.SetDelegation(ctx, &dpb.SetDelegationRequest{
			TableId: d.GetTableId(), FileSystem: d.GetFileSystem(), StartKey: d.GetStartKey(), EndKey: d.GetEndKey(),
			OwnerNode: target, LeaseDurationMs: s.cfg.LeaseDuration.Milliseconds(), ExpectedEpoch: d.GetEpoch(), RequireExpired: true,
		})
		if err != nil {
			s.log.Debug("reassigning a table", "table", d.GetTableId(), "err", err)
			continue
		}
		load[target]++
		s.log.Info("reassigned a table whose owner is gone", "table", d.GetTableId(), "fs", d.GetFileSystem(),
			"from", d.GetOwnerNode(), "to", target, "epoch", nd.GetEpoch())
		told[target] = true
	}
	for node := range told {
		s.tellFollow(ctx, node) // acquire now, not at the next map poll
	}
}

// leastLoaded picks the live server with the fewest tables, preferring
// not avoid (the owner that lost the table).
func leastLoaded(load map[uint64]int, avoid uint64) uint64 {
	ids := make([]uint64, 0, len(load))
	for id := range load {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	best := uint64(0)
	for _, id := range ids {
		if best == 0 || (id != avoid && (best == avoid || load[id] < load[best])) {
			best = id
		}
	}
	return best
}
