package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
)

// Role is a job a node does. A node runs any mix of roles (DESIGN §3).
type Role string

const (
	// RoleDirectory: the node holds a replica of the directory Raft group.
	RoleDirectory Role = "directory"
	// RoleStorage: the node serves its disks (extent and tract replicas).
	RoleStorage Role = "storage"
	// RoleMeta: the node runs a metadata server (DESIGN §2.6): it serves
	// the file-system tables the directory delegates to it.
	RoleMeta Role = "meta"
	// RoleGateway: the node runs a stateless NFSv3 gateway (DESIGN §2.7,
	// internal/gateway/nfs) on Config.NFSAddr.
	RoleGateway Role = "gateway"
)

// knownRoles are the roles a node can run today, in canonical order.
var knownRoles = []Role{RoleDirectory, RoleStorage, RoleMeta, RoleGateway}

// Peer is one member of the directory group.
type Peer struct {
	ID   uint64
	Addr string // host:port of its gRPC server
}

// LogConfig says how a node logs.
type LogConfig struct {
	// Format is "text" or "json".
	Format string
	// Level is the lowest level written.
	Level slog.Level
}

// Timeouts are the node's time limits. Zero fields take the defaults of
// DefaultTimeouts.
type Timeouts struct {
	// Shutdown bounds a graceful shutdown; what has not stopped by then is
	// stopped by force.
	Shutdown time.Duration
	// RPC is the default deadline of calls between nodes.
	RPC time.Duration
	// Heartbeat is how often the node agent heartbeats to the directory
	// (DESIGN §2.2: each second).
	Heartbeat time.Duration
	// NodeDead is how long the directory waits for a heartbeat before it
	// declares a node dead.
	NodeDead time.Duration
	// RaftTick is the Raft logical clock tick of the multi-Raft engine.
	RaftTick time.Duration
}

// DefaultTimeouts returns the timeouts a node uses unless told otherwise.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		Shutdown:  15 * time.Second,
		RPC:       5 * time.Second,
		Heartbeat: time.Second,
		NodeDead:  10 * time.Second,
		RaftTick:  100 * time.Millisecond,
	}
}

// Limits on a configuration.
const (
	maxClusterIDBytes     = 64
	maxFailureDomainBytes = 128
	maxDirectoryPeers     = 7 // a Raft group of 3 or 5, 7 at most
	maxDisks              = 64
	minTimeout            = time.Millisecond
	maxTimeout            = 10 * time.Minute
)

// identifierPattern is what cluster ids and failure domains look like:
// safe in file names, metadata and metric labels.
var identifierPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Config configures one node. The zero value is not valid: fill it from
// flags or a file, then Normalize it (Run does).
type Config struct {
	// NodeID identifies the node in its cluster for ever; it must be
	// positive and never reused. It is stored in the data directory on
	// first start and checked on every restart.
	NodeID uint64
	// ClusterID names the cluster. Every call between nodes carries it and
	// servers refuse calls for another cluster, so nodes of two clusters
	// can never talk even if they find each other's addresses.
	ClusterID string
	// DataDir holds everything the node stores: its lock, arbor.pid, the
	// pebble DB (db/). One server per data directory, enforced by a lock.
	DataDir string
	// DiskReserve is the space the node's store keeps in reserve (a
	// ballast file in db/): when the disk fills up the node releases it
	// and refuses writes instead of crashing (raftengine diskfull.go).
	// 0: no reserve (the flag's default is raftengine.DefaultBallastBytes).
	DiskReserve int64
	// ListenAddr is the host:port the gRPC server listens on. Port 0 picks
	// a free port (tests).
	ListenAddr string
	// AdvertiseAddr is the host:port other nodes use to reach this one.
	// Default: ListenAddr, which then needs a specific host.
	AdvertiseAddr string
	// HTTPAddr is the host:port of the HTTP server (/metrics, /healthz,
	// /debug/pprof).
	HTTPAddr string
	// NFSAddr is the host:port the gateway role serves NFSv3 and MOUNT
	// on (port 0 picks one).
	NFSAddr string
	// FailureDomain groups nodes that can fail together (a host, a rack):
	// no two replicas of anything are placed in one domain. Default: the
	// host name.
	FailureDomain string
	// Disks are the directories whose space the storage role serves.
	// Default: DataDir.
	Disks []string
	// Roles are the jobs the node does.
	Roles []Role
	// DirectoryPeers are the members of the directory group, sorted by id.
	// Every node needs them to find the directory; a node is a member iff
	// it has RoleDirectory.
	DirectoryPeers []Peer
	// DirectoryJoin: if this directory peer's store holds no directory
	// replica, it creates an empty one that waits for the directory's
	// leader to add it (as a learner, then a voter), instead of
	// bootstrapping the group from DirectoryPeers. A peer that comes back
	// with a new disk after the directory lost its quorum must join this
	// way (internal/directory/doc.go); bootstrapping would let it and the
	// other new peers form a second directory of the old membership.
	DirectoryJoin bool
	// Faults is the initial fault-injection configuration (DESIGN §1).
	Faults faults.Config
	// Tract holds the tract store's settings. Its tract size is what a new
	// cluster is created with (the directory records it once; later
	// values are ignored) and its replication the TLT's k.
	Tract tract.Options
	// MetadataReplicas is the replication of the extents a new cluster
	// creates (they hold every file system's metadata, the KV store and
	// the tables' records): 2f+1 replicas survive f lost nodes. The
	// directory leader's value when the cluster is created is what the
	// cluster keeps (an extent's geometry never changes; later values are
	// ignored). Zero: extent.DefaultReplication.
	MetadataReplicas int
	// Log says how to log; Logger, if set, is used instead.
	Log    LogConfig
	Logger *slog.Logger
	// Timeouts are the node's time limits.
	Timeouts Timeouts
	// TLS names the node's credentials (internal/security): its node
	// certificate and key, and the cluster CA every peer's certificate
	// must chain to. Required unless Insecure.
	TLS TLSFiles
	// Insecure serves gRPC in plain text, without client certificates or
	// authorization, and dials peers so (--insecure). For benchmarks'
	// reference runs and debugging only.
	Insecure bool
	// PProf serves /debug/pprof/ on the HTTP port (--pprof).
	PProf bool
	// Policy is who may call which gRPC method (nil:
	// security.DefaultPolicy); a method it does not name is refused to
	// everyone. Tests that serve their own services add them.
	Policy security.Policy
}

