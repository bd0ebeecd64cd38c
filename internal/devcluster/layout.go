package devcluster

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/arbor-storage/arbor/internal/extent"
)

// Files in a cluster directory.
const (
	layoutFileName  = "dev.json"
	lockFileName    = "dev.lock"
	ClusterFileName = "cluster"
	// LogFileName is each node's log, in its data dir.
	LogFileName = "arbor.log"
)

// Defaults and limits of a dev cluster.
const (
	DefaultNodes           = 5
	DefaultDirectoryVoters = 3
	maxNodes               = 64
	layoutFormatVersion    = 1
	clusterIDRandomBytes   = 6
)

// Role names as `arbor server --roles` takes them.
const (
	roleDirectory = "directory"
	roleStorage   = "storage"
	roleMeta      = "meta"
	roleGateway   = "gateway"
)

// NFSFileName lists the cluster's NFS gateways, one host:port a line.
const NFSFileName = "nfs"

// layout is the persisted description of a dev cluster (DIR/dev.json).
type layout struct {
	FormatVersion int          `json:"format_version"`
	ClusterID     string       `json:"cluster_id"`
	Nodes         []nodeLayout `json:"nodes"`
	// Insecure: the servers run with --insecure (Options.Insecure of the
	// last Open), so clients dial them in plain text.
	Insecure bool `json:"insecure,omitempty"`
	// MetadataReplicas is every node's --metadata-replicas (0: the
	// server's default), chosen when the cluster is created.
	MetadataReplicas int `json:"metadata_replicas,omitempty"`
}

type nodeLayout struct {
	ID       uint64   `json:"id"`
	Addr     string   `json:"addr"`
	HTTPAddr string   `json:"http_addr"`
	Domain   string   `json:"domain"`
	Roles    []string `json:"roles"`
	// NFSAddr is where the node's gateway serves NFS (role gateway).
	NFSAddr string `json:"nfs_addr,omitempty"`
}

func (n nodeLayout) isGateway() bool { return slices.Contains(n.Roles, roleGateway) }

func (n nodeLayout) isVoter() bool {
	for _, r := range n.Roles {
		if r == roleDirectory {
			return true
		}
	}
	return false
}

func (l *layout) voters() []nodeLayout {
	var vs []nodeLayout
	for _, n := range l.Nodes {
		if n.isVoter() {
			vs = append(vs, n)
		}
	}
	return vs
}

// directoryPeers is the --directory-peers value of every node.
func (l *layout) directoryPeers() string {
	var parts []string
	for _, n := range l.voters() {
		parts = append(parts, strconv.FormatUint(n.ID, 10)+"="+n.Addr)
	}
	return strings.Join(parts, ",")
}

func (l *layout) node(id uint64) (*nodeLayout, bool) {
	for i := range l.Nodes {
		if l.Nodes[i].ID == id {
			return &l.Nodes[i], true
		}
	}
	return nil, false
}

func newClusterID() (string, error) {
	b := make([]byte, clusterIDRandomBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cluster id: %w", err)
	}
	return "dev-" + hex.EncodeToString(b), nil
}

func newNodeLayout(id uint64, voter bool) nodeLayout {
	roles := []string{roleStorage, roleMeta, roleGateway}
	if voter {
		roles = []string{roleDirectory, roleStorage, roleMeta, roleGateway}
	}
	return nodeLayout{ID: id, Domain: fmt.Sprintf("dev-%d", id), Roles: roles}
}

// loadLayout reads DIR/dev.json; ok is false if there is none.
func loadLayout(dir string) (l *layout, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, layoutFileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	l = &layout{}
	if err := json.Unmarshal(b, l); err != nil {
		return nil, false, fmt.Errorf("%s: %w", filepath.Join(dir, layoutFileName), err)
	}
	if err := l.validate(); err != nil {
		return nil, false, fmt.Errorf("%s: %w", filepath.Join(dir, layoutFileName), err)
	}
	// Clusters laid out before metadata servers existed run one on every
	// node, as new ones do.
	for i := range l.Nodes {
		if !slices.Contains(l.Nodes[i].Roles, roleMeta) {
			l.Nodes[i].Roles = append(l.Nodes[i].Roles, roleMeta)
		}
		// And before gateways existed: one on every node too (its port is
		// chosen with the others' that are missing).
		if !l.Nodes[i].isGateway() {
			l.Nodes[i].Roles = append(l.Nodes[i].Roles, roleGateway)
		}
	}
	return l, true, nil
}

