package directory

import (
	"fmt"
	"strings"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Stable, compact text forms of the directory's messages for golden test
// output (prototext deliberately varies its spacing).

func fmtNode(n *pb.Node) string {
	var disks []string
	for _, d := range n.Disks {
		disks = append(disks, fmt.Sprintf("%s:%d/%d", d.Path, d.UsedBytes, d.CapacityBytes))
	}
	s := fmt.Sprintf("node %d epoch=%d %s addr=%s", n.Id, n.Epoch, stateName(n.State), n.Address)
	if n.HttpAddress != "" {
		s += " http=" + n.HttpAddress
	}
	if n.FailureDomain != "" {
		s += " domain=" + n.FailureDomain
	}
	if len(disks) > 0 {
		s += " disks=[" + strings.Join(disks, " ") + "]"
	}
	if len(n.Roles) > 0 {
		s += " roles=" + strings.Join(n.Roles, ",")
	}
	return s + fmt.Sprintf(" registered=%d hb=%d changed=%d", n.RegisteredUnixMs, n.LastHeartbeatUnixMs, n.StateChangedUnixMs)
}

func fmtTS(ts *pb.TractServer) string { return fmt.Sprintf("%d/%d", ts.NodeId, ts.DiskIndex) }

func fmtRow(r *pb.TLTRow) string {
	var parts []string
	for _, ts := range r.Slots {
		parts = append(parts, fmtTS(ts))
	}
	s := fmt.Sprintf("v%d %s", r.Version, strings.Join(parts, " "))
	for _, p := range r.Pending {
		s += fmt.Sprintf(" pending[%d]=%s", p.Slot, fmtTS(p.Server))
	}
	return s
}

func fmtExtent(e *pb.Extent) string {
	g := e.Geometry
	return fmt.Sprintf("extent %d epoch=%d page=%d block=%d size=%d repl=%d replicas=%v created=%d",
		e.ExtentId, e.Epoch, g.PageSizeBytes, g.BlockSizeBytes, g.ExtentSizeBytes, g.Replication, e.Replicas, e.CreatedUnixMs)
}

func fmtDelegation(d *pb.Delegation) string {
	return fmt.Sprintf("table %d fs=%d [%q, %q) owner=%d expiry=%d epoch=%d",
		d.TableId, d.FileSystem, d.StartKey, d.EndKey, d.OwnerNode, d.LeaseExpiryUnixMs, d.Epoch)
}

func fmtFileSystem(f *pb.FileSystem) string {
	var snaps []string
	for _, s := range f.Snapshots {
		snaps = append(snaps, fmtSnapshot(s))
	}
	return fmt.Sprintf("fs %d %q tenant=%d created=%d next-snapshot=%d snapshots=[%s]",
		f.Number, f.Name, f.TenantId, f.CreatedUnixMs, f.NextSnapshot, strings.Join(snaps, " "))
}

func fmtSnapshot(s *pb.Snapshot) string {
	return fmt.Sprintf("%d:%q@%d", s.Number, s.Name, s.CreatedUnixMs)
}

func fmtLease(l *pb.Lease) string {
	return fmt.Sprintf("lease %q holder=%d/%d epoch=%d granted=%d expiry=%d",
		l.Name, l.HolderNode, l.HolderEpoch, l.Epoch, l.GrantedUnixMs, l.ExpiryUnixMs)
}

func fmtConfig(e *pb.ConfigEntry) string {
	value := fmt.Sprintf("%q", e.Value)
	if len(e.Value) > 32 {
		value = fmt.Sprintf("<%d bytes>", len(e.Value))
	}
	return fmt.Sprintf("config %q=%s version=%d modified=%d", e.Key, value, e.Version, e.ModifiedUnixMs)
}

func fmtCluster(c *pb.ClusterInfo) string {
	return fmt.Sprintf("cluster %q tract=%d created=%d", c.ClusterId, c.TractSizeBytes, c.CreatedUnixMs)
}

func fmtResult(r *pb.CommandResult) string {
	var b strings.Builder
	b.WriteString(r.Code.String())
	if r.Message != "" {
		b.WriteString(": " + r.Message)
	}
	var payload string
	switch p := r.Payload.(type) {
	case *pb.CommandResult_Cluster:
		payload = fmtCluster(p.Cluster)
	case *pb.CommandResult_Node:
		payload = fmtNode(p.Node)
	case *pb.CommandResult_Tlt:
		payload = fmt.Sprintf("tlt version=%d", p.Tlt.Version)
	case *pb.CommandResult_Extent:
		payload = fmtExtent(p.Extent)
	case *pb.CommandResult_Delegation:
		payload = fmtDelegation(p.Delegation)
	case *pb.CommandResult_FileSystem:
		payload = fmtFileSystem(p.FileSystem)
	case *pb.CommandResult_Snapshot:
		payload = "snapshot " + fmtSnapshot(p.Snapshot)
	case *pb.CommandResult_Lease:
		payload = fmtLease(p.Lease)
	case *pb.CommandResult_ConfigEntry:
		payload = fmtConfig(p.ConfigEntry)
	case *pb.CommandResult_Version:
		payload = fmt.Sprintf("version=%d", p.Version)
	case *pb.CommandResult_Renewals:
		var lines []string
		for _, sub := range p.Renewals.GetResults() {
			lines = append(lines, strings.ReplaceAll(fmtResult(sub), "\n", "\n  "))
		}
		payload = strings.Join(lines, "\n  ")
	}
	if payload != "" {
		b.WriteString("\n  " + payload)
	}
	return b.String()
}

// dump prints the whole state of sm, in key order.
func dump(sm *StateMachine) string {
	var b strings.Builder
	line := func(s string) { b.WriteString(s + "\n") }
	if c := sm.Cluster(); c != nil {
		line(fmtCluster(c))
	}
	line(fmt.Sprintf("clock %d", sm.ClockUnixMs()))
	for _, n := range sm.Nodes() {
		line(fmtNode(n))
	}
	for _, s := range sm.MemberStats() {
		line(fmt.Sprintf("stats %d free=%d capacity=%d load=%g updated=%d", s.NodeId, s.FreeBytes, s.CapacityBytes, s.Load, s.UpdatedUnixMs))
	}
	if t := sm.TLT(); t != nil {
		line(fmt.Sprintf("tlt version=%d k=%d tract=%d rows=%d", t.Version, t.Replication, t.TractSizeBytes, len(t.Rows)))
		for i, r := range t.Rows {
			line(fmt.Sprintf("  row %d %s", i, fmtRow(r)))
		}
	}
	exts, _ := sm.Extents(0, maxExtents)
	for _, e := range exts {
		line(fmtExtent(e))
	}
	dm := sm.DelegationMap(0)
	if len(dm.Delegations) > 0 || dm.Version != 0 {
		line(fmt.Sprintf("delegation-map version=%d", dm.Version))
	}
	for _, d := range dm.Delegations {
		line("  " + fmtDelegation(d))
	}
	for _, f := range sm.FileSystems() {
		line(fmtFileSystem(f))
	}
	sm.mu.RLock()
	leaseNames := sortedKeys(sm.st.leases)
	sm.mu.RUnlock()
	for _, name := range leaseNames {
		l, _ := sm.Lease(name)
		line(fmtLease(l))
	}
	entries, _ := sm.ListConfig("", "", maxConfigEntries)
	for _, e := range entries {
		line(fmtConfig(e))
	}
	return b.String()
}
