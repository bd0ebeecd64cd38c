package devcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/security"
)

// Files of a dev cluster's credentials, under DIR/tls (TLSDirName).
const (
	TLSDirName = "tls"
	// AdminName is the admin credential's base name: DIR/tls/admin.crt,
	// admin.key and, for --credentials and $ARBOR_CREDENTIALS,
	// admin.pem (certificate, key and CA in one file).
	AdminName = "admin"
	// CredentialExt is the extension of a credential file.
	CredentialExt = ".pem"
)

// NodeCertName is the base name of node id's certificate and key in
// DIR/tls: node-ID.crt, node-ID.key. It is also the node's name in its
// identity (arbor://node/node-ID).
func NodeCertName(id uint64) string { return "node-" + strconv.FormatUint(id, 10) }

// nodeHosts are the hosts a dev node's certificate names: the loopback
// addresses its ports live on.
var nodeHosts = []string{"127.0.0.1", "::1", "localhost"}

// ensureTLS creates what is missing of DIR/tls: the cluster CA (ca.crt,
// ca.key), a certificate for every node of the layout and the admin
// credential. Existing files are reused as they are.
func ensureTLS(dir string, l *layout, now time.Time) error {
	tlsDir := filepath.Join(dir, TLSDirName)
	ca, err := security.LoadCA(tlsDir)
	if errors.Is(err, os.ErrNotExist) {
		if ca, err = security.NewCA(l.ClusterID, now); err == nil {
			err = ca.Save(tlsDir)
		}
	}
	if err != nil {
		return fmt.Errorf("devcluster: cluster CA in %s: %w", tlsDir, err)
	}
	issue := func(name string, req security.Request) error {
		// The last file written says the credential is whole: the
		// admin's .pem is written after its .crt.
		last := name + ".crt"
		if name == AdminName {
			last = name + CredentialExt
		}
		if _, err := os.Stat(filepath.Join(tlsDir, last)); err == nil {
			return nil
		}
		is, err := ca.Issue(req, now)
		if err != nil {
			return err
		}
		// A half-written pair from an interrupted start is replaced.
		os.Remove(filepath.Join(tlsDir, name+".key"))
		os.Remove(filepath.Join(tlsDir, name+".crt"))
		os.Remove(filepath.Join(tlsDir, name+CredentialExt))
		if err := is.Save(tlsDir, name); err != nil {
			return err
		}
		if name == AdminName {
			return security.WriteNewFile(filepath.Join(tlsDir, name+CredentialExt), ca.Credential(is), 0o600)
		}
		return nil
	}
	for _, n := range l.Nodes {
		name := NodeCertName(n.ID)
		if err := issue(name, security.Request{Identity: security.Node(name), Hosts: nodeHosts}); err != nil {
			return fmt.Errorf("devcluster: certificate of node %d: %w", n.ID, err)
		}
	}
	if err := issue(AdminName, security.Request{Identity: security.Admin()}); err != nil {
		return fmt.Errorf("devcluster: admin credential: %w", err)
	}
	return nil
}

// NodeTLSArgs are the `arbor server` flags that give node id the
// cluster's credentials (--insecure for an insecure cluster), for a server
// a test starts by hand next to the cluster's own: its certificate
// (DIR/tls/node-ID.*) is made if missing.
func (c *Cluster) NodeTLSArgs(id uint64) ([]string, error) {
	if c.opts.Insecure {
		return []string{"--insecure"}, nil
	}
	l := &layout{ClusterID: c.ClusterID(), Nodes: []nodeLayout{{ID: id}}}
	if err := ensureTLS(c.dir, l, time.Now()); err != nil {
		return nil, err
	}
	return c.tlsArgs(id), nil
}

// tlsArgs are the `arbor server` flags of node id's credentials.
func (c *Cluster) tlsArgs(id uint64) []string {
	if c.opts.Insecure {
		return []string{"--insecure"}
	}
	d := filepath.Join(c.dir, TLSDirName)
	name := NodeCertName(id)
	return []string{
		"--tls-cert=" + filepath.Join(d, name+".crt"),
		"--tls-key=" + filepath.Join(d, name+".key"),
		"--tls-ca=" + filepath.Join(d, security.CACertFile),
	}
}

// LoadAdminCredentials reads the admin credential of the dev cluster in
// dir (DIR/tls/admin.crt, admin.key and ca.crt).
func LoadAdminCredentials(dir string) (*security.Credentials, error) {
	d := filepath.Join(dir, TLSDirName)
	return security.LoadFiles(filepath.Join(d, AdminName+".crt"), filepath.Join(d, AdminName+".key"), filepath.Join(d, security.CACertFile))
}

// Credentials are the cluster's admin credentials (nil for an insecure
// cluster: Options.Insecure).
func (c *Cluster) Credentials() *security.Credentials { return c.creds }

// TLSDir is the directory of the cluster's CA, node certificates and
// admin credential.
func (c *Cluster) TLSDir() string { return filepath.Join(c.dir, TLSDirName) }

// DialOptions are the gRPC dial options of a client of the cluster with
// its admin credential: what tests and tools use to reach the nodes.
func (c *Cluster) DialOptions() []grpc.DialOption {
	return client.DialOptions(c.ClusterID(), c.creds)
}

// AdminCredentialFile is the path of the admin credential file
// (DIR/tls/admin.pem), for --credentials and $ARBOR_CREDENTIALS.
func (c *Cluster) AdminCredentialFile() string {
	return filepath.Join(c.dir, TLSDirName, AdminName+CredentialExt)
}

// NodeCredentials are node id's credentials (DIR/tls/node-ID.*), for
// tests that act as a node: what only nodes may call (the raft
// transport, replication) refuses the admin credential.
func (c *Cluster) NodeCredentials(id uint64) (*security.Credentials, error) {
	d := c.TLSDir()
	name := NodeCertName(id)
	return security.LoadFiles(filepath.Join(d, name+".crt"), filepath.Join(d, name+".key"), filepath.Join(d, security.CACertFile))
}
