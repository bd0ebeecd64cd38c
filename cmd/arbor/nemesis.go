package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/nemesis"
)

func newDebugNemesisCmd(a *app) *cobra.Command {
	cfg := nemesis.Config{Cycles: nemesis.DefaultCycles, Nodes: nemesis.DefaultNodes,
		HoldMin: nemesis.DefaultHoldMin, HoldMax: nemesis.DefaultHoldMax}
	var seed string
	var faultKinds []string
	cmd := &cobra.Command{
		Use:   "nemesis",
		Short: "Run a dev cluster under a mixed workload through kill, restart and partition cycles, and check that nothing is lost",
		Long: `Start a dev cluster in --dir (DIR/cluster) with two FUSE mounts of one file
system (DIR/mnt1, DIR/mnt2), run a mixed workload on it (files written,
fsynced, renamed and removed through both mounts; blobs put and read; KV
puts, and transactions moving value between accounts whose total never
changes), and run --cycles fault cycles: kill -9 of one or two nodes (the
directory leader, a table owner or an extent leader on purpose some of the
time), graceful restarts, partitions of one node or of a minority, slow and
failing RPCs. After each cycle, and at the end: every acknowledged file,
blob and key must read back with its checksum, fsck, kv check and blob
verify must pass, the accounts' total must hold and their history must be
linearizable (porcupine). Prints a line per cycle and a summary (faults,
operations, recovery times, anything lost); exits 1 if anything was lost or
a check failed (a node that panics because its disk is full, a known issue
of another layer, is listed apart). Every choice comes from --seed (default $ARBOR_SEED, else
random; the summary prints it).`,
		Example: `  arbor debug nemesis --dir /tmp/arbor-chaos --cycles 100
  arbor debug nemesis --dir /tmp/arbor-chaos --cycles 3 --seed 42
  arbor debug nemesis --dir /tmp/arbor-chaos-ec --nodes 7 --data ec:5+2 --cycles 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Dir == "" {
				return fmt.Errorf("--dir is required: the directory that holds the run's cluster and mounts")
			}
			if seed == "" {
				seed = os.Getenv("ARBOR_SEED")
			}
			if seed != "" {
				n, err := strconv.ParseUint(seed, 10, 64)
				if err != nil {
					return fmt.Errorf("--seed %q: not an unsigned integer", seed)
				}
				cfg.Seed = n
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the arbor binary: %w", err)
			}
			cfg.Binary = self
			cfg.Faults = faultKinds
			cfg.Out = a.stdout
			cfg.Logger = a.logger
			cfg.ServerArgs = []string{"--log-format=" + a.logFormat, "--log-level=" + a.logLevel}
			sum, err := nemesis.Run(cmd.Context(), cfg)
			if sum != nil {
				sum.Print(a.stdout)
			}
			if err != nil {
				return err
			}
			if sum.Failed() {
				return fmt.Errorf("the nemesis found problems (%d lost, %d other); replay with --seed %d",
					len(sum.Lost), len(sum.Failures), sum.Seed)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Dir, "dir", "", "directory of the run (created if missing): the cluster and the mount points")
	fl.IntVar(&cfg.Cycles, "cycles", cfg.Cycles, "fault cycles to run")
	fl.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "nodes of the cluster (3 to 9)")
	fl.StringVar(&cfg.Data, "data", "", "erasure-code the file system's data and the workload's blobs: ec:D+P (needs D+P nodes; the cluster gets rows of D+P and 2P+1 directory voters and metadata replicas)")
	fl.StringVar(&seed, "seed", "", "seed of every choice (default $ARBOR_SEED, else random)")
	fl.StringSliceVar(&faultKinds, "faults", nil, fmt.Sprintf("inject only these faults (default: all of %v)", nemesis.FaultKinds()))
	fl.BoolVar(&cfg.DiskFull, "disk-full", false, "run the last node on a 1 GiB tmpfs of its own and add the fault that fills it (needs root)")
	fl.DurationVar(&cfg.HoldMin, "hold-min", cfg.HoldMin, "shortest a fault lasts")
	fl.DurationVar(&cfg.HoldMax, "hold-max", cfg.HoldMax, "longest a fault lasts")
	fl.DurationVar(&cfg.CheckPatience, "check-patience", nemesis.DefaultCheckPatience, "how long a check may keep failing after a recovery before it counts as failed")
	fl.DurationVar(&cfg.RecoveryPatience, "recovery-patience", nemesis.DefaultRecoveryPatience, "how long the cluster may take to serve again after a fault is healed")
	return cmd
}
