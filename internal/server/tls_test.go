package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
	"github.com/arbor-storage/arbor/internal/security"
)

// testPKI is one CA for the package's tests, so their nodes trust each
// other, with its node and client credentials in dir.
type testPKI struct {
	dir   string
	ca    *security.CA
	admin *security.Credentials
}

var (
	pkiOnce sync.Once
	pki     testPKI
	pkiErr  error
)

// sharedPKI makes the package's CA on first use, under a directory that
// TestMain removes.
func sharedPKI(t *testing.T) *testPKI {
	t.Helper()
	pkiOnce.Do(func() {
		if pki.dir, pkiErr = os.MkdirTemp("", "arbor-server-tls-"); pkiErr != nil {
			return
		}
		now := time.Now()
		if pki.ca, pkiErr = security.NewCA("server-test", now); pkiErr != nil {
			return
		}
		if pkiErr = pki.ca.Save(pki.dir); pkiErr != nil {
			return
		}
		var is *security.Issued
		if is, pkiErr = pki.ca.Issue(security.Request{Identity: security.Node("node"), Hosts: []string{"127.0.0.1"}}, now); pkiErr != nil {
			return
		}
		if pkiErr = is.Save(pki.dir, "node"); pkiErr != nil {
			return
		}
		if is, pkiErr = pki.ca.Issue(security.Request{Identity: security.Admin()}, now); pkiErr != nil {
			return
		}
		pki.admin, pkiErr = security.ParseCredentials(pki.ca.Credential(is))
	})
	if pkiErr != nil {
		t.Fatalf("test PKI: %v", pkiErr)
	}
	return &pki
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pki.dir != "" {
		os.RemoveAll(pki.dir)
	}
	os.Exit(code)
}

// credential issues a client credential of id signed by the test CA.
func (p *testPKI) credential(t *testing.T, id security.Identity, notBefore, notAfter time.Time) *security.Credentials {
	t.Helper()
	is, err := p.ca.Issue(security.Request{Identity: id, NotBefore: notBefore, NotAfter: notAfter}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := security.ParseCredentials(p.ca.Credential(is))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfigRequiresTLSOrInsecure(t *testing.T) {
	cfg := testNodeConfig(t, 1, "c1", t.TempDir())
	cfg.TLS = TLSFiles{}
	if _, err := cfg.Normalize(); err == nil || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("no TLS files: %v, want an error naming --insecure", err)
	}
	cfg.Insecure = true
	if _, err := cfg.Normalize(); err != nil {
		t.Fatalf("--insecure: %v", err)
	}
	cfg.TLS.Dir = "/x"
	if _, err := cfg.Normalize(); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Fatalf("--insecure with --tls-dir: %v", err)
	}
	cfg.Insecure = false
	got, err := cfg.Normalize()
	if err != nil || got.TLS.CertFile != "/x/node.crt" || got.TLS.KeyFile != "/x/node.key" || got.TLS.CAFile != "/x/ca.crt" {
		t.Fatalf("--tls-dir /x: %+v, %v", got.TLS, err)
	}
}

