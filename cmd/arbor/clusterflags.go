package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/security"
)

// clusterEnv names the environment variable that points client commands
// at a cluster, like --cluster.
const clusterEnv = "ARBOR_CLUSTER"

// credentialsEnv names the environment variable holding the path of the
// credential file client commands present, like --credentials.
const credentialsEnv = "ARBOR_CREDENTIALS"

// credentialFlags are how a client command proves who it is to the nodes
// (mutual TLS, internal/security).
type credentialFlags struct {
	file     string
	insecure bool
}

func (f *credentialFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.file, "credentials", "", "credential file (PEM: certificate, key, CA) to present to the nodes (default: DIR/tls/admin.* with --dir, else $"+credentialsEnv+")")
	fl.BoolVar(&f.insecure, "insecure", false, "dial in plain text, without credentials (only for servers run with --insecure)")
}

// load returns the credentials to present: --credentials, else the dev
// cluster's admin credential with --dir (none if that cluster is
// insecure), else $ARBOR_CREDENTIALS; nil with --insecure.
func (f *credentialFlags) load(getenv func(string) string, devDir string, devInfo devcluster.Info) (*security.Credentials, error) {
	switch {
	case f.insecure && f.file != "":
		return nil, errors.New("give either --credentials or --insecure, not both")
	case f.insecure:
		return nil, nil
	case f.file != "":
		c, err := security.LoadCredentialFile(f.file)
		if err != nil {
			return nil, fmt.Errorf("--credentials: %w", err)
		}
		return c, nil
	case devDir != "" && devInfo.Insecure:
		return nil, nil
	case devDir != "":
		c, err := devcluster.LoadAdminCredentials(devDir)
		if err != nil {
			return nil, fmt.Errorf("--dir: the dev cluster's admin credential: %w", err)
		}
		return c, nil
	case getenv(credentialsEnv) != "":
		c, err := security.LoadCredentialFile(getenv(credentialsEnv))
		if err != nil {
			return nil, fmt.Errorf("$%s: %w", credentialsEnv, err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("no credentials: give --credentials FILE (arbor cert client writes one), set $%s, "+
		"use --dir DIR of arbor dev, or --insecure for a cluster whose servers run with --insecure", credentialsEnv)
}

// clusterFlags are how a client command finds its cluster.
type clusterFlags struct {
	addrs     string
	dir       string
	clusterID string
	creds     credentialFlags
	// timeout is --timeout: how long to wait for the cluster to answer
	// one step (policy.go).
	timeout time.Duration
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addrs, "cluster", "", "directory addresses host:port,... (default $"+clusterEnv+")")
	cmd.Flags().StringVar(&f.dir, "dir", "", "an arbor dev directory: read the addresses from DIR/"+devcluster.ClusterFileName)
	cmd.Flags().StringVar(&f.clusterID, "cluster-id", "", "refuse to talk to nodes of any other cluster (default: from --dir, else unchecked)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", defaultTimeout, timeoutUsage)
	f.creds.register(cmd.Flags())
}

// connect finds the cluster (resolve), probes its addresses
// (probeCluster), loads the credentials (after the probe, so a cluster
// that is not there is reported as such) and returns the context that bounds the command's waits
// on it by --timeout (withStallTimeout).
func (f *clusterFlags) connect(ctx context.Context, getenv func(string) string) (clusterTarget, context.Context, context.CancelFunc, error) {
	target, info, err := f.resolveAddrs(getenv)
	if err != nil {
		return target, nil, nil, err
	}
	ctx, cancel := withStallTimeout(ctx, f.timeout)
	if err := probeCluster(ctx, target.Addrs); err != nil {
		cancel()
		return target, nil, nil, err
	}
	if target.Credentials, err = f.creds.load(getenv, f.dir, info); err != nil {
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
	// Credentials are presented to the nodes (nil: plain text, --insecure).
	Credentials *security.Credentials
}

// DialOptions are the gRPC dial options for talking to the cluster.
func (t clusterTarget) DialOptions() []grpc.DialOption {
	return client.DialOptions(t.ClusterID, t.Credentials)
}

// Options are the client options of the cluster.
func (t clusterTarget) Options() client.Options {
	return client.Options{Addrs: t.Addrs, ClusterID: t.ClusterID, Credentials: t.Credentials}
}

// resolve finds the cluster (--cluster, else --dir, else $ARBOR_CLUSTER)
// and the credentials to present to it (credentialFlags.load).
func (f *clusterFlags) resolve(getenv func(string) string) (clusterTarget, error) {
	t, info, err := f.resolveAddrs(getenv)
	if err != nil {
		return t, err
	}
	t.Credentials, err = f.creds.load(getenv, f.dir, info)
	return t, err
}

func (f *clusterFlags) resolveAddrs(getenv func(string) string) (clusterTarget, devcluster.Info, error) {
	t := clusterTarget{ClusterID: f.clusterID}
	var info devcluster.Info
	switch {
	case f.addrs != "" && f.dir != "":
		return t, info, errors.New("give either --cluster or --dir, not both")
	case f.addrs != "":
		addrs, err := devcluster.ParseAddrs(f.addrs)
		if err != nil {
			return t, info, fmt.Errorf("--cluster: %w", err)
		}
		t.Addrs = addrs
	case f.dir != "":
		var err error
		info, err = devcluster.ReadInfo(filepath.Clean(f.dir))
		if err != nil {
			return t, info, fmt.Errorf("--dir: %w", err)
		}
		t.Addrs = info.DirectoryAddrs
		if t.ClusterID == "" {
			t.ClusterID = info.ClusterID
		} else if info.ClusterID != "" && info.ClusterID != t.ClusterID {
			return t, info, fmt.Errorf("--dir %s holds cluster %q, not --cluster-id %q", f.dir, info.ClusterID, t.ClusterID)
		}
	case getenv(clusterEnv) != "":
		addrs, err := devcluster.ParseAddrs(getenv(clusterEnv))
		if err != nil {
			return t, info, fmt.Errorf("$%s: %w", clusterEnv, err)
		}
		t.Addrs = addrs
	default:
		return t, info, fmt.Errorf("no cluster given: use --cluster host:port,..., --dir DIR (of arbor dev) or set %s", clusterEnv)
	}
	return t, info, nil
}
