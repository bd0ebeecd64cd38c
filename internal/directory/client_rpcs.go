package directory

import (
	"context"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// One method per RPC of the Directory service; see client.go for retries.

// InitCluster fixes the cluster identity (idempotent for the same id).
func (c *Client) InitCluster(ctx context.Context, req *pb.InitClusterRequest) (*pb.ClusterInfo, error) {
	return call(ctx, c, "InitCluster", func(ctx context.Context, d pb.DirectoryClient) (*pb.ClusterInfo, error) {
		return d.InitCluster(ctx, req)
	})
}

// Status returns the directory group's leader, members and the node table; with Local set, any replica answers from its own view.
func (c *Client) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	return call(ctx, c, "Status", func(ctx context.Context, d pb.DirectoryClient) (*pb.StatusResponse, error) { return d.Status(ctx, req) })
}

// Register registers a node or re-registers it with a new epoch.
func (c *Client) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	return call(ctx, c, "Register", func(ctx context.Context, d pb.DirectoryClient) (*pb.RegisterResponse, error) {
		return d.Register(ctx, req)
	})
}

// Heartbeat reports a node alive to the leader's failure detector.
func (c *Client) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	return call(ctx, c, "Heartbeat", func(ctx context.Context, d pb.DirectoryClient) (*pb.HeartbeatResponse, error) {
		return d.Heartbeat(ctx, req)
	})
}

// ListNodes returns every registered node.
func (c *Client) ListNodes(ctx context.Context, req *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return call(ctx, c, "ListNodes", func(ctx context.Context, d pb.DirectoryClient) (*pb.ListNodesResponse, error) {
		return d.ListNodes(ctx, req)
	})
}

// GetNode returns one node.
func (c *Client) GetNode(ctx context.Context, req *pb.GetNodeRequest) (*pb.Node, error) {
	return call(ctx, c, "GetNode", func(ctx context.Context, d pb.DirectoryClient) (*pb.Node, error) { return d.GetNode(ctx, req) })
}

// Decommission removes a node for good.
func (c *Client) Decommission(ctx context.Context, req *pb.DecommissionRequest) (*pb.Node, error) {
	return call(ctx, c, "Decommission", func(ctx context.Context, d pb.DirectoryClient) (*pb.Node, error) { return d.Decommission(ctx, req) })
}

// GetMemberStats returns the recorded member statistics.
func (c *Client) GetMemberStats(ctx context.Context, req *pb.GetMemberStatsRequest) (*pb.GetMemberStatsResponse, error) {
	return call(ctx, c, "GetMemberStats", func(ctx context.Context, d pb.DirectoryClient) (*pb.GetMemberStatsResponse, error) {
		return d.GetMemberStats(ctx, req)
	})
}

// GrantLease acquires (or extends) a lease.
func (c *Client) GrantLease(ctx context.Context, req *pb.GrantLeaseRequest) (*pb.Lease, error) {
	return call(ctx, c, "GrantLease", func(ctx context.Context, d pb.DirectoryClient) (*pb.Lease, error) { return d.GrantLease(ctx, req) })
}

// RenewLease extends a held lease.
func (c *Client) RenewLease(ctx context.Context, req *pb.RenewLeaseRequest) (*pb.Lease, error) {
	return call(ctx, c, "RenewLease", func(ctx context.Context, d pb.DirectoryClient) (*pb.Lease, error) { return d.RenewLease(ctx, req) })
}

// ReleaseLease frees a lease.
func (c *Client) ReleaseLease(ctx context.Context, req *pb.ReleaseLeaseRequest) (*pb.Lease, error) {
	return call(ctx, c, "ReleaseLease", func(ctx context.Context, d pb.DirectoryClient) (*pb.Lease, error) { return d.ReleaseLease(ctx, req) })
}

// GetLease returns a lease record.
func (c *Client) GetLease(ctx context.Context, req *pb.GetLeaseRequest) (*pb.Lease, error) {
	return call(ctx, c, "GetLease", func(ctx context.Context, d pb.DirectoryClient) (*pb.Lease, error) { return d.GetLease(ctx, req) })
}

// GetConfig reads one configuration value (linearizable).
func (c *Client) GetConfig(ctx context.Context, req *pb.GetConfigRequest) (*pb.ConfigEntry, error) {
	return call(ctx, c, "GetConfig", func(ctx context.Context, d pb.DirectoryClient) (*pb.ConfigEntry, error) { return d.GetConfig(ctx, req) })
}

