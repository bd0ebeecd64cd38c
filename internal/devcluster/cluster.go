package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/server"
)

// Defaults for Options.
const (
	DefaultStartTimeout = time.Minute
	DefaultStopTimeout  = 20 * time.Second
	// healthPollInterval is how often WaitHealthy re-checks.
	healthPollInterval = 100 * time.Millisecond
	// healthRequestTimeout bounds one /healthz request.
	healthRequestTimeout = 3 * time.Second
	// adminCallTimeout bounds one Admin call when no deadline is given.
	adminCallTimeout = 10 * time.Second
)

// HealthCheck decides whether a cluster is healthy; WaitHealthy polls it.
type HealthCheck func(ctx context.Context, c *Cluster) error

// Options configures a Cluster.
type Options struct {
	// Dir holds the cluster (required). It is created if missing.
	Dir string
	// Nodes is the number of nodes. Zero: as saved in Dir, or
	// DefaultNodes for a new cluster. More than saved adds storage nodes;
	// fewer is an error.
	Nodes int
	// DirectoryVoters is how many of the first nodes are directory
	// voters. Zero: as saved, or DefaultDirectoryVoters (at most Nodes).
	// Changing it for an existing cluster is an error.
	DirectoryVoters int
	// MetadataReplicas is how many replicas each metadata extent gets
	// (every server's --metadata-replicas): 2f+1 survive f lost nodes.
	// Zero: as saved, or the server's default (3). It is chosen when the
	// cluster is created; changing it later is an error.
	MetadataReplicas int
	// Binary is the arbor executable (required): os.Executable() for
	// arbor dev, devclustertest.Binary in tests.
	Binary string
	// ServerArgs are extra arguments for every `arbor server`, for example
	// "--faults=fail=0.01" or "--log-level=debug".
	ServerArgs []string
	// Env is extra environment for the servers, "KEY=value".
	Env []string
	// Health decides when the cluster is up. Nil: ClusterHealthy.
	Health HealthCheck
	// StartTimeout bounds Start's wait for health (0: DefaultStartTimeout).
	StartTimeout time.Duration
	// StopTimeout is how long a node gets between SIGTERM and SIGKILL (0:
	// DefaultStopTimeout).
	StopTimeout time.Duration
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// Insecure runs the servers with --insecure (plain text, no
	// authentication) and dials them so: the reference of the
	// benchmarks' TLS cost. Otherwise (the default) the cluster's
	// credentials are in DIR/tls (created at first start) and every
	// connection is mutual TLS.
	Insecure bool
	// PProf serves /debug/pprof/ on every node's HTTP port (--pprof).
	PProf bool
}

// Node describes one node of a cluster.
type Node struct {
	ID uint64
	// Addr is the node's gRPC address, HTTPAddr its HTTP one.
	Addr, HTTPAddr string
	Domain         string
	Roles          []string
	// NFSAddr is where its NFS gateway serves (role gateway).
	NFSAddr string
	// Dir is the node's data dir; LogPath its log file.
	Dir, LogPath string
	// PID is the server's process id while it runs (0 otherwise).
	PID     int
	Running bool
}

// Exit reports that a node exited without being asked to.
type Exit struct {
	ID  uint64
	Err error // the process's exit status; nil for exit code 0
	// LogTail is the end of its log.
	LogTail string
}

// Cluster is a local cluster of arbor server processes. Its methods are
// safe for concurrent use.
type Cluster struct {
	opts    Options
	dir     string
	logger  *slog.Logger
	health  HealthCheck
	lock    *os.File
	spawner *spawner
	exits   chan Exit

	mu      sync.Mutex
	layout  *layout
	procs   map[uint64]*process
	blocked map[uint64]map[uint64]bool // node -> peers it blocks, reapplied after restarts
	conns   map[string]*grpc.ClientConn
	closed  bool
	// creds are the admin credentials (nil if Options.Insecure).
	creds *security.Credentials
}

