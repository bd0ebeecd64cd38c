package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/server"
	"github.com/arbor-storage/arbor/internal/tract"
)

// faultsEnv names the environment variable with the default --faults.
const faultsEnv = "ARBOR_FAULTS"

// tractEnv names the environment variable with the default --tract.
const tractEnv = tract.OptionsEnv

// serverFlags are the flags of `arbor server`, as strings and numbers;
// config builds a server.Config from them.
type serverFlags struct {
	configFile     string
	nodeID         uint64
	clusterID      string
	dataDir        string
	diskReserve    string
	listen         string
	advertise      string
	http           string
	nfsListen      string
	domain         string
	disks          string
	roles          string
	directoryPeers string
	directoryJoin  bool
	faults         string
	tract          string
	metaReplicas   int
	timeouts       server.Timeouts
	tls            server.TLSFiles
	insecure       bool
	pprof          bool
}

func newServerCmd(a *app) *cobra.Command {
	f := &serverFlags{timeouts: server.DefaultTimeouts()}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run one arbor node",
		Long: `Run one arbor node until SIGINT or SIGTERM, then shut it down cleanly.

Settings come from flags and, optionally, a YAML or JSON file (--config)
whose keys are the flag names; flags win over the file. The fault-injection
switch (--faults) defaults to $` + faultsEnv + `.

gRPC is served only over mutual TLS: the node presents its certificate
and requires every caller's to chain to the cluster CA (--tls-dir, or
--tls-cert, --tls-key and --tls-ca; make them with ` + "`arbor cert`" + `).
Without them the server refuses to start unless --insecure is given.`,
		Example: `  arbor server --node-id 1 --cluster-id prod --data-dir /var/lib/arbor \
    --tls-dir /etc/arbor/tls --listen 10.0.0.1:7080 --http 10.0.0.1:7081 --domain rack-1 \
    --roles directory,storage \
    --directory-peers 1=10.0.0.1:7080,2=10.0.0.2:7080,3=10.0.0.3:7080`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if f.configFile == "" {
				return nil
			}
			if err := applyConfigFile(cmd.Flags(), f.configFile); err != nil {
				return err
			}
			return a.setUpLogging() // the file may set the log flags
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(a)
			if err != nil {
				return err
			}
			return a.runServer(cmd.Context(), cfg)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.configFile, "config", "", "YAML or JSON file of flag values (flags win)")
	fl.Uint64Var(&f.nodeID, "node-id", 0, "this node's id: positive, unique in the cluster, never reused")
	fl.StringVar(&f.clusterID, "cluster-id", "", "the cluster's id; nodes refuse calls for any other")
	fl.StringVar(&f.dataDir, "data-dir", "", "directory holding all of this node's state")
	fl.StringVar(&f.diskReserve, "disk-reserve", fmt.Sprintf("%dMiB", raftengine.DefaultBallastBytes>>20),
		"space kept in reserve in --data-dir (a ballast file): when the disk fills up the node releases it and refuses writes instead of crashing; 0 for none")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7080", "gRPC listen address host:port")
	fl.StringVar(&f.advertise, "advertise", "", "address other nodes use to reach this one (default --listen)")
	fl.StringVar(&f.http, "http", "127.0.0.1:7081", "HTTP address for /metrics, /healthz (and /debug/pprof with --pprof)")
	fl.StringVar(&f.domain, "domain", "", "failure domain (host, rack): no two replicas share one (default: host name)")
	fl.StringVar(&f.disks, "disks", "", "comma-separated directories whose space the storage role serves (default --data-dir)")
	fl.StringVar(&f.roles, "roles", string(server.RoleStorage)+","+string(server.RoleMeta), "comma-separated roles: directory, storage, meta, gateway")
	fl.StringVar(&f.nfsListen, "nfs-listen", "127.0.0.1:2049", "address the gateway role serves NFSv3 and MOUNT on (host:port)")
	fl.StringVar(&f.directoryPeers, "directory-peers", "", "the directory group: id=host:port,...")
	fl.BoolVar(&f.directoryJoin, "directory-join", false, "a directory peer with a new (empty) data dir joins the running directory instead of bootstrapping it (after `arbor directory recover`)")
	fl.StringVar(&f.tract, "tract", "", "tract store settings, e.g. tract-size=4MiB,replication=3 (default $"+tractEnv+"); the tract size is fixed when the cluster is created")
	fl.IntVar(&f.metaReplicas, "metadata-replicas", extent.DefaultReplication, "replicas of each metadata extent (file systems' metadata, KV, tables) a new cluster creates: 2f+1 survive f lost nodes; fixed when the cluster is created")
	fl.StringVar(&f.faults, "faults", "", "fault injection, e.g. fail=0.01,delay=0.05:1ms-20ms,dup=0.01,methods=REGEX,seed=N (default $"+faultsEnv+")")
	fl.StringVar(&f.tls.Dir, "tls-dir", "", "directory of the node's credentials: "+server.NodeCertFileName+", "+server.NodeKeyFileName+", "+server.CAFileName+" (as `arbor cert node --out` writes them)")
	fl.StringVar(&f.tls.CertFile, "tls-cert", "", "the node's certificate (PEM; default --tls-dir/"+server.NodeCertFileName+")")
	fl.StringVar(&f.tls.KeyFile, "tls-key", "", "the node's private key (PEM; default --tls-dir/"+server.NodeKeyFileName+")")
	fl.StringVar(&f.tls.CAFile, "tls-ca", "", "the cluster CA's certificate (PEM; default --tls-dir/"+server.CAFileName+")")
	fl.BoolVar(&f.insecure, "insecure", false, "serve gRPC in plain text with no authentication at all (benchmark references, debugging)")
	fl.BoolVar(&f.pprof, "pprof", false, "serve /debug/pprof/ on the HTTP port")
	fl.DurationVar(&f.timeouts.Shutdown, "shutdown-timeout", f.timeouts.Shutdown, "bound on a graceful shutdown")
	fl.DurationVar(&f.timeouts.RPC, "rpc-timeout", f.timeouts.RPC, "default deadline of calls between nodes")
	fl.DurationVar(&f.timeouts.Heartbeat, "heartbeat-interval", f.timeouts.Heartbeat, "how often the node heartbeats to the directory")
	fl.DurationVar(&f.timeouts.NodeDead, "node-dead-timeout", f.timeouts.NodeDead, "silence after which the directory declares a node dead")
	fl.DurationVar(&f.timeouts.RaftTick, "raft-tick", f.timeouts.RaftTick, "Raft tick interval")
	return cmd
}