// ListConfig lists configuration values by prefix.
func (c *Client) ListConfig(ctx context.Context, req *pb.ListConfigRequest) (*pb.ListConfigResponse, error) {
	return call(ctx, c, "ListConfig", func(ctx context.Context, d pb.DirectoryClient) (*pb.ListConfigResponse, error) {
		return d.ListConfig(ctx, req)
	})
}

// PutConfig sets a configuration value, optionally compare-and-set.
func (c *Client) PutConfig(ctx context.Context, req *pb.PutConfigRequest) (*pb.ConfigEntry, error) {
	return call(ctx, c, "PutConfig", func(ctx context.Context, d pb.DirectoryClient) (*pb.ConfigEntry, error) { return d.PutConfig(ctx, req) })
}

// DeleteConfig deletes a configuration value, optionally conditionally.
func (c *Client) DeleteConfig(ctx context.Context, req *pb.DeleteConfigRequest) (*pb.DeleteConfigResponse, error) {
	return call(ctx, c, "DeleteConfig", func(ctx context.Context, d pb.DirectoryClient) (*pb.DeleteConfigResponse, error) {
		return d.DeleteConfig(ctx, req)
	})
}

// CreateFileSystem creates a file system and assigns its number.
func (c *Client) CreateFileSystem(ctx context.Context, req *pb.CreateFileSystemRequest) (*pb.FileSystem, error) {
	return call(ctx, c, "CreateFileSystem", func(ctx context.Context, d pb.DirectoryClient) (*pb.FileSystem, error) {
		return d.CreateFileSystem(ctx, req)
	})
}

// DeleteFileSystem deletes a file system that has no tables.
func (c *Client) DeleteFileSystem(ctx context.Context, req *pb.DeleteFileSystemRequest) (*pb.FileSystem, error) {
	return call(ctx, c, "DeleteFileSystem", func(ctx context.Context, d pb.DirectoryClient) (*pb.FileSystem, error) {
		return d.DeleteFileSystem(ctx, req)
	})
}

// GetFileSystem returns a file system by number or name.
func (c *Client) GetFileSystem(ctx context.Context, req *pb.GetFileSystemRequest) (*pb.FileSystem, error) {
	return call(ctx, c, "GetFileSystem", func(ctx context.Context, d pb.DirectoryClient) (*pb.FileSystem, error) {
		return d.GetFileSystem(ctx, req)
	})
}

// ListFileSystems returns every file system.
func (c *Client) ListFileSystems(ctx context.Context, req *pb.ListFileSystemsRequest) (*pb.ListFileSystemsResponse, error) {
	return call(ctx, c, "ListFileSystems", func(ctx context.Context, d pb.DirectoryClient) (*pb.ListFileSystemsResponse, error) {
		return d.ListFileSystems(ctx, req)
	})
}

// CreateSnapshot adds a snapshot to a file system's list.
func (c *Client) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.Snapshot, error) {
	return call(ctx, c, "CreateSnapshot", func(ctx context.Context, d pb.DirectoryClient) (*pb.Snapshot, error) {
		return d.CreateSnapshot(ctx, req)
	})
}

// DeleteSnapshot removes a snapshot from a file system's list.
func (c *Client) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*pb.FileSystem, error) {
	return call(ctx, c, "DeleteSnapshot", func(ctx context.Context, d pb.DirectoryClient) (*pb.FileSystem, error) {
		return d.DeleteSnapshot(ctx, req)
	})
}

// GetTLT returns the tract locator table.
func (c *Client) GetTLT(ctx context.Context, req *pb.GetTLTRequest) (*pb.TLT, error) {
	return call(ctx, c, "GetTLT", func(ctx context.Context, d pb.DirectoryClient) (*pb.TLT, error) { return d.GetTLT(ctx, req) })
}

// InstallTLT replaces the tract locator table.
func (c *Client) InstallTLT(ctx context.Context, req *pb.InstallTLTRequest) (*pb.TLTVersion, error) {
	return call(ctx, c, "InstallTLT", func(ctx context.Context, d pb.DirectoryClient) (*pb.TLTVersion, error) { return d.InstallTLT(ctx, req) })
}

