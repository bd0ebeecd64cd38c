package security_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/arbor-storage/arbor/internal/directory/directorypb"
	_ "github.com/arbor-storage/arbor/internal/extent/extentpb"
	_ "github.com/arbor-storage/arbor/internal/faults/faultspb"
	_ "github.com/arbor-storage/arbor/internal/meta/metapb"
	_ "github.com/arbor-storage/arbor/internal/raftengine/enginepb"
	"github.com/arbor-storage/arbor/internal/security"
	_ "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

func newCA(t testing.TB) *security.CA {
	t.Helper()
	ca, err := security.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t testing.TB, ca *security.CA, req security.Request) *security.Credentials {
	t.Helper()
	is, err := ca.Issue(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := security.ParseCredentials(ca.Credential(is))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIdentityURIs(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want security.Identity
		err  string
	}{
		{"arbor://node/node-1", security.Node("node-1"), ""},
		{"arbor://admin", security.Admin(), ""},
		{"arbor://tenant/acme.prod", security.Tenant("acme.prod"), ""},
		{"arbor://admin/bob", security.Identity{}, "no name"},
		{"arbor://tenant/", security.Identity{}, "must be 1 to"},
		{"arbor://tenant/a/b", security.Identity{}, "must be 1 to"},
		{"arbor://tenant/-x", security.Identity{}, "must be 1 to"},
		{"arbor://root", security.Identity{}, "unknown kind"},
		{"arbor://tenant/t?x=1", security.Identity{}, "want arbor://"},
		{"https://admin", security.Identity{}, "want arbor://"},
	} {
		u, err := url.Parse(tc.uri)
		if err != nil {
			t.Fatal(err)
		}
		got, err := security.ParseURI(u)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURI(%s) = %v, %v; want error %q", tc.uri, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseURI(%s) = %v, %v; want %v", tc.uri, got, err, tc.want)
		}
		if got.String() != tc.uri {
			t.Errorf("%v.String() = %s, want %s", got, got, tc.uri)
		}
	}
}

func TestIssueNamesTheIdentity(t *testing.T) {
	ca := newCA(t)
	for _, req := range []security.Request{
		{Identity: security.Node("node-3"), Hosts: []string{"127.0.0.1", "n3.example.com"}},
		{Identity: security.Admin(), CommonName: "alice"},
		{Identity: security.Tenant("acme")},
	} {
		c := issue(t, ca, req)
		if c.Identity != req.Identity {
			t.Errorf("issued for %v, credentials say %v", req.Identity, c.Identity)
		}
		if err := c.CheckValid(time.Now()); err != nil {
			t.Errorf("%v: %v", req.Identity, err)
		}
		if err := c.Leaf.CheckSignatureFrom(ca.Cert); err != nil {
			t.Errorf("%v: not signed by the CA: %v", req.Identity, err)
		}
	}
	node := issue(t, ca, security.Request{Identity: security.Node("n"), Hosts: []string{"10.0.0.1", "h"}})
	if len(node.Leaf.IPAddresses) != 1 || len(node.Leaf.DNSNames) != 1 {
		t.Errorf("node hosts: IPs %v, DNS %v", node.Leaf.IPAddresses, node.Leaf.DNSNames)
	}
}

