package directory

import (
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

func (a *applier) initCluster(req *pb.InitClusterRequest) *pb.CommandResult {
	if err := checkClusterID(req.ClusterId); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if err := checkTractSize(req.TractSizeBytes); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if c := a.st.cluster; c != nil {
		if c.ClusterId != req.ClusterId {
			return withPayload(failf(pb.ErrorCode_CONFLICT, "cluster is already initialised as %q", c.ClusterId), c)
		}
		if c.TractSizeBytes != req.TractSizeBytes {
			return withPayload(failf(pb.ErrorCode_CONFLICT, "cluster %q has tract size %d, not %d",
				c.ClusterId, c.TractSizeBytes, req.TractSizeBytes), c)
		}
		return ok(c)
	}
	c := &pb.ClusterInfo{ClusterId: req.ClusterId, TractSizeBytes: req.TractSizeBytes, CreatedUnixMs: a.now}
	a.eff.set(keyCluster, c)
	a.eff.then(func(s *state) { s.cluster = c })
	return ok(c)
}

// usableNode returns the node if it may be given authority (a lease, a
// replica, a table): registered, neither dead nor decommissioned.
func (a *applier) usableNode(field string, id uint64) (*pb.Node, *pb.CommandResult) {
	n, found := a.st.nodes[id]
	if !found {
		return nil, failf(pb.ErrorCode_UNKNOWN_NODE, "%s: node %d is not registered", field, id)
	}
	switch n.State {
	case pb.NodeState_NODE_STATE_DECOMMISSIONED:
		return nil, failf(pb.ErrorCode_DECOMMISSIONED, "%s: node %d is decommissioned", field, id)
	case pb.NodeState_NODE_STATE_DEAD:
		return nil, failf(pb.ErrorCode_NODE_DEAD, "%s: node %d is dead and must register again", field, id)
	}
	return n, nil
}

func (a *applier) registerNode(req *pb.RegisterRequest) *pb.CommandResult {
	if err := checkRegister(req); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.nodes[req.NodeId]
	if exists && old.State == pb.NodeState_NODE_STATE_DECOMMISSIONED {
		return withPayload(failf(pb.ErrorCode_DECOMMISSIONED, "node %d is decommissioned and cannot register again", req.NodeId), old)
	}
	if !exists && len(a.st.nodes) >= maxNodes {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d nodes registered, limit %d (maxNodes)", len(a.st.nodes), maxNodes)
	}
	// Two live nodes claiming one address is a misconfiguration that would
	// send one node's traffic to the other.
	for _, id := range sortedKeys(a.st.nodes) {
		n := a.st.nodes[id]
		if id != req.NodeId && n.Address == req.Address &&
			(n.State == pb.NodeState_NODE_STATE_ALIVE || n.State == pb.NodeState_NODE_STATE_SUSPECT) {
			return failf(pb.ErrorCode_CONFLICT, "address %s is used by live node %d", req.Address, id)
		}
	}
	n := &pb.Node{
		Id:                  req.NodeId,
		Address:             req.Address,
		HttpAddress:         req.HttpAddress,
		FailureDomain:       req.FailureDomain,
		Disks:               cloneDisks(req.Disks),
		Roles:               slices.Clone(req.Roles),
		State:               pb.NodeState_NODE_STATE_ALIVE,
		Epoch:               1,
		RegisteredUnixMs:    a.now,
		LastHeartbeatUnixMs: a.now,
		StateChangedUnixMs:  a.now,
	}
	if exists {
		n.Epoch = old.Epoch + 1
	}
	a.eff.set(nodeKey(n.Id), n)
	a.eff.then(func(s *state) { s.nodes[n.Id] = n })
	return ok(n)
}

func cloneDisks(ds []*pb.Disk) []*pb.Disk {
	out := make([]*pb.Disk, len(ds))
	for i, d := range ds {
		out[i] = proto.Clone(d).(*pb.Disk)
	}
	return out
}

// setNodeState carries out a failure detector verdict on one incarnation.
// Allowed: ALIVE <-> SUSPECT, ALIVE/SUSPECT -> DEAD. Only registration
// leaves DEAD; nothing leaves DECOMMISSIONED.
func (a *applier) setNodeState(req *pb.SetNodeState) *pb.CommandResult {
	switch req.State {
	case pb.NodeState_NODE_STATE_ALIVE, pb.NodeState_NODE_STATE_SUSPECT, pb.NodeState_NODE_STATE_DEAD:
	default:
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "state %v cannot be set by the failure detector", req.State)
	}
	if req.LastHeartbeatUnixMs < 0 || req.LastHeartbeatUnixMs > maxUnixMs {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "last_heartbeat_unix_ms %d out of range", req.LastHeartbeatUnixMs)
	}
	old, exists := a.st.nodes[req.NodeId]
	if !exists {
		return failf(pb.ErrorCode_UNKNOWN_NODE, "node %d is not registered", req.NodeId)
	}
	if req.Epoch != old.Epoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "node %d is at epoch %d, not %d", req.NodeId, old.Epoch, req.Epoch), old)
	}
	switch {
	case old.State == pb.NodeState_NODE_STATE_DECOMMISSIONED:
		return withPayload(failf(pb.ErrorCode_DECOMMISSIONED, "node %d is decommissioned", req.NodeId), old)
	case old.State == req.State:
		return ok(old)
	case old.State == pb.NodeState_NODE_STATE_DEAD:
		return withPayload(failf(pb.ErrorCode_NODE_DEAD, "node %d is dead and must register again", req.NodeId), old)
	}
	n := proto.Clone(old).(*pb.Node)
	n.State = req.State
	n.LastHeartbeatUnixMs = max(n.LastHeartbeatUnixMs, req.LastHeartbeatUnixMs)
	n.StateChangedUnixMs = a.now
	a.eff.set(nodeKey(n.Id), n)
	a.eff.then(func(s *state) { s.nodes[n.Id] = n })
	return ok(n)
}

