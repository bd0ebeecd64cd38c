package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/tract"
)

// The file-system commands run the file-system library (internal/fs) in
// the CLI process, like a mount does.
//
// Where the metadata lives: every file system shares the cluster's one
// B-tree, the KV store's (internal/kv, root in the directory's config
// "kv/root"); each key of file system F begins with the tuple encoding of
// F, whose first byte is in 0x14..0x1c. Those leading bytes are reserved
// for file systems: `arbor kv` users must not write keys starting with
// them. One tree keeps one set of extents and one root to recover, and
// FSS runs every file system's schema in one B-tree too.

// fsOpTimeout bounds a file-system command that is not a mount or fsck.
const fsOpTimeout = 2 * time.Minute

// fsClient is a command's connection to everything a file system runs on.
type fsClient struct {
	dir   *directory.Client
	ec    *extent.Client
	tree  *btree.Tree
	tract *tract.Client
	data  *fs.TractData
	meta  fs.MetaStore
}

func (c *fsClient) Close() {
	c.tree.Close()
	c.tract.Close()
	c.ec.Close()
	c.dir.Close()
}

// dialFS connects to the cluster and opens its B-tree and tract store.
func dialFS(ctx context.Context, target clusterTarget, logger *slog.Logger) (*fsClient, error) {
	opts := target.DialOptions()
	dir, err := directory.Dial(target.Addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to the directory: %w", err)
	}
	ec, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: opts, Logger: logger})
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("extent client: %w", err)
	}
	tree, err := kv.OpenOnExtents(ctx, dir, ec, btree.Config{Logger: logger})
	if err != nil {
		ec.Close()
		dir.Close()
		return nil, fmt.Errorf("open the metadata tree: %w", err)
	}
	tc, err := tract.NewClient(tract.ClientConfig{Directory: dir, DialOptions: opts, Logger: logger})
	if err != nil {
		tree.Close()
		ec.Close()
		dir.Close()
		return nil, fmt.Errorf("tract client: %w", err)
	}
	data, err := fs.NewTractData(ctx, tc, 0)
	if err != nil {
		tc.Close()
		tree.Close()
		ec.Close()
		dir.Close()
		return nil, err
	}
	return &fsClient{dir: dir, ec: ec, tree: tree, tract: tc, data: data, meta: fs.BTreeMeta{Tree: tree}}, nil
}

func isExists(err error) bool {
	return status.Code(err) == codes.AlreadyExists || directory.CodeOf(err) == dpb.ErrorCode_ALREADY_EXISTS
}

// lookupFS finds a file system by name in the directory.
func (c *fsClient) lookupFS(ctx context.Context, name string) (*dpb.FileSystem, error) {
	if name == "" {
		return nil, errors.New("a file system name is required")
	}
	f, err := c.dir.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: name})
	if directory.IsNotFound(err) {
		return nil, fmt.Errorf("no file system named %q (arbor fs list shows them; arbor fs create makes one)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up file system %q: %w", name, err)
	}
	return f, nil
}

// createFS creates the file system name, or finds it if it exists, and
// formats its metadata (idempotent).
func (c *fsClient) createFS(ctx context.Context, name string) (*dpb.FileSystem, bool, error) {
	created := true
	f, err := c.dir.CreateFileSystem(ctx, &dpb.CreateFileSystemRequest{Name: name})
	if isExists(err) {
		created = false
		f, err = c.lookupFS(ctx, name)
	}
	if err != nil {
		return nil, false, fmt.Errorf("create file system %q: %w", name, err)
	}
	if err := fs.Format(ctx, c.meta, f.GetNumber(), fs.DefaultLayout, time.Now()); err != nil {
		return nil, false, fmt.Errorf("format file system %q (number %d): %w", name, f.GetNumber(), err)
	}
	return f, created, nil
}