func (l *layout) validate() error {
	if l.FormatVersion != layoutFormatVersion {
		return fmt.Errorf("format version %d, this build reads %d", l.FormatVersion, layoutFormatVersion)
	}
	if l.ClusterID == "" {
		return errors.New("no cluster id")
	}
	if len(l.Nodes) == 0 || len(l.Nodes) > maxNodes {
		return fmt.Errorf("%d nodes, want 1 to %d", len(l.Nodes), maxNodes)
	}
	for i, n := range l.Nodes {
		if n.ID != uint64(i+1) {
			return fmt.Errorf("node %d at position %d: ids must be 1..N in order", n.ID, i+1)
		}
		addrs := []string{n.Addr, n.HTTPAddr}
		if n.isGateway() && n.NFSAddr != "" {
			addrs = append(addrs, n.NFSAddr)
		}
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return fmt.Errorf("node %d: bad address %q", n.ID, a)
			}
		}
	}
	if len(l.voters()) == 0 {
		return errors.New("no directory voters")
	}
	if err := checkMetadataReplicas(l.MetadataReplicas, len(l.Nodes)); err != nil {
		return err
	}
	return nil
}

// metadataReplicas is the cluster's metadata replicas.
func (l *layout) metadataReplicas() int {
	if l.MetadataReplicas == 0 {
		return extent.DefaultReplication
	}
	return l.MetadataReplicas
}

// checkMetadataReplicas checks a cluster's metadata replicas (0: the
// default) against its node count.
func checkMetadataReplicas(r, nodes int) error {
	switch {
	case r == 0:
		return nil
	case r < 0 || r > extent.MaxReplication:
		return fmt.Errorf("%d metadata replicas: want 1 to %d", r, extent.MaxReplication)
	case r%2 == 0:
		return fmt.Errorf("%d metadata replicas: use an odd number (a Raft majority of an even group tolerates no more failures)", r)
	case r > nodes:
		return fmt.Errorf("%d metadata replicas for %d nodes: each replica needs a node of its own", r, nodes)
	}
	return nil
}

func (l *layout) save(dir string) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, layoutFileName), append(b, '\n'))
}

// writeFileAtomic writes path through a temporary file and a rename.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// freeAddrs returns n distinct free 127.0.0.1 addresses. The listeners are
// held until all are chosen so that the n are distinct. The ports come
// from below the kernel's ephemeral range: a port the kernel hands out for
// ":0" is also the kind it gives outgoing connections, and one of the many
// connections a test machine opens took such a port before the node bound
// it (seen in CI). Another process may still take a port first; the node
// then fails to start and says so in its log, and WaitHealthy reports it.
func freeAddrs(n int) ([]string, error) {
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			l.Close()
		}
	}()
	lo, hi := fixedPortRange()
	addrs := make([]string, 0, n)
	for attempt := 0; len(addrs) < n; attempt++ {
		addr := "127.0.0.1:0"
		if hi > lo && attempt < 100*n {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+int(randUint32()%uint32(hi-lo))))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "127.0.0.1:0" {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
			continue // taken: draw again
		}
		lis = append(lis, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// fixedPortRange is where freeAddrs draws ports: from 10000 up to the
// kernel's ephemeral range (Linux's ip_local_port_range, 32768 by
// default); an empty range (lo >= hi) means ":0".
func fixedPortRange() (lo, hi int) {
	lo, hi = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return lo, hi
}

func randUint32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// addrFree reports whether addr can be listened on now.
func addrFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}