func (a *applier) decommissionNode(req *pb.DecommissionRequest) *pb.CommandResult {
	old, exists := a.st.nodes[req.NodeId]
	if !exists {
		return failf(pb.ErrorCode_UNKNOWN_NODE, "node %d is not registered", req.NodeId)
	}
	if old.State == pb.NodeState_NODE_STATE_DECOMMISSIONED {
		return ok(old)
	}
	n := proto.Clone(old).(*pb.Node)
	n.State = pb.NodeState_NODE_STATE_DECOMMISSIONED
	n.StateChangedUnixMs = a.now
	a.eff.set(nodeKey(n.Id), n)
	a.eff.then(func(s *state) { s.nodes[n.Id] = n })
	return ok(n)
}

func (a *applier) updateMemberStats(req *pb.UpdateMemberStats) *pb.CommandResult {
	if len(req.Stats) == 0 || len(req.Stats) > maxNodes {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%d stats: must be 1 to %d (maxNodes)", len(req.Stats), maxNodes)
	}
	seen := map[uint64]bool{}
	for _, st := range req.Stats {
		if _, exists := a.st.nodes[st.NodeId]; !exists {
			return failf(pb.ErrorCode_UNKNOWN_NODE, "stats of node %d, which is not registered", st.NodeId)
		}
		if seen[st.NodeId] {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "stats of node %d are listed twice", st.NodeId)
		}
		seen[st.NodeId] = true
		if err := checkLoad(st.Load); err != nil {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "node %d: %v", st.NodeId, err)
		}
		if st.FreeBytes > st.CapacityBytes {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "node %d: free_bytes %d exceeds capacity_bytes %d", st.NodeId, st.FreeBytes, st.CapacityBytes)
		}
	}
	for _, in := range req.Stats {
		st := proto.Clone(in).(*pb.MemberStats)
		st.UpdatedUnixMs = a.now
		a.eff.set(statsKey(st.NodeId), st)
		a.eff.then(func(s *state) { s.stats[st.NodeId] = st })
	}
	return ok(nil)
}