// UpdateTLTRows changes TLT rows conditioned on their versions.
func (c *Client) UpdateTLTRows(ctx context.Context, req *pb.UpdateTLTRowsRequest) (*pb.TLTVersion, error) {
	return call(ctx, c, "UpdateTLTRows", func(ctx context.Context, d pb.DirectoryClient) (*pb.TLTVersion, error) {
		return d.UpdateTLTRows(ctx, req)
	})
}

// CreateExtent allocates an extent id and records its replicas.
func (c *Client) CreateExtent(ctx context.Context, req *pb.CreateExtentRequest) (*pb.Extent, error) {
	return call(ctx, c, "CreateExtent", func(ctx context.Context, d pb.DirectoryClient) (*pb.Extent, error) { return d.CreateExtent(ctx, req) })
}

// GetExtent returns one extent.
func (c *Client) GetExtent(ctx context.Context, req *pb.GetExtentRequest) (*pb.Extent, error) {
	return call(ctx, c, "GetExtent", func(ctx context.Context, d pb.DirectoryClient) (*pb.Extent, error) { return d.GetExtent(ctx, req) })
}

// ListExtents returns a page of extents.
func (c *Client) ListExtents(ctx context.Context, req *pb.ListExtentsRequest) (*pb.ListExtentsResponse, error) {
	return call(ctx, c, "ListExtents", func(ctx context.Context, d pb.DirectoryClient) (*pb.ListExtentsResponse, error) {
		return d.ListExtents(ctx, req)
	})
}

// ChangeExtentReplicas changes an extent's replicas conditioned on its epoch.
func (c *Client) ChangeExtentReplicas(ctx context.Context, req *pb.ChangeExtentReplicasRequest) (*pb.Extent, error) {
	return call(ctx, c, "ChangeExtentReplicas", func(ctx context.Context, d pb.DirectoryClient) (*pb.Extent, error) {
		return d.ChangeExtentReplicas(ctx, req)
	})
}

// GetDelegationMap returns the delegation map (of one file system, or all).
func (c *Client) GetDelegationMap(ctx context.Context, req *pb.GetDelegationMapRequest) (*pb.DelegationMap, error) {
	return call(ctx, c, "GetDelegationMap", func(ctx context.Context, d pb.DirectoryClient) (*pb.DelegationMap, error) {
		return d.GetDelegationMap(ctx, req)
	})
}

// SplitDelegation cuts a table in two.
func (c *Client) SplitDelegation(ctx context.Context, req *pb.SplitDelegationRequest) (*pb.DelegationPair, error) {
	return call(ctx, c, "SplitDelegation", func(ctx context.Context, d pb.DirectoryClient) (*pb.DelegationPair, error) {
		return d.SplitDelegation(ctx, req)
	})
}

// SetDelegation creates or reassigns a table.
func (c *Client) SetDelegation(ctx context.Context, req *pb.SetDelegationRequest) (*pb.Delegation, error) {
	return call(ctx, c, "SetDelegation", func(ctx context.Context, d pb.DirectoryClient) (*pb.Delegation, error) {
		return d.SetDelegation(ctx, req)
	})
}

// RenewDelegation extends a table owner's lease.
func (c *Client) RenewDelegation(ctx context.Context, req *pb.RenewDelegationRequest) (*pb.Delegation, error) {
	return call(ctx, c, "RenewDelegation", func(ctx context.Context, d pb.DirectoryClient) (*pb.Delegation, error) {
		return d.RenewDelegation(ctx, req)
	})
}

// RenewDelegations extends many table leases in one command; each
// renewal has its own result.
func (c *Client) RenewDelegations(ctx context.Context, req *pb.RenewDelegationsRequest) (*pb.RenewDelegationsResponse, error) {
	return call(ctx, c, "RenewDelegations", func(ctx context.Context, d pb.DirectoryClient) (*pb.RenewDelegationsResponse, error) {
		return d.RenewDelegations(ctx, req)
	})
}

// DeleteDelegation removes a table.
func (c *Client) DeleteDelegation(ctx context.Context, req *pb.DeleteDelegationRequest) (*pb.DeleteDelegationResponse, error) {
	return call(ctx, c, "DeleteDelegation", func(ctx context.Context, d pb.DirectoryClient) (*pb.DeleteDelegationResponse, error) {
		return d.DeleteDelegation(ctx, req)
	})
}
