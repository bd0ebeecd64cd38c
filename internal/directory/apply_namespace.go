package directory

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

func (a *applier) createFileSystem(req *pb.CreateFileSystemRequest) *pb.CommandResult {
	if err := checkFileSystemName("name", req.Name, MaxFileSystemNameBytes, "maxFileSystemNameBytes"); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	if req.DataLayout != "" {
		// The metadata service parsed and checked it against the cluster.
		if err := checkName("data_layout", req.DataLayout, maxDataLayoutBytes, "maxDataLayoutBytes"); err != nil {
			return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
		}
	}
	for _, num := range sortedKeys(a.st.fileSystems) {
		if f := a.st.fileSystems[num]; f.Name == req.Name {
			return withPayload(failf(pb.ErrorCode_ALREADY_EXISTS, "file system %q exists (number %d)", req.Name, num), f)
		}
	}
	if len(a.st.fileSystems) >= maxFileSystems {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "%d file systems, limit %d (maxFileSystems)", len(a.st.fileSystems), maxFileSystems)
	}
	c := a.counters()
	num := max(c.NextFileSystem, 1)
	c.NextFileSystem = num + 1
	f := &pb.FileSystem{Number: num, Name: req.Name, TenantId: req.TenantId, CreatedUnixMs: a.now, NextSnapshot: 1, DataLayout: req.DataLayout, Tenant: req.Tenant}
	a.setCounters(c)
	a.eff.set(fileSystemKey(num), f)
	a.eff.then(func(s *state) { s.fileSystems[num] = f })
	return ok(f)
}

func (a *applier) deleteFileSystem(req *pb.DeleteFileSystemRequest) *pb.CommandResult {
	f, exists := a.st.fileSystems[req.Number]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "file system %d does not exist", req.Number)
	}
	for _, id := range sortedKeys(a.st.delegations) {
		if a.st.delegations[id].FileSystem == req.Number {
			return failf(pb.ErrorCode_CONFLICT, "file system %d still has table %d; delete its tables first", req.Number, id)
		}
	}
	a.eff.del(fileSystemKey(req.Number))
	a.eff.then(func(s *state) { delete(s.fileSystems, req.Number) })
	return ok(f)
}

func (a *applier) createSnapshot(req *pb.CreateSnapshotRequest) *pb.CommandResult {
	if err := checkFileSystemName("name", req.Name, maxSnapshotNameBytes, "maxSnapshotNameBytes"); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err)
	}
	old, exists := a.st.fileSystems[req.FileSystem]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "file system %d does not exist", req.FileSystem)
	}
	for _, sn := range old.Snapshots {
		if sn.Name == req.Name {
			return withPayload(failf(pb.ErrorCode_ALREADY_EXISTS, "file system %d has snapshot %q (number %d)", req.FileSystem, req.Name, sn.Number), sn)
		}
	}
	if len(old.Snapshots) >= maxSnapshotsPerFileSystem {
		return failf(pb.ErrorCode_LIMIT_EXCEEDED, "file system %d has %d snapshots, limit %d (maxSnapshotsPerFileSystem)",
			req.FileSystem, len(old.Snapshots), maxSnapshotsPerFileSystem)
	}
	f := proto.Clone(old).(*pb.FileSystem)
	sn := &pb.Snapshot{Number: f.NextSnapshot, Name: req.Name, CreatedUnixMs: a.now}
	f.Snapshots = append(f.Snapshots, sn)
	f.NextSnapshot++
	a.eff.set(fileSystemKey(f.Number), f)
	a.eff.then(func(s *state) { s.fileSystems[f.Number] = f })
	return ok(proto.Clone(sn))
}

func (a *applier) deleteSnapshot(req *pb.DeleteSnapshotRequest) *pb.CommandResult {
	old, exists := a.st.fileSystems[req.FileSystem]
	if !exists {
		return failf(pb.ErrorCode_NOT_FOUND, "file system %d does not exist", req.FileSystem)
	}
	at := -1
	for i, sn := range old.Snapshots {
		if sn.Number == req.Snapshot {
			at = i
		}
	}
	if at < 0 {
		return failf(pb.ErrorCode_NOT_FOUND, "file system %d has no snapshot %d", req.FileSystem, req.Snapshot)
	}
	f := proto.Clone(old).(*pb.FileSystem)
	f.Snapshots = append(f.Snapshots[:at], f.Snapshots[at+1:]...)
	a.eff.set(fileSystemKey(f.Number), f)
	a.eff.then(func(s *state) { s.fileSystems[f.Number] = f })
	return ok(f)
}
