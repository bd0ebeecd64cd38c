package main

import (
	"context"
	"fmt"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// The two functions in this file are where the CLI meets the directory
// group (internal/directory).

// fetchClusterView asks the directory of the cluster at target for what
// `arbor status` and `arbor nodes` print. It asks for the leader's
// linearizable view; if no leader answers (no quorum), it falls back to
// the possibly stale view of whichever member answers, and says so.
func fetchClusterView(ctx context.Context, target clusterTarget) (ClusterView, error) {
	c, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		return ClusterView{}, fmt.Errorf("connect to the directory: %w", err)
	}
	defer c.Close()
	st, err := c.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		local, lerr := c.Status(ctx, &pb.StatusRequest{Local: true})
		if lerr != nil {
			return ClusterView{}, fmt.Errorf("directory status: %w", err)
		}
		st = local
	}
	v := ClusterView{Leader: st.GetLeaderId(), Voters: st.GetVoters()}
	for _, n := range st.GetNodes() {
		v.Nodes = append(v.Nodes, NodeView{
			ID:      n.GetId(),
			Address: n.GetAddress(),
			Domain:  n.GetFailureDomain(),
			State:   NodeState(directory.StateName(n.GetState())),
			Roles:   n.GetRoles(),
		})
	}
	return v, nil
}

// decommissionNode asks the directory to decommission node id (`arbor
// nodes decommission ID`).
func decommissionNode(ctx context.Context, target clusterTarget, id uint64) error {
	c, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		return fmt.Errorf("connect to the directory: %w", err)
	}
	defer c.Close()
	if _, err := c.Decommission(ctx, &pb.DecommissionRequest{NodeId: id}); err != nil {
		return fmt.Errorf("decommission node %d: %w", id, err)
	}
	return nil
}
