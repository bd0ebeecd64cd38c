package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/extent"
)

// acceptLossFlag is the consent `arbor extent recover` needs before it
// changes anything.
const acceptLossFlag = "yes-lose-unreplicated-writes"

// recoverWarning is what `arbor extent recover` says before it acts.
const recoverWarning = `WARNING: this makes one surviving replica the extent's only voter. Writes
that only the lost replicas held are lost for good: with a majority of the
replicas gone, an acknowledged write survives only if the chosen replica
held it. The lost replicas must never come back with their old data: if
they are only cut off (a partition, not dead disks), they may still form a
quorum with newer writes, and recovering now would lose those and fork the
extent. The extent manager re-replicates the extent afterwards; a lost
replica that returns is removed as an orphan.
`

func newExtentRecoverCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var accept bool
	cmd := &cobra.Command{
		Use:   "recover ID",
		Short: "Recover an extent that lost its quorum from its most up-to-date surviving replica (may lose writes)",
		Long: "Recover an extent whose group lost a majority of its replicas for good (disks gone): the surviving\n" +
			"replica with the most up-to-date log becomes the group's only voter, the extent map lists it alone,\n" +
			"and the extent manager adds new replicas. Without --" + acceptLossFlag + " it only prints the plan.\n\n" + recoverWarning,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id < extent.FirstExtentID {
				return fmt.Errorf("extent id %q is not an extent id (%d or more)", args[0], extent.FirstExtentID)
			}
			target, ctx, cancel, err := cf.connect(cmd.Context(), a.getenv)
			if err != nil {
				return err
			}
			defer cancel()
			dir, cl, err := extentClients(target)
			if err != nil {
				return err
			}
			defer dir.Close()
			defer cl.Close()
			plan, err := cl.PlanRecovery(ctx, id)
			if err != nil {
				return fmt.Errorf("extent %d: %w", id, err)
			}
			fmt.Fprint(a.stdout, plan.String())
			switch {
			case plan.Chosen == 0:
				return fmt.Errorf("extent %d: no replica survives: nothing to recover from", id)
			case plan.Quorum:
				fmt.Fprintf(a.stdout, "extent %d has a majority of its voters alive (%v of %v): nothing to recover; raft and the extent manager repair it without loss\n",
					id, plan.Survivors, plan.Voters)
				return nil
			}
			fmt.Fprintf(a.stdout, "plan: recover extent %d from node %d (the most up-to-date of survivors %v)\n\n", id, plan.Chosen, plan.Survivors)
			fmt.Fprint(a.stdout, recoverWarning)
			if !accept {
				return fmt.Errorf("nothing changed: run again with --%s to recover extent %d from node %d", acceptLossFlag, id, plan.Chosen)
			}
			resp, e, err := cl.RecoverExtent(ctx, plan, dir)
			if resp != nil {
				writeRecovered(a.stdout, id, resp)
			}
			if err != nil {
				return fmt.Errorf("extent %d: %w", id, err)
			}
			fmt.Fprintf(a.stdout, "extent map: extent %d replicas %v at epoch %d; the extent manager adds the others\n", id, e.Replicas, e.Epoch)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&accept, acceptLossFlag, false, "recover, accepting that writes only the lost replicas held are lost")
	return cmd
}

func writeRecovered(w io.Writer, id uint64, r interface {
	GetNodeId() uint64
	GetRemovedVoters() []uint64
	GetPreviousCommit() uint64
	GetLastIndex() uint64
	GetTerm() uint64
}) {
	fmt.Fprintf(w, "recovered: extent %d now has node %d as its only voter (removed %v); kept its log through entry %d (it knew commits through %d), term %d\n",
		id, r.GetNodeId(), r.GetRemovedVoters(), r.GetLastIndex(), r.GetPreviousCommit(), r.GetTerm())
}
