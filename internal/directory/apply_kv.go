package directory

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// held reports whether l is held at time now.
func held(l *pb.Lease, now int64) bool { return l != nil && l.HolderNode != 0 && now < l.ExpiryUnixMs }

func (a *applier) grantLease(req *pb.GrantLeaseRequest) *pb.CommandResult {
	if err := checkLeaseName(req.Name); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if err := checkLeaseDuration("duration_ms", req.DurationMs); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	n, res := a.usableNode("holder_node", req.HolderNode)
	if res != nil {
		return res
	}
	if req.HolderEpoch != n.Epoch {
		return failf(pb.ErrorCode_STALE_EPOCH, "node %d is at epoch %d, not %d", n.Id, n.Epoch, req.HolderEpoch)
	}
	old, exists := a.st.leases[req.Name]
	var l *pb.Lease
	switch {
	case held(old, a.now) && old.HolderNode == req.HolderNode && old.HolderEpoch == req.HolderEpoch:
		l = proto.Clone(old).(*pb.Lease)
		l.ExpiryUnixMs = max(old.ExpiryUnixMs, addMs(a.now, req.DurationMs))
	case held(old, a.now):
		return withPayload(failf(pb.ErrorCode_LEASE_HELD, "lease %q is held by node %d until %d", req.Name, old.HolderNode, old.ExpiryUnixMs), old)
	default:
		if !exists && len(a.st.leases) >= maxLeases {
			return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d leases, limit %d (maxLeases)", len(a.st.leases), maxLeases)
		}
		l = &pb.Lease{
			Name:          req.Name,
			HolderNode:    req.HolderNode,
			HolderEpoch:   req.HolderEpoch,
			Epoch:         1,
			GrantedUnixMs: a.now,
			ExpiryUnixMs:  addMs(a.now, req.DurationMs),
		}
		if exists {
			l.Epoch = old.Epoch + 1
		}
	}
	a.eff.set(leaseKey(l.Name), l)
	a.eff.then(func(s *state) { s.leases[l.Name] = l })
	return ok(l)
}

func (a *applier) renewLease(req *pb.RenewLeaseRequest) *pb.CommandResult {
	if err := checkLeaseName(req.Name); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if err := checkLeaseDuration("duration_ms", req.DurationMs); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.leases[req.Name]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "lease %q does not exist", req.Name)
	}
	if req.HolderNode == 0 || req.HolderNode != old.HolderNode || req.LeaseEpoch != old.Epoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "lease %q is at epoch %d held by node %d, not epoch %d by node %d",
			req.Name, old.Epoch, old.HolderNode, req.LeaseEpoch, req.HolderNode), old)
	}
	if !held(old, a.now) {
		return withPayload(failf(pb.ErrorCode_EXPIRED, "lease %q expired at %d", req.Name, old.ExpiryUnixMs), old)
	}
	// A later incarnation of the holder does not inherit the lease.
	n, res := a.usableNode("holder_node", req.HolderNode)
	if res != nil {
		return res
	}
	if n.Epoch != old.HolderEpoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "lease %q was granted to epoch %d of node %d, which is now at epoch %d",
			req.Name, old.HolderEpoch, n.Id, n.Epoch), old)
	}
	l := proto.Clone(old).(*pb.Lease)
	l.ExpiryUnixMs = max(old.ExpiryUnixMs, addMs(a.now, req.DurationMs))
	a.eff.set(leaseKey(l.Name), l)
	a.eff.then(func(s *state) { s.leases[l.Name] = l })
	return ok(l)
}

func (a *applier) releaseLease(req *pb.ReleaseLeaseRequest) *pb.CommandResult {
	if err := checkLeaseName(req.Name); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.leases[req.Name]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "lease %q does not exist", req.Name)
	}
	if old.HolderNode == 0 && (req.Force || req.LeaseEpoch == old.Epoch) {
		return ok(old) // already free: a retried release succeeds
	}
	if !req.Force && (req.HolderNode != old.HolderNode || req.LeaseEpoch != old.Epoch) {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "lease %q is at epoch %d held by node %d, not epoch %d by node %d",
			req.Name, old.Epoch, old.HolderNode, req.LeaseEpoch, req.HolderNode), old)
	}
	l := proto.Clone(old).(*pb.Lease)
	l.HolderNode, l.HolderEpoch = 0, 0
	l.ExpiryUnixMs = min(l.ExpiryUnixMs, a.now)
	a.eff.set(leaseKey(l.Name), l)
	a.eff.then(func(s *state) { s.leases[l.Name] = l })
	return ok(l)
}

func (a *applier) putConfig(req *pb.PutConfigRequest) *pb.CommandResult {
	if err := checkConfigKey(req.Key); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if err := checkConfigValue(req.Value); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.config[req.Key]
	if req.ExpectedVersion != nil {
		cur := uint64(0)
		if exists {
			cur = old.Version
		}
		if *req.ExpectedVersion != cur {
			r := failf(pb.ErrorCode_CONFLICT, "key %q is at version %d, not %d", req.Key, cur, *req.ExpectedVersion)
			if exists {
				return withPayload(r, old)
			}
			return r
		}
	}
	if !exists && len(a.st.config) >= maxConfigEntries {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d config entries, limit %d (maxConfigEntries)", len(a.st.config), maxConfigEntries)
	}
	e := &pb.ConfigEntry{Key: req.Key, Value: append([]byte(nil), req.Value...), Version: a.index, ModifiedUnixMs: a.now}
	a.eff.set(configKey(e.Key), e)
	a.eff.then(func(s *state) { s.config[e.Key] = e })
	return ok(e)
}

func (a *applier) deleteConfig(req *pb.DeleteConfigRequest) *pb.CommandResult {
	if err := checkConfigKey(req.Key); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.config[req.Key]
	cur := uint64(0)
	if exists {
		cur = old.Version
	}
	if req.ExpectedVersion != nil && *req.ExpectedVersion != cur {
		r := failf(pb.ErrorCode_CONFLICT, "key %q is at version %d, not %d", req.Key, cur, *req.ExpectedVersion)
		if exists {
			return withPayload(r, old)
		}
		return r
	}
	if !exists {
		return ok(uint64(0))
	}
	a.eff.del(configKey(req.Key))
	a.eff.then(func(s *state) { delete(s.config, req.Key) })
	return ok(a.index)
}