func TestIssueRefusesBadRequests(t *testing.T) {
	ca := newCA(t)
	now := time.Now()
	for _, tc := range []struct {
		name string
		req  security.Request
		err  string
	}{
		{"node without hosts", security.Request{Identity: security.Node("n")}, "at least one host"},
		{"client with hosts", security.Request{Identity: security.Tenant("t"), Hosts: []string{"h"}}, "only node"},
		{"no identity", security.Request{}, "no identity"},
		{"bad tenant", security.Request{Identity: security.Tenant("a b")}, "must be 1 to"},
		{"ends before it starts", security.Request{Identity: security.Admin(), NotBefore: now, NotAfter: now.Add(-time.Second)}, "before it starts"},
		{"outlives the CA", security.Request{Identity: security.Admin(), NotAfter: now.Add(20 * 365 * 24 * time.Hour)}, "after the CA's"},
	} {
		if _, err := ca.Issue(tc.req, now); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestCASaveLoad(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err == nil {
		t.Fatal("Save over an existing CA succeeded")
	}
	if st, err := os.Stat(filepath.Join(dir, security.CAKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, %v; want mode 0600", st, err)
	}
	got, err := security.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) {
		t.Fatal("loaded CA differs")
	}
	// A key of another CA next to the certificate is refused.
	other := t.TempDir()
	if err := newCA(t).Save(other); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(other, security.CAKeyFile))
	if err := os.WriteFile(filepath.Join(dir, security.CAKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := security.LoadCA(dir); err == nil || !strings.Contains(err.Error(), "do not belong together") {
		t.Fatalf("LoadCA with a foreign key: %v", err)
	}
}

// blocks splits a credential file into its PEM blocks.
func blocks(data []byte) []*pem.Block {
	var out []*pem.Block
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		out = append(out, b)
	}
}

func join(bs ...*pem.Block) []byte {
	var buf bytes.Buffer
	for _, b := range bs {
		buf.Write(pem.EncodeToMemory(b))
	}
	return buf.Bytes()
}

func TestParseCredentialsRefusesBadFiles(t *testing.T) {
	ca := newCA(t)
	is, err := ca.Issue(security.Request{Identity: security.Tenant("t")}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Issue(security.Request{Identity: security.Tenant("u")}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b := blocks(ca.Credential(is)) // leaf, key, CA
	ob := blocks(ca.Credential(other))
	if _, err := security.ParseCredentials(join(b[2], b[1], b[0])); err != nil {
		t.Fatalf("blocks in another order: %v", err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		err  string
	}{
		{"empty", nil, "no PEM blocks"},
		{"no key", join(b[0], b[2]), "one private key"},
		{"two keys", join(b[0], b[1], ob[1], b[2]), "one private key"},
		{"foreign key", join(b[0], ob[1], b[2]), "does not belong"},
		{"no CA", join(b[0], b[1]), "no CA certificate"},
		{"no leaf", join(b[1], b[2]), "no certificate of the holder"},
		{"two leaves", join(b[0], ob[0], b[1], b[2]), "more than one certificate"},
		{"other block", join(b[0], b[1], b[2], &pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte{1}}), "unexpected PEM block"},
		{"garbage after", append(join(b[0], b[1], b[2]), "junk"...), "not PEM"},
		{"bad certificate", join(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}, b[1], b[2]), "certificate 1"},
	} {
		if _, err := security.ParseCredentials(tc.data); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

// FuzzParseCredentials: the credential decoder never panics, and what it
// accepts names a valid identity whose certificate its key matches.
func FuzzParseCredentials(f *testing.F) {
	ca := newCA(f)
	for _, id := range []security.Identity{security.Admin(), security.Tenant("t"), security.Node("n")} {
		req := security.Request{Identity: id}
		if id == security.Node("n") {
			req.Hosts = []string{"127.0.0.1"}
		}
		is, err := ca.Issue(req, time.Now())
		if err != nil {
			f.Fatal(err)
		}
		cred := ca.Credential(is)
		f.Add(cred)
		f.Add(cred[:len(cred)/2])
		f.Add(append(cred, cred...))
	}
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := security.ParseCredentials(data)
		if err != nil {
			return
		}
		if c.Leaf == nil || c.Identity.Kind == security.KindNone {
			t.Fatalf("accepted credentials without identity: %+v", c)
		}
		if _, err := security.ParseURI(c.Identity.URI()); err != nil {
			t.Fatalf("accepted identity %v does not parse back: %v", c.Identity, err)
		}
	})
}

// TestDefaultPolicyClassifiesEveryMethod keeps the policy in step with
// the services: every method of every arbor service linked into the binary
// has an explicit class (the policy fails closed, so an unclassified
// method would be refused to everyone, the nodes included), and every
// method the policy names exists.
func TestDefaultPolicyClassifiesEveryMethod(t *testing.T) {
	p := security.DefaultPolicy()
	services := map[string]bool{}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "arbor.") {
			return true
		}
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			services[string(sd.FullName())] = true
			for j := 0; j < sd.Methods().Len(); j++ {
				m := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				if p.Class(m) == security.ClassUnknown {
					t.Errorf("%s has no class in DefaultPolicy: name it (any, admin or node)", m)
				}
			}
		}
		return true
	})
	for _, s := range []string{"arbor.raftengine.v1.RaftTransport", "arbor.directory.v1.Directory", "arbor.tract.v1.TractServer",
		"arbor.extent.v1.Extent", "arbor.meta.v1.Meta", "arbor.faults.v1.Admin"} {
		if !services[s] {
			t.Errorf("service %s not found among the linked descriptors", s)
		}
	}
	for method, class := range p {
		s := strings.TrimPrefix(method, "/")
		i := strings.LastIndex(s, "/")
		if i < 0 {
			t.Errorf("%q is not /service/method", method)
			continue
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s[:i]))
		if err != nil {
			t.Errorf("%s (%v): no service %s: %v", method, class, s[:i], err)
			continue
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok || sd.Methods().ByName(protoreflect.Name(s[i+1:])) == nil {
			t.Errorf("%s (%v): service %s has no method %s", method, class, s[:i], s[i+1:])
		}
		if class == security.ClassUnknown {
			t.Errorf("%s is named with the unknown class", method)
		}
	}
	for _, m := range []string{"/arbor.raftengine.v1.RaftTransport/Send", "/arbor.tract.v1.TractServer/Replicate", "/arbor.extent.v1.Extent/CreateReplica"} {
		if p.Class(m) != security.ClassNode {
			t.Errorf("%s is %v, want node", m, p.Class(m))
		}
	}
	for _, m := range []string{"/arbor.directory.v1.Directory/InstallTLT", "/arbor.meta.v1.Meta/MoveTable", "/arbor.extent.v1.Extent/Recover",
		"/arbor.directory.v1.Directory/Decommission", "/arbor.directory.v1.Directory/CreateExtent"} {
		if p.Class(m) != security.ClassAdmin {
			t.Errorf("%s is %v, want admin", m, p.Class(m))
		}
	}
	if p.Class("/arbor.tract.v1.TractServer/ReadTract") != security.ClassAny {
		t.Error("ReadTract is not open to tenants")
	}
	if p.Class("/arbor.tract.v1.TractServer/NoSuchMethod") != security.ClassUnknown {
		t.Error("a method the policy does not name has a class")
	}
}

