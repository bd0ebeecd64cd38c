package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/arbor-storage/arbor/internal/overview"
)

// NodeState is a node's state as the directory's failure detector sees it.
type NodeState string

const (
	// NodeAlive: heartbeating.
	NodeAlive NodeState = "alive"
	// NodeSuspect: heartbeats are late, not yet declared dead.
	NodeSuspect NodeState = "suspect"
	// NodeDead: silent past the timeout; its data is being re-replicated.
	NodeDead NodeState = "dead"
	// NodeDecommissioned: removed by an operator.
	NodeDecommissioned NodeState = "decommissioned"
)

// nodeStates lists the states in the order status summaries print them.
var nodeStates = []NodeState{NodeAlive, NodeSuspect, NodeDead, NodeDecommissioned}

// ClusterView is what `arbor status` and `arbor nodes` print: the
// directory's view of the cluster. fetchClusterView fills it.
type ClusterView struct {
	// Leader is the node leading the directory group; 0 if there is none.
	Leader uint64 `json:"leader"`
	// Voters are the directory group's voting members.
	Voters []uint64 `json:"voters"`
	// Nodes are all nodes the directory knows.
	Nodes []NodeView `json:"nodes"`
	// Degraded lists what needs attention, and parts of the cluster that
	// could not be read (internal/overview); only `arbor status` prints it.
	Degraded []overview.Problem `json:"degraded"`
	// Gateways are the cluster's NFS gateways and whether each answers.
	Gateways []overview.Gateway `json:"gateways"`
}

// NodeView is one node as the directory knows it.
type NodeView struct {
	ID      uint64    `json:"id"`
	Address string    `json:"address"`
	Domain  string    `json:"domain"`
	State   NodeState `json:"state"`
	Roles   []string  `json:"roles"`
}

// sorted returns a copy of v with voters and nodes in id order and nil
// lists made empty (JSON prints [] rather than null).
func (v ClusterView) sorted() ClusterView {
	out := ClusterView{Leader: v.Leader, Voters: slices.Clone(v.Voters), Nodes: slices.Clone(v.Nodes), Degraded: slices.Clone(v.Degraded),
		Gateways: slices.Clone(v.Gateways)}
	if out.Gateways == nil {
		out.Gateways = []overview.Gateway{}
	}
	slices.SortFunc(out.Gateways, func(a, b overview.Gateway) int { return cmp.Compare(a.Address, b.Address) })
	if out.Voters == nil {
		out.Voters = []uint64{}
	}
	if out.Nodes == nil {
		out.Nodes = []NodeView{}
	}
	if out.Degraded == nil {
		out.Degraded = []overview.Problem{}
	}
	slices.Sort(out.Voters)
	slices.SortFunc(out.Nodes, func(a, b NodeView) int { return cmp.Compare(a.ID, b.ID) })
	for i := range out.Nodes {
		if out.Nodes[i].Roles == nil {
			out.Nodes[i].Roles = []string{}
		}
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeStatusJSON prints the view as JSON.
func writeStatusJSON(w io.Writer, v ClusterView) error { return writeJSON(w, v.sorted()) }

// writeNodesJSON prints {"nodes": [...]}.
func writeNodesJSON(w io.Writer, v ClusterView) error {
	return writeJSON(w, struct {
		Nodes []NodeView `json:"nodes"`
	}{v.sorted().Nodes})
}

// writeStatus prints the view for people: a summary, what is degraded,
// then the node table.
func writeStatus(w io.Writer, v ClusterView) error {
	v = v.sorted()
	leader := "none"
	if v.Leader != 0 {
		leader = "node " + strconv.FormatUint(v.Leader, 10)
	}
	voters := make([]string, len(v.Voters))
	for i, id := range v.Voters {
		voters[i] = strconv.FormatUint(id, 10)
	}
	votersText := strings.Join(voters, ", ")
	if votersText == "" {
		votersText = "none"
	}
	count := map[NodeState]int{}
	for _, n := range v.Nodes {
		count[n.State]++
	}
	var summary []string
	for _, s := range nodeStates {
		if count[s] > 0 {
			summary = append(summary, fmt.Sprintf("%d %s", count[s], s))
		}
	}
	for _, n := range v.Nodes {
		if !slices.Contains(nodeStates, n.State) && count[n.State] > 0 {
			summary = append(summary, fmt.Sprintf("%d %s", count[n.State], n.State))
			count[n.State] = 0
		}
	}
	nodesText := strconv.Itoa(len(v.Nodes))
	if len(summary) > 0 {
		nodesText += " (" + strings.Join(summary, ", ") + ")"
	}
	if _, err := fmt.Fprintf(w, "directory leader: %s\ndirectory voters: %s\nnodes:            %s\n", leader, votersText, nodesText); err != nil {
		return err
	}
	if err := writeDegraded(w, v.Degraded); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	if err := writeNodeTable(w, v); err != nil {
		return err
	}
	if len(v.Gateways) > 0 {
		var gs []string
		for _, g := range v.Gateways {
			gs = append(gs, g.Address+" "+g.State)
		}
		if _, err := fmt.Fprintf(w, "\nnfs gateways: %s\n", strings.Join(gs, ", ")); err != nil {
			return err
		}
	}
	return nil
}

// writeDegraded prints "degraded: none", or "degraded:" and one problem a
// line.
func writeDegraded(w io.Writer, ps []overview.Problem) error {
	if len(ps) == 0 {
		_, err := fmt.Fprintln(w, "degraded: none")
		return err
	}
	var b strings.Builder
	b.WriteString("degraded:\n")
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s: %s\n", p.Subject, p.Message)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeNodes prints the node table alone.
func writeNodes(w io.Writer, v ClusterView) error { return writeNodeTable(w, v.sorted()) }

// writeNodeTable prints one row per node; DIRECTORY says "leader" or
// "voter" for directory members.
func writeNodeTable(w io.Writer, v ClusterView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tDOMAIN\tSTATE\tDIRECTORY\tROLES")
	for _, n := range v.Nodes {
		dir := "-"
		switch {
		case n.ID == v.Leader:
			dir = "leader"
		case slices.Contains(v.Voters, n.ID):
			dir = "voter"
		}
		roles := strings.Join(n.Roles, ",")
		if roles == "" {
			roles = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", n.ID, dash(n.Address), dash(n.Domain), dash(string(n.State)), dir, roles)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