// config builds the node's configuration from the flags.
func (f *serverFlags) config(a *app) (server.Config, error) {
	roles, err := server.ParseRoles(f.roles)
	if err != nil {
		return server.Config{}, fmt.Errorf("--roles: %w", err)
	}
	peers, err := server.ParsePeers(f.directoryPeers)
	if err != nil {
		return server.Config{}, fmt.Errorf("--directory-peers: %w", err)
	}
	spec, source := f.faults, "--faults"
	if spec == "" {
		spec, source = a.getenv(faultsEnv), "$"+faultsEnv
	}
	fc, err := faults.Parse(spec)
	if err != nil {
		return server.Config{}, fmt.Errorf("%s: %w", source, err)
	}
	tractSpec, tractSource := f.tract, "--tract"
	if tractSpec == "" {
		tractSpec, tractSource = a.getenv(tractEnv), "$"+tractEnv
	}
	tractOpts, err := tract.ParseOptions(tractSpec)
	if err != nil {
		return server.Config{}, fmt.Errorf("%s: %w", tractSource, err)
	}
	reserve, err := tract.ParseBytes(f.diskReserve)
	if err != nil || reserve > 1<<40 {
		return server.Config{}, fmt.Errorf("--disk-reserve %q: want a size such as 72MiB, at most 1 TiB", f.diskReserve)
	}
	var disks []string
	for d := range strings.SplitSeq(f.disks, ",") {
		if d = strings.TrimSpace(d); d != "" {
			disks = append(disks, d)
		}
	}
	cfg := server.Config{
		NodeID:           f.nodeID,
		ClusterID:        f.clusterID,
		DataDir:          f.dataDir,
		DiskReserve:      int64(reserve),
		ListenAddr:       f.listen,
		AdvertiseAddr:    f.advertise,
		HTTPAddr:         f.http,
		NFSAddr:          f.nfsListen,
		FailureDomain:    f.domain,
		Disks:            disks,
		Roles:            roles,
		DirectoryPeers:   peers,
		DirectoryJoin:    f.directoryJoin,
		Faults:           fc,
		Tract:            tractOpts,
		MetadataReplicas: f.metaReplicas,
		Log:              a.logConfig,
		Logger:           a.logger,
		Timeouts:         f.timeouts,
		TLS:              f.tls,
		Insecure:         f.insecure,
		PProf:            f.pprof,
	}
	return cfg.Normalize()
}
