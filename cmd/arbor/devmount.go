package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
)

// devFileSystem is the file system `arbor dev --mount` creates and mounts.
const devFileSystem = "default"

// Bounds of arbor dev's wait to mount.
const (
	// devMountTimeout bounds how long arbor dev waits for the cluster's
	// storage (extents, the TLT, the metadata servers) to be ready for a
	// mount.
	devMountTimeout = 3 * time.Minute
	// devMountAttemptTimeout bounds one attempt to mount.
	devMountAttemptTimeout = 30 * time.Second
	// devMountRetry is the pause between two attempts.
	devMountRetry = time.Second
)

// mountFunc mounts a file system (mountFS; tests replace it).
type mountFunc func(ctx context.Context, target clusterTarget, opts mountOptions, logger *slog.Logger) (*mounted, error)

// devMount creates the file system "default" if missing and mounts it at
// dir.
func devMount(ctx context.Context, a *app, c *devcluster.Cluster, dir string) (*mounted, error) {
	target := clusterTarget{Addrs: c.DirectoryAddrs(), ClusterID: c.ClusterID(), Credentials: c.Credentials()}
	opts := mountOptions{fsName: devFileSystem, dir: dir, create: true, allowOther: os.Geteuid() == 0, http: "127.0.0.1:0"}
	return mountWhenReady(ctx, a, mountFS, target, opts, devMountTimeout)
}

// mountWhenReady mounts with mount, retrying for up to wait. Right after
// a new cluster is healthy its storage is still being set up: the extent
// manager makes the first extents once the storage nodes registered, the
// TLT is installed, the metadata servers take their tables. Until then a
// mount fails with errors that only say which part is missing ("the
// cluster has no extents yet", "no TLT is installed"), which mean nothing
// to a new user: they say one line on what is awaited, the errors go to
// the debug log, and only the last one is shown if the wait ends in
// failure.
func mountWhenReady(parent context.Context, a *app, mount mountFunc, target clusterTarget, opts mountOptions, wait time.Duration) (*mounted, error) {
	ctx, cancel := context.WithTimeout(parent, wait)
	defer cancel()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, devMountAttemptTimeout)
		m, err := mount(actx, target, opts, a.logger)
		acancel()
		if err == nil {
			fmt.Fprintf(a.stdout, "file system %q mounted at %s (its profiles: http://%s/debug/pprof/)\n", opts.fsName, opts.dir, m.debugAddr)
			return m, nil
		}
		if errors.Is(err, errKernelMount) {
			return nil, err
		}
		if attempt == 1 {
			fmt.Fprintf(a.stderr, "arbor dev: waiting for the cluster's storage (extents, tract locator table, metadata servers) to be ready to mount %s (up to %v)\n",
				opts.dir, wait)
		}
		a.logger.Debug("mount not ready yet; retrying", "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil, parent.Err() // interrupted
			}
			return nil, fmt.Errorf("mount file system %q at %s: the cluster's storage was not ready after %v and %d attempts; last error: %w (the nodes' logs, whose paths are printed above, say why; --log-level debug shows every attempt)",
				opts.fsName, opts.dir, time.Since(start).Round(time.Second), attempt, err)
		case <-time.After(devMountRetry):
		}
	}
}
