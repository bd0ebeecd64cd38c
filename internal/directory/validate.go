package directory

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"unicode"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Field validators. Each returns a message naming the field and the limit it
// breaks; they are shared by Apply and the service (which refuses bad
// requests before proposing them).

func checkAddress(field, addr string, required bool) error {
	if addr == "" {
		if required {
			return fmt.Errorf("%s is required", field)
		}
		return nil
	}
	if len(addr) > maxAddressBytes {
		return fmt.Errorf("%s is %d bytes, limit %d (maxAddressBytes)", field, len(addr), maxAddressBytes)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is not host:port: %v", field, addr, err)
	}
	if host == "" {
		return fmt.Errorf("%s %q has no host", field, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%s %q has a bad port", field, addr)
	}
	return nil
}

// checkName validates a printable name: non-empty, at most limit bytes, no
// control characters.
func checkName(field, name string, limit int, limitName string) error {
	if name == "" {
		return fmt.Errorf("%s is required", field)
	}
	if len(name) > limit {
		return fmt.Errorf("%s is %d bytes, limit %d (%s)", field, len(name), limit, limitName)
	}
	if i := strings.IndexFunc(name, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%s %q has a control character at byte %d", field, name, i)
	}
	return nil
}

func checkClusterID(id string) error {
	if err := checkName("cluster_id", id, maxClusterIDBytes, "maxClusterIDBytes"); err != nil {
		return err
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("cluster_id %q: only letters, digits, '-', '_' and '.' are allowed", id)
		}
	}
	return nil
}

func checkTractSize(size uint64) error {
	if size < minTractSizeBytes || size > maxTractSizeBytes || size&(size-1) != 0 {
		return fmt.Errorf("tract_size_bytes %d: must be a power of two in [%d, %d]", size, minTractSizeBytes, maxTractSizeBytes)
	}
	return nil
}

func checkRegister(req *pb.RegisterRequest) error {
	if req.NodeId == 0 {
		return fmt.Errorf("node_id is required (0 is reserved)")
	}
	if err := checkAddress("address", req.Address, true); err != nil {
		return err
	}
	if err := checkAddress("http_address", req.HttpAddress, false); err != nil {
		return err
	}
	if len(req.FailureDomain) > maxFailureDomainBytes {
		return fmt.Errorf("failure_domain is %d bytes, limit %d (maxFailureDomainBytes)", len(req.FailureDomain), maxFailureDomainBytes)
	}
	if len(req.Disks) > maxDisksPerNode {
		return fmt.Errorf("%d disks, limit %d (maxDisksPerNode)", len(req.Disks), maxDisksPerNode)
	}
	paths := map[string]bool{}
	for i, d := range req.Disks {
		if err := checkName(fmt.Sprintf("disks[%d].path", i), d.Path, maxDiskPathBytes, "maxDiskPathBytes"); err != nil {
			return err
		}
		if paths[d.Path] {
			return fmt.Errorf("disks[%d].path %q is listed twice", i, d.Path)
		}
		paths[d.Path] = true
		if d.UsedBytes > d.CapacityBytes {
			return fmt.Errorf("disks[%d]: used_bytes %d exceeds capacity_bytes %d", i, d.UsedBytes, d.CapacityBytes)
		}
	}
	if len(req.Roles) > maxRolesPerNode {
		return fmt.Errorf("%d roles, limit %d (maxRolesPerNode)", len(req.Roles), maxRolesPerNode)
	}
	roles := map[string]bool{}
	for _, r := range req.Roles {
		if r == "" || len(r) > maxRoleBytes {
			return fmt.Errorf("role %q: must be 1 to %d bytes (maxRoleBytes)", r, maxRoleBytes)
		}
		for _, c := range r {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("role %q: only lower-case letters, digits and '-' are allowed", r)
			}
		}
		if roles[r] {
			return fmt.Errorf("role %q is listed twice", r)
		}
		roles[r] = true
	}
	return nil
}

