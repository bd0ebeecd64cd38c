package security

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// Credentials are what a party presents and trusts: its certificate and
// key, the identity the certificate names, and the CA certificates it
// trusts.
type Credentials struct {
	Identity Identity
	Leaf     *x509.Certificate
	cert     tls.Certificate
	roots    *x509.CertPool
}

// ParseCredentials parses a credential file's contents (see the package
// doc: one key, its certificate, one or more CA certificates).
func ParseCredentials(data []byte) (*Credentials, error) {
	certs, keys, err := decodePEM(data)
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("want one private key, found %d", len(keys))
	}
	var leaf *x509.Certificate
	var cas []*x509.Certificate
	for _, c := range certs {
		switch {
		case c.IsCA:
			cas = append(cas, c)
		case leaf != nil:
			return nil, errors.New("more than one certificate that is not a CA")
		default:
			leaf = c
		}
	}
	if leaf == nil {
		return nil, errors.New("no certificate of the holder (only CA certificates)")
	}
	if len(cas) == 0 {
		return nil, errors.New("no CA certificate to verify the servers with")
	}
	if !samePublicKey(leaf.PublicKey, keys[0].Public()) {
		return nil, errors.New("the private key does not belong to the certificate")
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	return &Credentials{
		Identity: id,
		Leaf:     leaf,
		cert:     tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: keys[0], Leaf: leaf},
		roots:    roots,
	}, nil
}

// LoadCredentialFile reads a credential file.
func LoadCredentialFile(path string) (*Credentials, error) {
	data, err := readPEMFile(path)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	c, err := ParseCredentials(data)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	return c, nil
}

// LoadFiles reads credentials from three files: the holder's certificate,
// its key and the CA certificate(s).
func LoadFiles(certPath, keyPath, caPath string) (*Credentials, error) {
	var all []byte
	for _, p := range []string{certPath, keyPath, caPath} {
		data, err := readPEMFile(p)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		all = append(append(all, data...), '\n')
	}
	c, err := ParseCredentials(all)
	if err != nil {
		return nil, fmt.Errorf("credentials %s, %s, %s: %w", certPath, keyPath, caPath, err)
	}
	return c, nil
}

// CheckValid reports whether the credentials' certificate is valid at now.
func (c *Credentials) CheckValid(now time.Time) error {
	switch {
	case now.Before(c.Leaf.NotBefore):
		return fmt.Errorf("certificate of %s is not valid before %v", c.Identity, c.Leaf.NotBefore)
	case now.After(c.Leaf.NotAfter):
		return fmt.Errorf("certificate of %s expired at %v", c.Identity, c.Leaf.NotAfter)
	}
	return nil
}

// ServerTLS is the TLS configuration of a node's server: it presents the
// node's certificate and requires a client certificate signed by the CA
// (invariant 1). The credentials must be a node's.
func ServerTLS(c *Credentials) (*tls.Config, error) {
	if c.Identity.Kind != KindNode {
		return nil, fmt.Errorf("a server needs a node certificate, not one of %s", c.Identity)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.roots,
		// Refuse in the handshake a client certificate that chains to
		// the CA but names no identity.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no client certificate")
			}
			_, err := IdentityOf(cs.PeerCertificates[0])
			return err
		},
	}, nil
}

// ClientTLS is the TLS configuration of a client (or of a node dialling
// another): it presents c's certificate and accepts only servers whose
// certificate the CA signed for the dialled host and names a node
// (invariant 2).
func ClientTLS(c *Credentials) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		RootCAs:      c.roots,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			id, err := IdentityOf(cs.PeerCertificates[0])
			if err != nil {
				return fmt.Errorf("server: %w", err)
			}
			if id.Kind != KindNode {
				return fmt.Errorf("server presents the certificate of %s, not of a node", id)
			}
			return nil
		},
	}
}

// ServerCredentials are gRPC server transport credentials from
// ServerTLS.
func ServerCredentials(c *Credentials) (credentials.TransportCredentials, error) {
	cfg, err := ServerTLS(c)
	if err != nil {
		return nil, err
	}
	return identityCredentials{credentials.NewTLS(cfg)}, nil
}

// identityCredentials derive the client's identity once per connection,
// in the handshake, instead of once per RPC: the connection's AuthInfo is
// an IdentityInfo.
type identityCredentials struct {
	credentials.TransportCredentials
}

// IdentityInfo is the AuthInfo of a connection to a server built with
// ServerCredentials: the TLS state and the identity its verified client
// certificate names (or why it names none).
type IdentityInfo struct {
	credentials.TLSInfo
	Identity Identity
	// Err is why the certificate yields no identity; the connection's
	// RPCs are refused with it.
	Err error
}

func (c identityCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		return conn, info, err
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok {
		return conn, info, nil
	}
	id, idErr := tlsIdentity(tlsInfo)
	return conn, IdentityInfo{TLSInfo: tlsInfo, Identity: id, Err: idErr}, nil
}

func (c identityCredentials) Clone() credentials.TransportCredentials {
	return identityCredentials{c.TransportCredentials.Clone()}
}

// ClientCredentials are gRPC client transport credentials from
// ClientTLS.
func ClientCredentials(c *Credentials) credentials.TransportCredentials {
	return credentials.NewTLS(ClientTLS(c))
}
