package main

import (
	"context"
	"fmt"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/overview"
	"github.com/arbor-storage/arbor/internal/tract"
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
// nodes decommission ID`). A decommissioned node is given up for good: the
// TLT manager repairs its rows from the other members, so a row whose only
// complete copy is on it would lose what only it held. Unless acceptLoss,
// such rows (or a TLT that cannot be read to tell) refuse the command and
// nothing changes; `arbor tlt --wait` shows when they are in sync.
func decommissionNode(ctx context.Context, target clusterTarget, id uint64, acceptLoss bool) error {
	c, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		return fmt.Errorf("connect to the directory: %w", err)
	}
	defer c.Close()
	if !acceptLoss {
		if err := checkNoOnlyCopies(ctx, target, c, id); err != nil {
			return err
		}
	}
	if _, err := c.Decommission(ctx, &pb.DecommissionRequest{NodeId: id}); err != nil {
		return fmt.Errorf("decommission node %d: %w", id, err)
	}
	return nil
}

// checkNoOnlyCopies refuses to give node id up while a TLT row has its
// only complete copy there.
func checkNoOnlyCopies(ctx context.Context, target clusterTarget, c *directory.Client, id uint64) error {
	tc, err := tract.NewClient(tract.ClientConfig{Directory: c, DialOptions: target.DialOptions()})
	if err != nil {
		return err
	}
	defer tc.Close()
	v, err := overview.FetchTLT(ctx, c, tc)
	if err != nil {
		return fmt.Errorf("nothing changed: cannot tell whether TLT rows hold their only complete copy on node %d (%w); run again with --%s to decommission it anyway", id, err, acceptLossFlag)
	}
	if rows := v.RowsOnlyOn(id); len(rows) > 0 {
		return fmt.Errorf("nothing changed: %d TLT rows have their only complete copy on node %d (rows %v): decommissioning it now would lose what only it holds; wait until `arbor tlt` shows them in sync (`arbor tlt --wait`), or run again with --%s", len(rows), id, rows, acceptLossFlag)
	}
	return nil
}