// Open takes ownership of opts.Dir (an flock on DIR/dev.lock) and loads its
// layout, or creates a new cluster: a random cluster id, node ids 1..N and
// free 127.0.0.1 ports, saved in DIR/dev.json. No process starts yet.
func Open(opts Options) (c *Cluster, err error) {
	if opts.Dir == "" {
		return nil, errors.New("devcluster: no cluster directory")
	}
	if opts.Binary == "" {
		return nil, errors.New("devcluster: no arbor binary")
	}
	if opts.Nodes < 0 || opts.Nodes > maxNodes {
		return nil, fmt.Errorf("devcluster: %d nodes, want 1 to %d", opts.Nodes, maxNodes)
	}
	if opts.DirectoryVoters < 0 || (opts.Nodes > 0 && opts.DirectoryVoters > opts.Nodes) {
		return nil, fmt.Errorf("devcluster: %d directory voters for %d nodes", opts.DirectoryVoters, opts.Nodes)
	}
	if opts.DirectoryVoters > 0 && opts.DirectoryVoters%2 == 0 {
		return nil, fmt.Errorf("devcluster: %d directory voters: use an odd number (a Raft majority of an even group tolerates no more failures)", opts.DirectoryVoters)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	health := opts.Health
	if health == nil {
		health = ClusterHealthy
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	c = &Cluster{
		opts: opts, dir: dir, logger: logger, health: health, lock: lock,
		exits:   make(chan Exit, maxNodes),
		procs:   map[uint64]*process{},
		blocked: map[uint64]map[uint64]bool{},
		conns:   map[string]*grpc.ClientConn{},
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if c.layout, err = c.loadOrCreateLayout(); err != nil {
		return nil, err
	}
	if !opts.Insecure {
		if err := ensureTLS(dir, c.layout, time.Now()); err != nil {
			return nil, err
		}
		if c.creds, err = LoadAdminCredentials(dir); err != nil {
			return nil, fmt.Errorf("devcluster: %w", err)
		}
	}
	c.spawner = newSpawner()
	return c, nil
}

// lockDir flocks DIR/dev.lock and records our pid in it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
			holder = " (pid " + strings.TrimSpace(string(b)) + ")"
		}
		return nil, fmt.Errorf("devcluster: %s is in use by another arbor dev or test%s", dir, holder)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

func (c *Cluster) loadOrCreateLayout() (*layout, error) {
	l, ok, err := loadLayout(c.dir)
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	if !ok {
		n := c.opts.Nodes
		if n == 0 {
			n = DefaultNodes
		}
		voters := c.opts.DirectoryVoters
		if voters == 0 {
			voters = min(DefaultDirectoryVoters, n)
			if voters%2 == 0 {
				voters--
			}
		}
		if voters > n {
			return nil, fmt.Errorf("devcluster: %d directory voters for %d nodes", voters, n)
		}
		if err := checkMetadataReplicas(c.opts.MetadataReplicas, n); err != nil {
			return nil, fmt.Errorf("devcluster: %w", err)
		}
		id, err := newClusterID()
		if err != nil {
			return nil, err
		}
		l = &layout{FormatVersion: layoutFormatVersion, ClusterID: id, MetadataReplicas: c.opts.MetadataReplicas}
		c.logger.Info("new dev cluster", "cluster", id, "nodes", n, "directory_voters", voters, "metadata_replicas", l.metadataReplicas(), "dir", c.dir)
		for i := 1; i <= n; i++ {
			l.Nodes = append(l.Nodes, newNodeLayout(uint64(i), i <= voters))
		}
	} else {
		voters := len(l.voters())
		switch {
		case c.opts.DirectoryVoters != 0 && c.opts.DirectoryVoters != voters:
			return nil, fmt.Errorf("devcluster: %s holds a cluster with %d directory voters, not %d", c.dir, voters, c.opts.DirectoryVoters)
		case c.opts.MetadataReplicas != 0 && c.opts.MetadataReplicas != l.metadataReplicas():
			return nil, fmt.Errorf("devcluster: %s holds a cluster with %d metadata replicas, not %d (fixed when the cluster was created)", c.dir, l.metadataReplicas(), c.opts.MetadataReplicas)
		case c.opts.Nodes != 0 && c.opts.Nodes < len(l.Nodes):
			return nil, fmt.Errorf("devcluster: %s holds a %d-node cluster; it cannot shrink to %d (decommission nodes instead)", c.dir, len(l.Nodes), c.opts.Nodes)
		}
		for i := len(l.Nodes) + 1; i <= c.opts.Nodes; i++ {
			l.Nodes = append(l.Nodes, newNodeLayout(uint64(i), false))
			c.logger.Info("adding node", "node", i)
		}
		c.logger.Info("existing dev cluster", "cluster", l.ClusterID, "nodes", len(l.Nodes), "directory_voters", voters, "dir", c.dir)
	}
	// Nodes without addresses (new ones) get free ports now.
	var missing int
	for _, n := range l.Nodes {
		if n.Addr == "" {
			missing++
		}
	}
	var missingNFS int
	for _, n := range l.Nodes {
		if n.isGateway() && n.NFSAddr == "" {
			missingNFS++
		}
	}
	if missing+missingNFS > 0 {
		addrs, err := freeAddrs(2*missing + missingNFS)
		if err != nil {
			return nil, err
		}
		for i := range l.Nodes {
			if l.Nodes[i].Addr == "" {
				l.Nodes[i].Addr, l.Nodes[i].HTTPAddr, addrs = addrs[0], addrs[1], addrs[2:]
			}
			if l.Nodes[i].isGateway() && l.Nodes[i].NFSAddr == "" {
				l.Nodes[i].NFSAddr, addrs = addrs[0], addrs[1:]
			}
		}
	}
	l.Insecure = c.opts.Insecure
	if err := l.save(c.dir); err != nil {
		return nil, fmt.Errorf("devcluster: save layout: %w", err)
	}
	return l, nil
}

// Dir returns the cluster directory.
func (c *Cluster) Dir() string { return c.dir }

// ClusterID returns the cluster's id.
func (c *Cluster) ClusterID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.layout.ClusterID
}

// Exits reports nodes that exit without being asked to (a crash, a failed
// start). Reading it is optional; reports beyond its buffer are dropped.
func (c *Cluster) Exits() <-chan Exit { return c.exits }

// Nodes describes every node, by id.
func (c *Cluster) Nodes() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes := make([]Node, 0, len(c.layout.Nodes))
	for _, n := range c.layout.Nodes {
		nodes = append(nodes, c.nodeLocked(n))
	}
	return nodes
}

