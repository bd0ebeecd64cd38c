package main

import (
	"context"
	"fmt"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/overview"
)

// The two functions in this file are where the CLI meets the directory
// group (internal/directory).

// fetchClusterView gathers what `arbor status` and `arbor nodes` print
// (internal/overview): the directory's view of the nodes, from the leader
// or, if none answers, from whichever member does, and what is degraded
// across the cluster. Parts that cannot be read within their own bound
// show as degraded; only a directory that no member answers for is an
// error.
func fetchClusterView(ctx context.Context, target clusterTarget) (ClusterView, error) {
	o, err := overview.Gather(ctx, target.Addrs, target.DialOptions()...)
	if err != nil {
		return ClusterView{}, err
	}
	return viewOf(o), nil
}

// viewOf is the part of an overview that status and nodes print.
func viewOf(o overview.Overview) ClusterView {
	v := ClusterView{Leader: o.Directory.Leader, Voters: o.Directory.Voters, Degraded: o.Degraded, Gateways: o.Gateways}
	for _, n := range o.Nodes {
		v.Nodes = append(v.Nodes, NodeView{ID: n.ID, Address: n.Address, Domain: n.Domain, State: NodeState(n.State), Roles: n.Roles})
	}
	return v
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
