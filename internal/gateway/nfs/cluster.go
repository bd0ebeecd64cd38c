package nfs

import (
	"context"
	"fmt"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// ClusterBackend serves a cluster's file systems: records from the
// directory, sessions through the metadata service's client library.
// The cluster must be dialled with DurableMetadata (NFS replies promise
// that a change is on stable storage).
type ClusterBackend struct {
	Cluster *client.Cluster
}

var _ Backend = ClusterBackend{}

func infoOf(f *dpb.FileSystem) FSInfo {
	info := FSInfo{Number: f.GetNumber(), Name: f.GetName(), Gen: uint64(f.GetCreatedUnixMs())}
	for _, s := range f.GetSnapshots() {
		info.Snapshots = append(info.Snapshots, SnapInfo{Name: s.GetName(), Number: s.GetNumber()})
	}
	return info
}

// FileSystems lists the cluster's file systems.
func (b ClusterBackend) FileSystems(ctx context.Context) ([]FSInfo, error) {
	resp, err := b.Cluster.Directory().ListFileSystems(ctx, &dpb.ListFileSystemsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list file systems: %w", err)
	}
	out := make([]FSInfo, 0, len(resp.GetFileSystems()))
	for _, f := range resp.GetFileSystems() {
		out = append(out, infoOf(f))
	}
	return out, nil
}

func (b ClusterBackend) get(ctx context.Context, req *dpb.GetFileSystemRequest) (FSInfo, error) {
	f, err := b.Cluster.Directory().GetFileSystem(ctx, req)
	if directory.IsNotFound(err) {
		return FSInfo{}, fmt.Errorf("%w: %q (number %d)", ErrNoFileSystem, req.GetName(), req.GetNumber())
	}
	if err != nil {
		return FSInfo{}, fmt.Errorf("look up file system: %w", err)
	}
	return infoOf(f), nil
}

// FileSystemByName looks up a file system by name.
func (b ClusterBackend) FileSystemByName(ctx context.Context, name string) (FSInfo, error) {
	return b.get(ctx, &dpb.GetFileSystemRequest{Name: name})
}

// FileSystemByNumber looks up a file system by number.
func (b ClusterBackend) FileSystemByNumber(ctx context.Context, number uint64) (FSInfo, error) {
	return b.get(ctx, &dpb.GetFileSystemRequest{Number: number})
}

// Open opens a session of the file system at snapshot snap.
func (b ClusterBackend) Open(ctx context.Context, info FSInfo, snap uint64) (FS, error) {
	f, err := b.Cluster.Directory().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: info.Number})
	if err != nil {
		return nil, fmt.Errorf("look up file system %q: %w", info.Name, err)
	}
	return b.Cluster.OpenFS(ctx, f, snap)
}
