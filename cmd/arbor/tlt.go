package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// tltWaitPoll is how often `arbor tlt --wait` looks again.
const tltWaitPoll = 500 * time.Millisecond

func newTLTCmd(a *app) *cobra.Command {
	var f transferFlags
	var asJSON, wait, noRows bool
	cmd := &cobra.Command{
		Use:   "tlt",
		Short: "Show the tract locator table and the state of every tractserver",
		Long: `Show the tract locator table (FDS): each row's version, primary, replicas and
pending entries, whether every member is in sync, and per tractserver its
slots, stored tracts and rows it is catching up. With --wait, first wait
(with a progress bar) until no row is catching up: recovery and growth have
finished.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mode, err := f.mode()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			c, err := a.dialTract(&f.cf)
			if err != nil {
				return err
			}
			defer c.Close()
			var v TLTView
			if wait {
				v, err = waitInSync(ctx, c, newProgress(a.stderr, mode, "recovery", 0, false))
			} else {
				v, err = fetchTLTView(ctx, c)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, v)
			}
			return writeTLT(a.stdout, v, !noRows)
		},
	}
	f.register(cmd)
	f.timeout = defaultClientTimeout
	cmd.Flags().Lookup("timeout").DefValue = defaultClientTimeout.String()
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every row is in sync (raise --timeout for long recoveries)")
	cmd.Flags().BoolVar(&noRows, "no-rows", false, "print the summary and the tractservers, not every row")
	return cmd
}

// TLTView is what `arbor tlt` prints.
type TLTView struct {
	Version     uint64       `json:"version"`
	Replication int          `json:"replication"`
	TractSize   int          `json:"tract_size"`
	Servers     []ServerView `json:"servers"`
	Rows        []RowView    `json:"rows"`
	// RowsCatchingUp counts rows with a member or pending entry not in
	// sync (or whose state could not be read).
	RowsCatchingUp int `json:"rows_catching_up"`
	// RecoveredBytes is the total copied by catch-ups on the nodes that
	// answered, since they started.
	RecoveredBytes uint64 `json:"recovered_bytes"`
}

// ServerView is one tractserver.
type ServerView struct {
	Server     string `json:"server"`
	Address    string `json:"address"`
	Domain     string `json:"domain"`
	State      string `json:"state"`
	Slots      int    `json:"slots"`
	Primary    int    `json:"primary"`
	Pending    int    `json:"pending"`
	Tracts     uint64 `json:"tracts"`
	Bytes      uint64 `json:"bytes"`
	CatchingUp int    `json:"catching_up"`
	Error      string `json:"error,omitempty"`
}

// RowView is one row of the table.
type RowView struct {
	Row     int      `json:"row"`
	Version uint64   `json:"version"`
	Slots   []string `json:"slots"`
	Pending []string `json:"pending"`
	// Behind lists members not in sync, with their catch-up progress.
	Behind []string `json:"behind"`
}

func fetchTLTView(ctx context.Context, c *tractClients) (TLTView, error) {
	t, err := c.tract.RefreshTLT(ctx)
	if err != nil {
		return TLTView{}, err
	}
	nodes, err := c.dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return TLTView{}, fmt.Errorf("list nodes: %w", err)
	}
	byID := map[uint64]*dpb.Node{}
	for _, n := range nodes.Nodes {
		byID[n.Id] = n
	}
	statuses := map[uint64]*tpb.StatusResponse{}
	errs := map[uint64]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Only this loop reads asked; the goroutines write statuses under mu.
	asked := map[uint64]bool{}
	for _, s := range t.Servers() {
		if asked[s.Node] {
			continue
		}
		asked[s.Node] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			st, err := c.tract.NodeStatus(sctx, s.Node, true)
			cancel()
			mu.Lock()
			statuses[s.Node], errs[s.Node] = st, err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return buildTLTView(t, byID, statuses, errs), nil
}

// buildTLTView combines the table, the node table and the tractservers'
// statuses.
func buildTLTView(t *tract.Table, nodes map[uint64]*dpb.Node, statuses map[uint64]*tpb.StatusResponse, errs map[uint64]error) TLTView {
	v := TLTView{Version: t.Version, Replication: t.Replication, TractSize: t.TractSize}
	type key struct {
		row int
		s   tract.ServerID
	}
	rowStatus := map[key]*tpb.RowStatus{}
	disk := map[tract.ServerID]*tpb.DiskStatus{}
	for node, st := range statuses {
		if st == nil {
			continue
		}
		for _, d := range st.Disks {
			s := tract.ServerID{Node: node, Disk: d.Disk}
			disk[s] = d
			v.RecoveredBytes += d.RecoveredBytes
			for _, r := range d.Rows {
				rowStatus[key{int(r.Row), s}] = r
			}
		}
	}
	servers := map[tract.ServerID]*ServerView{}
	view := func(s tract.ServerID) *ServerView {
		if sv := servers[s]; sv != nil {
			return sv
		}
		sv := &ServerView{Server: s.String(), State: "unknown"}
		if n := nodes[s.Node]; n != nil {
			sv.Address, sv.Domain, sv.State = n.Address, n.FailureDomain, directory.StateName(n.State)
		}
		if d := disk[s]; d != nil {
			sv.Tracts, sv.Bytes = d.Tracts, d.Bytes
		} else if err := errs[s.Node]; err != nil {
			sv.Error = err.Error()
		}
		servers[s] = sv
		return sv
	}
	inSync := func(ri int, s tract.ServerID) (bool, string) {
		st := rowStatus[key{ri, s}]
		switch {
		case st == nil:
			return false, s.String() + " (no status)"
		case st.Version != t.Rows[ri].Version:
			return false, fmt.Sprintf("%s (at version %d)", s, st.Version)
		case !st.InSync:
			return false, fmt.Sprintf("%s (%d tracts, %s copied)", s, st.CopiedTracts, humanBytes(int64(st.CopiedBytes)))
		}
		return true, ""
	}
	for ri, r := range t.Rows {
		rv := RowView{Row: ri, Version: r.Version, Slots: []string{}, Pending: []string{}, Behind: []string{}}
		for j, s := range r.Slots {
			rv.Slots = append(rv.Slots, s.String())
			sv := view(s)
			sv.Slots++
			if j == 0 {
				sv.Primary++
			}
			if ok, why := inSync(ri, s); !ok {
				rv.Behind = append(rv.Behind, why)
				sv.CatchingUp++
			}
		}
		for _, p := range r.Pending {
			rv.Pending = append(rv.Pending, fmt.Sprintf("%d:%s", p.Slot, p.Server))
			sv := view(p.Server)
			sv.Pending++
			if ok, why := inSync(ri, p.Server); !ok {
				rv.Behind = append(rv.Behind, why)
				sv.CatchingUp++
			}
		}
		if len(rv.Behind) > 0 {
			v.RowsCatchingUp++
		}
		v.Rows = append(v.Rows, rv)
	}
	ids := make([]tract.ServerID, 0, len(servers))
	for s := range servers {
		ids = append(ids, s)
	}
	sort.Slice(ids, func(i, j int) bool {
		return ids[i].Node < ids[j].Node || ids[i].Node == ids[j].Node && ids[i].Disk < ids[j].Disk
	})
	v.Servers = []ServerView{}
	for _, s := range ids {
		v.Servers = append(v.Servers, *servers[s])
	}
	return v
}

// waitInSync polls until no row is catching up, drawing the share of rows
// in sync and the bytes copied so far.
func waitInSync(ctx context.Context, c *tractClients, bar *progress) (TLTView, error) {
	start := time.Now()
	var startBytes uint64
	first := true
	for {
		v, err := fetchTLTView(ctx, c)
		if err == nil {
			if first {
				startBytes, first = v.RecoveredBytes, false
			}
			copied := int64(0)
			if v.RecoveredBytes > startBytes {
				copied = int64(v.RecoveredBytes - startBytes)
			}
			bar.Set(int64(len(v.Rows)-v.RowsCatchingUp), int64(len(v.Rows)),
				fmt.Sprintf("rows in sync, %s copied, %v", humanBytes(copied), time.Since(start).Round(time.Second)))
			if v.RowsCatchingUp == 0 {
				bar.Finish()
				return v, nil
			}
		}
		select {
		case <-ctx.Done():
			bar.Finish()
			if err != nil {
				return TLTView{}, fmt.Errorf("waiting for the rows to be in sync: %w (last error: %v)", ctx.Err(), err)
			}
			return TLTView{}, fmt.Errorf("waiting for the rows to be in sync: %w", ctx.Err())
		case <-time.After(tltWaitPoll):
		}
	}
}

// writeTLT prints the view for people.
func writeTLT(w io.Writer, v TLTView, rows bool) error {
	fmt.Fprintf(w, "TLT version %d: %d rows, %d replicas per row, tract size %s\n",
		v.Version, len(v.Rows), v.Replication, humanBytes(int64(v.TractSize)))
	if v.RowsCatchingUp == 0 {
		fmt.Fprintf(w, "every row in sync (%s copied by catch-ups since the nodes started)\n\n", humanBytes(int64(v.RecoveredBytes)))
	} else {
		fmt.Fprintf(w, "%d rows catching up (%s copied so far)\n\n", v.RowsCatchingUp, humanBytes(int64(v.RecoveredBytes)))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tADDRESS\tDOMAIN\tSTATE\tSLOTS\tPRIMARY\tPENDING\tTRACTS\tBYTES\tCATCHING UP")
	for _, s := range v.Servers {
		tracts, bytes := fmt.Sprint(s.Tracts), humanBytes(int64(s.Bytes))
		if s.Error != "" {
			tracts, bytes = "?", "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\n", s.Server, dash(s.Address), dash(s.Domain), s.State,
			s.Slots, s.Primary, s.Pending, tracts, bytes, s.CatchingUp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !rows {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROW\tVERSION\tPRIMARY\tREPLICAS\tPENDING\tSYNC")
	for _, r := range v.Rows {
		pending := "-"
		if len(r.Pending) > 0 {
			pending = strings.Join(r.Pending, " ")
		}
		sync := "ok"
		if len(r.Behind) > 0 {
			sync = "catching up: " + strings.Join(r.Behind, ", ")
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", r.Row, r.Version, r.Slots[0], strings.Join(r.Slots[1:], " "), pending, sync)
	}
	return tw.Flush()
}
