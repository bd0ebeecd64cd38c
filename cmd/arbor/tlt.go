package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/overview"
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
			ctx, c, err := a.dialTract(cmd.Context(), &f.cf)
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every row is in sync, as long as the cluster answers (--timeout bounds each poll)")
	cmd.Flags().BoolVar(&noRows, "no-rows", false, "print the summary and the tractservers, not every row")
	cmd.AddCommand(newTLTForgetCmd(a))
	return cmd
}

// The table's view is gathered by internal/overview, which the dashboard
// and `arbor status` share.
type (
	// TLTView is what `arbor tlt` prints.
	TLTView = overview.TLTView
	// ServerView is one tractserver.
	ServerView = overview.ServerView
	// RowView is one row of the table.
	RowView = overview.RowView
)

func fetchTLTView(ctx context.Context, c *tractClients) (TLTView, error) {
	return overview.FetchTLT(ctx, c.dir, c.tract)
}

// buildTLTView combines the table, the node table and the tractservers'
// statuses.
var buildTLTView = overview.BuildTLT

// waitInSync polls until no row is catching up, drawing the share of rows
// in sync and the bytes copied so far.
func waitInSync(ctx context.Context, c *tractClients, bar *progress) (TLTView, error) {
	start := time.Now()
	var startBytes uint64
	first := true
	for {
		v, err := fetchTLTView(ctx, c)
		if err == nil {
			stepDone(ctx) // an answer: recovery may take longer than --timeout
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
	if v.RowsWaiting > 0 {
		fmt.Fprintf(w, "%d rows wait for a dead member that holds their only complete copy: they are not repaired, and not writable, until it returns\n\n", v.RowsWaiting)
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
		if len(r.WaitingFor) > 0 {
			sync = "waiting for " + strings.Join(r.WaitingFor, " or ") + ": the only complete copy; " + sync
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", r.Row, r.Version, r.Slots[0], strings.Join(r.Slots[1:], " "), pending, sync)
	}
	return tw.Flush()
}
