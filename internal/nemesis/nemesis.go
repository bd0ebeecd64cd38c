package nemesis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/tract"
)

// Defaults and bounds of a run.
const (
	DefaultNodes  = 5
	DefaultCycles = 100
	// DefaultHoldMin and DefaultHoldMax bound how long a fault lasts.
	DefaultHoldMin = 3 * time.Second
	DefaultHoldMax = 12 * time.Second
	// DefaultCheckPatience is how long a check may keep failing after a
	// cycle's recovery (re-replication, a TLT repair) before it counts as
	// failed.
	DefaultCheckPatience = 3 * time.Minute
	// DefaultRecoveryPatience bounds the wait for the cluster to become
	// healthy, and serve every kind of request, after a fault is healed.
	DefaultRecoveryPatience = 3 * time.Minute
	// opTimeout bounds one workload operation through the libraries.
	opTimeout = 60 * time.Second
	// fileSystem is the file system the mounts share.
	fileSystem = "chaos"
	maxNodes   = 9
)

// Config configures a run.
type Config struct {
	// Binary is the arbor executable the nodes and mounts run (required).
	Binary string
	// Dir holds the run: the cluster in Dir/cluster, the mount points in
	// Dir/mnt1 and Dir/mnt2 (required; created if missing).
	Dir string
	// Nodes is the cluster's size (0: DefaultNodes).
	Nodes int
	// Cycles is how many fault cycles run (0: DefaultCycles).
	Cycles int
	// Seed drives every choice (0: a random seed, reported).
	Seed uint64
	// HoldMin and HoldMax bound a fault's duration (0: the defaults).
	HoldMin, HoldMax time.Duration
	// CheckPatience and RecoveryPatience (0: the defaults).
	CheckPatience, RecoveryPatience time.Duration
	// Faults, if set, limits the faults to these kinds (FaultKinds).
	Faults []string
	// DiskFull runs the last node on a small disk of its own (a 1 GiB
	// tmpfs; root only) and adds the fault that fills it up.
	DiskFull bool
	// Data is the layout of the file system's data and of the workload's
	// blobs: "" (the tract store's replication) or an erasure code
	// "ec:D+P" (tract.ParseLayout). An erasure-coded run needs D+P nodes
	// or more; its cluster gets TLT rows of D+P slots and 2P+1 directory
	// voters and metadata replicas, so that its metadata survives the P
	// lost nodes its data survives (kills of two nodes stay within that
	// for P >= 2).
	Data string
	// ServerArgs are extra `arbor server` arguments.
	ServerArgs []string
	// Out receives one line per cycle and the summary (nil: discarded).
	Out io.Writer
	// Logger receives details (nil: discarded).
	Logger *slog.Logger
}

