package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fuse"
)

// mounted is a file system mounted by this process.
type mounted struct {
	m    *fuse.Mount
	fsys *client.FS
	c    *client.Cluster
	log  *slog.Logger
	// debug serves /debug/pprof/ (opts.http); nil if not asked.
	debug *http.Server
	// debugAddr is the address it listens on.
	debugAddr string
}

// mountOptions are what `arbor mount` and `arbor dev --mount` take.
type mountOptions struct {
	fsName, snapshot, dir string
	allowOther, debug     bool
	// durable: metadata changes are answered once durable (no early
	// answers).
	durable bool
	// http, if set, is where the mount serves /debug/pprof/.
	http string
	// create makes the file system if it does not exist (arbor dev).
	create bool
}

// errKernelMount marks a failure of the kernel mount itself (no FUSE
// here, a busy mount point), which waiting does not cure.
var errKernelMount = errors.New("FUSE mount failed")

// mountFS connects to the cluster and mounts a file system at opts.dir.
func mountFS(ctx context.Context, target clusterTarget, opts mountOptions, logger *slog.Logger) (_ *mounted, err error) {
	if err := prepareMountPoint(opts.dir); err != nil {
		return nil, err
	}
	c, err := client.Dial(client.Options{Addrs: target.Addrs, ClusterID: target.ClusterID, Credentials: target.Credentials, Logger: logger,
		DurableMetadata: opts.durable || os.Getenv("ARBOR_DURABLE_METADATA") != ""})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	f, err := c.FileSystem(ctx, opts.fsName)
	if err != nil && opts.create {
		f, _, err = createFS(ctx, c, opts.fsName, "", "")
	}
	if err != nil {
		return nil, err
	}
	var snap uint64
	if opts.snapshot != "" {
		s, err := client.Snapshot(f, opts.snapshot)
		if err != nil {
			return nil, err
		}
		snap = s.GetNumber()
	}
	fsys, err := c.OpenFS(ctx, f, snap)
	if err != nil {
		return nil, fmt.Errorf("open file system %q: %w", f.GetName(), err)
	}
	// The first request finds the file system's metadata server: a new
	// file system's table may take a moment to be served.
	if _, err := fsys.GetAttr(ctx, fs.RootHandle); err != nil {
		_ = fsys.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("file system %q: %w", f.GetName(), err)
	}
	source := "arbor:" + f.GetName()
	if opts.snapshot != "" {
		source += "@" + opts.snapshot
	}
	m, err := fuse.New(fsys.FS, opts.dir, fuse.Options{Name: source, AllowOther: opts.allowOther, Debug: opts.debug, Logger: logger})
	if err != nil {
		// A mount can fail after the kernel attached it: detach it.
		if fuse.Mounted(opts.dir) {
			lazyUnmount(opts.dir)
		}
		return nil, errors.Join(fmt.Errorf("%w: %w", errKernelMount, err), fsys.Close(context.WithoutCancel(ctx)))
	}
	mt := &mounted{m: m, fsys: fsys, c: c, log: logger}
	if opts.http != "" {
		lis, err := net.Listen("tcp", opts.http)
		if err != nil {
			logger.Warn("serving the mount's profiles", "addr", opts.http, "err", err)
		} else {
			mux := http.NewServeMux()
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
			mt.debug = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			mt.debugAddr = lis.Addr().String()
			go func() { _ = mt.debug.Serve(lis) }()
		}
	}
	return mt, nil
}

// prepareMountPoint creates dir if missing and clears a dead FUSE mount
// left there by a process that was killed.
func prepareMountPoint(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, syscall.ENOTCONN) {
		lazyUnmount(dir)
		fi, err = os.Stat(dir)
	}
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: mount point %s is not a directory", errKernelMount, dir)
	}
	if fuse.Mounted(dir) {
		return fmt.Errorf("%w: %s is a mount point already (unmount it first)", errKernelMount, dir)
	}
	return nil
}

// lazyUnmount detaches a mount even while it is busy.
func lazyUnmount(dir string) {
	for _, tool := range []string{"fusermount3", "fusermount"} {
		if exec.Command(tool, "-u", "-z", dir).Run() == nil {
			return
		}
	}
	_ = syscall.Unmount(dir, syscall.MNT_DETACH)
}

// unmountTimeout is how long a busy mount is retried before it is
// detached lazily.
const unmountTimeout = 5 * time.Second

// Close unmounts (lazily if it stays busy), flushes and closes the file
// system, and disconnects.
func (m *mounted) Close(ctx context.Context) error {
	deadline := time.Now().Add(unmountTimeout)
	var uerr error
	for {
		uerr = m.m.Unmount()
		if uerr == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if uerr != nil {
		m.log.Warn("mount is busy; detaching it lazily", "dir", m.m.Dir(), "err", uerr)
		lazyUnmount(m.m.Dir())
	}
	err := m.fsys.Close(ctx)
	m.c.Close()
	if m.debug != nil {
		_ = m.debug.Close()
	}
	return err
}

func newMountCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var opts mountOptions
	cmd := &cobra.Command{
		Use:   "mount FS DIR",
		Short: "Mount a file system (FUSE) until interrupted",
		Long: `Mount file system FS at DIR with FUSE and serve it until SIGINT or SIGTERM,
then unmount it. With --snapshot NAME, mount that snapshot, read only.

The mount gives close-to-open consistency between mounts: what one mount
wrote and closed, another sees when it opens the file afterwards.`,
		Example: `  arbor mount default /mnt/arbor --dir /tmp/arbor
  arbor mount default /mnt/yesterday --snapshot yesterday --dir /tmp/arbor`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			// Mounting is the step --timeout bounds; serving is not.
			target, octx, cancel, err := cf.connect(ctx, a.getenv)
			if err != nil {
				return err
			}
			opts.fsName, opts.dir = args[0], args[1]
			m, err := mountFS(octx, target, opts, a.logger)
			cancel()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "mounted %s at %s; running until SIGINT or SIGTERM\n", args[0], args[1])
			done := make(chan struct{})
			go func() { m.m.Wait(); close(done) }()
			select {
			case <-ctx.Done():
			case <-done:
				fmt.Fprintln(a.stderr, "arbor mount: unmounted from outside")
			}
			cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
			defer ccancel()
			if err := m.Close(cctx); err != nil {
				return fmt.Errorf("unmount: %w", err)
			}
			fmt.Fprintf(a.stdout, "unmounted %s\n", args[1])
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&opts.snapshot, "snapshot", "", "mount this snapshot, read only")
	cmd.Flags().BoolVar(&opts.allowOther, "allow-other", os.Geteuid() == 0, "let other users use the mount (default when run as root)")
	cmd.Flags().BoolVar(&opts.durable, "durable", false, "answer every metadata change only once it is durable (no early answers; also $ARBOR_DURABLE_METADATA)")
	cmd.Flags().BoolVar(&opts.debug, "fuse-debug", false, "log every FUSE request")
	cmd.Flags().StringVar(&opts.http, "http", "", "serve /debug/pprof/ of the mount at this address (host:port)")
	return cmd
}
