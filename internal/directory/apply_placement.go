package directory

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// checkTLTRow validates one row's slots and pending entries against the
// registered nodes. Failure-domain spreading is the table builder's policy
// (FDS §3.3.1), not checked here, so a one-machine development cluster
// works.
func (a *applier) checkTLTRow(field string, k uint32, slots []*pb.TractServer, pending []*pb.PendingEntry) *pb.CommandResult {
	if len(slots) != int(k) {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: %d slots, replication is %d", field, len(slots), k)
	}
	if len(pending) > int(k) {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: %d pending entries, at most one per slot", field, len(pending))
	}
	seen := map[[2]uint64]bool{}
	checkServer := func(what string, ts *pb.TractServer) *pb.CommandResult {
		if ts == nil {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: %s is empty", field, what)
		}
		n, exists := a.st.nodes[ts.NodeId]
		if !exists {
			return failf(pb.ErrorCode_UNKNOWN_NODE, "%s: %s: node %d is not registered", field, what, ts.NodeId)
		}
		if n.State == pb.NodeState_NODE_STATE_DECOMMISSIONED {
			return failf(pb.ErrorCode_DECOMMISSIONED, "%s: %s: node %d is decommissioned", field, what, ts.NodeId)
		}
		if int(ts.DiskIndex) >= len(n.Disks) {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: %s: node %d has %d disks, no disk %d", field, what, ts.NodeId, len(n.Disks), ts.DiskIndex)
		}
		key := [2]uint64{ts.NodeId, uint64(ts.DiskIndex)}
		if seen[key] {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: tractserver %d/%d appears twice", field, ts.NodeId, ts.DiskIndex)
		}
		seen[key] = true
		return nil
	}
	for i, ts := range slots {
		if r := checkServer(fmt.Sprintf("slot %d", i), ts); r != nil {
			return r
		}
	}
	pendingSlots := map[uint32]bool{}
	for i, p := range pending {
		if p.Slot >= k {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: pending[%d] names slot %d of %d", field, i, p.Slot, k)
		}
		if pendingSlots[p.Slot] {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%s: slot %d has two pending entries", field, p.Slot)
		}
		pendingSlots[p.Slot] = true
		if r := checkServer(fmt.Sprintf("pending[%d]", i), p.Server); r != nil {
			return r
		}
	}
	return nil
}

func (a *applier) installTLT(req *pb.InstallTLTRequest) *pb.CommandResult {
	if a.st.cluster == nil {
		return failf(pb.ErrorCode_NOT_INITIALIZED, "the cluster is not initialised")
	}
	cur := uint64(0)
	if a.st.tlt != nil {
		cur = a.st.tlt.Version
	}
	if req.ExpectedVersion != cur {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "TLT is at version %d, not %d", cur, req.ExpectedVersion), &pb.TLTVersion{Version: cur})
	}
	if req.Replication < 1 || req.Replication > maxReplication {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "replication %d: must be in [1, %d] (maxReplication)", req.Replication, maxReplication)
	}
	if len(req.Rows) == 0 || len(req.Rows) > maxTLTRows {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%d rows: must be 1 to %d (maxTLTRows)", len(req.Rows), maxTLTRows)
	}
	for i, r := range req.Rows {
		if res := a.checkTLTRow(fmt.Sprintf("row %d", i), req.Replication, r.Slots, r.Pending); res != nil {
			return res
		}
	}
	version := cur + 1
	header := &pb.TLT{Version: version, TractSizeBytes: a.st.cluster.TractSizeBytes, Replication: req.Replication}
	rows := make([]*pb.TLTRow, len(req.Rows))
	a.eff.delRange(prefixTLTRow, prefixEnd(prefixTLTRow))
	for i, r := range req.Rows {
		rows[i] = &pb.TLTRow{Version: version, Slots: r.Slots, Pending: r.Pending}
		rows[i] = proto.Clone(rows[i]).(*pb.TLTRow)
		a.eff.set(tltRowKey(uint32(i)), rows[i])
	}
	a.eff.set(keyTLTHeader, header)
	a.eff.then(func(s *state) { s.tlt, s.tltRows = header, rows })
	return ok(&pb.TLTVersion{Version: version})
}

