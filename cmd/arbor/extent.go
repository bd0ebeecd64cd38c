package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/overview"
)

// extentReplicaTimeout bounds the question to one replica about its
// extent's leader.
const extentReplicaTimeout = overview.ExtentReplicaTimeout

// ExtentView is one extent as `arbor extent list` prints it (gathered by
// internal/overview, which the dashboard and `arbor status` share).
type ExtentView = overview.ExtentView

// ExtentDetail is what `arbor extent show ID` prints.
type ExtentDetail struct {
	ExtentView
	PageSizeBytes   uint32 `json:"page_size_bytes"`
	BlockSizeBytes  uint32 `json:"block_size_bytes"`
	ExtentSizeBytes uint64 `json:"extent_size_bytes"`
	// The rest comes from the leader; empty when none answered (Error says
	// why).
	Term            uint64       `json:"term"`
	Voters          []uint64     `json:"voters"`
	Learners        []uint64     `json:"learners"`
	AppliedIndex    uint64       `json:"applied_index"`
	PagesUsed       uint64       `json:"pages_used"`
	BlocksAllocated uint64       `json:"blocks_allocated"`
	PendingTxns     uint64       `json:"pending_txns"`
	Pending         []PendingTxn `json:"pending"`
	Error           string       `json:"error,omitempty"`
}

// PendingTxn is a cross-extent transaction with a PREPARED or DECIDED
// record in the extent.
type PendingTxn struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Prev   uint64 `json:"prev_extent"`
	Next   uint64 `json:"next_extent"`
	Expiry string `json:"expiry"`
}

func newExtentCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "extent",
		Short: "Inspect the extent store (replicated arrays of pages under the B-tree)",
	}
	var lcf clusterFlags
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List every extent: replicas, replication, leader, epoch",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, ctx, cancel, err := lcf.connect(cmd.Context(), a.getenv)
			if err != nil {
				return err
			}
			defer cancel()
			views, err := fetchExtentViews(ctx, target)
			if err != nil {
				return fmt.Errorf("list extents of %v: %w", target.Addrs, err)
			}
			if asJSON {
				return writeExtentsJSON(a.stdout, views)
			}
			return writeExtents(a.stdout, views)
		},
	}
	lcf.register(list)
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON: [{\"id\", \"replicas\", \"replication\", \"leader\", \"epoch\"}...]")

	var scf clusterFlags
	var showJSON bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one extent: replicas, leader, epoch, geometry, pages used, pending transactions",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("extent id %q is not a positive integer", args[0])
			}
			target, ctx, cancel, err := scf.connect(cmd.Context(), a.getenv)
			if err != nil {
				return err
			}
			defer cancel()
			d, err := fetchExtentDetail(ctx, target, id)
			if err != nil {
				return fmt.Errorf("extent %d: %w", id, err)
			}
			if showJSON {
				return writeJSON(a.stdout, d.sorted())
			}
			return writeExtentDetail(a.stdout, d)
		},
	}
	scf.register(show)
	show.Flags().BoolVar(&showJSON, "json", false, "print JSON")
	cmd.AddCommand(list, show, newExtentRecoverCmd(a))
	return cmd
}

// extentClients connects to the cluster's directory and extent store.
func extentClients(target clusterTarget) (*directory.Client, *extent.Client, error) {
	dir, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the directory: %w", err)
	}
	cl, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: target.DialOptions(), CallTimeout: extentReplicaTimeout})
	if err != nil {
		dir.Close()
		return nil, nil, err
	}
	return dir, cl, nil
}

// fetchExtentViews reads the extent map and asks the replicas of every
// extent, in parallel, who leads it.
func fetchExtentViews(ctx context.Context, target clusterTarget) ([]ExtentView, error) {
	dir, cl, err := extentClients(target)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	defer cl.Close()
	return overview.FetchExtents(ctx, cl)
}

