package security

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Files of a CA directory and default validity periods.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"

	// CAValidity is how long a new CA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// DefaultValidity is how long a node or client certificate is valid
	// unless told otherwise.
	DefaultValidity = 365 * 24 * time.Hour
	// clockSkew backdates every certificate's start, so a node whose clock
	// lags a little accepts a certificate issued just now.
	clockSkew = 5 * time.Minute
	// maxPEMBytes bounds a certificate, key or credential file.
	maxPEMBytes = 1 << 20
	// maxHosts bounds the host names and addresses of one certificate.
	maxHosts = 64
)

// PEM block types.
const (
	pemCertificate = "CERTIFICATE"
	pemPrivateKey  = "PRIVATE KEY"
)

// CA is a cluster certificate authority: the root every node and client
// certificate of the cluster chains to.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert, PEM-encoded.
	CertPEM []byte
}

// NewCA makes a CA named name (the subject of its certificate).
func NewCA(name string, now time.Time) (*CA, error) {
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name + " CA", Organization: []string{"arbor"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("CA: sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})}, nil
}

// Save writes the CA to dir/ca.crt and dir/ca.key (0600), refusing to
// overwrite an existing CA.
func (ca *CA) Save(dir string) error {
	keyPEM, err := encodeKey(ca.Key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{CAKeyFile, keyPEM, 0o600}, {CACertFile, ca.CertPEM, 0o644}} {
		if err := writeNew(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("CA: %w", err)
		}
	}
	return nil
}

// LoadCA reads the CA of dir (ca.crt and ca.key) and checks that they
// belong together.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := readPEMFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	keyPEM, err := readPEMFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	certs, keys, err := decodePEM(append(append([]byte(nil), certPEM...), keyPEM...))
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", dir, err)
	}
	if len(certs) != 1 || len(keys) != 1 {
		return nil, fmt.Errorf("CA %s: want one certificate in %s and one key in %s, found %d and %d", dir, CACertFile, CAKeyFile, len(certs), len(keys))
	}
	if !certs[0].IsCA {
		return nil, fmt.Errorf("CA %s: %s is not a CA certificate", dir, CACertFile)
	}
	if !samePublicKey(certs[0].PublicKey, keys[0].Public()) {
		return nil, fmt.Errorf("CA %s: %s and %s do not belong together", dir, CACertFile, CAKeyFile)
	}
	return &CA{Cert: certs[0], Key: keys[0], CertPEM: certPEM}, nil
}

// Request is what a certificate is issued for.
type Request struct {
	// Identity is the holder's identity (the URI SAN).
	Identity Identity
	// CommonName names the holder for people; default: the identity's
	// name, or "admin".
	CommonName string
	// Hosts are the DNS names and IP addresses a node serves under (its
	// advertised and listen hosts); required for nodes, refused for
	// clients.
	Hosts []string
	// NotBefore and NotAfter bound the validity; zero NotBefore is now
	// (less a little clock skew), zero NotAfter is NotBefore plus
	// DefaultValidity.
	NotBefore, NotAfter time.Time
}

// Issued is a signed certificate and its private key, PEM-encoded.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a new key pair for req. Nodes get server and client usage,
// administrators and tenants client usage only.
func (ca *CA) Issue(req Request, now time.Time) (*Issued, error) {
	if err := req.Identity.check(); err != nil {
		return nil, fmt.Errorf("issue: %w", err)
	}
	node := req.Identity.Kind == KindNode
	switch {
	case node && len(req.Hosts) == 0:
		return nil, errors.New("issue: a node certificate needs at least one host (the names and addresses it is dialled at)")
	case !node && len(req.Hosts) > 0:
		return nil, errors.New("issue: only node certificates name hosts")
	case len(req.Hosts) > maxHosts:
		return nil, fmt.Errorf("issue: %d hosts, more than the limit of %d", len(req.Hosts), maxHosts)
	}
	if req.NotBefore.IsZero() {
		req.NotBefore = now.Add(-clockSkew)
	}
	if req.NotAfter.IsZero() {
		req.NotAfter = req.NotBefore.Add(clockSkew + DefaultValidity)
	}
	if !req.NotAfter.After(req.NotBefore) {
		return nil, fmt.Errorf("issue: validity ends (%v) before it starts (%v)", req.NotAfter, req.NotBefore)
	}
	if req.NotAfter.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("issue: validity ends (%v) after the CA's (%v)", req.NotAfter, ca.Cert.NotAfter)
	}
	cn := req.CommonName
	if cn == "" {
		cn = req.Identity.Name
		if cn == "" {
			cn = req.Identity.Kind.String()
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"arbor"}},
		NotBefore:    req.NotBefore,
		NotAfter:     req.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{req.Identity.URI()},
	}
	if node {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range req.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			} else {
				return nil, errors.New("issue: empty host")
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue: sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("issue: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der}), KeyPEM: keyPEM}, nil
}

// Credential is the credential file of the issued certificate: its
// certificate, its key and the CA's certificate in one PEM file.
func (ca *CA) Credential(is *Issued) []byte {
	var b bytes.Buffer
	b.Write(is.CertPEM)
	b.Write(is.KeyPEM)
	b.Write(ca.CertPEM)
	return b.Bytes()
}

// Save writes the certificate to dir/name.crt and its key to dir/name.key
// (0600), refusing to overwrite either.
func (is *Issued) Save(dir, name string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeNew(filepath.Join(dir, name+".key"), is.KeyPEM, 0o600); err != nil {
		return err
	}
	return writeNew(filepath.Join(dir, name+".crt"), is.CertPEM, 0o644)
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return serial, nil
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// writeNew writes a file that must not exist yet, then syncs it.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// WriteNewFile writes data to path, which must not exist yet (a
// credential file: mode 0600).
func WriteNewFile(path string, data []byte, mode os.FileMode) error {
	return writeNew(path, data, mode)
}

// readPEMFile reads a PEM file of at most maxPEMBytes.
func readPEMFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxPEMBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than the limit of %d for a PEM file", path, st.Size(), maxPEMBytes)
	}
	buf := make([]byte, st.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return buf, nil
}

// decodePEM decodes every block of a PEM file: certificates and PKCS #8
// private keys (ECDSA or Ed25519). Any other block, trailing garbage or a
// block that does not parse is an error.
func decodePEM(data []byte) (certs []*x509.Certificate, keys []crypto.Signer, err error) {
	if len(data) > maxPEMBytes {
		return nil, nil, fmt.Errorf("%d bytes of PEM, more than the limit of %d", len(data), maxPEMBytes)
	}
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch block.Type {
		case pemCertificate:
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
			}
			certs = append(certs, c)
		case pemPrivateKey:
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("private key: %w", err)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, nil, fmt.Errorf("private key of type %T cannot sign", k)
			}
			keys = append(keys, s)
		default:
			return nil, nil, fmt.Errorf("unexpected PEM block %q (want %q or %q)", block.Type, pemCertificate, pemPrivateKey)
		}
	}
	if len(certs) == 0 && len(keys) == 0 {
		return nil, nil, errors.New("no PEM blocks")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, nil, errors.New("data that is not PEM after the last block")
	}
	return certs, keys, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}
