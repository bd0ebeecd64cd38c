package extent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/security"
)

// tenantListener serves node id's Extent service as tenant t's client
// sees it: the node's guarded service behind an interceptor that gives
// every call t's identity, as the Authorizer does from a verified
// certificate.
func tenantListener(t *testing.T, c *testCluster, id uint64, tenant string) *bufconn.Listener {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(security.WithIdentity(ctx, security.Tenant(tenant)), req)
	}))
	c.node(id).node.Register(srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis
}

// tenantConn is node id's Extent service as tenant t's client sees it.
func tenantConn(t *testing.T, c *testCluster, id uint64, tenant string) pb.ExtentClient {
	t.Helper()
	lis := tenantListener(t, c, id, tenant)
	conn, err := grpc.NewClient("passthrough:///"+tenant, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewExtentClient(conn)
}

// tenantClient is a Client whose calls reach nodes 1..n as tenant's.
func tenantClient(t *testing.T, c *testCluster, n uint64, tenant string) *Client {
	t.Helper()
	lis := map[string]*bufconn.Listener{}
	for id := uint64(1); id <= n; id++ {
		lis[nodeAddr(id)] = tenantListener(t, c, id, tenant)
	}
	cl, err := NewClient(ClientConfig{Directory: c.dir, Logger: c.logger, CallTimeout: 2 * time.Second, DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			if l := lis[addr]; l != nil {
				return l.DialContext(ctx)
			}
			return nil, fmt.Errorf("no node listens at %s", addr)
		})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestTenantRefusalIsPermissionDenied: the client reports a node's
// refusal of a tenant (another owner's page) as ErrPermissionDenied at
// once: nothing ran, so it is not retried until the deadline as an
// unavailable node, and the node is not taken for down.
func TestTenantRefusalIsPermissionDenied(t *testing.T) {
	c := newTestCluster(t, 3, 16)
	ext := c.createExtent(smallGeometry(), 1, 2, 3)
	acme, bob := tenantClient(t, c, 3, "acme"), tenantClient(t, c, 3, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := retry(t, "acme allocates a block", 10*time.Second, func(ctx context.Context) ([]Result, error) {
		return acme.Commit(ctx, []Element{Allocate(ext, security.ExtentTenant("acme"))})
	})
	start := time.Now()
	_, err := bob.ReadPage(ctx, rs[0].Block)
	if !errors.Is(err, ErrPermissionDenied) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("bob reads acme's page: %v, want ErrPermissionDenied", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the refusal took %v: retried as if nothing had answered", took)
	}
	bob.mu.Lock()
	down := len(bob.down)
	bob.mu.Unlock()
	if down != 0 {
		t.Errorf("bob's client takes %d node(s) for down after a refusal", down)
	}
}

// TestTenantCannotStepAnotherOwnersTransaction is issue 15's review
// finding: the steps that carry only a transaction id (decide-and-release,
// release, abort, fence) and QueryTxn are checked against the record of
// the transaction, so tenant bob can neither commit nor abort nor read
// tenant acme's prepared part, at the leader or through a follower; a
// refusal because acme's transaction holds a block does not show bob the
// holder (acme sees its own); acme's steps on its own transaction work.
func TestTenantCannotStepAnotherOwnersTransaction(t *testing.T) {
	c := newTestCluster(t, 3, 15)
	e1 := c.createExtent(smallGeometry(), 1, 2, 3)
	e2 := c.createExtent(smallGeometry(), 1, 2, 3)
	leader := c.leader(e1)
	follower := leader%3 + 1
	acme, bob := tenantConn(t, c, leader, "acme"), tenantConn(t, c, leader, "bob")
	bobAtFollower := tenantConn(t, c, follower, "bob")
	acmeOwn, bobOwn := security.ExtentTenant("acme"), security.ExtentTenant("bob")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const txn = 0x5eed0015
	expiry := time.Now().Add(20 * time.Second).UnixMilli()
	prep, err := acme.TxnStep(ctx, &pb.TxnStepRequest{ExtentId: e1, Kind: pb.StepKind_STEP_KIND_PREPARE, TxnId: txn, NextExtent: e2,
		ExpiryUnixMs: expiry, RequestId: 1,
		Elements: []*pb.Element{{Op: &pb.Element_Allocate{Allocate: &pb.AllocateOp{ExtentId: e1, Tenant: acmeOwn, AnyBlock: true}}}}})
	if err != nil {
		t.Fatalf("acme prepares: %v", err)
	}
	reserved := prep.GetResults()[0].GetBlock()

	state := func() pb.TxnState {
		t.Helper()
		rec, err := c.stateMachines(e1)[leader].QueryTxn(txn)
		if err != nil {
			t.Fatal(err)
		}
		return rec.GetState()
	}
	for _, kind := range []pb.StepKind{pb.StepKind_STEP_KIND_DECIDE_RELEASE, pb.StepKind_STEP_KIND_RELEASE, pb.StepKind_STEP_KIND_ABORT, pb.StepKind_STEP_KIND_FENCE} {
		_, err := bob.TxnStep(ctx, &pb.TxnStepRequest{ExtentId: e1, Kind: kind, TxnId: txn, ExpiryUnixMs: expiry, RequestId: uint64(10 + kind)})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("bob's %v of acme's transaction at the leader: %v, want PermissionDenied", kind, err)
		}
		_, err = bobAtFollower.TxnStep(ctx, &pb.TxnStepRequest{ExtentId: e1, Kind: kind, TxnId: txn, ExpiryUnixMs: expiry, RequestId: uint64(20 + kind)})
		if d, ok := detailOf(err); !ok || d.Code != pb.Code_CODE_NOT_LEADER || d.LeaderId != leader {
			t.Errorf("bob's %v of acme's transaction at a follower: %v, want NOT_LEADER naming leader %d (not forwarded)", kind, err, leader)
		}
		if s := state(); s != pb.TxnState_TXN_STATE_PREPARED {
			t.Fatalf("after bob's %v, acme's transaction is %v, want PREPARED", kind, s)
		}
	}
	if _, err := bob.QueryTxn(ctx, &pb.QueryTxnRequest{ExtentId: e1, TxnId: txn}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("bob queries acme's transaction: %v, want PermissionDenied", err)
	}

	// The block acme's prepare reserved, asked for by each tenant.
	grab := func(cl pb.ExtentClient, own uint64, rid uint64) *pb.Error {
		t.Helper()
		_, err := cl.Commit(ctx, &pb.CommitRequest{ExtentId: e1, RequestId: rid, Elements: []*pb.Element{{Op: &pb.Element_Allocate{Allocate: &pb.AllocateOp{
			ExtentId: e1, Tenant: own, Block: &pb.Pointer{ExtentId: e1, Page: reserved.GetPage(), Generation: reserved.GetGeneration() - 1}}}}}})
		d, ok := detailOf(err)
		if !ok || d.Code != pb.Code_CODE_PREPARED {
			t.Fatalf("allocate a block a prepared transaction reserved: %v, want CODE_PREPARED", err)
		}
		return d
	}
	if d := grab(bob, bobOwn, 30); d.Holder != nil || strings.Contains(d.Message, "5eed0015") {
		t.Errorf("bob's refusal shows acme's transaction: holder %v, message %q", d.Holder, d.Message)
	}
	if d := grab(acme, acmeOwn, 31); d.GetHolder().GetTxnId() != txn {
		t.Errorf("acme's refusal names holder %v, want its own transaction %x (its recovery needs it)", d.Holder, txn)
	}

	if r, err := acme.QueryTxn(ctx, &pb.QueryTxnRequest{ExtentId: e1, TxnId: txn}); err != nil || r.GetRecord().GetState() != pb.TxnState_TXN_STATE_PREPARED {
		t.Fatalf("acme queries its transaction: %v %v", r, err)
	}
	if _, err := acme.TxnStep(ctx, &pb.TxnStepRequest{ExtentId: e1, Kind: pb.StepKind_STEP_KIND_ABORT, TxnId: txn, ExpiryUnixMs: expiry, RequestId: 40}); err != nil {
		t.Fatalf("acme aborts its transaction: %v", err)
	}
	if s := state(); s != pb.TxnState_TXN_STATE_ABORTED {
		t.Fatalf("acme's transaction is %v after its abort, want ABORTED", s)
	}
	// A fence where the transaction has no record stays open (a tenant's
	// recovery of its own transaction needs it; ids are random).
	if _, err := bob.TxnStep(ctx, &pb.TxnStepRequest{ExtentId: e2, Kind: pb.StepKind_STEP_KIND_FENCE, TxnId: 0x0b0b, ExpiryUnixMs: expiry, RequestId: 41}); err != nil {
		// e2 may be led elsewhere: the refusal must then be NOT_LEADER.
		if d, ok := detailOf(err); !ok || d.Code != pb.Code_CODE_NOT_LEADER {
			t.Fatalf("bob fences its own transaction id: %v", err)
		}
	}
}