func (c *Config) normalize() error {
	if c.Binary == "" || c.Dir == "" {
		return errors.New("nemesis: Binary and Dir are required")
	}
	if c.Nodes == 0 {
		c.Nodes = DefaultNodes
	}
	if c.Nodes < 3 || c.Nodes > maxNodes {
		return fmt.Errorf("nemesis: %d nodes, want 3 to %d", c.Nodes, maxNodes)
	}
	if c.Cycles == 0 {
		c.Cycles = DefaultCycles
	}
	if c.Cycles < 0 {
		return fmt.Errorf("nemesis: %d cycles", c.Cycles)
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64() | 1
	}
	if c.HoldMin == 0 {
		c.HoldMin = DefaultHoldMin
	}
	if c.HoldMax == 0 {
		c.HoldMax = DefaultHoldMax
	}
	if c.HoldMax < c.HoldMin {
		return fmt.Errorf("nemesis: hold %v-%v", c.HoldMin, c.HoldMax)
	}
	if c.CheckPatience == 0 {
		c.CheckPatience = DefaultCheckPatience
	}
	if c.RecoveryPatience == 0 {
		c.RecoveryPatience = DefaultRecoveryPatience
	}
	for _, f := range c.Faults {
		if !slices.Contains(FaultKinds(), f) {
			return fmt.Errorf("nemesis: unknown fault %q (faults: %v)", f, FaultKinds())
		}
	}
	if c.Data != "" {
		l, err := tract.ParseLayout(c.Data)
		if err != nil {
			return fmt.Errorf("nemesis: --data: %w", err)
		}
		if !l.IsEC() {
			return fmt.Errorf("nemesis: --data %s: only an erasure code (ec:D+P) is a mode of its own", l)
		}
		if c.Nodes < l.EC.Width() || 2*l.EC.Parity+1 > min(c.Nodes, extent.MaxReplication) {
			return fmt.Errorf("nemesis: --data %s needs %d nodes or more (and %d directory voters and metadata replicas); %d given", l, max(l.EC.Width(), 2*l.EC.Parity+1), 2*l.EC.Parity+1, c.Nodes)
		}
		c.Data = l.String()
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// run is one nemesis run's state.
type run struct {
	cfg     Config
	log     *slog.Logger
	rng     *rand.Rand // the nemesis's choices; only the cycle loop uses it
	cluster *devcluster.Cluster
	cl      *client.Cluster
	layout  tract.Layout // Config.Data, parsed (zero: replicated)
	mounts  []*mount
	sum     *Summary
	pause   sync.RWMutex // workers hold it for reading around each operation
	stop    chan struct{}
	wg      sync.WaitGroup

	logOffsets map[uint64]int64 // how far scanLogs read each node's log
	disk       *smallDisk       // the last node's small disk (Config.DiskFull)
	current    atomic.Int64     // the cycle running

	fs   []*fsWorker
	blob *blobWorker
	kv   *kvWorker
	bank *bank
}

// Run runs cfg.Cycles fault cycles and the final checks, and returns the
// summary. The error is about the run itself (the cluster would not start,
// ctx ended); what the run found is in the summary (Summary.Failed).
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, log: cfg.Logger, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6e656d65)), sum: newSummary(cfg), stop: make(chan struct{})}
	data := "replicated"
	if cfg.Data != "" {
		data = cfg.Data
	}
	fmt.Fprintf(cfg.Out, "nemesis: seed %d (replay with ARBOR_SEED=%d or --seed %d), %d nodes, %d cycles, data %s, in %s\n",
		cfg.Seed, cfg.Seed, cfg.Seed, cfg.Nodes, cfg.Cycles, data, cfg.Dir)
	start := time.Now()
	err := r.runAll(ctx)
	r.sum.Duration = time.Since(start)
	return r.sum, err
}

func (r *run) runAll(ctx context.Context) (err error) {
	if err := os.MkdirAll(r.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("nemesis: %w", err)
	}
	if _, err := os.Stat(filepath.Join(r.cfg.Dir, "cluster")); err == nil {
		return fmt.Errorf("nemesis: %s holds an earlier run: remove it or choose another directory (the checks need a new cluster)", r.cfg.Dir)
	}
	opts := devcluster.Options{
		Dir:          filepath.Join(r.cfg.Dir, "cluster"),
		Nodes:        r.cfg.Nodes,
		Binary:       r.cfg.Binary,
		ServerArgs:   r.cfg.ServerArgs,
		StartTimeout: r.cfg.RecoveryPatience,
		Logger:       r.log,
	}
	if r.cfg.Data != "" {
		if r.layout, err = tract.ParseLayout(r.cfg.Data); err != nil {
			return err
		}
		survive := 2*r.layout.EC.Parity + 1
		opts.DirectoryVoters, opts.MetadataReplicas = survive, survive
		opts.Env = []string{tract.OptionsEnv + "=replication=" + strconv.Itoa(r.layout.EC.Width())}
	}
	r.cluster, err = devcluster.Open(opts)
	if err != nil {
		return err
	}
	if r.cfg.DiskFull {
		last := uint64(r.cfg.Nodes)
		nd, _ := r.cluster.Node(last)
		if r.disk, err = mountSmallDisk(last, nd.Dir); err != nil {
			r.cluster.Close()
			return err
		}
	}
	defer func() {
		if cerr := r.cluster.Close(); cerr != nil {
			r.log.Warn("stopping the cluster", "err", cerr)
		}
		if r.disk != nil {
			r.disk.unmount()
		}
	}()
	if err := r.cluster.Start(ctx); err != nil {
		return err
	}
	r.cl, err = client.Dial(client.Options{Addrs: r.cluster.DirectoryAddrs(), ClusterID: r.cluster.ClusterID(), Credentials: r.cluster.Credentials(), Logger: r.log})
	if err != nil {
		return err
	}
	defer r.cl.Close()
	if err := r.setUp(ctx); err != nil {
		r.stopWorkers()
		r.unmountAll()
		return err
	}
	defer r.unmountAll()
	r.startWorkers()
	exits := r.watchExits()
	defer close(exits)

	for i := 1; i <= r.cfg.Cycles && ctx.Err() == nil; i++ {
		r.current.Store(int64(i))
		r.cycle(ctx, i)
		r.sum.mu.Lock()
		r.sum.CyclesRun = i
		r.sum.mu.Unlock()
	}
	r.stopWorkers()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.finalChecks(ctx)
	return nil
}

