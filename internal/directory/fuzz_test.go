package directory

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// seedCommands is one command of every kind, valid against baseState.
func seedCommands() []*pb.Command {
	cmds := []*pb.Command{
		{Op: &pb.Command_InitCluster{InitCluster: &pb.InitClusterRequest{ClusterId: "c", TractSizeBytes: 1 << 16}}},
		{Op: &pb.Command_RegisterNode{RegisterNode: &pb.RegisterRequest{NodeId: 4, Address: "h:4", Roles: []string{"storage"}, Disks: []*pb.Disk{{Path: "/d", CapacityBytes: 9}}}}},
		{Op: &pb.Command_SetNodeState{SetNodeState: &pb.SetNodeState{NodeId: 1, Epoch: 1, State: pb.NodeState_NODE_STATE_SUSPECT}}},
		{Op: &pb.Command_DecommissionNode{DecommissionNode: &pb.DecommissionRequest{NodeId: 3}}},
		{Op: &pb.Command_UpdateMemberStats{UpdateMemberStats: &pb.UpdateMemberStats{Stats: []*pb.MemberStats{{NodeId: 1, FreeBytes: 1, CapacityBytes: 2, Load: 0.5}}}}},
		{Op: &pb.Command_InstallTlt{InstallTlt: &pb.InstallTLTRequest{ExpectedVersion: 1, Replication: 2, Rows: []*pb.TLTRow{{Slots: []*pb.TractServer{{NodeId: 1}, {NodeId: 2}}}}}}},
		{Op: &pb.Command_UpdateTltRows{UpdateTltRows: &pb.UpdateTLTRowsRequest{Updates: []*pb.RowUpdate{{Row: 0, ExpectedVersion: 1, Slots: []*pb.TractServer{{NodeId: 2}, {NodeId: 1}}, Pending: []*pb.PendingEntry{{Slot: 0, Server: &pb.TractServer{NodeId: 3}}}}}}}},
		{Op: &pb.Command_CreateExtent{CreateExtent: &pb.CreateExtentRequest{Geometry: &pb.ExtentGeometry{PageSizeBytes: 4096, BlockSizeBytes: 4096, ExtentSizeBytes: 8192, Replication: 1}, Replicas: []uint64{2}}}},
		{Op: &pb.Command_ChangeExtentReplicas{ChangeExtentReplicas: &pb.ChangeExtentReplicasRequest{ExtentId: firstExtentID, ExpectedEpoch: 1, Replicas: []uint64{1, 2}}}},
		{Op: &pb.Command_SetDelegation{SetDelegation: &pb.SetDelegationRequest{FileSystem: 1, StartKey: []byte("x"), OwnerNode: 1, LeaseDurationMs: 1000}}},
		{Op: &pb.Command_RenewDelegation{RenewDelegation: &pb.RenewDelegationRequest{TableId: 1, Epoch: 1, OwnerNode: 1, LeaseDurationMs: 1000}}},
		{Op: &pb.Command_RenewDelegations{RenewDelegations: &pb.RenewDelegationsRequest{Renewals: []*pb.RenewDelegationRequest{
			{TableId: 1, Epoch: 1, OwnerNode: 1, LeaseDurationMs: 1000}, {TableId: 7, Epoch: 1, OwnerNode: 1, LeaseDurationMs: 1000}}}}},
		{Op: &pb.Command_DeleteDelegation{DeleteDelegation: &pb.DeleteDelegationRequest{TableId: 1, ExpectedEpoch: 1}}},
		{Op: &pb.Command_CreateFileSystem{CreateFileSystem: &pb.CreateFileSystemRequest{Name: "fs3", TenantId: 5, DataLayout: "ec:5+2"}}},
		{Op: &pb.Command_DeleteFileSystem{DeleteFileSystem: &pb.DeleteFileSystemRequest{Number: 2}}},
		{Op: &pb.Command_CreateSnapshot{CreateSnapshot: &pb.CreateSnapshotRequest{FileSystem: 1, Name: "s"}}},
		{Op: &pb.Command_DeleteSnapshot{DeleteSnapshot: &pb.DeleteSnapshotRequest{FileSystem: 1, Snapshot: 1}}},
		{Op: &pb.Command_GrantLease{GrantLease: &pb.GrantLeaseRequest{Name: "l2", HolderNode: 2, HolderEpoch: 1, DurationMs: 1000}}},
		{Op: &pb.Command_RenewLease{RenewLease: &pb.RenewLeaseRequest{Name: "l", HolderNode: 1, LeaseEpoch: 1, DurationMs: 1000}}},
		{Op: &pb.Command_ReleaseLease{ReleaseLease: &pb.ReleaseLeaseRequest{Name: "l", HolderNode: 1, LeaseEpoch: 1}}},
		{Op: &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{Key: "k2", Value: []byte("v"), ExpectedVersion: proto.Uint64(0)}}},
		{Op: &pb.Command_DeleteConfig{DeleteConfig: &pb.DeleteConfigRequest{Key: "k"}}},
	}
	for _, c := range cmds {
		c.NowUnixMs = 5000
	}
	return cmds
}

