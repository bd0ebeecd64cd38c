package security

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Kind is what an identity is.
type Kind int

const (
	// KindNone is no identity: a plaintext connection to an insecure
	// server (--insecure), which authorizes everything.
	KindNone Kind = iota
	// KindNode is a cluster node.
	KindNode
	// KindAdmin is an administrator.
	KindAdmin
	// KindTenant is a client of one tenant.
	KindTenant
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindAdmin:
		return "admin"
	case KindTenant:
		return "tenant"
	}
	return "none"
}

// URIScheme is the scheme of identity URIs.
const URIScheme = "arbor"

// maxNameBytes bounds node, tenant and holder names.
const maxNameBytes = 64

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// CheckName reports whether s can name a node, a tenant or a certificate
// holder.
func CheckName(s string) error {
	if len(s) == 0 || len(s) > maxNameBytes || !namePattern.MatchString(s) {
		return fmt.Errorf("name %q must be 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", s, maxNameBytes)
	}
	return nil
}

// Identity is who a caller is, as its certificate says.
type Identity struct {
	Kind Kind
	// Name is the node's name (KindNode) or the tenant (KindTenant);
	// empty for an administrator.
	Name string
}

// Node is the identity of the node named name.
func Node(name string) Identity { return Identity{Kind: KindNode, Name: name} }

// Admin is the identity of an administrator.
func Admin() Identity { return Identity{Kind: KindAdmin} }

// Tenant is the identity of a client of tenant name.
func Tenant(name string) Identity { return Identity{Kind: KindTenant, Name: name} }

func (id Identity) String() string { return id.URI().String() }

func (id Identity) check() error {
	switch id.Kind {
	case KindNode, KindTenant:
		return CheckName(id.Name)
	case KindAdmin:
		if id.Name != "" {
			return errors.New("an administrator identity has no name")
		}
		return nil
	}
	return errors.New("no identity")
}

// URI is the identity's URI subject alternative name.
func (id Identity) URI() *url.URL {
	switch id.Kind {
	case KindAdmin:
		return &url.URL{Scheme: URIScheme, Host: "admin"}
	case KindNode, KindTenant:
		return &url.URL{Scheme: URIScheme, Host: id.Kind.String(), Path: "/" + id.Name}
	}
	return &url.URL{Scheme: URIScheme, Host: "none"}
}

// ParseURI parses an identity URI (arbor://node/N, arbor://admin,
// arbor://tenant/T).
func ParseURI(u *url.URL) (Identity, error) {
	if u.Scheme != URIScheme || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("identity URI %q: want %s://node/NAME, %s://admin or %s://tenant/NAME", u, URIScheme, URIScheme, URIScheme)
	}
	var id Identity
	name := strings.TrimPrefix(u.Path, "/")
	switch u.Host {
	case "admin":
		id = Admin()
		if u.Path != "" {
			return Identity{}, fmt.Errorf("identity URI %q: an administrator has no name", u)
		}
	case "node":
		id = Node(name)
	case "tenant":
		id = Tenant(name)
	default:
		return Identity{}, fmt.Errorf("identity URI %q: unknown kind %q (node, admin, tenant)", u, u.Host)
	}
	if err := id.check(); err != nil {
		return Identity{}, fmt.Errorf("identity URI %q: %w", u, err)
	}
	return id, nil
}

// IdentityOf returns the identity a certificate names: its one arbor://
// URI subject alternative name.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme {
			continue
		}
		id, err := ParseURI(u)
		if err != nil {
			return Identity{}, err
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q names no %s:// identity", cert.Subject.CommonName, URIScheme)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("certificate %q names %d identities, want one", cert.Subject.CommonName, len(found))
}

type identityKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// FromContext returns the identity of the caller of the RPC ctx belongs
// to, as the server's interceptor derived it from the verified peer
// certificate; ok is false outside such an RPC.
func FromContext(ctx context.Context) (id Identity, ok bool) {
	id, ok = ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// ExtentTenant is the extent-store tenant (the 64-bit owner in every
// extent block's ownership record, FSS §3) of tenant name's data: the
// first 8 bytes of SHA-256("arbor tenant " + name) with the top bit set.
// The extent servers refuse a tenant's credential every page and block
// whose owner is not ExtentTenant of its name, so the owner recorded in a
// tenant's blocks is always its authenticated identity. Values below 2^63
// are the cluster's own (file-system metadata is 1).
func ExtentTenant(name string) uint64 {
	return extentOwner("arbor tenant " + name)
}

// AdminExtentTenant is the extent-store owner of the administrators' own
// KV key space: no tenant's ExtentTenant (the hash input differs).
func AdminExtentTenant() uint64 { return extentOwner("arbor admin") }

func extentOwner(s string) uint64 {
	sum := sha256.Sum256([]byte(s))
	return binary.BigEndian.Uint64(sum[:8]) | 1<<63
}