// Node describes node id.
func (c *Cluster) Node(id uint64) (Node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.layout.node(id)
	if !ok {
		return Node{}, false
	}
	return c.nodeLocked(*n), true
}

func (c *Cluster) nodeLocked(n nodeLayout) Node {
	node := Node{
		ID: n.ID, Addr: n.Addr, HTTPAddr: n.HTTPAddr, Domain: n.Domain, Roles: slices.Clone(n.Roles), NFSAddr: n.NFSAddr,
		Dir: c.nodeDir(n.ID), LogPath: filepath.Join(c.nodeDir(n.ID), LogFileName),
	}
	if p := c.procs[n.ID]; p != nil && !p.exited() {
		node.Running, node.PID = true, p.cmd.Process.Pid
	}
	return node
}

func (c *Cluster) nodeDir(id uint64) string { return filepath.Join(c.dir, strconv.FormatUint(id, 10)) }

// DirectoryAddrs returns the directory voters' gRPC addresses, by node id:
// what a client needs to find the cluster (and what DIR/cluster holds).
func (c *Cluster) DirectoryAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var addrs []string
	for _, n := range c.layout.voters() {
		addrs = append(addrs, n.Addr)
	}
	return addrs
}

// Start starts every node that is not running and waits until the cluster
// is healthy (Options.Health, at most Options.StartTimeout); then it
// reapplies the partitions set on the nodes it started and writes
// DIR/cluster. Nodes whose saved ports are taken get new ones.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	var ids []uint64
	for _, n := range c.layout.Nodes {
		if p := c.procs[n.ID]; p == nil || p.exited() {
			ids = append(ids, n.ID)
		}
	}
	c.mu.Unlock()
	// First stop orphans of a killed owner: they hold the ports we check.
	for _, id := range ids {
		if err := c.stopOrphan(id); err != nil {
			return err
		}
	}
	if err := c.reassignTakenPorts(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if err := c.startProcess(id); err != nil {
			return err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return err
	}
	if err := c.pushBlocked(ctx, ids); err != nil {
		return err
	}
	return c.writeClusterFile()
}