// baseState is a replica holding some of everything, for commands to act on.
func baseState(t testing.TB) *replica {
	r := newReplica(t)
	for _, cmd := range []*pb.Command{
		{Op: &pb.Command_InitCluster{InitCluster: &pb.InitClusterRequest{ClusterId: "c", TractSizeBytes: 1 << 16}}},
		{Op: &pb.Command_RegisterNode{RegisterNode: &pb.RegisterRequest{NodeId: 1, Address: "h:1", Disks: []*pb.Disk{{Path: "/d", CapacityBytes: 9}}}}},
		{Op: &pb.Command_RegisterNode{RegisterNode: &pb.RegisterRequest{NodeId: 2, Address: "h:2", Disks: []*pb.Disk{{Path: "/d", CapacityBytes: 9}}}}},
		{Op: &pb.Command_RegisterNode{RegisterNode: &pb.RegisterRequest{NodeId: 3, Address: "h:3", Disks: []*pb.Disk{{Path: "/d", CapacityBytes: 9}}}}},
		{Op: &pb.Command_InstallTlt{InstallTlt: &pb.InstallTLTRequest{Replication: 2, Rows: []*pb.TLTRow{{Slots: []*pb.TractServer{{NodeId: 1}, {NodeId: 2}}}}}}},
		{Op: &pb.Command_CreateExtent{CreateExtent: &pb.CreateExtentRequest{Geometry: &pb.ExtentGeometry{PageSizeBytes: 4096, BlockSizeBytes: 4096, ExtentSizeBytes: 8192, Replication: 1}, Replicas: []uint64{1}}}},
		{Op: &pb.Command_CreateFileSystem{CreateFileSystem: &pb.CreateFileSystemRequest{Name: "fs1"}}},
		{Op: &pb.Command_CreateFileSystem{CreateFileSystem: &pb.CreateFileSystemRequest{Name: "empty"}}},
		{Op: &pb.Command_CreateSnapshot{CreateSnapshot: &pb.CreateSnapshotRequest{FileSystem: 1, Name: "s0"}}},
		{Op: &pb.Command_SetDelegation{SetDelegation: &pb.SetDelegationRequest{FileSystem: 1, StartKey: []byte("a"), EndKey: []byte("m"), OwnerNode: 1, LeaseDurationMs: 10000}}},
		{Op: &pb.Command_GrantLease{GrantLease: &pb.GrantLeaseRequest{Name: "l", HolderNode: 1, HolderEpoch: 1, DurationMs: 10000}}},
		{Op: &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{Key: "k", Value: []byte("v")}}},
	} {
		cmd.NowUnixMs = 1000
		if res := r.apply(cmd); res.Code != pb.ErrorCode_OK {
			t.Fatalf("base state: %v", fmtResult(res))
		}
	}
	return r
}

// TestSeedCommands checks that every seed applies to the base state, so the
// fuzzer starts from commands that reach deep into each handler.
func TestSeedCommands(t *testing.T) {
	for _, cmd := range seedCommands() {
		r := baseState(t)
		if res := r.apply(cmd); res.Code != pb.ErrorCode_OK {
			t.Errorf("%T: %s", cmd.Op, fmtResult(res))
		}
	}
}

// FuzzDecodeCommand feeds arbitrary bytes to DecodeCommand and Apply: no
// panic, a refused command changes nothing, and the mirror always equals a
// reload of the key space (replica.applyRaw checks both).
func FuzzDecodeCommand(f *testing.F) {
	for _, cmd := range seedCommands() {
		data, err := proto.Marshal(cmd)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd, err := DecodeCommand(data)
		if err == nil {
			if cmd.Op == nil || cmd.NowUnixMs <= 0 {
				t.Fatalf("DecodeCommand accepted %x without an operation or time", data)
			}
			if _, err := EncodeCommand(cmd); err != nil {
				t.Fatalf("EncodeCommand refused what DecodeCommand accepted: %v", err)
			}
		}
		r := baseState(t)
		res := r.applyRaw(data)
		if err != nil && res.Code != pb.ErrorCode_INVALID_ARGUMENT {
			t.Fatalf("undecodable command gave %v", res.Code)
		}
	})
}