func (a *applier) updateTLTRows(req *pb.UpdateTLTRowsRequest) *pb.CommandResult {
	if a.st.tlt == nil {
		return failf(pb.ErrorCode_NOT_FOUND, "no TLT is installed")
	}
	if len(req.Updates) == 0 || len(req.Updates) > maxRowUpdates {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%d row updates: must be 1 to %d (maxRowUpdates)", len(req.Updates), maxRowUpdates)
	}
	seen := map[uint32]bool{}
	for i, u := range req.Updates {
		if int(u.Row) >= len(a.st.tltRows) {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "updates[%d]: row %d of %d", i, u.Row, len(a.st.tltRows))
		}
		if seen[u.Row] {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "row %d is updated twice", u.Row)
		}
		seen[u.Row] = true
		if cur := a.st.tltRows[u.Row].Version; cur != u.ExpectedVersion {
			return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "row %d is at version %d, not %d", u.Row, cur, u.ExpectedVersion),
				&pb.TLTVersion{Version: a.st.tlt.Version})
		}
		if res := a.checkTLTRow(fmt.Sprintf("row %d", u.Row), a.st.tlt.Replication, u.Slots, u.Pending); res != nil {
			return res
		}
	}
	version := a.st.tlt.Version + 1
	header := proto.Clone(a.st.tlt).(*pb.TLT)
	header.Version = version
	a.eff.set(keyTLTHeader, header)
	changed := map[uint32]*pb.TLTRow{}
	for _, u := range req.Updates {
		row := proto.Clone(&pb.TLTRow{Version: version, Slots: u.Slots, Pending: u.Pending}).(*pb.TLTRow)
		changed[u.Row] = row
		a.eff.set(tltRowKey(u.Row), row)
	}
	a.eff.then(func(s *state) {
		rows := append([]*pb.TLTRow(nil), s.tltRows...)
		for i, r := range changed {
			rows[i] = r
		}
		s.tlt, s.tltRows = header, rows
	})
	return ok(&pb.TLTVersion{Version: version})
}

func (a *applier) checkReplicas(replicas []uint64) *pb.CommandResult {
	if len(replicas) == 0 || len(replicas) > maxExtentReplicas {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%d replicas: must be 1 to %d (maxExtentReplicas)", len(replicas), maxExtentReplicas)
	}
	seen := map[uint64]bool{}
	for i, id := range replicas {
		if seen[id] {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "replica node %d is listed twice", id)
		}
		seen[id] = true
		if _, res := a.usableNode(fmt.Sprintf("replicas[%d]", i), id); res != nil {
			return res
		}
	}
	return nil
}

func (a *applier) createExtent(req *pb.CreateExtentRequest) *pb.CommandResult {
	if err := checkGeometry(req.Geometry); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if len(req.Replicas) != int(req.Geometry.Replication) {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%d replicas for replication %d", len(req.Replicas), req.Geometry.Replication)
	}
	if res := a.checkReplicas(req.Replicas); res != nil {
		return res
	}
	if len(a.st.extents) >= maxExtents {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d extents, limit %d (maxExtents)", len(a.st.extents), maxExtents)
	}
	c := a.counters()
	id := max(c.NextExtentId, firstExtentID)
	c.NextExtentId = id + 1
	e := &pb.Extent{
		ExtentId:      id,
		Geometry:      proto.Clone(req.Geometry).(*pb.ExtentGeometry),
		Replicas:      append([]uint64(nil), req.Replicas...),
		Epoch:         1,
		CreatedUnixMs: a.now,
	}
	a.setCounters(c)
	a.eff.set(extentKey(id), e)
	a.eff.then(func(s *state) { s.extents[id] = e })
	return ok(e)
}

func (a *applier) changeExtentReplicas(req *pb.ChangeExtentReplicasRequest) *pb.CommandResult {
	old, exists := a.st.extents[req.ExtentId]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "extent %d does not exist", req.ExtentId)
	}
	if req.ExpectedEpoch != old.Epoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "extent %d is at epoch %d, not %d", req.ExtentId, old.Epoch, req.ExpectedEpoch), old)
	}
	if res := a.checkReplicas(req.Replicas); res != nil {
		return res
	}
	e := proto.Clone(old).(*pb.Extent)
	e.Replicas = append([]uint64(nil), req.Replicas...)
	e.Epoch++
	a.eff.set(extentKey(e.ExtentId), e)
	a.eff.then(func(s *state) { s.extents[e.ExtentId] = e })
	return ok(e)
}