func checkLeaseDuration(field string, ms int64) error {
	if ms < minLeaseDuration.Milliseconds() || ms > maxLeaseDuration.Milliseconds() {
		return fmt.Errorf("%s %d ms: must be in [%d, %d] ms (minLeaseDuration, maxLeaseDuration)",
			field, ms, minLeaseDuration.Milliseconds(), maxLeaseDuration.Milliseconds())
	}
	return nil
}

func checkLeaseName(name string) error {
	return checkName("name", name, maxLeaseNameBytes, "maxLeaseNameBytes")
}

func checkConfigKey(key string) error {
	return checkName("key", key, maxConfigKeyBytes, "maxConfigKeyBytes")
}

func checkConfigValue(v []byte) error {
	if len(v) > maxConfigValueBytes {
		return fmt.Errorf("value is %d bytes, limit %d (maxConfigValueBytes)", len(v), maxConfigValueBytes)
	}
	return nil
}

func checkFileSystemName(field, name string, limit int, limitName string) error {
	if err := checkName(field, name, limit, limitName); err != nil {
		return err
	}
	if strings.ContainsRune(name, '/') {
		return fmt.Errorf("%s %q contains '/'", field, name)
	}
	return nil
}

func checkGeometry(g *pb.ExtentGeometry) error {
	if g == nil {
		return fmt.Errorf("geometry is required")
	}
	p, b, e := uint64(g.PageSizeBytes), uint64(g.BlockSizeBytes), g.ExtentSizeBytes
	if p < minPageSizeBytes || p > maxPageSizeBytes || p&(p-1) != 0 {
		return fmt.Errorf("page_size_bytes %d: must be a power of two in [%d, %d]", p, minPageSizeBytes, maxPageSizeBytes)
	}
	if b < p || b > maxBlockSizeBytes || b%p != 0 {
		return fmt.Errorf("block_size_bytes %d: must be a multiple of the page size %d, at most %d (maxBlockSizeBytes)", b, p, maxBlockSizeBytes)
	}
	if e < b || e > maxExtentSizeBytes || e%b != 0 {
		return fmt.Errorf("extent_size_bytes %d: must be a multiple of the block size %d, at most %d (maxExtentSizeBytes)", e, b, uint64(maxExtentSizeBytes))
	}
	if g.Replication < 1 || g.Replication > maxExtentReplicas {
		return fmt.Errorf("replication %d: must be in [1, %d] (maxExtentReplicas)", g.Replication, maxExtentReplicas)
	}
	return nil
}

func checkTableRange(start, end []byte) error {
	if len(start) > maxTableKeyBytes || len(end) > maxTableKeyBytes {
		return fmt.Errorf("table keys are %d and %d bytes, limit %d (maxTableKeyBytes)", len(start), len(end), maxTableKeyBytes)
	}
	if len(end) > 0 && string(end) <= string(start) {
		return fmt.Errorf("empty key range [%q, %q)", start, end)
	}
	return nil
}

func checkLoad(load float64) error {
	if math.IsNaN(load) || math.IsInf(load, 0) || load < 0 {
		return fmt.Errorf("load %v: must be a finite non-negative number", load)
	}
	return nil
}

// checkStateless validates everything about a command that does not depend
// on the directory's state. Apply runs it first; the service runs it before
// proposing, so a malformed request never reaches the log.
func checkRenewal(r *pb.RenewDelegationRequest) error {
	if r.GetTableId() == 0 || r.GetOwnerNode() == 0 {
		return fmt.Errorf("table_id and owner_node are required")
	}
	return checkLeaseDuration("lease_duration_ms", r.GetLeaseDurationMs())
}

