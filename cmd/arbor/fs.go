package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/meta"
	mpb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
)

// The file-system commands are clients of the metadata servers (through
// internal/client): file systems, snapshots and fsck are requests to
// them; a mount asks them for metadata and reads and writes tracts itself.
// Every file system's metadata lives in the cluster's system B-tree
// (kv.SystemSpace), which only nodes and administrators can reach and the
// kv commands never open.

// dialCluster connects to the cluster a command targets.
func dialCluster(target clusterTarget, logger *slog.Logger) (*client.Cluster, error) {
	return client.Dial(client.Options{Addrs: target.Addrs, ClusterID: target.ClusterID, Credentials: target.Credentials, Logger: logger})
}

// createFS creates the file system name with the given data layout (""
// the tract store's default), or finds it if it exists. The metadata
// client checks the name (meta.CheckFileSystemName), the metadata server
// the layout (against the cluster's failure domains).
func createFS(ctx context.Context, c *client.Cluster, name, layout, tenant string) (*dpb.FileSystem, bool, error) {
	_, created, err := c.Meta().CreateTenantFileSystem(ctx, name, layout, tenant)
	if err != nil {
		return nil, false, fmt.Errorf("create file system %q: %w", name, err)
	}
	f, err := c.FileSystem(ctx, name)
	return f, created, err
}

// fsCommand runs fn with a connection to the cluster, its waits bounded
// by --timeout (policy.go).
func (a *app) fsCommand(cmd *cobra.Command, cf *clusterFlags, fn func(ctx context.Context, c *client.Cluster) error) error {
	target, ctx, cancel, err := cf.connect(cmd.Context(), a.getenv)
	if err != nil {
		return err
	}
	defer cancel()
	c, err := dialCluster(target, a.logger)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// dataLayoutName is how a file system's data layout is shown: "-" for
// the tract store's default replication.
func dataLayoutName(f *dpb.FileSystem) string {
	if f.GetDataLayout() == "" {
		return "-"
	}
	return f.GetDataLayout()
}

func newFSCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fs",
		Short: "Create, list and delete file systems",
		Long: `Manage the cluster's file systems. Each has a name and a number; its
metadata lives in the cluster's B-tree and its files' bytes in the tract
store. Mount one with arbor mount.`,
	}
	var createF, listF, deleteF clusterFlags
	var listJSON bool
	var deleteProgress, dataLayout, tenant string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a file system",
		Long: `Create a file system. --data sets the layout of its files' data: each
new file's blob is replicas:K or ec:D+P (Reed-Solomon, e.g. ec:5+2: 1.4
bytes stored per byte, any 2 shards lost); metadata, and small files kept
inline in it, stay replicated. A cluster whose TLT rows have fewer than
D+P tractservers in distinct failure domains refuses ec:D+P.

--tenant T makes the file system tenant T's (issue 15): only T's
credentials (and administrators) can mount, snapshot, check or delete
it, and only T's listings show it. An administrator creates for any
existing tenant (without --tenant: a file system of the cluster's own,
which no tenant reaches); a tenant's credential creates only its own
(--tenant may be omitted or name itself).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Refused before reaching for the cluster.
			if err := meta.CheckFileSystemName(args[0]); err != nil {
				return fmt.Errorf("create file system: %w", err)
			}
			if dataLayout != "" {
				l, err := tract.ParseLayout(dataLayout)
				if err != nil {
					return fmt.Errorf("create file system: --data: %w", err)
				}
				dataLayout = l.String()
			}
			if tenant != "" {
				if err := security.CheckName(tenant); err != nil {
					return fmt.Errorf("create file system: --tenant: %w", err)
				}
			}
			return a.fsCommand(cmd, &createF, func(ctx context.Context, c *client.Cluster) error {
				if err := checkTenantExists(ctx, c, tenant); err != nil {
					return fmt.Errorf("create file system: %w", err)
				}
				f, created, err := createFS(ctx, c, args[0], dataLayout, tenant)
				if err != nil {
					return err
				}
				if !created {
					return fmt.Errorf("file system %q exists (number %d)", f.GetName(), f.GetNumber())
				}
				if f.GetDataLayout() != "" {
					fmt.Fprintf(a.stdout, "created file system %q (number %d, data %s)\n", f.GetName(), f.GetNumber(), f.GetDataLayout())
					return nil
				}
				fmt.Fprintf(a.stdout, "created file system %q (number %d)\n", f.GetName(), f.GetNumber())
				return nil
			})
		},
	}
	createF.register(create)
	create.Flags().StringVar(&dataLayout, "data", "", "layout of the files' data: replicas:K or ec:D+P (default: the tract store's replication)")
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant that owns the file system (default: a tenant credential's own; an administrator's: none)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the file systems",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, ctx, cancel, err := listF.connect(cmd.Context(), a.getenv)
			if err != nil {
				return err
			}
			defer cancel()
			dir, err := directory.Dial(target.Addrs, target.DialOptions()...)
			if err != nil {
				return fmt.Errorf("connect to the directory: %w", err)
			}
			defer dir.Close()
			resp, err := dir.ListFileSystems(ctx, &dpb.ListFileSystemsRequest{})
			if err != nil {
				return fmt.Errorf("list file systems: %w", err)
			}
			if listJSON {
				type row struct {
					Number    uint64   `json:"number"`
					Name      string   `json:"name"`
					Created   string   `json:"created"`
					Snapshots []string `json:"snapshots"`
					Data      string   `json:"data"`   // "": the tract store's default
					Tenant    string   `json:"tenant"` // "": the cluster's own
				}
				rows := []row{}
				for _, f := range resp.GetFileSystems() {
					r := row{Number: f.GetNumber(), Name: f.GetName(), Created: time.UnixMilli(f.GetCreatedUnixMs()).UTC().Format(time.RFC3339), Snapshots: []string{},
						Data: f.GetDataLayout(), Tenant: f.GetTenant()}
					for _, s := range f.GetSnapshots() {
						r.Snapshots = append(r.Snapshots, s.GetName())
					}
					rows = append(rows, r)
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NUMBER\tNAME\tDATA\tSNAPSHOTS\tCREATED\tTENANT")
			for _, f := range resp.GetFileSystems() {
				tenant := f.GetTenant()
				if tenant == "" {
					tenant = "-"
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", f.GetNumber(), f.GetName(), dataLayoutName(f), len(f.GetSnapshots()),
					time.UnixMilli(f.GetCreatedUnixMs()).UTC().Format(time.RFC3339), tenant)
			}
			return w.Flush()
		},
	}
	listF.register(list)
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a file system with all its files and snapshots",
		Long: `Delete a file system: its files' blobs, all its metadata (snapshots too),
