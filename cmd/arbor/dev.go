package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/faults"
)

func newDevCmd(a *app) *cobra.Command {
	var (
		configFile   string
		dir          string
		nodes        int
		voters       int
		metaReplicas int
		faultSpec    string
		mountDir     string
		startTimeout = devcluster.DefaultStartTimeout
		stopTimeout  = devcluster.DefaultStopTimeout
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole cluster on this machine until interrupted",
		Long: `Start a local cluster of arbor server processes on free 127.0.0.1 ports, with
their data under --dir (one folder per node, named by its id), wait until it
is healthy, write the directory addresses to DIR/cluster, print them, and run
until SIGINT or SIGTERM; then stop every node cleanly.

Every connection is mutual TLS: at first start arbor dev makes the
cluster's CA, a certificate for every node and an admin credential under
DIR/tls (reused later); client commands given --dir DIR present the admin
credential. The nodes serve /debug/pprof/ on their HTTP ports.

Run it again on the same --dir to bring the same cluster back with all its
state: same node ids and, when they are free, the same ports. The first
--directory-voters nodes are directory voters; every node stores data.
--metadata-replicas sets how many replicas each metadata extent gets when
the cluster is created: an ec:D+P file system's metadata must survive the
P lost nodes its data survives, so it needs 2P+1 (arbor dev --nodes 7
--directory-voters 5 --metadata-replicas 5 for ec:5+2).`,
		Example: `  arbor dev --dir /tmp/arbor
  arbor status --dir /tmp/arbor`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return nil
			}
			if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
				return err
			}
			return a.setUpLogging()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is required: the directory that holds the cluster")
			}
			if faultSpec != "" {
				if _, err := faults.Parse(faultSpec); err != nil {
					return fmt.Errorf("--faults: %w", err)
				}
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the arbor binary: %w", err)
			}
			serverArgs := []string{"--log-format=" + a.logFormat, "--log-level=" + a.logLevel}
			if faultSpec != "" {
				serverArgs = append(serverArgs, "--faults="+faultSpec)
			}
			return runDev(cmd.Context(), a, devcluster.Options{
				Dir:              dir,
				Nodes:            nodes,
				DirectoryVoters:  voters,
				MetadataReplicas: metaReplicas,
				Binary:           self,
				ServerArgs:       serverArgs,
				StartTimeout:     startTimeout,
				StopTimeout:      stopTimeout,
				Logger:           a.logger,
				// Benchmarks and profiling read the nodes' profiles.
				PProf: true,
			}, mountDir)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configFile, "config", "", "YAML or JSON file of flag values (flags win)")
	fl.StringVar(&dir, "dir", "", "directory holding the cluster (created if missing)")
	fl.IntVar(&nodes, "nodes", 0, fmt.Sprintf("number of nodes (default %d, or as saved in --dir)", devcluster.DefaultNodes))
	fl.IntVar(&voters, "directory-voters", 0, fmt.Sprintf("how many of the first nodes are directory voters: 1, 3 or 5 (default %d, or as saved)", devcluster.DefaultDirectoryVoters))
	fl.IntVar(&metaReplicas, "metadata-replicas", 0, "replicas of each metadata extent (file systems' metadata, KV, tables), odd, at most the nodes: 2f+1 survive f lost nodes; an ec:D+P file system needs 2P+1 (default 3, or as saved; fixed at creation)")
	fl.StringVar(&faultSpec, "faults", "", "fault injection for every node (see arbor server --help); $"+faultsEnv+" also reaches the nodes")
	fl.StringVar(&mountDir, "mount", "", "once healthy, create the file system \""+devFileSystem+"\" if missing and mount it here (FUSE)")
	fl.DurationVar(&startTimeout, "start-timeout", startTimeout, "how long to wait for the cluster to be healthy")
	fl.DurationVar(&stopTimeout, "stop-timeout", stopTimeout, "how long a node gets to stop before it is killed")
	return cmd
}

// runDev runs the cluster until ctx ends (SIGINT or SIGTERM).
func runDev(ctx context.Context, a *app, opts devcluster.Options, mountDir string) (err error) {
	c, err := devcluster.Open(opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(a.stderr, "arbor dev: stopping the cluster")
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stopping the cluster: %w", cerr))
		} else {
			fmt.Fprintln(a.stderr, "arbor dev: cluster stopped; its data stays in", c.Dir())
		}
	}()
	fmt.Fprintf(a.stderr, "arbor dev: starting cluster %s in %s\n", c.ClusterID(), c.Dir())
	if err := c.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return err
	}
	printDevCluster(a, c)
	if mountDir != "" {
		m, err := devMount(ctx, a, c, mountDir)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case errors.Is(err, errKernelMount):
			// The cluster works without the mount: say why and go on.
			fmt.Fprintf(a.stderr, "arbor dev: could not mount the file system at %s (is FUSE available? /dev/fuse, fusermount3): %v\n", mountDir, err)
		case err != nil:
			return err
		}
		if m != nil {
			defer func() {
				fmt.Fprintln(a.stderr, "arbor dev: unmounting", mountDir)
				cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if merr := m.Close(cctx); merr != nil {
					err = errors.Join(err, fmt.Errorf("unmount %s: %w", mountDir, merr))
				}
			}()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case exit := <-c.Exits():
			fmt.Fprintf(a.stderr, "arbor dev: node %d exited unexpectedly (%v); end of its log:\n%s\n", exit.ID, exit.Err, exit.LogTail)
		}
	}
}

func printDevCluster(a *app, c *devcluster.Cluster) {
	addrs := strings.Join(c.DirectoryAddrs(), ",")
	nodes := c.Nodes()
	w := a.stdout
	fmt.Fprintf(w, "arbor dev cluster %s is up: %d nodes, data in %s\n", c.ClusterID(), len(nodes), c.Dir())
	fmt.Fprintf(w, "directory: %s\n", addrs)
	for _, n := range nodes {
		fmt.Fprintf(w, "  node %d  pid %d  grpc %s  http %s  roles %s  log %s\n",
			n.ID, n.PID, n.Addr, n.HTTPAddr, strings.Join(n.Roles, ","), n.LogPath)
	}
	fmt.Fprintf(w, "clients: --dir %s, or --cluster %s, or export %s=%s\n", c.Dir(), addrs, clusterEnv, addrs)
	if len(nodes) > 0 {
		fmt.Fprintf(w, "dashboard: http://%s/ui/ (every node serves it on its http address)\n", nodes[0].HTTPAddr)
	}
	if nfs := c.NFSAddrs(); len(nfs) > 0 {
		host, port, _ := strings.Cut(nfs[0], ":")
		fmt.Fprintf(w, "nfs: %d gateways, listed in %s; e.g. nfs-ls 'nfs://%s/default?nfsport=%s&mountport=%s'\n",
			len(nfs), filepath.Join(c.Dir(), devcluster.NFSFileName), host, port, port)
	}
	fmt.Fprintf(w, "running until SIGINT (Ctrl-C) or SIGTERM; started %s\n", time.Now().Format(time.TimeOnly))
}