// stopOrphan stops an arbor server still running on node id's data dir.
// Since we own the cluster directory it cannot belong to a live owner.
func (c *Cluster) stopOrphan(id uint64) error {
	dir := c.nodeDir(id)
	pid := arborServerPID(dir)
	if pid == 0 {
		return nil
	}
	c.logger.Warn("stopping orphaned server from an earlier run", "node", id, "pid", pid)
	if err := stopForeign(pid, c.opts.StopTimeout); err != nil {
		return fmt.Errorf("devcluster: node %d: stop orphaned server: %w", id, err)
	}
	return nil
}

// reassignTakenPorts gives new ports to the nodes among ids whose saved
// ports are in use by someone else, and saves the layout.
func (c *Cluster) reassignTakenPorts(ids []uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for _, id := range ids {
		n, _ := c.layout.node(id)
		if n.isGateway() && n.NFSAddr != "" && !addrFree(n.NFSAddr) {
			nfsAddr, err := freeAddrs(1)
			if err != nil {
				return err
			}
			c.logger.Warn("saved NFS port is taken; using a new one", "node", id, "old", n.NFSAddr, "new", nfsAddr[0])
			n.NFSAddr = nfsAddr[0]
			changed = true
		}
		if addrFree(n.Addr) && addrFree(n.HTTPAddr) {
			continue
		}
		addrs, err := freeAddrs(2)
		if err != nil {
			return err
		}
		c.logger.Warn("saved ports are taken; using new ones", "node", id, "old", n.Addr+","+n.HTTPAddr, "new", addrs[0]+","+addrs[1])
		if n.isVoter() {
			c.logger.Warn("a directory voter moved: running nodes keep its old address until they restart", "node", id)
		}
		n.Addr, n.HTTPAddr = addrs[0], addrs[1]
		changed = true
	}
	if changed {
		if err := c.layout.save(c.dir); err != nil {
			return fmt.Errorf("devcluster: save layout: %w", err)
		}
	}
	return nil
}

// serverArgs is the `arbor server` command line of node n.
func (c *Cluster) serverArgs(n nodeLayout) []string {
	args := []string{
		"server",
		"--node-id=" + strconv.FormatUint(n.ID, 10),
		"--cluster-id=" + c.layout.ClusterID,
		"--data-dir=" + c.nodeDir(n.ID),
		"--listen=" + n.Addr,
		"--http=" + n.HTTPAddr,
		"--domain=" + n.Domain,
		"--roles=" + strings.Join(n.Roles, ","),
		"--directory-peers=" + c.layout.directoryPeers(),
	}
	if n.isGateway() {
		args = append(args, "--nfs-listen="+n.NFSAddr)
	}
	if r := c.layout.MetadataReplicas; r != 0 {
		args = append(args, "--metadata-replicas="+strconv.Itoa(r))
	}
	args = append(args, c.tlsArgs(n.ID)...)
	if c.opts.PProf {
		args = append(args, "--pprof")
	}
	// The node's own bound on its graceful stop ends before the SIGKILL
	// of StopTimeout, so that it gives up its waits rather than be killed.
	args = append(args, "--shutdown-timeout="+(c.opts.StopTimeout*7/10).String())
	return append(args, c.opts.ServerArgs...)
}

// startProcess starts node id's server, with extra arguments, without
// waiting for it.
func (c *Cluster) startProcess(id uint64, extra ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("devcluster: cluster is closed")
	}
	n, ok := c.layout.node(id)
	if !ok {
		return fmt.Errorf("devcluster: no node %d", id)
	}
	if p := c.procs[id]; p != nil && !p.exited() {
		return fmt.Errorf("devcluster: node %d is already running (pid %d)", id, p.cmd.Process.Pid)
	}
	dir := c.nodeDir(id)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("devcluster: node %d: %w", id, err)
	}
	logPath := filepath.Join(dir, LogFileName)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("devcluster: node %d: %w", id, err)
	}
	args := append(c.serverArgs(*n), extra...)
	fmt.Fprintf(logFile, "=== devcluster %s: starting node %d: %s %s\n",
		time.Now().Format(time.RFC3339Nano), id, c.opts.Binary, strings.Join(args, " "))
	cmd := exec.Command(c.opts.Binary, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), c.opts.Env...)
	cmd.SysProcAttr = serverSysProcAttr()
	if err := c.spawner.start(cmd); err != nil {
		logFile.Close()
		return fmt.Errorf("devcluster: start node %d: %w", id, err)
	}
	p := &process{id: id, cmd: cmd, log: logFile, done: make(chan struct{})}
	c.procs[id] = p
	c.logger.Info("started node", "node", id, "pid", cmd.Process.Pid, "grpc", n.Addr, "http", n.HTTPAddr, "log", logPath)
	go c.reap(p, logPath)
	return nil
}