func TestStartRefusesCredentialsThatAreNotANode(t *testing.T) {
	p := sharedPKI(t)
	dir := t.TempDir()
	is, err := p.ca.Issue(security.Request{Identity: security.Admin()}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Save(dir, "admin"); err != nil {
		t.Fatal(err)
	}
	cfg := testNodeConfig(t, 1, "c1", filepath.Join(dir, "data"))
	cfg.TLS = TLSFiles{CertFile: filepath.Join(dir, "admin.crt"), KeyFile: filepath.Join(dir, "admin.key"), CAFile: filepath.Join(p.dir, security.CACertFile)}
	if _, err := Start(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "not of a node") {
		t.Fatalf("Start with an admin certificate: %v", err)
	}
}

// TestTLSRefusesStrangersAndAuthorizes is the node's side of invariant 1
// and 4 of internal/security, in process: a plaintext client, a client of
// another CA and an expired certificate fail before any RPC runs; a
// tenant is refused an admin method; admin and nodes are served.
func TestTLSRefusesStrangersAndAuthorizes(t *testing.T) {
	p := sharedPKI(t)
	cfg := testNodeConfig(t, 1, "c1", t.TempDir())
	cfg.Policy = nil // the cluster's own policy, which does not name the echo service
	n := startNode(t, cfg, echoModule())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(opts []grpc.DialOption) *grpc.ClientConn {
		cc, err := grpc.NewClient(n.Addr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	echo := func(opts []grpc.DialOption) error {
		_, err := testpb.NewTestServiceClient(dial(opts)).EmptyCall(ctx, &testpb.Empty{})
		return err
	}
	getFaults := func(creds *security.Credentials) error {
		_, err := faultspb.NewAdminClient(dial(client.DialOptions("c1", creds))).GetFaults(ctx, &faultspb.GetFaultsRequest{})
		return err
	}
	setFaults := func(creds *security.Credentials) error {
		off := "off"
		_, err := faultspb.NewAdminClient(dial(client.DialOptions("c1", creds))).SetFaults(ctx, &faultspb.SetFaultsRequest{Config: &off})
		return err
	}

	// Plain text: the handshake fails, the call is Unavailable.
	if err := echo([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext client: %v, want Unavailable", err)
	}
	// TLS without a client certificate.
	noCert := security.ClientTLS(p.admin)
	noCert.Certificates = nil
	if err := echo([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(noCert))}); status.Code(err) != codes.Unavailable {
		t.Errorf("client without certificate: %v, want Unavailable", err)
	}
	// A client of another CA.
	other, err := security.NewCA("other", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	is, err := other.Issue(security.Request{Identity: security.Admin()}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := security.ParseCredentials(append(other.Credential(is), p.ca.CertPEM...))
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(client.DialOptions("c1", stranger)); status.Code(err) != codes.Unavailable {
		t.Errorf("client of another CA: %v, want Unavailable", err)
	}
	// An expired certificate.
	expired := p.credential(t, security.Admin(), time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	if err := echo(client.DialOptions("c1", expired)); status.Code(err) != codes.Unavailable {
		t.Errorf("expired certificate: %v, want Unavailable", err)
	}
	// A tenant: served an ordinary method, refused an admin one.
	tenant := p.credential(t, security.Tenant("t1"), time.Time{}, time.Time{})
	if err := getFaults(tenant); err != nil {
		t.Errorf("tenant, ordinary method: %v", err)
	}
	if err := setFaults(tenant); status.Code(err) != codes.PermissionDenied {
		t.Errorf("tenant, SetFaults: %v, want PermissionDenied", err)
	}
	// The administrator is served both.
	if err := getFaults(p.admin); err != nil {
		t.Errorf("admin, ordinary method: %v", err)
	}
	if err := setFaults(p.admin); err != nil {
		t.Errorf("admin, SetFaults: %v", err)
	}
	// The policy fails closed: the echo service, which the policy does
	// not name, is refused to everyone, the administrator and the node
	// itself included, and its handler never runs.
	for _, c := range []*security.Credentials{tenant, p.admin} {
		if err := echo(client.DialOptions("c1", c)); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%v calling a method outside the policy: %v, want PermissionDenied", c.Identity, err)
		}
	}
	nodeConn, err := n.Env().Dialer.Conn(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testpb.NewTestServiceClient(nodeConn).EmptyCall(ctx, &testpb.Empty{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a node calling a method outside the policy: %v, want PermissionDenied", err)
	}
}

type raftStub struct {
	enginepb.UnimplementedRaftTransportServer
}

// TestNodeOnlyMethodsRefuseAdmin: the raft transport answers nodes only;
// an administrator is refused before the handler runs.
func TestNodeOnlyMethodsRefuseAdmin(t *testing.T) {
	p := sharedPKI(t)
	mod := ModuleFuncs{ModuleName: "raftstub", InitFunc: func(_ context.Context, env *Env) error {
		enginepb.RegisterRaftTransportServer(env.GRPC, raftStub{})
		return nil
	}}
	n := startNode(t, testNodeConfig(t, 1, "c1", t.TempDir()), mod)
	m := startNode(t, testNodeConfig(t, 2, "c1", t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	send := func(cc grpc.ClientConnInterface) error {
		st, err := enginepb.NewRaftTransportClient(cc).Send(ctx)
		if err != nil {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}
	cc, err := grpc.NewClient(n.Addr(), client.DialOptions("c1", p.admin)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := send(cc); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("admin calling the raft transport: %v, want PermissionDenied", err)
	}
	// Another node passes the authorizer and reaches the (stub) handler.
	peer, err := m.Env().Dialer.Conn(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := send(peer); status.Code(err) != codes.Unimplemented {
		t.Fatalf("node calling the raft transport: %v, want the stub's Unimplemented", err)
	}
}

func TestPProfOnlyWhenAsked(t *testing.T) {
	n := startNode(t, testNodeConfig(t, 1, "c1", t.TempDir()))
	if code, _ := httpGet(t, "http://"+n.HTTPAddr()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof = %d, want 404", code)
	}
	cfg := testNodeConfig(t, 2, "c1", t.TempDir())
	cfg.PProf = true
	m := startNode(t, cfg)
	if code, _ := httpGet(t, "http://"+m.HTTPAddr()+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with --pprof = %d, want 200", code)
	}
}