// TestAuthorizerFailsClosed: through the interceptor, a method the policy
// does not name is refused to every identity without running its handler,
// the identity comes from the connection's AuthInfo (derived once, in the
// handshake), and a connection whose certificate named no identity is
// refused every method.
func TestAuthorizerFailsClosed(t *testing.T) {
	policy := security.Policy{"/s.S/Open": security.ClassAny, "/s.S/Admin": security.ClassAdmin}
	intercept := security.NewAuthorizer(policy, false).UnaryServerInterceptor()
	call := func(info credentials.AuthInfo, method string) (security.Identity, error) {
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
		var got security.Identity
		_, err := intercept(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
			id, ok := security.FromContext(ctx)
			if !ok {
				t.Errorf("%s: handler ran without an identity", method)
			}
			got = id
			return nil, nil
		})
		return got, err
	}
	for _, id := range []security.Identity{security.Tenant("t"), security.Admin(), security.Node("n1")} {
		info := security.IdentityInfo{Identity: id}
		if _, err := call(info, "/s.S/Unknown"); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%v calling an unknown method: %v, want PermissionDenied", id, err)
		}
		got, err := call(info, "/s.S/Open")
		if err != nil || got != id {
			t.Errorf("%v calling an open method: identity %v, %v", id, got, err)
		}
		_, err = call(info, "/s.S/Admin")
		if want := id.Kind != security.KindTenant; (err == nil) != want {
			t.Errorf("%v calling an admin method: %v", id, err)
		}
	}
	bad := security.IdentityInfo{Err: status.Error(codes.Unauthenticated, "no identity")}
	if _, err := call(bad, "/s.S/Open"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a connection without identity: %v, want Unauthenticated", err)
	}
	if _, err := call(nil, "/s.S/Open"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a connection without TLS to a secure server: %v, want Unauthenticated", err)
	}
}