// reap waits for p to exit and reports an unexpected exit.
func (c *Cluster) reap(p *process, logPath string) {
	err := p.cmd.Wait()
	p.log.Close()
	c.mu.Lock()
	p.exitErr = err
	expected := p.expected
	close(p.done)
	c.mu.Unlock()
	if expected {
		return
	}
	tail := logTail(logPath, logTailLines)
	c.logger.Error("node exited unexpectedly", "node", p.id, "err", err, "log", logPath)
	select {
	case c.exits <- Exit{ID: p.id, Err: err, LogTail: tail}:
	default:
	}
}

// WaitHealthy polls the health check until it passes, ctx ends or
// Options.StartTimeout passes. It fails at once if a node that should be
// running has exited, quoting the end of its log.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	start := time.Now()
	c.logger.Info("waiting for the cluster to be healthy")
	var last error
	for {
		if err := c.checkNoneExited(); err != nil {
			return err
		}
		if last = c.health(ctx, c); last == nil {
			c.logger.Info("cluster healthy", "after", time.Since(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devcluster: cluster not healthy after %v: %w", time.Since(start).Round(time.Millisecond), last)
		case <-time.After(healthPollInterval):
		}
	}
}

// checkNoneExited fails if a node we started and did not stop has exited.
func (c *Cluster) checkNoneExited() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.layout.Nodes {
		p := c.procs[n.ID]
		if p != nil && !p.expected && p.exited() {
			logPath := filepath.Join(c.nodeDir(n.ID), LogFileName)
			return fmt.Errorf("devcluster: node %d exited (%v); end of %s:\n%s", n.ID, p.exitErr, logPath, logTail(logPath, logTailLines))
		}
	}
	return nil
}

// HTTPHealthy checks that every running node answers /healthz with 200, as
// the node of this cluster it should be; nodes the harness has cut off from
// the directory (CutOff) are not expected to be healthy.
func HTTPHealthy(ctx context.Context, c *Cluster) error {
	clusterID := c.ClusterID()
	client := &http.Client{Timeout: healthRequestTimeout}
	for _, n := range c.Nodes() {
		if !n.Running || c.CutOff(n.ID) {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTPAddr+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("node %d: %w", n.ID, err)
		}
		var report server.HealthReport
		err = json.NewDecoder(resp.Body).Decode(&report)
		resp.Body.Close()
		switch {
		case err != nil:
			return fmt.Errorf("node %d: /healthz: %w", n.ID, err)
		case report.NodeID != n.ID || report.ClusterID != clusterID:
			return fmt.Errorf("node %d: %s is node %d of cluster %q, not ours", n.ID, n.HTTPAddr, report.NodeID, report.ClusterID)
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("node %d: /healthz %s: phase %s, checks %v", n.ID, resp.Status, report.Phase, report.Checks)
		}
	}
	return nil
}

func (c *Cluster) writeClusterFile() error {
	addrs := c.DirectoryAddrs()
	if err := writeFileAtomic(filepath.Join(c.dir, ClusterFileName), []byte(strings.Join(addrs, ",")+"\n")); err != nil {
		return fmt.Errorf("devcluster: write cluster file: %w", err)
	}
	var nfs strings.Builder
	for _, a := range c.NFSAddrs() {
		nfs.WriteString(a + "\n")
	}
	if err := writeFileAtomic(filepath.Join(c.dir, NFSFileName), []byte(nfs.String())); err != nil {
		return fmt.Errorf("devcluster: write nfs file: %w", err)
	}
	return nil
}

