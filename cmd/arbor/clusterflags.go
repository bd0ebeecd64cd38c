package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
)

// clusterEnv names the environment variable that points client commands
// at a cluster, like --cluster.
const clusterEnv = "ARBOR_CLUSTER"

// clusterFlags are how a client command finds its cluster.
type clusterFlags struct {
	addrs     string
	dir       string
	clusterID string
	// timeout is --timeout: how long to wait for the cluster to answer
	// one step (policy.go).
	timeout time.Duration
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addrs, "cluster", "", "directory addresses host:port,... (default $"+clusterEnv+")")
	cmd.Flags().StringVar(&f.dir, "dir", "", "an arbor dev directory: read the addresses from DIR/"+devcluster.ClusterFileName)
	cmd.Flags().StringVar(&f.clusterID, "cluster-id", "", "refuse to talk to nodes of any other cluster (default: from --dir, else unchecked)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", defaultTimeout, timeoutUsage)
}

// connect finds the cluster (resolve), probes its addresses
// (probeCluster) and returns the context that bounds the command's waits
// on it by --timeout (withStallTimeout).
func (f *clusterFlags) connect(ctx context.Context, getenv func(string) string) (clusterTarget, context.Context, context.CancelFunc, error) {
	target, err := f.resolve(getenv)
	if err != nil {
		return target, nil, nil, err
	}
	ctx, cancel := withStallTimeout(ctx, f.timeout)
	if err := probeCluster(ctx, target.Addrs); err != nil {
		cancel()
		return target, nil, nil, err
	}
	return target, ctx, cancel, nil
}

// clusterTarget is a cluster a client command talks to.
type clusterTarget struct {
	// Addrs are directory members' gRPC addresses; any of them may answer.
	Addrs []string
	// ClusterID, if known, is sent on every call so nodes of another
	// cluster refuse it.
	ClusterID string
}

// DialOptions are the gRPC dial options for talking to the cluster.
func (t clusterTarget) DialOptions() []grpc.DialOption { return client.DialOptions(t.ClusterID) }

// resolve finds the cluster: --cluster, else --dir, else $ARBOR_CLUSTER.
func (f *clusterFlags) resolve(getenv func(string) string) (clusterTarget, error) {
	t := clusterTarget{ClusterID: f.clusterID}
	switch {
	case f.addrs != "" && f.dir != "":
		return t, errors.New("give either --cluster or --dir, not both")
	case f.addrs != "":
		addrs, err := devcluster.ParseAddrs(f.addrs)
		if err != nil {
			return t, fmt.Errorf("--cluster: %w", err)
		}
		t.Addrs = addrs
	case f.dir != "":
		info, err := devcluster.ReadInfo(filepath.Clean(f.dir))
		if err != nil {
			return t, fmt.Errorf("--dir: %w", err)
		}
		t.Addrs = info.DirectoryAddrs
		if t.ClusterID == "" {
			t.ClusterID = info.ClusterID
		} else if info.ClusterID != "" && info.ClusterID != t.ClusterID {
			return t, fmt.Errorf("--dir %s holds cluster %q, not --cluster-id %q", f.dir, info.ClusterID, t.ClusterID)
		}
	case getenv(clusterEnv) != "":
		addrs, err := devcluster.ParseAddrs(getenv(clusterEnv))
		if err != nil {
			return t, fmt.Errorf("$%s: %w", clusterEnv, err)
		}
		t.Addrs = addrs
	default:
		return t, fmt.Errorf("no cluster given: use --cluster host:port,..., --dir DIR (of arbor dev) or set %s", clusterEnv)
	}
	return t, nil
}