// setDelegationVersion records that the delegation map changed at this index.
func (a *applier) setDelegationVersion() {
	c := a.counters()
	c.DelegationMapVersion = a.index
	a.setCounters(c)
}

func (a *applier) checkOwner(owner uint64, leaseMs int64) *pb.CommandResult {
	if owner == 0 {
		if leaseMs != 0 {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "an unassigned table has no lease (lease_duration_ms %d)", leaseMs)
		}
		return nil
	}
	if _, res := a.usableNode("owner_node", owner); res != nil {
		return res
	}
	if err := checkLeaseDuration("lease_duration_ms", leaseMs); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	return nil
}

// setDelegation creates or reassigns a table. Reassignment does not wait
// for the old owner's lease: safety comes from the epoch, which the new
// owner writes into the table header and which fences the old owner's
// transactions (DESIGN.md §2.6).
func (a *applier) setDelegation(req *pb.SetDelegationRequest) *pb.CommandResult {
	if err := checkTableRange(req.StartKey, req.EndKey); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if res := a.checkOwner(req.OwnerNode, req.LeaseDurationMs); res != nil {
		return res
	}
	if _, exists := a.st.fileSystems[req.FileSystem]; !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "file system %d does not exist", req.FileSystem)
	}
	d := &pb.Delegation{
		TableId:    req.TableId,
		FileSystem: req.FileSystem,
		StartKey:   append([]byte(nil), req.StartKey...),
		EndKey:     append([]byte(nil), req.EndKey...),
		OwnerNode:  req.OwnerNode,
	}
	if req.OwnerNode != 0 {
		d.LeaseExpiryUnixMs = addMs(a.now, req.LeaseDurationMs)
	}
	c := a.counters()
	if req.TableId == 0 {
		if req.ExpectedEpoch != 0 {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "a new table (table_id 0) has no expected_epoch")
		}
		if len(a.st.delegations) >= maxDelegations {
			return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d tables, limit %d (maxDelegations)", len(a.st.delegations), maxDelegations)
		}
		d.TableId = max(c.NextTableId, 1)
		d.Epoch = 1
		c.NextTableId = d.TableId + 1
	} else {
		old, exists := a.st.delegations[req.TableId]
		if !exists {
			return failf(pb.ErrorCode_NOT_FOUND, "table %d does not exist", req.TableId)
		}
		if req.ExpectedEpoch != old.Epoch {
			return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "table %d is at epoch %d, not %d", req.TableId, old.Epoch, req.ExpectedEpoch), old)
		}
		if req.FileSystem != old.FileSystem {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "table %d belongs to file system %d, not %d", req.TableId, old.FileSystem, req.FileSystem)
		}
		if req.RequireExpired && old.OwnerNode != 0 && old.OwnerNode != req.OwnerNode && a.now < old.LeaseExpiryUnixMs {
			return withPayload(failf(pb.ErrorCode_CONFLICT, "table %d is leased to node %d until %d", req.TableId, old.OwnerNode, old.LeaseExpiryUnixMs), old)
		}
		d.Epoch = old.Epoch + 1
	}
	for _, id := range sortedKeys(a.st.delegations) {
		o := a.st.delegations[id]
		if id != d.TableId && o.FileSystem == d.FileSystem && rangesOverlap(o.StartKey, o.EndKey, d.StartKey, d.EndKey) {
			return withPayload(failf(pb.ErrorCode_CONFLICT, "key range overlaps table %d", id), o)
		}
	}
	c.DelegationMapVersion = a.index
	a.setCounters(c)
	a.eff.set(delegationKey(d.TableId), d)
	a.eff.then(func(s *state) { s.delegations[d.TableId] = d })
	return ok(d)
}

