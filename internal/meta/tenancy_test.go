package meta

import (
	"context"
	"errors"
	"net/url"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/security"
)

// testIdentityKey carries, in these tests only, the identity a node's
// authorizer would derive from the caller's certificate: the test servers
// run without TLS.
const testIdentityKey = "x-test-identity"

// withTestIdentities gives the servers an interceptor that takes the
// caller's identity from testIdentityKey, as security's authorizer does
// from the certificate.
func withTestIdentities(c *testCluster) {
	c.serverOpts = append(c.serverOpts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(testIdentityKey)) == 1 {
			u, err := url.Parse(md.Get(testIdentityKey)[0])
			if err != nil {
				return nil, err
			}
			id, err := security.ParseURI(u)
			if err != nil {
				return nil, err
			}
			ctx = security.WithIdentity(ctx, id)
		}
		return h(ctx, req)
	}))
}

// clientAs is a metadata client whose calls carry identity id.
func (c *testCluster) clientAs(id security.Identity) *Client {
	c.t.Helper()
	dial := func(addr string) (grpc.ClientConnInterface, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return invoker(metadata.AppendToOutgoingContext(ctx, testIdentityKey, id.String()), method, req, reply, cc, opts...)
			}))
	}
	cl, err := NewClient(ClientConfig{Directory: c.dir.Client(), Dial: dial, Logger: c.log, Durable: true})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// TestTenantsReachOnlyTheirFileSystems: a file system created by tenant
// a's credential is a's (its directory record says so); tenant b is
// refused every request that names it (EACCES, from PermissionDenied)
// and a's file system is unchanged afterwards; a's own requests, and an
// administrator's, are served; a tenant cannot create a file system for
// another tenant, nor take over another's by creating its name; an
// administrator creates for any tenant.
func TestTenantsReachOnlyTheirFileSystems(t *testing.T) {
	c := newTestCluster(t, 2, withTestIdentities)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, b, admin := c.clientAs(security.Tenant("a")), c.clientAs(security.Tenant("b")), c.clientAs(security.Admin())

	f, created, err := a.CreateTenantFileSystem(ctx, "afs", "", "")
	if err != nil || !created {
		t.Fatalf("a creates afs: %v (created %v)", err, created)
	}
	rec, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f})
	if err != nil || rec.GetTenant() != "a" {
		t.Fatalf("afs record: %v, %v; want tenant a", rec, err)
	}
	am := a.FileSystem(f, 0, 11)
	defer am.Close(context.Background())
	if _, err := am.Create(ctx, fs.RootHandle, "file", 0o644, fs.Cred{}, false); err != nil {
		t.Fatalf("a creates a file: %v", err)
	}
	before, err := am.ReadDir(ctx, fs.RootHandle, 0, 100)
	if err != nil {
		t.Fatal(err)
	}

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EACCES) {
			t.Errorf("b: %s: %v, want EACCES", what, err)
		}
	}
	bm := b.FileSystem(f, 0, 12)
	_, err = bm.Lookup(ctx, fs.RootHandle, "file")
	refused("lookup", err)
	_, err = bm.GetAttr(ctx, fs.RootHandle)
	refused("getattr", err)
	_, err = bm.Create(ctx, fs.RootHandle, "intruder", 0o644, fs.Cred{}, false)
	refused("create", err)
	_, err = bm.ReadDir(ctx, fs.RootHandle, 0, 100)
	refused("readdir", err)
	_, err = bm.StatFS(ctx)
	refused("statfs", err)
	_, err = b.CreateSnapshot(ctx, f, "snap")
	refused("snapshot", err)
	_, err = b.Check(ctx, f, false)
	refused("fsck", err)
	_, err = b.DeleteFileSystem(ctx, "afs")
	refused("delete", err)
	_, _, err = b.CreateTenantFileSystem(ctx, "afs", "", "")
	refused("create over a's file system", err)
	_, _, err = b.CreateTenantFileSystem(ctx, "bfs", "", "a")
	refused("create a file system for a", err)
	if _, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: "bfs"}); !errors.Is(err, directory.ErrNotFound) {
		t.Errorf("b's refused create for a left a file system: %v", err)
	}
	tables, err := b.Tables(ctx, 0)
	if err != nil {
		t.Fatalf("b lists tables: %v", err)
	}
	// The table list comes from the delegation map (which the directory
	// filters for tenants: the cluster test checks that) and the owners'
	// TableStats, which leave a's tables out of b's answer.
	for _, tb := range tables {
		if tb.FileSystem == f && tb.Reported {
			t.Errorf("b's table listing reports a's table %+v", tb)
		}
	}

	// a's file system is as a left it, and a is served.
	after, err := am.ReadDir(ctx, fs.RootHandle, 0, 100)
	if err != nil || len(after) != len(before) {
		t.Fatalf("a's root after b's attempts: %v, %v; before %v", after, err, before)
	}
	if rec, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f}); err != nil || len(rec.GetSnapshots()) != 0 {
		t.Fatalf("afs after b's attempts: %v, %v", rec, err)
	}
	if _, err := a.CreateSnapshot(ctx, f, "snap"); err != nil {
		t.Errorf("a snapshots afs: %v", err)
	}
	if rep, err := a.Check(ctx, f, false); err != nil || !rep.OK() {
		t.Errorf("a checks afs: %+v, %v", rep, err)
	}
	// The administrator reaches a's file system and creates for b.
	if _, err := admin.FileSystem(f, 0, 13).Lookup(ctx, fs.RootHandle, "file"); err != nil {
		t.Errorf("admin looks up a's file: %v", err)
	}
	g, _, err := admin.CreateTenantFileSystem(ctx, "bfs", "", "b")
	if err != nil {
		t.Fatalf("admin creates bfs for b: %v", err)
	}
	if rec, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: g}); err != nil || rec.GetTenant() != "b" {
		t.Fatalf("bfs record: %v, %v; want tenant b", rec, err)
	}
	if _, _, err := admin.CreateTenantFileSystem(ctx, "bfs", "", "a"); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("admin creating b's bfs for a: %v, want EEXIST", err)
	}
	if _, err := b.FileSystem(g, 0, 14).GetAttr(ctx, fs.RootHandle); err != nil {
		t.Errorf("b reaches its own bfs: %v", err)
	}
}

