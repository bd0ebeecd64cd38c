package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
)

// devFileSystem is the file system `arbor dev --mount` creates and mounts.
const devFileSystem = "default"

// devMountTimeout bounds how long arbor dev waits for the cluster's
// storage (extents, the TLT) to be ready for a mount.
const devMountTimeout = 3 * time.Minute

// devMount creates the file system "default" if missing and mounts it at
// dir. Right after the cluster is healthy its extents and TLT may not
// exist yet, so it retries until they do.
func devMount(ctx context.Context, a *app, c *devcluster.Cluster, dir string) (*mounted, error) {
	target := clusterTarget{Addrs: c.DirectoryAddrs(), ClusterID: c.ClusterID()}
	ctx, cancel := context.WithTimeout(ctx, devMountTimeout)
	defer cancel()
	opts := mountOptions{fsName: devFileSystem, dir: dir, create: true, allowOther: os.Geteuid() == 0, http: "127.0.0.1:0"}
	for {
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := mountFS(actx, target, opts, a.logger)
		acancel()
		if err == nil {
			fmt.Fprintf(a.stdout, "file system %q mounted at %s (its profiles: http://%s/debug/pprof/)\n", devFileSystem, dir, m.debugAddr)
			return m, nil
		}
		if errors.Is(err, errKernelMount) {
			return nil, err
		}
		a.logger.Info("mount not ready yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("mount file system %q at %s: %w", devFileSystem, dir, err)
		case <-time.After(time.Second):
		}
	}
}
