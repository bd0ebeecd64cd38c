package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func newStatusCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the directory leader, voters and every node",
		Long: `Show the cluster as the directory sees it: the directory group's leader and
voters, and every node with its address, failure domain, state (alive,
suspect, dead, decommissioned) and roles.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			view, err := a.clusterView(cmd.Context(), &cf, cf.timeout)
			if err != nil {
				return err
			}
			if asJSON {
				return writeStatusJSON(a.stdout, view)
			}
			return writeStatus(a.stdout, view)
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newNodesCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			view, err := a.clusterView(cmd.Context(), &cf, cf.timeout)
			if err != nil {
				return err
			}
			if asJSON {
				return writeNodesJSON(a.stdout, view)
			}
			return writeNodes(a.stdout, view)
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var dcf clusterFlags
	var acceptLoss bool
	decommission := &cobra.Command{
		Use:   "decommission ID",
		Short: "Take a node out of the cluster for good",
		Long: "Takes a node out of the cluster for good: it can never register again, and the TLT manager\n" +
			"moves its rows to other tractservers, which copy from the rows' other members. It refuses (and\n" +
			"changes nothing) while a TLT row has its only complete copy on the node, unless --" + acceptLossFlag + ".",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("node id %q is not a positive integer", args[0])
			}
			target, err := dcf.resolve(a.getenv)
			if err != nil {
				return err
			}
			ctx, cancel := withStallTimeout(cmd.Context(), dcf.timeout)
			defer cancel()
			if err := a.decommission(ctx, target, id, acceptLoss); err != nil {
				return fmt.Errorf("decommission node %d: %w", id, err)
			}
			fmt.Fprintf(a.stdout, "node %d is being decommissioned\n", id)
			return nil
		},
	}
	dcf.register(decommission)
	decommission.Flags().BoolVar(&acceptLoss, acceptLossFlag, false, "decommission even if TLT rows hold their only complete copy on the node (losing what only it holds)")
	cmd.AddCommand(decommission)
	return cmd
}

// clusterView finds the cluster and fetches its view within timeout.
func (a *app) clusterView(ctx context.Context, cf *clusterFlags, timeout time.Duration) (ClusterView, error) {
	target, err := cf.resolve(a.getenv)
	if err != nil {
		return ClusterView{}, err
	}
	ctx, cancel := withStallTimeout(ctx, timeout)
	defer cancel()
	view, err := a.fetchView(ctx, target)
	if err != nil {
		return ClusterView{}, fmt.Errorf("cluster status from %v: %w", target.Addrs, err)
	}
	return view, nil
}
