package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/server"
)

// directoryRecoverWarning is what `arbor directory recover` says before it
// acts.
const directoryRecoverWarning = `WARNING: this makes this node's replica the directory's only voter. Changes
that only the lost peers held are lost for good (node registrations and
deaths, TLT rows, extent map, table delegations, file systems, configuration):
with a majority of the peers gone, an acknowledged change survives only if
this replica held it. Recover the most up-to-date survivor (highest last
term, then last index: run this without --yes-lose-unreplicated-writes on
each to compare). The lost peers must never come back with their old data:
if they are only cut off (a partition, not dead disks) they may still form
a quorum with newer changes, and recovering now would fork the directory.
Afterwards: start this node as before; it leads the directory alone. Start
each lost peer on a new, empty --data-dir with the same --node-id,
--directory-peers and --directory-join: the leader adds it as a learner and
promotes it to voter once it has caught up. Never start them without
--directory-join: peers with empty disks would bootstrap a second directory.
`

func newDirectoryCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "directory",
		Short: "Operate the directory group (the cluster's configuration service)",
	}
	cmd.AddCommand(newDirectoryRecoverCmd(a))
	return cmd
}

func newDirectoryRecoverCmd(a *app) *cobra.Command {
	var dataDir string
	var accept bool
	cmd := &cobra.Command{
		Use:   "recover --data-dir DIR",
		Short: "Recover a directory that lost its quorum from a stopped peer's replica (may lose changes)",
		Long: "Recover the directory group after a majority of its peers was lost for good (disks gone): on the\n" +
			"data dir of a STOPPED directory peer, make its replica the group's only voter, keeping every\n" +
			"entry it holds. Without --" + acceptLossFlag + " it only describes the replica (compare the\n" +
			"survivors with it) and changes nothing.\n\n" + directoryRecoverWarning,
		Example: "  arbor directory recover --data-dir /var/lib/arbor\n" +
			"  arbor directory recover --data-dir /var/lib/arbor --" + acceptLossFlag,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return errors.New("--data-dir is required: the data dir of the stopped directory peer to recover from")
			}
			r, rep, err := server.RecoverDirectoryOffline(dataDir, accept)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "directory replica of node %d (cluster %q) in %s: voters %v, learners %v; last entry %d of term %d; commit %d, applied %d, term %d\n",
				r.NodeID, r.ClusterID, r.DataDir, r.Voters, r.Learners, r.LastIndex, r.LastTerm, r.Commit, r.Applied, r.Term)
			if r.Alone() {
				fmt.Fprintf(a.stdout, "node %d is already the directory's only voter: nothing to recover; start it, and the lost peers with --directory-join\n", r.NodeID)
				return nil
			}
			if rep == nil {
				fmt.Fprintf(a.stdout, "plan: make node %d the directory's only voter (removing %v)\n\n", r.NodeID, others(r.NodeID, r.Voters, r.Learners))
				fmt.Fprint(a.stdout, directoryRecoverWarning)
				return fmt.Errorf("nothing changed: run again with --%s to recover the directory from node %d", acceptLossFlag, r.NodeID)
			}
			fmt.Fprint(a.stdout, directoryRecoverWarning)
			fmt.Fprintf(a.stdout, "\nrecovered: the directory now has node %d as its only voter (removed %v); kept its log through entry %d (it knew commits through %d), term %d",
				r.NodeID, rep.Removed, rep.LastIndex, rep.PreviousCommit, rep.Term)
			if rep.Neutralised > 0 {
				fmt.Fprintf(a.stdout, "; %d unapplied membership change(s) dropped", rep.Neutralised)
			}
			fmt.Fprintf(a.stdout, "\nnext: start node %d as before, then each lost peer on an empty --data-dir with --directory-join\n", r.NodeID)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "the stopped directory peer's data directory (its `arbor server --data-dir`)")
	cmd.Flags().BoolVar(&accept, acceptLossFlag, false, "recover, accepting that changes only the lost peers held are lost")
	return cmd
}

// others lists the members of sets besides self, once each.
func others(self uint64, sets ...[]uint64) []uint64 {
	var out []uint64
	for _, s := range sets {
		for _, id := range s {
			if id != self {
				out = append(out, id)
			}
		}
	}
	return out
}
