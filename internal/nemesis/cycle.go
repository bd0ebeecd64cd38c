package nemesis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/overview"
	"github.com/arbor-storage/arbor/internal/retry"
)

// The nemesis's faults.
const (
	faultKill     = "kill"      // kill -9 of one node, restarted after the hold
	faultKillTwo  = "kill-two"  // kill -9 of two nodes at once
	faultRestart  = "restart"   // a graceful stop, started again after the hold
	faultIsolate  = "isolate"   // one node cut off from all others
	faultMinority = "partition" // two nodes cut off from the other three
	faultSlow     = "slow-rpcs" // every node delays 30% of its RPCs by 5-80 ms
	faultFlaky    = "flaky-rpcs"
	faultDiskFull = "disk-full" // the small disk of the last node filled up (Config.DiskFull)
)

// FaultKinds lists every fault the nemesis knows, for Config.Faults.
func FaultKinds() []string {
	kinds := make([]string, len(faultWeights))
	for i, f := range faultWeights {
		kinds[i] = f.kind
	}
	return kinds
}

// faultWeights is how often each fault is chosen.
var faultWeights = []struct {
	kind   string
	weight int
}{
	{faultKill, 4}, {faultKillTwo, 2}, {faultRestart, 1}, {faultIsolate, 2},
	{faultMinority, 2}, {faultSlow, 1}, {faultFlaky, 1}, {faultDiskFull, 1},
}

// Victims the nemesis aims at on purpose.
const (
	victimRandom          = "random"
	victimDirectoryLeader = "directory-leader"
	victimTableOwner      = "table-owner"
	victimExtentLeader    = "extent-leader"
)

func (r *run) chooseFault() string {
	total := 0
	for _, f := range faultWeights {
		if r.faultEnabled(f.kind) {
			total += f.weight
		}
	}
	n := r.rng.IntN(total)
	for _, f := range faultWeights {
		if !r.faultEnabled(f.kind) {
			continue
		}
		if n < f.weight {
			return f.kind
		}
		n -= f.weight
	}
	return faultKill
}

// faultEnabled reports whether the run may inject kind: the disk-full
// fault only with Config.DiskFull, every fault unless Config.Faults names
// some.
func (r *run) faultEnabled(kind string) bool {
	if kind == faultDiskFull && !r.cfg.DiskFull {
		return false
	}
	return len(r.cfg.Faults) == 0 || slices.Contains(r.cfg.Faults, kind)
}

// victim picks the node a fault hits: a quarter of the time each, the
// directory's leader, the owner of one of the file system's tables, the
// leader of an extent, or any node. If the role's holder cannot be found,
// any node.
func (r *run) victim(ctx context.Context) (string, uint64) {
	ids := r.nodeIDs()
	role := []string{victimRandom, victimDirectoryLeader, victimTableOwner, victimExtentLeader}[r.rng.IntN(4)]
	any := r.pick(ids)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var id uint64
	switch role {
	case victimDirectoryLeader:
		if st, err := r.cluster.DirectoryStatus(ctx); err == nil {
			id = st.GetLeaderId()
		}
	case victimTableOwner:
		if m, err := r.cl.Directory().GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{}); err == nil {
			var owners []uint64
			for _, d := range m.GetDelegations() {
				if d.GetOwnerNode() != 0 {
					owners = append(owners, d.GetOwnerNode())
				}
			}
			if len(owners) > 0 {
				id = owners[r.rng.IntN(len(owners))]
			}
		}
	case victimExtentLeader:
		id = r.extentLeader(ctx)
	}
	if id == 0 {
		return victimRandom, any
	}
	return role, id
}

// extentLeader returns the leader of a random extent (0 if none known).
func (r *run) extentLeader(ctx context.Context) uint64 {
	ec, err := extent.NewClient(extent.ClientConfig{Directory: r.cl.Directory(), DialOptions: r.cluster.DialOptions()})
	if err != nil {
		return 0
	}
	defer ec.Close()
	infos, err := ec.Extents(ctx)
	if err != nil || len(infos) == 0 {
		return 0
	}
	e := infos[r.rng.IntN(len(infos))]
	return overview.LeaderOf(ctx, ec, e.ID, e.Replicas)
}