// openFS opens file system f (at snapshot snap if non-zero).
func (c *fsClient) openFS(ctx context.Context, f *dpb.FileSystem, snap uint64, logger *slog.Logger) (*fs.FS, error) {
	fsys, err := fs.Open(ctx, fs.Config{Meta: c.meta, Data: c.data, Number: f.GetNumber(), Snapshot: snap, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("open file system %q (number %d): %w", f.GetName(), f.GetNumber(), err)
	}
	return fsys, nil
}

func findSnapshot(f *dpb.FileSystem, name string) (*dpb.Snapshot, error) {
	for _, s := range f.GetSnapshots() {
		if s.GetName() == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("file system %q has no snapshot named %q (arbor snapshot list %s shows them)", f.GetName(), name, f.GetName())
}

// fsCommand runs fn with a connection to the cluster, bounded by timeout
// (0: none).
func (a *app) fsCommand(cmd *cobra.Command, cf *clusterFlags, timeout time.Duration, fn func(ctx context.Context, c *fsClient) error) error {
	target, err := cf.resolve(a.getenv)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := dialFS(ctx, target, a.logger)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
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
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a file system",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &createF, fsOpTimeout, func(ctx context.Context, c *fsClient) error {
				f, created, err := c.createFS(ctx, args[0])
				if err != nil {
					return err
				}
				if !created {
					return fmt.Errorf("file system %q exists (number %d)", f.GetName(), f.GetNumber())
				}
				fmt.Fprintf(a.stdout, "created file system %q (number %d)\n", f.GetName(), f.GetNumber())
				return nil
			})
		},
	}
	createF.register(create)
	list := &cobra.Command{
		Use:   "list",
		Short: "List the file systems",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, err := listF.resolve(a.getenv)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), fsOpTimeout)
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
				}
				rows := []row{}
				for _, f := range resp.GetFileSystems() {
					r := row{Number: f.GetNumber(), Name: f.GetName(), Created: time.UnixMilli(f.GetCreatedUnixMs()).UTC().Format(time.RFC3339), Snapshots: []string{}}
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
			fmt.Fprintln(w, "NUMBER\tNAME\tSNAPSHOTS\tCREATED")
			for _, f := range resp.GetFileSystems() {
				fmt.Fprintf(w, "%d\t%s\t%d\t%s\n", f.GetNumber(), f.GetName(), len(f.GetSnapshots()),
					time.UnixMilli(f.GetCreatedUnixMs()).UTC().Format(time.RFC3339))
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
			return a.fsCommand(cmd, &deleteF, 0, func(ctx context.Context, c *fsClient) error {
				f, err := c.lookupFS(ctx, args[0])
				if err != nil {
					return err
				}
				st, err := fs.Destroy(ctx, c.meta, c.data, f.GetNumber())
				if err != nil {
					return err
				}
				if _, err := c.dir.DeleteFileSystem(ctx, &dpb.DeleteFileSystemRequest{Number: f.GetNumber()}); err != nil && !directory.IsNotFound(err) {
					return fmt.Errorf("delete the directory record of %q: %w", f.GetName(), err)
				}
				fmt.Fprintf(a.stdout, "deleted file system %q (number %d): %d keys, %d blobs\n", f.GetName(), f.GetNumber(), st.Keys, st.Blobs)
				return nil
			})
		},
	}
	deleteF.register(del)
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
	create := &cobra.Command{
		Use:   "create FS NAME",
		Short: "Take a snapshot of a file system",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.fsCommand(cmd, &createF, fsOpTimeout, func(ctx context.Context, c *fsClient) error {
				f, err := c.lookupFS(ctx, args[0])
				if err != nil {
					return err
				}
				if _, err := findSnapshot(f, args[1]); err == nil {
					return fmt.Errorf("file system %q has a snapshot named %q", args[0], args[1])
				}
				sn, err := c.dir.CreateSnapshot(ctx, &dpb.CreateSnapshotRequest{FileSystem: f.GetNumber(), Name: args[1]})
				if err != nil {
					return fmt.Errorf("number the snapshot: %w", err)
				}
				fsys, err := c.openFS(ctx, f, 0, a.logger)
				if err != nil {
					return err
				}
				err = fsys.CreateSnapshot(ctx, sn.GetNumber(), sn.GetName())
				if err != nil {
					// Leave the directory as the metadata: without the
					// snapshot.
					_, derr := c.dir.DeleteSnapshot(context.WithoutCancel(ctx), &dpb.DeleteSnapshotRequest{FileSystem: f.GetNumber(), Snapshot: sn.GetNumber()})
					return errors.Join(fmt.Errorf("take snapshot %q: %w", args[1], err), derr)
				}
				fmt.Fprintf(a.stdout, "created snapshot %q of %q (number %d)\n", sn.GetName(), f.GetName(), sn.GetNumber())
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
			return a.fsCommand(cmd, &listF, fsOpTimeout, func(ctx context.Context, c *fsClient) error {
				f, err := c.lookupFS(ctx, args[0])
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
			return a.fsCommand(cmd, &deleteF, 0, func(ctx context.Context, c *fsClient) error {
				f, err := c.lookupFS(ctx, args[0])
				if err != nil {
					return err
				}
				sn, err := findSnapshot(f, args[1])
				if err != nil {
					return err
				}
				fsys, err := c.openFS(ctx, f, 0, a.logger)
				if err != nil {
					return err
				}
				st, err := fsys.DeleteSnapshot(ctx, sn.GetNumber())
				if err != nil {
					return fmt.Errorf("delete snapshot %q: %w", args[1], err)
				}
				if _, err := c.dir.DeleteSnapshot(ctx, &dpb.DeleteSnapshotRequest{FileSystem: f.GetNumber(), Snapshot: sn.GetNumber()}); err != nil && !directory.IsNotFound(err) {
					return fmt.Errorf("delete the directory record of snapshot %q: %w", args[1], err)
				}
				fmt.Fprintf(a.stdout, "deleted snapshot %q of %q: %d versions, %d tracts, %d blobs reclaimed\n",
					args[1], args[0], st.Versions, st.Tracts, st.Blobs)
				return nil
			})
		},
	}
	deleteF.register(del)
	cmd.AddCommand(create, list, del)
	return cmd
}

func newFsckCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var data, asJSON bool
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
			return a.fsCommand(cmd, &cf, 0, func(ctx context.Context, c *fsClient) error {
				f, err := c.lookupFS(ctx, args[0])
				if err != nil {
					return err
				}
				fsys, err := fs.Open(ctx, fs.Config{Meta: c.meta, Data: c.data, Number: f.GetNumber(), ReadOnly: true, Logger: a.logger})
				if err != nil {
					return fmt.Errorf("open file system %q: %w", args[0], err)
				}
				r, err := fsys.Check(ctx, fs.CheckOptions{Data: data})
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
					fmt.Fprintf(a.stdout, "file system %q (number %d): %d views, %d objects, %d names, %d blocks, %d tracts, %d blobs\n",
						f.GetName(), f.GetNumber(), r.Views, r.Objects, r.Names, r.Blocks, r.Tracts, r.Blobs)
					fmt.Fprintf(a.stdout, "pending: %d orphans, %d queued blobs, %d garbage versions\n", r.Orphans, r.Queued, r.Garbage)
					fmt.Fprintf(a.stdout, "problems: %d dangling, %d link counts, %d leaked, %d other\n", r.Dangling, r.LinkCount, r.Leaked, r.Other)
					for _, p := range r.Problems {
						fmt.Fprintln(a.stdout, "  "+p)
					}
				}
				if !r.OK() {
					return fmt.Errorf("file system %q has %d problems", args[0], r.Dangling+r.LinkCount+r.Leaked+r.Other)
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
	return cmd
}
