package tract

import (
	"context"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/security"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// testIdentityKey carries, in these tests only, the identity a node's
// authorizer would derive from the caller's certificate: the test
// servers run without TLS.
const testIdentityKey = "x-test-identity"

// withTestIdentity gives an RPC's context the identity its caller's
// metadata names (testIdentityKey), as security's authorizer does from
// the certificate.
func withTestIdentity(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get(testIdentityKey)) != 1 {
		return ctx
	}
	u, err := url.Parse(md.Get(testIdentityKey)[0])
	if err != nil {
		return ctx
	}
	id, err := security.ParseURI(u)
	if err != nil {
		return ctx
	}
	return security.WithIdentity(ctx, id)
}

// clientAs is a client of the cluster whose calls carry identity id.
func (c *testCluster) clientAs(id security.Identity) *Client {
	c.t.Helper()
	dial := func(addr string) (grpc.ClientConnInterface, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return invoker(metadata.AppendToOutgoingContext(ctx, testIdentityKey, id.String()), method, req, reply, cc, opts...)
			}))
	}
	cl, err := NewClient(ClientConfig{Directory: c.dir, Dial: dial, Logger: c.log, AttemptTimeout: 10 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// TestStaleOwnerCannotWriteARecreatedBlob (issue 15 review): tenant acme
// deletes its blob and tenant bob creates a blob under the same GUID and
// writes it. A tractserver that still believes acme owns acme's old life
// (an owner it asked for before the deletion: a primary that moved since,
// or a check that raced the re-creation) must not let acme's write of
// that life replace what bob's life wrote: bob's tract reads back as bob
// wrote it.
func TestStaleOwnerCannotWriteARecreatedBlob(t *testing.T) {
	c := newTestCluster(t, 3, 2, testTractSize)
	acme, bob := c.clientAs(security.Tenant("acme")), c.clientAs(security.Tenant("bob"))
	ctx := ctxT(t)
	g := NewGUID()

	old, err := acme.CreateBlobSized(ctx, g, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.WriteTract(ctx, 0, []byte("acme's first life")); err != nil {
		t.Fatal(err)
	}
	if err := acme.DeleteBlob(ctx, g); err != nil {
		t.Fatal(err)
	}
	b, err := bob.CreateBlobSized(ctx, g, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteTract(ctx, 0, []byte("bob's blob")); err != nil {
		t.Fatal(err)
	}

	// The primary of tract 0's row still believes acme owns acme's old life.
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 0)]
	primary := c.nodes[row.Slots[0].Node]
	primary.svc.owners.mu.Lock()
	primary.svc.owners.m[g] = blobOwner{incarnation: old.Info().Incarnation, tenant: "acme", asked: time.Now()}
	primary.svc.owners.mu.Unlock()

	conn, err := grpc.NewClient(primary.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := []byte("acme overwrites bob")
	_, err = tpb.NewTractServerClient(conn).WriteTract(metadata.AppendToOutgoingContext(ctx, testIdentityKey, security.Tenant("acme").String()),
		&tpb.WriteTractRequest{Disk: row.Slots[0].Disk, Guid: g[:], Tract: 0, RowVersion: row.Version, Replication: 2,
			Incarnation: old.Info().Incarnation, Data: data, Crc32C: Checksum(data)})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("acme's write of its deleted life over bob's tract: %v, want PermissionDenied", err)
	}
	got, err := b.ReadTract(ctx, 0)
	if err != nil || string(got) != "bob's blob" {
		t.Fatalf("bob's tract reads %q, %v; want what bob wrote", got, err)
	}
	// Bob writes on, over acme's old life's tracts included.
	if err := b.WriteTract(ctx, 0, []byte("bob again")); err != nil {
		t.Fatalf("bob writes its blob: %v", err)
	}
}