// cycle runs one fault, its recovery, and the checks.
func (r *run) cycle(ctx context.Context, n int) {
	kind := r.chooseFault()
	hold := r.cfg.HoldMin + time.Duration(r.rng.Int64N(int64(r.cfg.HoldMax-r.cfg.HoldMin)+1))
	role, v := r.victim(ctx)
	ids := r.nodeIDs()
	faultSeed := r.rng.Uint64()
	var down []uint64 // nodes to start again
	what := ""
	var err error
	switch kind {
	case faultKill:
		what = fmt.Sprintf("kill -9 node %d (%s)", v, role)
		err = r.cluster.Kill(v)
		down = []uint64{v}
	case faultKillTwo:
		v2 := r.pick(ids, v)
		what = fmt.Sprintf("kill -9 nodes %d (%s) and %d", v, role, v2)
		err = errors.Join(r.cluster.Kill(v), r.cluster.Kill(v2))
		down = []uint64{v, v2}
	case faultRestart:
		what = fmt.Sprintf("stop node %d (%s) and start it again", v, role)
		err = r.cluster.StopNode(ctx, v)
		down = []uint64{v}
	case faultIsolate:
		what = fmt.Sprintf("isolate node %d (%s)", v, role)
		err = r.cluster.Isolate(ctx, v)
	case faultMinority:
		v2 := r.pick(ids, v)
		what = fmt.Sprintf("partition nodes %d (%s) and %d from the rest", v, role, v2)
		err = r.cluster.Partition(ctx, v, v2)
	case faultSlow:
		what = "delay 30% of every node's RPCs by 5-80 ms"
		err = r.setFaultsAll(ctx, fmt.Sprintf("delay=0.3:5ms-80ms,seed=%d", faultSeed))
	case faultFlaky:
		what = "fail 3% and duplicate 2% of every node's RPCs"
		err = r.setFaultsAll(ctx, fmt.Sprintf("fail=0.03,dup=0.02,seed=%d", faultSeed))
	case faultDiskFull:
		what = fmt.Sprintf("fill node %d's disk", r.disk.node)
		err = r.disk.fill()
	}
	r.sum.fault(kind)
	r.log.Info("nemesis: fault", "cycle", n, "fault", what, "hold", hold)
	if err != nil {
		r.sum.fail(n, "nemesis", fmt.Sprintf("%s: %v", what, err))
	}
	_ = retry.Sleep(ctx, hold)

	// Heal: partitions and faults off, stopped nodes started again.
	healed := time.Now()
	if err := r.cluster.Heal(ctx); err != nil {
		r.log.Warn("heal", "err", err)
	}
	if kind == faultSlow || kind == faultFlaky {
		if err := r.setFaultsAll(ctx, "off"); err != nil {
			r.sum.fail(n, "nemesis", fmt.Sprintf("turn faults off: %v", err))
		}
	}
	if kind == faultDiskFull {
		if err := r.disk.free(); err != nil {
			r.sum.fail(n, "nemesis", fmt.Sprintf("free node %d's disk: %v", r.disk.node, err))
		}
		// A node that stopped on the full disk is started again (its exit
		// is reported as a crash).
		if nd, ok := r.cluster.Node(r.disk.node); ok && !nd.Running {
			down = append(down, r.disk.node)
		}
	}
	if open := r.openMountFiles(); len(open) > 0 {
		r.sum.fail(n, "nemesis", fmt.Sprintf("the nemesis holds files of a mount open while it starts nodes (their exec would flush them through the cluster being restarted): %v", open))
	}
	for _, id := range down {
		if err := r.cluster.StartNode(ctx, id); err != nil {
			r.sum.fail(n, "nemesis", fmt.Sprintf("start node %d again: %v", id, err))
		}
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.RecoveryPatience)
	err = r.cluster.WaitHealthy(wctx)
	cancel()
	healthy := time.Since(healed)
	if err != nil {
		r.sum.fail(n, "recovery", fmt.Sprintf("after %s: cluster not healthy within %v: %v", what, r.cfg.RecoveryPatience, err))
	}
	serving, perr := r.probe(ctx, healed)
	if perr != nil {
		r.sum.fail(n, "recovery", fmt.Sprintf("after %s: %v", what, perr))
	}
	r.sum.recovered(kind, healthy, serving)

	var checks time.Duration
	waited := r.paused(func() {
		start := time.Now()
		r.checkAll(ctx, n, false)
		checks = time.Since(start)
	})
	fmt.Fprintf(r.cfg.Out, "cycle %d/%d: %s for %v; healthy after %v, serving after %v; workload paused in %v, checks %v; %s\n",
		n, r.cfg.Cycles, what, hold.Round(time.Millisecond), healthy.Round(time.Millisecond), serving.Round(time.Millisecond),
		waited.Round(time.Millisecond), checks.Round(time.Millisecond), r.sum.brief())
}

// setFaultsAll sets every running node's fault configuration.
func (r *run) setFaultsAll(ctx context.Context, spec string) error {
	var errs []error
	for _, n := range r.cluster.Nodes() {
		if n.Running {
			errs = append(errs, r.cluster.SetFaults(ctx, n.ID, spec))
		}
	}
	return errors.Join(errs...)
}

// probe waits until a KV put, a blob put and a file write through the
// first mount all succeed, and returns how long after since that took.
func (r *run) probe(ctx context.Context, since time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RecoveryPatience)
	defer cancel()
	tree, err := r.cl.KV(ctx)
	if err != nil {
		return time.Since(since), err
	}
	tc, err := r.cl.Tracts()
	if err != nil {
		return time.Since(since), err
	}
	probes := []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"kv put", func(ctx context.Context) error {
			return tree.Put(ctx, []byte("chaos/probe"), []byte(time.Now().String()))
		}},
		{"blob put", func(ctx context.Context) error {
			_, _, err := putBlob(ctx, tc, r.layout, []byte("probe"))
			return err
		}},
		{"file write", func(ctx context.Context) error {
			return writeFileSync(ctx, filepath.Join(r.mounts[0].dir, "probe"), filepath.Join(r.cfg.Dir, "probe.data"), []byte(time.Now().String()))
		}},
	}
	for _, p := range probes {
		for {
			actx, acancel := context.WithTimeout(ctx, 20*time.Second)
			err := p.f(actx)
			acancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return time.Since(since), fmt.Errorf("%s never succeeded: %w", p.name, err)
			}
			_ = retry.Sleep(ctx, 200*time.Millisecond)
		}
	}
	return time.Since(since), nil
}

// openMountFiles lists the files of the mounts this process holds open
// (see fsCmd: it must hold none when it forks a node).
func (r *run) openMountFiles() []string {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var open []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue
		}
		for _, m := range r.mounts {
			if target == m.dir || strings.HasPrefix(target, m.dir+"/") {
				open = append(open, target)
			}
		}
	}
	return open
}