// TestDeleteFileSystemChecksTheRecordItDeletes: the tenancy guard checks
// a delete's name before the handler looks the file system up again; if
// the name changed hands in between (deleted, then created by another
// tenant), the handler must refuse rather than delete the other tenant's
// file system (issue 15 review: check-then-act). The handler is called
// as the guard would have let it run.
func TestDeleteFileSystemChecksTheRecordItDeletes(t *testing.T) {
	c := newTestCluster(t, 1, withTestIdentities)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := c.clientAs(security.Tenant("a"))
	f, _, err := a.CreateTenantFileSystem(ctx, "shared-name", "", "")
	if err != nil {
		t.Fatal(err)
	}
	var srv *Server
	for _, ts := range c.servers {
		srv = ts.srv
	}
	asB := security.WithIdentity(ctx, security.Tenant("b"))
	_, err = srv.DeleteFileSystem(asB, &pb.DeleteFileSystemRequest{Name: "shared-name"})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("b's delete of a's file system (past the guard): %v, want PermissionDenied", err)
	}
	if rec, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f}); err != nil || rec.GetTenant() != "a" {
		t.Fatalf("a's file system after b's refused delete: %v, %v", rec, err)
	}
	resp, err := srv.DeleteFileSystem(security.WithIdentity(ctx, security.Tenant("a")), &pb.DeleteFileSystemRequest{Name: "shared-name"})
	if err != nil || resp.GetError() != nil || resp.GetNumber() != f {
		t.Fatalf("a deletes its file system: %v, %v", resp, err)
	}
}