// handshake runs one TLS handshake between a server and a client config
// over loopback TCP (buffered, so a side that fails does not block the
// other's alert) and returns the client's and the server's errors. With
// TLS 1.3 the client finishes before the server checked its certificate,
// so the client's error about that shows on its first read.
func handshake(t *testing.T, server, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		s := tls.Server(conn, server)
		err = s.HandshakeContext(ctx)
		if err == nil {
			_, err = s.Write([]byte{1})
		}
		s.Close()
		done <- err
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(conn, client)
	clientErr = c.HandshakeContext(ctx)
	if clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	c.Close()
	return clientErr, <-done
}

func TestHandshakes(t *testing.T) {
	ca := newCA(t)
	node := issue(t, ca, security.Request{Identity: security.Node("n1"), Hosts: []string{"127.0.0.1"}})
	admin := issue(t, ca, security.Request{Identity: security.Admin()})
	tenant := issue(t, ca, security.Request{Identity: security.Tenant("t")})
	srv, err := security.ServerTLS(node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := security.ServerTLS(admin); err == nil {
		t.Error("ServerTLS accepted an admin certificate")
	}
	dial := func(c *security.Credentials, host string) *tls.Config {
		cfg := security.ClientTLS(c)
		cfg.ServerName = host
		return cfg
	}
	for _, c := range []*security.Credentials{node, admin, tenant} {
		if cerr, serr := handshake(t, srv, dial(c, "127.0.0.1")); cerr != nil || serr != nil {
			t.Errorf("%v: client %v, server %v", c.Identity, cerr, serr)
		}
	}
	// A host the node's certificate does not name.
	if cerr, _ := handshake(t, srv, dial(admin, "10.9.9.9")); cerr == nil {
		t.Error("client accepted a node certificate for another host")
	}
	// Another CA's client.
	stranger := issue(t, newCA(t), security.Request{Identity: security.Admin()})
	if _, serr := handshake(t, srv, dial(stranger, "127.0.0.1")); serr == nil {
		t.Error("server accepted a client of another CA")
	}
	// An expired client certificate.
	expired := issue(t, ca, security.Request{Identity: security.Admin(), NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if _, serr := handshake(t, srv, dial(expired, "127.0.0.1")); serr == nil {
		t.Error("server accepted an expired certificate")
	}
	// A server whose certificate is a tenant's (forged server config).
	fake := srv.Clone()
	tcfg := security.ClientTLS(tenant)
	fake.Certificates = tcfg.Certificates
	if cerr, _ := handshake(t, fake, dial(admin, "127.0.0.1")); cerr == nil {
		t.Error("client accepted a tenant's certificate as a server's")
	}
}

// TestExtentTenants: a tenant's extent-store owner is stable (it is in
// every block the tenant's KV tree ever allocated), distinct from other
// tenants', from the administrators' space and from the cluster's own
// owners (below 2^63: file-system metadata is 1).
func TestExtentTenants(t *testing.T) {
	seen := map[uint64]string{security.AdminExtentTenant(): "admin"}
	for _, name := range []string{"acme", "bob", "Acme", "acme2", "a", "admin", "node-1"} {
		o := security.ExtentTenant(name)
		if o < 1<<63 {
			t.Errorf("ExtentTenant(%q) = %#x, in the cluster's own range", name, o)
		}
		if other, ok := seen[o]; ok {
			t.Errorf("ExtentTenant(%q) = ExtentTenant of %q", name, other)
		}
		seen[o] = name
		if security.ExtentTenant(name) != o {
			t.Errorf("ExtentTenant(%q) is not stable", name)
		}
	}
	// The derivation is an on-disk format: changing it orphans every
	// tenant's KV tree.
	if got := security.ExtentTenant("acme"); got != 0x988799b601674e35 {
		t.Errorf("ExtentTenant(\"acme\") = %#x, want 0x988799b601674e35", got)
	}
}
