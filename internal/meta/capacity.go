package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
)

// The capacity statfs reports (fs.Capacity) is the cluster's, shared by
// every file system, worked out from what the directory knows:
//
//   - Which disks count: those of nodes with the storage role that are
//     alive or suspect. A suspect node still holds its TLT places, so its
//     space is still the cluster's; a dead node's replicas are being
//     rebuilt elsewhere and its disks hold nothing a client can use, so it
//     counts for nothing (and a decommissioned one is gone).
//   - Each node's figures: the free and capacity bytes of its last
//     heartbeat's MemberStats (the node measures its disks' file systems;
//     internal/server), or, before the directory recorded any, the disks
//     it registered with (capacity and used bytes).
//   - Raw bytes become bytes of file data by dividing by the TLT's
//     replication k: each byte of a file is kept k times. Without a TLT
//     (nothing can be stored yet) k is taken as 1.
//
// Used is capacity less free, so it counts whatever else shares the
// nodes' disks (on a development cluster, every node's disk is the same
// file system, counted once per node and divided by k). Quotas per file
// system do not exist yet; when they do, statfs should show the smaller of
// the quota and this.

// capacityTTL is how long a metadata server reuses the directory's answer:
// df and every statfs of a mount stay cheap (three directory reads per
// period at most), and the figures the directory holds move only every
// stats flush (10 s) anyway.
const capacityTTL = 3 * time.Second

// storageRole is the node role that serves disks (internal/server's
// RoleStorage).
const storageRole = "storage"

// capacityDirectory is what working out the capacity asks of the directory
// (*directory.Client implements it).
type capacityDirectory interface {
	ListNodes(ctx context.Context, req *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error)
	GetMemberStats(ctx context.Context, req *dpb.GetMemberStatsRequest) (*dpb.GetMemberStatsResponse, error)
	GetTLT(ctx context.Context, req *dpb.GetTLTRequest) (*dpb.TLT, error)
}

// capacityCache remembers the cluster's capacity for capacityTTL.
type capacityCache struct {
	dir capacityDirectory
	now func() time.Time

	// mu is held while the directory is asked, so concurrent statfs calls
	// ask once.
	mu    sync.Mutex
	at    time.Time // when c was read; zero: never
	c     fs.Capacity
	valid bool
}

// get returns the cluster's capacity, asking the directory if the cached
// answer is older than capacityTTL. If the directory cannot answer, the
// last answer is returned however old it is; with none, the error.
func (cc *capacityCache) get(ctx context.Context) (fs.Capacity, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	now := cc.now()
	if cc.valid && now.Sub(cc.at) < capacityTTL {
		return cc.c, nil
	}
	c, err := readCapacity(ctx, cc.dir)
	if err != nil {
		if cc.valid {
			return cc.c, nil
		}
		return fs.Capacity{}, err
	}
	cc.c, cc.at, cc.valid = c, now, true
	return c, nil
}

// readCapacity asks the directory for the nodes, their statistics and the
// replication factor, and sums them (clusterCapacity).
func readCapacity(ctx context.Context, dir capacityDirectory) (fs.Capacity, error) {
	nodes, err := dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return fs.Capacity{}, fmt.Errorf("meta: capacity: list nodes: %w", err)
	}
	stats, err := dir.GetMemberStats(ctx, &dpb.GetMemberStatsRequest{})
	if err != nil {
		return fs.Capacity{}, fmt.Errorf("meta: capacity: member statistics: %w", err)
	}
	var k uint32
	tlt, err := dir.GetTLT(ctx, &dpb.GetTLTRequest{})
	switch {
	case err == nil:
		k = tlt.GetReplication()
	case !directory.IsNotFound(err):
		return fs.Capacity{}, fmt.Errorf("meta: capacity: read the TLT: %w", err)
	}
	return clusterCapacity(nodes.GetNodes(), stats.GetStats(), k), nil
}

// clusterCapacity sums the raw capacity and free space of the live storage
// nodes and divides them by the replication k (0 counts as 1); see the
// comment at the top of this file for what counts.
func clusterCapacity(nodes []*dpb.Node, stats []*dpb.MemberStats, k uint32) fs.Capacity {
	byNode := make(map[uint64]*dpb.MemberStats, len(stats))
	for _, s := range stats {
		byNode[s.GetNodeId()] = s
	}
	var total, free uint64
	for _, n := range nodes {
		switch n.GetState() {
		case dpb.NodeState_NODE_STATE_ALIVE, dpb.NodeState_NODE_STATE_SUSPECT:
		default:
			continue
		}
		if !slices.Contains(n.GetRoles(), storageRole) {
			continue
		}
		if s, ok := byNode[n.GetId()]; ok && s.GetCapacityBytes() > 0 {
			total += s.GetCapacityBytes()
			free += min(s.GetFreeBytes(), s.GetCapacityBytes())
			continue
		}
		for _, d := range n.GetDisks() {
			total += d.GetCapacityBytes()
			free += d.GetCapacityBytes() - min(d.GetUsedBytes(), d.GetCapacityBytes())
		}
	}
	k = max(k, 1)
	return fs.Capacity{TotalBytes: total / uint64(k), FreeBytes: free / uint64(k)}
}