// NFSAddrs returns the addresses of the nodes' NFS gateways, by node id.
func (c *Cluster) NFSAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.layout.Nodes {
		if n.isGateway() && n.NFSAddr != "" {
			out = append(out, n.NFSAddr)
		}
	}
	return out
}

// StartNode starts node id (stopped or killed before). It does not wait
// for health and so cannot reapply the node's partitions yet: use Restart,
// or call Partition again once the node is up.
func (c *Cluster) StartNode(ctx context.Context, id uint64) error {
	return c.StartNodeWith(ctx, id)
}

// StartNodeWith is StartNode with extra `arbor server` arguments for this
// start only, for example --directory-join for a directory peer that comes
// back on an empty data dir.
func (c *Cluster) StartNodeWith(ctx context.Context, id uint64, extra ...string) error {
	if err := c.stopOrphan(id); err != nil {
		return err
	}
	if err := c.reassignTakenPorts([]uint64{id}); err != nil {
		return err
	}
	return c.startProcess(id, extra...)
}

// Restart stops node id gracefully, starts it again, waits for the cluster
// to be healthy, and reapplies its partitions.
func (c *Cluster) Restart(ctx context.Context, id uint64) error {
	if err := c.StopNode(ctx, id); err != nil {
		return err
	}
	if err := c.StartNode(ctx, id); err != nil {
		return err
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return err
	}
	return c.reapplyBlocked(ctx, id)
}

// StopNode stops node id: SIGTERM, then SIGKILL after Options.StopTimeout.
// It returns an error if the node did not exit cleanly.
func (c *Cluster) StopNode(ctx context.Context, id uint64) error {
	return c.signalAndWait(ctx, id, unix.SIGTERM, c.opts.StopTimeout)
}

// Kill kills node id with SIGKILL (a crash: no shutdown, pid file left
// behind) and waits until it is gone.
func (c *Cluster) Kill(id uint64) error {
	err := c.signalAndWait(context.Background(), id, unix.SIGKILL, 0)
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return nil // killed, as asked
	}
	return err
}

// signalAndWait sends sig to node id and waits for it to exit, escalating
// to SIGKILL after grace (0: never).
func (c *Cluster) signalAndWait(ctx context.Context, id uint64, sig unix.Signal, grace time.Duration) error {
	c.mu.Lock()
	p := c.procs[id]
	if _, ok := c.layout.node(id); !ok {
		c.mu.Unlock()
		return fmt.Errorf("devcluster: no node %d", id)
	}
	if p == nil || p.exited() {
		c.mu.Unlock()
		return nil
	}
	p.expected = true
	c.mu.Unlock()

	signalled := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("devcluster: signal node %d: %w", id, err)
	}
	var escalate <-chan time.Time
	if grace > 0 {
		t := time.NewTimer(grace)
		defer t.Stop()
		escalate = t.C
	}
	killed := false
	for {
		select {
		case <-p.done:
			if killed {
				return fmt.Errorf("devcluster: node %d did not stop within %v of SIGTERM and was killed", id, grace)
			}
			if p.exitErr != nil {
				return fmt.Errorf("devcluster: node %d: %w", id, p.exitErr)
			}
			c.logger.Info("node stopped", "node", id, "took", time.Since(signalled).Round(time.Millisecond))
			return nil
		case <-escalate:
			escalate = nil
			killed = true
			c.logger.Warn("node ignored SIGTERM; killing it", "node", id, "after", grace)
			_ = p.cmd.Process.Kill()
		case <-ctx.Done():
			if !killed {
				killed = true
				_ = p.cmd.Process.Kill()
			}
		}
	}
}

// Stop stops every running node at once (SIGTERM, SIGKILL after
// Options.StopTimeout) and waits for all. It returns every node's error.
func (c *Cluster) Stop(ctx context.Context) error {
	nodes := c.Nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		if !n.Running {
			continue
		}
		wg.Go(func() { errs[i] = c.StopNode(ctx, n.ID) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close stops every node, closes the connections and releases the cluster
// directory. The cluster's data stays; Open brings it back.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.opts.StopTimeout)
	defer cancel()
	err := c.Stop(ctx)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return err
	}
	c.closed = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, cc := range conns {
		cc.Close()
	}
	c.spawner.close()
	return errors.Join(err, c.lock.Close())
}

// Conn returns a shared tool connection to node id's gRPC server, with
// the admin credentials; every call carries the cluster id. The Cluster closes it.
func (c *Cluster) Conn(id uint64) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("devcluster: cluster is closed")
	}
	n, ok := c.layout.node(id)
	if !ok {
		return nil, fmt.Errorf("devcluster: no node %d", id)
	}
	if cc := c.conns[n.Addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(n.Addr, client.DialOptions(c.layout.ClusterID, c.creds)...)
	if err != nil {
		return nil, fmt.Errorf("devcluster: dial node %d: %w", id, err)
	}
	c.conns[n.Addr] = cc
	return cc, nil
}