// TLSFiles are the paths of a node's credentials. Dir, if set, fills the
// paths not given: Dir/node.crt, Dir/node.key, Dir/ca.crt (what `arbor
// cert node --out DIR` writes).
type TLSFiles struct {
	Dir      string
	CertFile string
	KeyFile  string
	CAFile   string
}

// Files written by `arbor cert node` into its --out directory.
const (
	NodeCertFileName = "node.crt"
	NodeKeyFileName  = "node.key"
	CAFileName       = "ca.crt"
)

// MetadataGeometry is the geometry of the extents a new cluster creates:
// the default one with MetadataReplicas replicas.
func (c Config) MetadataGeometry() extent.Geometry {
	g := extent.DefaultGeometry()
	g.Replication = uint32(max(c.MetadataReplicas, 0))
	return g
}

// HasRole reports whether the node runs role r.
func (c Config) HasRole(r Role) bool { return slices.Contains(c.Roles, r) }

// Normalize fills the defaults (advertise address, disks, failure domain,
// timeouts), makes paths absolute and validates the result. It returns
// every problem it finds, joined.
func (c Config) Normalize() (Config, error) {
	c.Disks = slices.Clone(c.Disks)
	c.Roles = slices.Clone(c.Roles)
	c.DirectoryPeers = slices.Clone(c.DirectoryPeers)
	if c.DataDir != "" {
		abs, err := filepath.Abs(c.DataDir)
		if err != nil {
			return c, fmt.Errorf("data dir %q: %w", c.DataDir, err)
		}
		c.DataDir = abs
	}
	if len(c.Disks) == 0 && c.DataDir != "" {
		c.Disks = []string{c.DataDir}
	}
	for i, d := range c.Disks {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			return c, fmt.Errorf("disk %q: %w", d, err)
		}
		c.Disks[i] = abs
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.ListenAddr
	}
	if d := c.TLS.Dir; d != "" {
		for _, f := range []struct {
			p    *string
			name string
		}{{&c.TLS.CertFile, NodeCertFileName}, {&c.TLS.KeyFile, NodeKeyFileName}, {&c.TLS.CAFile, CAFileName}} {
			if *f.p == "" {
				*f.p = filepath.Join(d, f.name)
			}
		}
	}
	for _, p := range []*string{&c.TLS.CertFile, &c.TLS.KeyFile, &c.TLS.CAFile} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return c, fmt.Errorf("tls file %q: %w", *p, err)
			}
			*p = abs
		}
	}
	if c.FailureDomain == "" {
		host, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("failure domain: not given and no host name: %w", err)
		}
		c.FailureDomain = host
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.MetadataReplicas == 0 {
		c.MetadataReplicas = extent.DefaultReplication
	}
	def := DefaultTimeouts()
	for _, f := range []struct{ v, d *time.Duration }{
		{&c.Timeouts.Shutdown, &def.Shutdown}, {&c.Timeouts.RPC, &def.RPC},
		{&c.Timeouts.Heartbeat, &def.Heartbeat}, {&c.Timeouts.NodeDead, &def.NodeDead},
		{&c.Timeouts.RaftTick, &def.RaftTick},
	} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	slices.SortFunc(c.DirectoryPeers, func(a, b Peer) int { return cmpUint(a.ID, b.ID) })
	return c, c.validate()
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// validate checks a normalized configuration.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.NodeID == 0 {
		bad("node id (--node-id) must be a positive integer")
	}
	switch {
	case c.ClusterID == "":
		bad("cluster id (--cluster-id) must be set")
	case len(c.ClusterID) > maxClusterIDBytes || !identifierPattern.MatchString(c.ClusterID):
		bad("cluster id %q must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", c.ClusterID, maxClusterIDBytes)
	}
	if c.DataDir == "" {
		bad("data dir (--data-dir) must be set")
	}
	if err := c.MetadataGeometry().Validate(); err != nil || c.MetadataReplicas < 1 {
		bad("metadata replicas (--metadata-replicas) %d: must be in [1, %d]", c.MetadataReplicas, extent.MaxReplication)
	}
	var listenPort int
	if err := checkHostPort(c.ListenAddr, false); err != nil {
		bad("listen address (--listen): %v", err)
	} else {
		_, p, _ := net.SplitHostPort(c.ListenAddr)
		listenPort, _ = strconv.Atoi(p)
	}
	advertise := c.AdvertiseAddr
	if advertise == c.ListenAddr && listenPort == 0 {
		// Inherits the port the listener gets; Start resolves it.
		if host, _, err := net.SplitHostPort(advertise); err == nil {
			advertise = net.JoinHostPort(host, "1")
		}
	}
	if err := checkHostPort(advertise, true); err != nil {
		if c.AdvertiseAddr == c.ListenAddr {
			bad("advertise address (--advertise): %v; listening on %q needs an explicit --advertise", err, c.ListenAddr)
		} else {
			bad("advertise address (--advertise): %v", err)
		}
	}
	if err := checkHostPort(c.HTTPAddr, false); err != nil {
		bad("http address (--http): %v", err)
	}
	if c.HasRole(RoleGateway) {
		if err := checkHostPort(c.NFSAddr, false); err != nil {
			bad("nfs address (--nfs-listen): %v", err)
		}
	}
	if len(c.FailureDomain) > maxFailureDomainBytes || !identifierPattern.MatchString(c.FailureDomain) {
		bad("failure domain (--domain) %q must be 1 to %d letters, digits, '.', '_' or '-'", c.FailureDomain, maxFailureDomainBytes)
	}

	if len(c.Disks) > maxDisks {
		bad("%d disks (--disks), more than the limit of %d", len(c.Disks), maxDisks)
	}
	seenDisk := map[string]bool{}
	for _, d := range c.Disks {
		if d == "" {
			bad("disks (--disks): empty path")
		} else if seenDisk[d] {
			bad("disks (--disks): %q listed twice", d)
		}
		seenDisk[d] = true
	}

	if len(c.Roles) == 0 {
		bad("roles (--roles) must name at least one of %s", joinRoles(knownRoles))
	}
	seenRole := map[Role]bool{}
	for _, r := range c.Roles {
		if !slices.Contains(knownRoles, r) {
			bad("roles (--roles): unknown role %q (known: %s)", r, joinRoles(knownRoles))
		} else if seenRole[r] {
			bad("roles (--roles): %q listed twice", r)
		}
		seenRole[r] = true
	}

	errs = append(errs, c.validatePeers(listenPort)...)

	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log format (--log-format) %q must be text or json", c.Log.Format)
	}
	for _, t := range []struct {
		name, flag string
		v          time.Duration
	}{
		{"shutdown timeout", "--shutdown-timeout", c.Timeouts.Shutdown},
		{"rpc timeout", "--rpc-timeout", c.Timeouts.RPC},
		{"heartbeat interval", "--heartbeat-interval", c.Timeouts.Heartbeat},
		{"node dead timeout", "--node-dead-timeout", c.Timeouts.NodeDead},
		{"raft tick", "--raft-tick", c.Timeouts.RaftTick},
	} {
		if t.v < minTimeout || t.v > maxTimeout {
			bad("%s (%s) %v must be in [%v, %v]", t.name, t.flag, t.v, minTimeout, maxTimeout)
		}
	}
	if c.Timeouts.NodeDead < 3*c.Timeouts.Heartbeat {
		bad("node dead timeout %v must be at least 3 heartbeat intervals (%v): one lost heartbeat must not kill a node",
			c.Timeouts.NodeDead, 3*c.Timeouts.Heartbeat)
	}
	if err := c.Faults.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("faults (--faults): %w", err))
	}
	hasTLS := c.TLS.CertFile != "" || c.TLS.KeyFile != "" || c.TLS.CAFile != ""
	switch {
	case c.Insecure && hasTLS:
		bad("--insecure and TLS files (--tls-dir, --tls-cert, --tls-key, --tls-ca) exclude each other")
	case !c.Insecure && (c.TLS.CertFile == "" || c.TLS.KeyFile == "" || c.TLS.CAFile == ""):
		bad("TLS credentials must be set: --tls-dir DIR (with %s, %s, %s, as `arbor cert node` writes them) or --tls-cert, --tls-key and --tls-ca; "+
			"--insecure serves without them (no authentication at all)", NodeCertFileName, NodeKeyFileName, CAFileName)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid server configuration:\n%w", err)
	}
	return nil
}