func checkStateless(cmd *pb.Command) error {
	if len(cmd.RequestId) > maxRequestIDBytes {
		return fmt.Errorf("request id of %d bytes exceeds %d", len(cmd.RequestId), maxRequestIDBytes)
	}
	switch op := cmd.Op.(type) {
	case *pb.Command_InitCluster:
		if err := checkClusterID(op.InitCluster.ClusterId); err != nil {
			return err
		}
		return checkTractSize(op.InitCluster.TractSizeBytes)
	case *pb.Command_RegisterNode:
		return checkRegister(op.RegisterNode)
	case *pb.Command_SetNodeState:
		r := op.SetNodeState
		if r.NodeId == 0 || r.Epoch == 0 {
			return fmt.Errorf("node_id and epoch are required")
		}
	case *pb.Command_DecommissionNode:
		if op.DecommissionNode.NodeId == 0 {
			return fmt.Errorf("node_id is required")
		}
	case *pb.Command_UpdateMemberStats:
		if n := len(op.UpdateMemberStats.Stats); n == 0 || n > maxNodes {
			return fmt.Errorf("%d stats: must be 1 to %d (maxNodes)", n, maxNodes)
		}
	case *pb.Command_InstallTlt:
		r := op.InstallTlt
		if r.Replication < 1 || r.Replication > maxReplication {
			return fmt.Errorf("replication %d: must be in [1, %d] (maxReplication)", r.Replication, maxReplication)
		}
		if len(r.Rows) == 0 || len(r.Rows) > maxTLTRows {
			return fmt.Errorf("%d rows: must be 1 to %d (maxTLTRows)", len(r.Rows), maxTLTRows)
		}
		for i, row := range r.Rows {
			if err := checkRowShape(r.Replication, row.Slots, row.Pending); err != nil {
				return fmt.Errorf("row %d: %w", i, err)
			}
		}
	case *pb.Command_UpdateTltRows:
		if n := len(op.UpdateTltRows.Updates); n == 0 || n > maxRowUpdates {
			return fmt.Errorf("%d row updates: must be 1 to %d (maxRowUpdates)", n, maxRowUpdates)
		}
		for _, u := range op.UpdateTltRows.Updates {
			if err := checkRowShape(uint32(len(u.Slots)), u.Slots, u.Pending); err != nil {
				return fmt.Errorf("row %d: %w", u.Row, err)
			}
		}
	case *pb.Command_CreateExtent:
		r := op.CreateExtent
		if err := checkGeometry(r.Geometry); err != nil {
			return err
		}
		if len(r.Replicas) != int(r.Geometry.Replication) {
			return fmt.Errorf("%d replicas for replication %d", len(r.Replicas), r.Geometry.Replication)
		}
		return checkReplicaList(r.Replicas)
	case *pb.Command_ChangeExtentReplicas:
		if op.ChangeExtentReplicas.ExtentId == 0 {
			return fmt.Errorf("extent_id is required")
		}
		return checkReplicaList(op.ChangeExtentReplicas.Replicas)
	case *pb.Command_SetDelegation:
		r := op.SetDelegation
		if err := checkTableRange(r.StartKey, r.EndKey); err != nil {
			return err
		}
		if r.FileSystem == 0 {
			return fmt.Errorf("file_system is required")
		}
		if r.TableId == 0 && r.ExpectedEpoch != 0 {
			return fmt.Errorf("a new table (table_id 0) has no expected_epoch")
		}
		if r.OwnerNode == 0 {
			if r.LeaseDurationMs != 0 {
				return fmt.Errorf("an unassigned table has no lease (lease_duration_ms %d)", r.LeaseDurationMs)
			}
			return nil
		}
		return checkLeaseDuration("lease_duration_ms", r.LeaseDurationMs)
	case *pb.Command_RenewDelegation:
		return checkRenewal(op.RenewDelegation)
	case *pb.Command_RenewDelegations:
		rs := op.RenewDelegations.GetRenewals()
		if len(rs) == 0 || len(rs) > maxRenewals {
			return fmt.Errorf("%d renewals: between 1 and %d are allowed", len(rs), maxRenewals)
		}
		for i, r := range rs {
			if err := checkRenewal(r); err != nil {
				return fmt.Errorf("renewal %d (table %d): %w", i, r.GetTableId(), err)
			}
		}
	case *pb.Command_DeleteDelegation:
		if op.DeleteDelegation.TableId == 0 {
			return fmt.Errorf("table_id is required")
		}
	case *pb.Command_SplitDelegation:
		r := op.SplitDelegation
		if r.TableId == 0 || len(r.SplitKey) == 0 {
			return fmt.Errorf("table_id and split_key are required")
		}
		if len(r.SplitKey) > maxTableKeyBytes {
			return fmt.Errorf("split_key of %d bytes, limit %d (maxTableKeyBytes)", len(r.SplitKey), maxTableKeyBytes)
		}
	case *pb.Command_CreateFileSystem:
		return checkFileSystemName("name", op.CreateFileSystem.Name, MaxFileSystemNameBytes, "maxFileSystemNameBytes")
	case *pb.Command_DeleteFileSystem:
		if op.DeleteFileSystem.Number == 0 {
			return fmt.Errorf("number is required")
		}
	case *pb.Command_CreateSnapshot:
		if op.CreateSnapshot.FileSystem == 0 {
			return fmt.Errorf("file_system is required")
		}
		return checkFileSystemName("name", op.CreateSnapshot.Name, maxSnapshotNameBytes, "maxSnapshotNameBytes")
	case *pb.Command_DeleteSnapshot:
		if op.DeleteSnapshot.FileSystem == 0 || op.DeleteSnapshot.Snapshot == 0 {
			return fmt.Errorf("file_system and snapshot are required")
		}
	case *pb.Command_GrantLease:
		r := op.GrantLease
		if err := checkLeaseName(r.Name); err != nil {
			return err
		}
		if r.HolderNode == 0 || r.HolderEpoch == 0 {
			return fmt.Errorf("holder_node and holder_epoch are required")
		}
		return checkLeaseDuration("duration_ms", r.DurationMs)
	case *pb.Command_RenewLease:
		r := op.RenewLease
		if err := checkLeaseName(r.Name); err != nil {
			return err
		}
		if r.HolderNode == 0 || r.LeaseEpoch == 0 {
			return fmt.Errorf("holder_node and lease_epoch are required")
		}
		return checkLeaseDuration("duration_ms", r.DurationMs)
	case *pb.Command_ReleaseLease:
		r := op.ReleaseLease
		if err := checkLeaseName(r.Name); err != nil {
			return err
		}
		if !r.Force && (r.HolderNode == 0 || r.LeaseEpoch == 0) {
			return fmt.Errorf("holder_node and lease_epoch are required unless force is set")
		}
	case *pb.Command_PutConfig:
		if err := checkConfigKey(op.PutConfig.Key); err != nil {
			return err
		}
		return checkConfigValue(op.PutConfig.Value)
	case *pb.Command_DeleteConfig:
		return checkConfigKey(op.DeleteConfig.Key)
	default:
		return fmt.Errorf("unknown operation %T", op)
	}
	return nil
}

