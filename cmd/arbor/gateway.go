package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/gateway/nfs"
)

func newGatewayCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve file systems over a network protocol (nfs)",
	}
	cmd.AddCommand(newGatewayNFSCmd(a))
	return cmd
}

func newGatewayNFSCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var listen string
	var portmap, drc bool
	cmd := &cobra.Command{
		Use:   "nfs",
		Short: "Serve every file system over NFSv3 until interrupted",
		Long: `Serve the cluster's file systems over NFSv3 (and MOUNT v3) on one TCP port
until SIGINT or SIGTERM. Every file system is exported as /NAME, and each of
its snapshots, read only, as /NAME/.snapshot/SNAP.

The gateway is stateless (FSS's Orca): file handles name their objects, so
any gateway of the cluster answers any handle, and a client may switch
gateways at any time. Clients that need a portmapper get one on port 111
with --portmap; others are told the port, e.g. with libnfs:
  nfs://HOST/default?nfsport=PORT&mountport=PORT`,
		Example: `  arbor gateway nfs --listen 127.0.0.1:2049 --dir /tmp/arbor
  nfs-ls 'nfs://127.0.0.1/default?nfsport=2049&mountport=2049'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			target, _, cancel, err := cf.connect(ctx, a.getenv)
			if err != nil {
				return err
			}
			cancel()
			c, err := client.Dial(client.Options{Addrs: target.Addrs, ClusterID: target.ClusterID, Credentials: target.Credentials, Logger: a.logger, DurableMetadata: true})
			if err != nil {
				return err
			}
			defer c.Close()
			cfg := nfs.Config{Backend: nfs.ClusterBackend{Cluster: c}, Logger: a.logger, Locks: nfs.KVLocks{Open: c.KV}}
			if drc {
				cfg.Replies = &nfs.KVReplies{Open: c.KV}
			}
			srv, err := nfs.Start(cfg, listen, portmap)
			if err != nil {
				return err
			}
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			if err := nfs.Register(rctx, c.Directory(), nfs.Registration{Addr: srv.Addr(), StartedUnixMs: time.Now().UnixMilli()}); err != nil {
				a.logger.Warn("arbor status will not list this gateway", "err", err)
			}
			rcancel()
			fmt.Fprintf(a.stdout, "serving NFSv3 on %s; running until SIGINT or SIGTERM\n", srv.Addr())
			var serr error
			select {
			case <-ctx.Done():
			case serr = <-srv.Done():
			}
			cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
			defer ccancel()
			if err := nfs.Deregister(cctx, c.Directory(), srv.Addr()); err != nil {
				a.logger.Warn("leaving the gateway's entry in the directory", "err", err)
			}
			if err := srv.Close(cctx); err != nil {
				fmt.Fprintf(a.stderr, "arbor gateway nfs: closing: %v\n", err)
			}
			return serr
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "address to serve NFS and MOUNT on (host:port)")
	cmd.Flags().BoolVar(&portmap, "portmap", false, "also answer the portmapper (program 100000) on port 111 of the --listen host")
	cmd.Flags().BoolVar(&drc, "drc", true, "keep the duplicate-request cache in the cluster's KV store (false: faster creates and removes, but a call retransmitted to another gateway may be applied twice)")
	return cmd
}