// setUp creates the file system, mounts it twice, and prepares the
// workloads' state.
func (r *run) setUp(ctx context.Context) error {
	create := []string{"fs", "create", fileSystem}
	if r.cfg.Data != "" {
		create = append(create, "--data", r.cfg.Data)
	}
	if _, err := r.cli(ctx, time.Minute, create...); err != nil {
		return fmt.Errorf("nemesis: create the file system: %w", err)
	}
	for i := 1; i <= 2; i++ {
		m, err := startMount(ctx, r.cfg.Binary, r.cluster.Dir(), fileSystem, filepath.Join(r.cfg.Dir, fmt.Sprintf("mnt%d", i)), r.log)
		if err != nil {
			return fmt.Errorf("nemesis: mount %d: %w", i, err)
		}
		r.mounts = append(r.mounts, m)
	}
	seed := r.cfg.Seed
	for i := range 2 {
		w, err := newFSWorker(ctx, i, r.mounts[i].dir, r.mounts[1-i].dir, r.cfg.Dir, seed+uint64(i)+1)
		if err != nil {
			return err
		}
		r.fs = append(r.fs, w)
	}
	tc, err := r.cl.Tracts()
	if err != nil {
		return err
	}
	r.blob = newBlobWorker(tc, r.layout, seed+11)
	tree, err := r.cl.KV(ctx)
	if err != nil {
		return fmt.Errorf("nemesis: open the KV store: %w", err)
	}
	r.kv = newKVWorker(tree, seed+12)
	r.bank, err = newBank(ctx, tree, seed+13)
	return err
}

// startWorkers runs every workload in its own goroutine until stop.
func (r *run) startWorkers() {
	loop := func(name string, pace time.Duration, op func(ctx context.Context) error) {
		r.wg.Go(func() {
			for {
				select {
				case <-r.stop:
					return
				default:
				}
				r.pause.RLock()
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				err := op(ctx)
				cancel()
				r.pause.RUnlock()
				r.sum.op(name, err)
				wait := pace
				if err != nil {
					r.log.Debug("workload operation failed", "worker", name, "err", err)
					wait = max(pace, 100*time.Millisecond) // do not spin on a cluster that is down
				}
				select {
				case <-r.stop:
					return
				case <-time.After(wait):
				}
			}
		})
	}
	for i, w := range r.fs {
		loop(fmt.Sprintf("fs%d", i+1), 0, w.step)
	}
	// The library workloads are paced so that a long run's checks and
	// disks stay bounded (a few thousand keys and blobs per hour).
	loop("blob", 300*time.Millisecond, r.blob.step)
	loop("kv", 50*time.Millisecond, r.kv.step)
	for i := range 2 {
		loop(fmt.Sprintf("bank%d", i+1), 5*time.Millisecond, func(ctx context.Context) error { return r.bank.step(ctx, i) })
	}
}

func (r *run) stopWorkers() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

// paused runs f while no workload operation runs.
func (r *run) paused(f func()) time.Duration {
	start := time.Now()
	r.pause.Lock()
	waited := time.Since(start)
	defer r.pause.Unlock()
	f()
	return waited
}

// watchExits records nodes that exit without being asked to.
func (r *run) watchExits() chan struct{} {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case e := <-r.cluster.Exits():
				r.sum.fail(int(r.current.Load()), "crash", fmt.Sprintf("node %d exited unexpectedly (%v); end of its log:\n%s", e.ID, e.Err, e.LogTail))
			}
		}
	}()
	return done
}

// nodeIDs returns every node's id.
func (r *run) nodeIDs() []uint64 {
	var ids []uint64
	for _, n := range r.cluster.Nodes() {
		ids = append(ids, n.ID)
	}
	return ids
}

// pick returns a random element of ids other than those in not.
func (r *run) pick(ids []uint64, not ...uint64) uint64 {
	var c []uint64
	for _, id := range ids {
		if !slices.Contains(not, id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0
	}
	return c[r.rng.IntN(len(c))]
}