// checkRowShape checks a TLT row's structure for replication k.
func checkRowShape(k uint32, slots []*pb.TractServer, pending []*pb.PendingEntry) error {
	if k < 1 || k > maxReplication || len(slots) != int(k) {
		return fmt.Errorf("%d slots, replication %d (maxReplication %d)", len(slots), k, maxReplication)
	}
	if len(pending) > int(k) {
		return fmt.Errorf("%d pending entries, at most one per slot", len(pending))
	}
	for i, ts := range slots {
		if ts == nil || ts.NodeId == 0 {
			return fmt.Errorf("slot %d has no tractserver", i)
		}
	}
	for i, p := range pending {
		if p.Server == nil || p.Server.NodeId == 0 {
			return fmt.Errorf("pending[%d] has no tractserver", i)
		}
		if p.Slot >= k {
			return fmt.Errorf("pending[%d] names slot %d of %d", i, p.Slot, k)
		}
	}
	return nil
}

func checkReplicaList(replicas []uint64) error {
	if len(replicas) == 0 || len(replicas) > maxExtentReplicas {
		return fmt.Errorf("%d replicas: must be 1 to %d (maxExtentReplicas)", len(replicas), maxExtentReplicas)
	}
	seen := map[uint64]bool{}
	for _, id := range replicas {
		if id == 0 || seen[id] {
			return fmt.Errorf("replica node %d is zero or listed twice", id)
		}
		seen[id] = true
	}
	return nil
}