func (c Config) validatePeers(listenPort int) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.DirectoryPeers) == 0 {
		bad("directory peers (--directory-peers) must list the directory group as id=host:port,...")
	}
	if len(c.DirectoryPeers) > maxDirectoryPeers {
		bad("%d directory peers, more than the limit of %d", len(c.DirectoryPeers), maxDirectoryPeers)
	}
	ids := map[uint64]bool{}
	addrs := map[string]bool{}
	self := false
	for _, p := range c.DirectoryPeers {
		if p.ID == 0 {
			bad("directory peers: node id 0 is not valid")
		}
		if ids[p.ID] {
			bad("directory peers: node %d listed twice", p.ID)
		}
		ids[p.ID] = true
		if err := checkHostPort(p.Addr, true); err != nil {
			bad("directory peers: node %d: %v", p.ID, err)
		}
		if addrs[p.Addr] {
			bad("directory peers: address %s listed twice", p.Addr)
		}
		addrs[p.Addr] = true
		if p.ID == c.NodeID {
			self = true
			// With port 0 the advertised address is known only once the
			// node listens; Start checks it again then.
			if listenPort != 0 && p.Addr != c.AdvertiseAddr {
				bad("directory peers list node %d at %s, but it advertises %s", p.ID, p.Addr, c.AdvertiseAddr)
			}
		}
	}
	switch {
	case c.NodeID == 0:
	case self && !c.HasRole(RoleDirectory):
		bad("node %d is a directory peer (--directory-peers) but lacks the %q role (--roles)", c.NodeID, RoleDirectory)
	case !self && c.HasRole(RoleDirectory):
		bad("node %d has the %q role but is not in the directory peers (--directory-peers)", c.NodeID, RoleDirectory)
	}
	if c.DirectoryJoin && !c.HasRole(RoleDirectory) {
		bad("--directory-join is for directory peers; node %d lacks the %q role", c.NodeID, RoleDirectory)
	}
	return errs
}

