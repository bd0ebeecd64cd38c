package devcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Info is what a client can learn about a dev cluster from its directory,
// without owning it (arbor status --dir, arbor debug faults --dir).
type Info struct {
	// ClusterID is the cluster's id, "" if DIR/dev.json is missing.
	ClusterID string
	// DirectoryAddrs are the addresses in DIR/cluster.
	DirectoryAddrs []string
	// Nodes are the nodes in DIR/dev.json (empty if it is missing).
	Nodes []NodeAddr
	// Insecure: the cluster's servers run with --insecure (DIR/dev.json);
	// otherwise clients present DIR/tls/admin.crt (LoadAdminCredentials).
	Insecure bool
}

// NodeAddr is where one node of a dev cluster listens.
type NodeAddr struct {
	ID             uint64
	Addr, HTTPAddr string
}

// ReadInfo reads DIR/cluster (required: arbor dev writes it once the
// cluster is up) and DIR/dev.json (optional).
func ReadInfo(dir string) (Info, error) {
	var info Info
	addrs, err := ReadClusterFile(filepath.Join(dir, ClusterFileName))
	if err != nil {
		return info, err
	}
	info.DirectoryAddrs = addrs
	l, ok, err := loadLayout(dir)
	if err != nil {
		return info, err
	}
	if ok {
		info.ClusterID = l.ClusterID
		info.Insecure = l.Insecure
		for _, n := range l.Nodes {
			info.Nodes = append(info.Nodes, NodeAddr{ID: n.ID, Addr: n.Addr, HTTPAddr: n.HTTPAddr})
		}
	}
	return info, nil
}

// ReadClusterFile reads a cluster file: host:port addresses separated by
// commas (and optionally white space).
func ReadClusterFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s does not exist: has arbor dev started a cluster there?", path)
	}
	if err != nil {
		return nil, err
	}
	addrs, err := ParseAddrs(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return addrs, nil
}

// ParseAddrs parses a comma-separated host:port list (the form of
// --cluster, ARBOR_CLUSTER and DIR/cluster), dropping duplicates.
func ParseAddrs(s string) ([]string, error) {
	var addrs []string
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(part); err != nil || port == "" {
			return nil, fmt.Errorf("%q is not host:port", part)
		}
		if !seen[part] {
			seen[part] = true
			addrs = append(addrs, part)
		}
	}
	if len(addrs) == 0 {
		return nil, errors.New("no addresses")
	}
	return addrs, nil
}
