package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/meta"
	"github.com/arbor-storage/arbor/internal/overview"
)

// newTableList computes what `arbor table list --json` prints: the tables
// and their balance (internal/overview, which the dashboard shares).
var newTableList = overview.NewTableList

func newTableCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "table",
		Short: "List, move and split the file systems' metadata tables",
		Long: `A file system's metadata is cut into tables, ranges of directory ids, each
served by one metadata server under a lease (Ursa Minor). Moving a table
hands it to another server without copying anything; splitting one cuts its
range in two. Tables also move when their server dies, and hot or large
ones split on their own.`,
	}
	var listF, moveF, splitF clusterFlags
	var moveProgress string
	var asJSON bool
	var fsName string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tables: file system, range, owner, epoch, inodes, recent load",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.fsCommand(cmd, &listF, func(ctx context.Context, c *client.Cluster) error {
				var f uint64
				if fsName != "" {
					rec, err := c.FileSystem(ctx, fsName)
					if err != nil {
						return err
					}
					f = rec.GetNumber()
				}
				ts, err := c.Meta().Tables(ctx, f)
				if err != nil {
					return err
				}
				servers, err := metaServers(ctx, c)
				if err != nil {
					return err
				}
				l := newTableList(ts, servers)
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(l)
				}
				w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "TABLE\tFS\tRANGE\tOWNER\tEPOCH\tINODES\tOPS/S\tCREATES/S")
				for _, t := range l.Tables {
					inodes, ops, creates := "?", "?", "?"
					if t.Reported {
						inodes = strconv.FormatUint(t.Inodes, 10)
						ops, creates = fmt.Sprintf("%.1f", t.OpsPerSec), fmt.Sprintf("%.1f", t.CreatesPerSec)
					}
					fmt.Fprintf(w, "%d\t%d\t[%s, %s)\t%d\t%d\t%s\t%s\t%s\n", t.Table, t.FileSystem, t.Lo, t.Hi, t.Owner, t.Epoch, inodes, ops, creates)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "balance (coefficient of variation): inodes %.3f over tables, %.3f over servers; load %.3f over tables, %.3f over servers\n",
					l.InodesCVTables, l.InodesCVNodes, l.LoadCVTables, l.LoadCVNodes)
				return nil
			})
		},
	}
	listF.register(list)
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().StringVar(&fsName, "fs", "", "only this file system's tables")
	move := &cobra.Command{
		Use:   "move TABLE NODE",
		Short: "Hand a table to another metadata server (no data is copied)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("table %q: want a table number (arbor table list shows them)", args[0])
			}
			node, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || node == 0 {
				return fmt.Errorf("node %q: want a node id (arbor nodes shows them)", args[1])
			}
			return a.fsCommand(cmd, &moveF, func(ctx context.Context, c *client.Cluster) error {
				var epoch uint64
				err := a.longJobWatched(ctx, moveProgress, "move", func(w meta.Watch) (err error) {
					epoch, err = c.Meta().MoveTableWatch(ctx, id, node, w)
					return err
				})
				if err != nil {
					return fmt.Errorf("move table %d to node %d: %w", id, node, err)
				}
				fmt.Fprintf(a.stdout, "moved table %d to node %d (epoch %d)\n", id, node, epoch)
				return nil
			})
		},
	}
	moveF.register(move)
	move.Flags().StringVar(&moveProgress, "progress", "auto", progressUsage)
	split := &cobra.Command{
		Use:   "split TABLE [AT]",
		Short: "Cut a table in two (at directory id AT, or where its owner chooses)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("table %q: want a table number (arbor table list shows them)", args[0])
			}
			var at uint64
			if len(args) == 2 {
				if at, err = strconv.ParseUint(args[1], 0, 64); err != nil || at == 0 {
					return fmt.Errorf("directory id %q: want a non-zero number (0x... for hex)", args[1])
				}
			}
			return a.fsCommand(cmd, &splitF, func(ctx context.Context, c *client.Cluster) error {
				nt, start, err := c.Meta().SplitTable(ctx, id, at)
				if err != nil {
					return fmt.Errorf("split table %d: %w", id, err)
				}
				fmt.Fprintf(a.stdout, "split table %d at %#x: table %d now holds [%#x, ...)\n", id, start, nt, start)
				return nil
			})
		},
	}
	splitF.register(split)
	cmd.AddCommand(list, move, split)
	return cmd
}

// metaServers returns the live metadata servers' node ids.
func metaServers(ctx context.Context, c *client.Cluster) ([]uint64, error) {
	return c.Meta().Servers(ctx)
}