// checkHostPort checks a host:port; needHost rejects an empty or
// unspecified host (0.0.0.0, ::) and port 0, which others cannot dial.
func checkHostPort(addr string, needHost bool) error {
	if addr == "" {
		return errors.New("must be set as host:port")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("%q: port %q is not a number in [0, 65535]", addr, port)
	}
	if needHost {
		if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			return fmt.Errorf("%q has no specific host that others can dial", addr)
		}
		if p == 0 {
			return fmt.Errorf("%q has port 0, which others cannot dial", addr)
		}
	}
	return nil
}

// ParseRoles parses a comma-separated role list such as
// "directory,storage".
func ParseRoles(s string) ([]Role, error) {
	var roles []Role
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r := Role(part)
		if !slices.Contains(knownRoles, r) {
			return nil, fmt.Errorf("unknown role %q (known: %s)", part, joinRoles(knownRoles))
		}
		if slices.Contains(roles, r) {
			return nil, fmt.Errorf("role %q listed twice", part)
		}
		roles = append(roles, r)
	}
	return roles, nil
}

func joinRoles(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// ParsePeers parses directory peers written as "id=host:port,..." and
// returns them sorted by id.
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		ids, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("peer %q is not id=host:port", part)
		}
		id, err := strconv.ParseUint(ids, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("peer %q: %q is not a positive node id", part, ids)
		}
		if err := checkHostPort(addr, true); err != nil {
			return nil, fmt.Errorf("peer %q: %w", part, err)
		}
		for _, p := range peers {
			if p.ID == id {
				return nil, fmt.Errorf("peer %d listed twice", id)
			}
		}
		peers = append(peers, Peer{ID: id, Addr: addr})
	}
	slices.SortFunc(peers, func(a, b Peer) int { return cmpUint(a.ID, b.ID) })
	return peers, nil
}

// FormatPeers is the inverse of ParsePeers.
func FormatPeers(peers []Peer) string {
	parts := make([]string, len(peers))
	for i, p := range peers {
		parts[i] = strconv.FormatUint(p.ID, 10) + "=" + p.Addr
	}
	return strings.Join(parts, ",")
}