// admin calls node id's Admin service: GetFaults for a nil req, else
// SetFaults; bounded by adminCallTimeout unless ctx has a deadline.
func (c *Cluster) admin(ctx context.Context, id uint64, req *faultspb.SetFaultsRequest) (*faultspb.FaultsState, error) {
	cc, err := c.Conn(id)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, adminCallTimeout)
		defer cancel()
	}
	client := faultspb.NewAdminClient(cc)
	// A node just restarted may find our shared connection still backing
	// off from its downtime: wait for it (within the deadline) rather than
	// fail on the last dial error.
	if req == nil {
		return client.GetFaults(ctx, &faultspb.GetFaultsRequest{}, grpc.WaitForReady(true))
	}
	st, err := client.SetFaults(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("devcluster: node %d: set faults: %w", id, err)
	}
	return st, nil
}

// Faults returns node id's fault state (configuration, blocked peers,
// counts).
func (c *Cluster) Faults(ctx context.Context, id uint64) (*faultspb.FaultsState, error) {
	return c.admin(ctx, id, nil)
}

// SetFaults sets node id's fault configuration (Parse syntax; "off" for
// none).
func (c *Cluster) SetFaults(ctx context.Context, id uint64, spec string) error {
	_, err := c.admin(ctx, id, &faultspb.SetFaultsRequest{Config: &spec})
	return err
}

// Partition cuts the nodes in side off from every other node, in both
// directions. Partitions add up until Heal.
func (c *Cluster) Partition(ctx context.Context, side ...uint64) error {
	in := map[uint64]bool{}
	for _, id := range side {
		if _, ok := c.Node(id); !ok {
			return fmt.Errorf("devcluster: no node %d", id)
		}
		in[id] = true
	}
	var inside, outside []uint64
	for _, n := range c.Nodes() {
		if in[n.ID] {
			inside = append(inside, n.ID)
		} else {
			outside = append(outside, n.ID)
		}
	}
	c.mu.Lock()
	for _, a := range inside {
		for _, b := range outside {
			c.blockLocked(a, b)
			c.blockLocked(b, a)
		}
	}
	c.mu.Unlock()
	return c.pushBlocked(ctx, append(inside, outside...))
}

// Isolate cuts node id off from every other node.
func (c *Cluster) Isolate(ctx context.Context, id uint64) error { return c.Partition(ctx, id) }

func (c *Cluster) blockLocked(node, peer uint64) {
	if c.blocked[node] == nil {
		c.blocked[node] = map[uint64]bool{}
	}
	c.blocked[node][peer] = true
}

// Heal removes every partition.
func (c *Cluster) Heal(ctx context.Context) error {
	c.mu.Lock()
	c.blocked = map[uint64]map[uint64]bool{}
	c.mu.Unlock()
	var ids []uint64
	for _, n := range c.Nodes() {
		ids = append(ids, n.ID)
	}
	return c.pushBlocked(ctx, ids)
}

// pushBlocked sends each running node among ids its full blocked set.
func (c *Cluster) pushBlocked(ctx context.Context, ids []uint64) error {
	var errs []error
	for _, id := range ids {
		if n, _ := c.Node(id); !n.Running {
			continue
		}
		if err := c.reapplyBlocked(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) reapplyBlocked(ctx context.Context, id uint64) error {
	c.mu.Lock()
	peers := slices.Sorted(maps.Keys(c.blocked[id]))
	c.mu.Unlock()
	_, err := c.admin(ctx, id, &faultspb.SetFaultsRequest{Blocked: &faultspb.NodeSet{Nodes: peers}})
	return err
}
