package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// forgetMemberWarning is what `arbor tlt forget-member` says before it acts.
const forgetMemberWarning = `WARNING: this gives the node up for good: it is decommissioned (it can never
register again; a machine that comes back must join under a new node id),
and every TLT row that waits for it is repaired from the best copy that
survives: the live member holding the most tracts of the row becomes its
primary, and the others copy from it. Tracts written to the row that only
the given-up node held completely are lost, and the other members drop
what the new primary does not hold. Do it only when the node's disks are
gone; while they may return, the rows are right to wait.
`

func newTLTForgetCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var accept bool
	cmd := &cobra.Command{
		Use:   "forget-member NODE",
		Short: "Give up a dead node that TLT rows wait for, repairing them from their best remaining copies (may lose writes)",
		Long: "A TLT row whose only complete copy is on a dead node waits for that node to return (arbor tlt\n" +
			"shows it under waiting_for). If the node will never return, this decommissions it, and the TLT\n" +
			"manager repairs those rows from the best copies that survive. Without --" + acceptLossFlag + "\n" +
			"it only prints the rows that wait for the node and changes nothing.\n\n" + forgetMemberWarning,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("node id %q is not a positive integer", args[0])
			}
			ctx, c, err := a.dialTract(cmd.Context(), &cf)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.dir.Status(ctx, &dpb.StatusRequest{})
			if err != nil {
				return fmt.Errorf("directory status: %w", err)
			}
			var node *dpb.Node
			for _, n := range st.Nodes {
				if n.Id == id {
					node = n
				}
			}
			switch {
			case node == nil:
				return fmt.Errorf("node %d is not in the cluster: nothing to forget", id)
			case node.State == dpb.NodeState_NODE_STATE_DECOMMISSIONED:
				fmt.Fprintf(a.stdout, "node %d is already decommissioned: no row waits for it\n", id)
				return nil
			case node.State != dpb.NodeState_NODE_STATE_DEAD:
				return fmt.Errorf("node %d is %s, not dead: only a node the directory declared dead can be given up (a live node is retired with `arbor nodes decommission`, after its rows have other complete copies)",
					id, strings.ToLower(strings.TrimPrefix(node.State.String(), "NODE_STATE_")))
			}
			v, err := fetchTLTView(ctx, c)
			if err != nil {
				return err
			}
			var rows []string
			prefix := strconv.FormatUint(id, 10) + "/"
			for _, r := range v.Rows {
				for _, s := range r.WaitingFor {
					if strings.HasPrefix(s, prefix) {
						rows = append(rows, fmt.Sprintf("%d (waiting for %s)", r.Row, strings.Join(r.WaitingFor, ", ")))
						break
					}
				}
			}
			if len(rows) == 0 {
				fmt.Fprintf(a.stdout, "node %d is dead; no TLT row waits for it (the manager repairs its rows from complete copies)\n", id)
			} else {
				fmt.Fprintf(a.stdout, "node %d is dead; %d TLT rows wait for it: %s\n", id, len(rows), strings.Join(rows, "; "))
			}
			fmt.Fprint(a.stdout, "\n"+forgetMemberWarning)
			if !accept {
				return fmt.Errorf("nothing changed: run again with --%s to give node %d up", acceptLossFlag, id)
			}
			if _, err := c.dir.Decommission(ctx, &dpb.DecommissionRequest{NodeId: id}); err != nil {
				return fmt.Errorf("decommission node %d: %w", id, err)
			}
			fmt.Fprintf(a.stdout, "node %d given up (decommissioned): the TLT manager repairs the rows that waited for it; `arbor tlt --wait` follows the repair\n", id)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&accept, acceptLossFlag, false, "give the node up, accepting that writes only it held completely are lost")
	return cmd
}