func (a *applier) renewDelegation(req *pb.RenewDelegationRequest) *pb.CommandResult {
	old, exists := a.st.delegations[req.TableId]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "table %d does not exist", req.TableId)
	}
	if req.Epoch != old.Epoch || req.OwnerNode == 0 || req.OwnerNode != old.OwnerNode {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "table %d is owned by node %d at epoch %d, not node %d at epoch %d",
			req.TableId, old.OwnerNode, old.Epoch, req.OwnerNode, req.Epoch), old)
	}
	if err := checkLeaseDuration("lease_duration_ms", req.LeaseDurationMs); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if _, res := a.usableNode("owner_node", req.OwnerNode); res != nil {
		return res
	}
	if a.now >= old.LeaseExpiryUnixMs {
		return withPayload(failf(pb.ErrorCode_EXPIRED, "the lease on table %d expired at %d", req.TableId, old.LeaseExpiryUnixMs), old)
	}
	d := proto.Clone(old).(*pb.Delegation)
	d.LeaseExpiryUnixMs = max(old.LeaseExpiryUnixMs, addMs(a.now, req.LeaseDurationMs))
	a.setDelegationVersion()
	a.eff.set(delegationKey(d.TableId), d)
	a.eff.then(func(s *state) { s.delegations[d.TableId] = d })
	return ok(d)
}

// renewDelegations renews each lease as renewDelegation would; the
// command succeeds, and each renewal that fails changes nothing (its
// handler records effects only once every check passed).
func (a *applier) renewDelegations(req *pb.RenewDelegationsRequest) *pb.CommandResult {
	out := &pb.RenewDelegationsResponse{Results: make([]*pb.CommandResult, len(req.GetRenewals()))}
	for i, r := range req.GetRenewals() {
		out.Results[i] = a.renewDelegation(r)
	}
	return ok(out)
}

func (a *applier) deleteDelegation(req *pb.DeleteDelegationRequest) *pb.CommandResult {
	old, exists := a.st.delegations[req.TableId]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "table %d does not exist", req.TableId)
	}
	if req.ExpectedEpoch != old.Epoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "table %d is at epoch %d, not %d", req.TableId, old.Epoch, req.ExpectedEpoch), old)
	}
	a.setDelegationVersion()
	a.eff.del(delegationKey(req.TableId))
	a.eff.then(func(s *state) { delete(s.delegations, req.TableId) })
	return ok(a.index)
}

// splitDelegation cuts a table in two at split_key: the left part keeps the
// table id at a new epoch (fencing what the owner did under the old one),
// the right part is a new table with the same owner and lease.
func (a *applier) splitDelegation(req *pb.SplitDelegationRequest) *pb.CommandResult {
	old, exists := a.st.delegations[req.TableId]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "table %d does not exist", req.TableId)
	}
	if req.ExpectedEpoch != old.Epoch {
		return withPayload(failf(pb.ErrorCode_STALE_EPOCH, "table %d is at epoch %d, not %d", req.TableId, old.Epoch, req.ExpectedEpoch), old)
	}
	if bytes.Compare(req.SplitKey, old.StartKey) <= 0 || (len(old.EndKey) > 0 && bytes.Compare(req.SplitKey, old.EndKey) >= 0) {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "split key %x is not inside table %d's range [%x, %x)", req.SplitKey, req.TableId, old.StartKey, old.EndKey)
	}
	if len(a.st.delegations) >= maxDelegations {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d tables, limit %d (maxDelegations)", len(a.st.delegations), maxDelegations)
	}
	c := a.counters()
	left := proto.Clone(old).(*pb.Delegation)
	left.EndKey = append([]byte(nil), req.SplitKey...)
	left.Epoch++
	right := proto.Clone(old).(*pb.Delegation)
	right.TableId = max(c.NextTableId, 1)
	right.StartKey = append([]byte(nil), req.SplitKey...)
	right.Epoch = 1
	c.NextTableId = right.TableId + 1
	c.DelegationMapVersion = a.index
	a.setCounters(c)
	a.eff.set(delegationKey(left.TableId), left)
	a.eff.set(delegationKey(right.TableId), right)
	a.eff.then(func(s *state) {
		s.delegations[left.TableId] = left
		s.delegations[right.TableId] = right
	})
	return ok(&pb.DelegationPair{Left: left, Right: right})
}