// fetchExtentDetail reads one extent's map entry and asks its leader
// (through any replica) for its linearizable state.
func fetchExtentDetail(ctx context.Context, target clusterTarget, id uint64) (ExtentDetail, error) {
	dir, cl, err := extentClients(target)
	if err != nil {
		return ExtentDetail{}, err
	}
	defer dir.Close()
	defer cl.Close()
	e, err := dir.GetExtent(ctx, &dpb.GetExtentRequest{ExtentId: id})
	if err != nil {
		return ExtentDetail{}, err
	}
	g := e.GetGeometry()
	d := ExtentDetail{
		ExtentView:    ExtentView{ID: id, Replicas: e.Replicas, Replication: g.GetReplication(), Epoch: e.Epoch},
		PageSizeBytes: g.GetPageSizeBytes(), BlockSizeBytes: g.GetBlockSizeBytes(), ExtentSizeBytes: g.GetExtentSizeBytes(),
	}
	ictx, cancel := context.WithTimeout(ctx, 2*extentReplicaTimeout)
	defer cancel()
	info, err := cl.Info(ictx, id)
	if err != nil {
		d.Error = err.Error()
		d.Leader = overview.LeaderOf(ctx, cl, id, e.Replicas)
		return d, nil
	}
	d.Leader, d.Term, d.Voters, d.Learners = info.LeaderId, info.Term, info.Voters, info.Learners
	m := info.GetMeta()
	d.AppliedIndex, d.PagesUsed, d.BlocksAllocated, d.PendingTxns = m.GetAppliedIndex(), m.GetPagesUsed(), m.GetBlocksAllocated(), m.GetPendingTxns()
	for _, t := range info.Pending {
		d.Pending = append(d.Pending, PendingTxn{
			ID: fmt.Sprintf("%016x", t.TxnId), State: strings.ToLower(strings.TrimPrefix(t.State.String(), "TXN_STATE_")),
			Prev: t.PrevExtent, Next: t.NextExtent, Expiry: time.UnixMilli(t.ExpiryUnixMs).UTC().Format(time.RFC3339Nano),
		})
	}
	return d, nil
}

// sortedExtents returns views by id with empty lists instead of nil.
func sortedExtents(views []ExtentView) []ExtentView {
	out := slices.Clone(views)
	if out == nil {
		out = []ExtentView{}
	}
	slices.SortFunc(out, func(a, b ExtentView) int { return cmp.Compare(a.ID, b.ID) })
	for i := range out {
		if out[i].Replicas == nil {
			out[i].Replicas = []uint64{}
		}
	}
	return out
}

func (d ExtentDetail) sorted() ExtentDetail {
	d.ExtentView = sortedExtents([]ExtentView{d.ExtentView})[0]
	for _, l := range []*[]uint64{&d.Voters, &d.Learners} {
		*l = slices.Clone(*l)
		if *l == nil {
			*l = []uint64{}
		}
		slices.Sort(*l)
	}
	if d.Pending == nil {
		d.Pending = []PendingTxn{}
	}
	return d
}

// writeExtentsJSON prints [{"id", "replicas", "replication", "leader", "epoch"}...].
func writeExtentsJSON(w io.Writer, views []ExtentView) error {
	return writeJSON(w, sortedExtents(views))
}

func idList(ids []uint64) string {
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ",")
}

func nodeOrNone(id uint64) string {
	if id == 0 {
		return "none"
	}
	return strconv.FormatUint(id, 10)
}

// writeExtents prints one row per extent.
func writeExtents(w io.Writer, views []ExtentView) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREPLICAS\tREPLICATION\tLEADER\tEPOCH")
	for _, v := range sortedExtents(views) {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\n", v.ID, idList(v.Replicas), v.Replication, nodeOrNone(v.Leader), v.Epoch)
	}
	return tw.Flush()
}

// writeExtentDetail prints one extent for people.
func writeExtentDetail(w io.Writer, d ExtentDetail) error {
	d = d.sorted()
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "extent:\t%d\n", d.ID)
	fmt.Fprintf(tw, "replicas:\t%s (epoch %d, replication %d)\n", idList(d.Replicas), d.Epoch, d.Replication)
	leader := nodeOrNone(d.Leader)
	if d.Leader != 0 && d.Term != 0 {
		leader = fmt.Sprintf("node %d (term %d)", d.Leader, d.Term)
	}
	fmt.Fprintf(tw, "leader:\t%s\n", leader)
	fmt.Fprintf(tw, "geometry:\t%d B pages, %d B blocks, %d B extent\n", d.PageSizeBytes, d.BlockSizeBytes, d.ExtentSizeBytes)
	if d.Error != "" {
		fmt.Fprintf(tw, "state:\tunavailable: %s\n", d.Error)
		return tw.Flush()
	}
	fmt.Fprintf(tw, "voters:\t%s\n", idList(d.Voters))
	fmt.Fprintf(tw, "learners:\t%s\n", idList(d.Learners))
	fmt.Fprintf(tw, "applied index:\t%d\n", d.AppliedIndex)
	fmt.Fprintf(tw, "pages used:\t%d\n", d.PagesUsed)
	fmt.Fprintf(tw, "blocks allocated:\t%d\n", d.BlocksAllocated)
	fmt.Fprintf(tw, "pending transactions:\t%d\n", d.PendingTxns)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.Pending) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TXN\tSTATE\tPREV\tNEXT\tEXPIRES")
	for _, p := range d.Pending {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.ID, p.State, nodeOrNone(p.Prev), nodeOrNone(p.Next), p.Expiry)
	}
	return tw.Flush()
}