and its directory record. It must not be mounted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &deleteF, func(ctx context.Context, c *client.Cluster) error {
				f, err := c.FileSystem(ctx, args[0])
				if err != nil {
					return err
				}
				var st *mpb.DeleteFileSystemResponse
				err = a.longJobWatched(ctx, deleteProgress, "delete", func(w meta.Watch) (err error) {
					st, err = c.Meta().DeleteFileSystemWatch(ctx, f.GetName(), w)
					return err
				})
				if err != nil {
					return fmt.Errorf("delete file system %q: %w", f.GetName(), err)
				}
				fmt.Fprintf(a.stdout, "deleted file system %q (number %d): %d keys, %d blobs\n", f.GetName(), f.GetNumber(), st.GetKeys(), st.GetBlobs())
				return nil
			})
		},
	}
	deleteF.register(del)
	del.Flags().StringVar(&deleteProgress, "progress", "auto", progressUsage)
	cmd.AddCommand(create, list, del)
	return cmd
}

func newSnapshotCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Create, list and delete snapshots of a file system",
		Long: `A snapshot is the state of a whole file system at one instant; it never
changes and is readable with arbor mount FS DIR --snapshot NAME (read only).`,
	}
	var createF, listF, deleteF clusterFlags
	var deleteProgress string
	create := &cobra.Command{
		Use:   "create FS NAME",
		Short: "Take a snapshot of a file system",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Refused before reaching for the cluster; the server checks too.
			if err := meta.CheckSnapshotName(args[1]); err != nil {
				return fmt.Errorf("take a snapshot of %q: %w", args[0], err)
			}
			return a.fsCommand(cmd, &createF, func(ctx context.Context, c *client.Cluster) error {
				f, err := c.FileSystem(ctx, args[0])
				if err != nil {
					return err
				}
				if _, err := client.Snapshot(f, args[1]); err == nil {
					return fmt.Errorf("file system %q has a snapshot named %q", args[0], args[1])
				}
				n, err := c.Meta().CreateSnapshot(ctx, f.GetNumber(), args[1])
				if err != nil {
					return fmt.Errorf("take snapshot %q: %w", args[1], err)
				}
				fmt.Fprintf(a.stdout, "created snapshot %q of %q (number %d)\n", args[1], f.GetName(), n)
				return nil
			})
		},
	}
	createF.register(create)
	list := &cobra.Command{
		Use:   "list FS",
		Short: "List the snapshots of a file system",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &listF, func(ctx context.Context, c *client.Cluster) error {
				f, err := c.FileSystem(ctx, args[0])
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NUMBER\tNAME\tCREATED")
				for _, s := range f.GetSnapshots() {
					fmt.Fprintf(w, "%d\t%s\t%s\n", s.GetNumber(), s.GetName(), time.UnixMilli(s.GetCreatedUnixMs()).UTC().Format(time.RFC3339Nano))
				}
				return w.Flush()
			})
		},
	}
	listF.register(list)
	del := &cobra.Command{
		Use:   "delete FS NAME",
		Short: "Delete a snapshot and reclaim what only it held",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &deleteF, func(ctx context.Context, c *client.Cluster) error {
				f, err := c.FileSystem(ctx, args[0])
				if err != nil {
					return err
				}
				sn, err := client.Snapshot(f, args[1])
				if err != nil {
					return err
				}
				var st *mpb.DeleteSnapshotResponse
				err = a.longJobWatched(ctx, deleteProgress, "delete", func(w meta.Watch) (err error) {
					st, err = c.Meta().DeleteSnapshotWatch(ctx, f.GetNumber(), sn.GetNumber(), w)
					return err
				})
				if err != nil {
					return fmt.Errorf("delete snapshot %q: %w", args[1], err)
				}
				fmt.Fprintf(a.stdout, "deleted snapshot %q of %q: %d versions, %d tracts, %d blobs reclaimed\n",
					args[1], args[0], st.GetVersions(), st.GetTracts(), st.GetBlobs())
				return nil
			})
		},
	}
	deleteF.register(del)
	del.Flags().StringVar(&deleteProgress, "progress", "auto", progressUsage)
	cmd.AddCommand(create, list, del)
	return cmd
}

func newFsckCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var data, asJSON bool
	var progressFlag string
	cmd := &cobra.Command{
		Use:   "fsck FS",
		Short: "Check a file system: dangling entries, link counts, leaked tracts",
		Long: `Walk a file system's metadata in every view (the live file system and each
snapshot) and the tract store, and report dangling entries, wrong link
counts, leaked tracts and objects, and any other broken invariant. It exits
with status 1 if it found a problem. Run it on a quiet file system: changes
made during the check may show as problems.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &cf, func(ctx context.Context, c *client.Cluster) error {
				f, err := c.FileSystem(ctx, args[0])
				if err != nil {
					return err
				}
				var r *fs.CheckReport
				err = a.longJobWatched(ctx, progressFlag, "fsck", func(w meta.Watch) (err error) {
					r, err = c.Meta().CheckWatch(ctx, f.GetNumber(), data, w)
					return err
				})
				if err != nil {
					return fmt.Errorf("check %q: %w", args[0], err)
				}
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					if err := enc.Encode(r); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(a.stdout, "file system %q (number %d): %d views, %d objects, %d names, %d blocks (%d inline), %d tracts, %d blobs\n",
						f.GetName(), f.GetNumber(), r.Views, r.Objects, r.Names, r.Blocks, r.Inline, r.Tracts, r.Blobs)
					fmt.Fprintf(a.stdout, "pending: %d orphans, %d queued blobs, %d tracts to free, %d garbage versions\n", r.Orphans, r.Queued, r.FreeingTracts, r.Garbage)
					fmt.Fprintf(a.stdout, "problems: %d lost data, %d dangling, %d link counts, %d leaked, %d other\n", r.Lost, r.Dangling, r.LinkCount, r.Leaked, r.Other)
					for _, p := range r.Problems {
						fmt.Fprintln(a.stdout, "  "+p)
					}
				}
				if !r.OK() {
					return fmt.Errorf("file system %q has %d problems", args[0], r.ProblemCount())
				}
				if !asJSON {
					fmt.Fprintln(a.stdout, "clean")
				}
				return nil
			})
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&data, "data", false, "also read every referenced tract")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&progressFlag, "progress", "auto", progressUsage)
	return cmd
}
