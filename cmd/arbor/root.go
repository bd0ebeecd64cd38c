package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/server"
)

// app is what every command shares: its streams, environment and logger.
// Passing it around (instead of package variables) keeps commands
// testable in one process.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	logFormat, logLevel string
	logConfig           server.LogConfig
	logger              *slog.Logger

	// The effects commands end in; tests replace them.
	runServer    func(ctx context.Context, cfg server.Config) error
	fetchView    func(ctx context.Context, target clusterTarget) (ClusterView, error)
	decommission func(ctx context.Context, target clusterTarget, id uint64, acceptLoss bool) error
}

func newRootCmd(a *app) *cobra.Command {
	if a.runServer == nil {
		a.runServer = server.Run
	}
	if a.fetchView == nil {
		a.fetchView = func(ctx context.Context, t clusterTarget) (ClusterView, error) {
			if err := probeCluster(ctx, t.Addrs); err != nil {
				return ClusterView{}, err
			}
			return fetchClusterView(ctx, t)
		}
	}
	if a.decommission == nil {
		a.decommission = func(ctx context.Context, t clusterTarget, id uint64, acceptLoss bool) error {
			if err := probeCluster(ctx, t.Addrs); err != nil {
				return err
			}
			return decommissionNode(ctx, t, id, acceptLoss)
		}
	}
	root := &cobra.Command{
		Use:   "arbor",
		Short: "Arbor: a scalable, fault-tolerant storage system",
		Long: `Arbor is a storage system for one data center: a file system, a blob store
and a transactional key-value store over one replicated store.

  arbor dev --dir /tmp/arbor     run a whole cluster on this machine
  arbor status --dir /tmp/arbor  show the cluster
  arbor server ...               run one node (production)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setUpLogging()
		},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "lowest level logged: debug, info, warn or error")
	root.AddCommand(
		newServerCmd(a), newCertCmd(a), newTenantCmd(a),
		newDevCmd(a),
		newStatusCmd(a),
		newNodesCmd(a),
		newVersionCmd(a),
		newDebugCmd(a),
		newExtentCmd(a), newDirectoryCmd(a),
		newBlobCmd(a), newTLTCmd(a),
		newKVCmd(a),
		newFSCmd(a), newSnapshotCmd(a), newMountCmd(a), newFsckCmd(a), newTableCmd(a),
		newGatewayCmd(a),
	)
	return root
}

// setUpLogging builds the logger from --log-format and --log-level. It
// runs after flags (and a config file's values) are set.
func (a *app) setUpLogging() error {
	level, err := server.ParseLogLevel(a.logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	a.logConfig = server.LogConfig{Format: a.logFormat, Level: level}
	a.logger, err = server.NewLogger(a.stderr, a.logConfig)
	if err != nil {
		return fmt.Errorf("--log-format: %w", err)
	}
	return nil
}
