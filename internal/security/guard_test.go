package security_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/arbor-storage/arbor/internal/security"
)

// guardedEcho is one unary method, shaped as protoc-gen-go-grpc writes
// them, that allocates nothing itself: what GuardService adds is all a
// benchmark of it measures.
func guardedEcho(g security.Guard) (grpc.MethodHandler, grpc.UnaryServerInterceptor) {
	info := &grpc.UnaryServerInfo{FullMethod: "/s.S/Echo"}
	echo := func(_ context.Context, req any) (any, error) { return req, nil }
	desc := &grpc.ServiceDesc{ServiceName: "s.S", Methods: []grpc.MethodDesc{{MethodName: "Echo",
		Handler: func(_ any, ctx context.Context, _ func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			if ic == nil {
				return echo(ctx, info)
			}
			return ic(ctx, info, info, echo)
		}}}}
	authorizer := security.NewAuthorizer(security.Policy{"/s.S/Echo": security.ClassAny}, false).UnaryServerInterceptor()
	return security.GuardService(desc, g).Methods[0].Handler, authorizer
}

// peerContext is the context of an RPC on a connection whose verified
// certificate names id, as ServerCredentials gives it.
func peerContext(id security.Identity) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: security.IdentityInfo{Identity: id}})
}

// TestGuardRunsForTenantsOnly: the guard checks (and filters the answers
// of) tenants; a node's or an administrator's call goes straight to its
// handler.
func TestGuardRunsForTenantsOnly(t *testing.T) {
	var checked []string
	h, ic := guardedEcho(security.Guard{Check: func(ctx context.Context, _ string, _ any) error {
		tenant, _ := security.CallerTenant(ctx)
		checked = append(checked, tenant)
		return nil
	}})
	for _, id := range []security.Identity{security.Node("n1"), security.Admin(), security.Tenant("acme")} {
		if _, err := h(nil, peerContext(id), nil, ic); err != nil {
			t.Fatalf("%v: %v", id, err)
		}
	}
	if len(checked) != 1 || checked[0] != "acme" {
		t.Fatalf("the guard checked %q, want only tenant acme", checked)
	}
}

// passThrough is an interceptor chain that only calls the handler: with
// it a benchmark measures the guard alone.
func passThrough(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(ctx, req)
}

func benchGuard(b *testing.B, id security.Identity, withAuthorizer bool) {
	h, authorizer := guardedEcho(security.Guard{Check: func(context.Context, string, any) error { return nil }})
	ic := grpc.UnaryServerInterceptor(passThrough)
	if withAuthorizer {
		ic = authorizer
	}
	ctx := peerContext(id)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h(nil, ctx, nil, ic); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardNode is the guard's own cost on a node's call (an
// administrator's is the same): no allocation.
func BenchmarkGuardNode(b *testing.B) { benchGuard(b, security.Node("n1"), false) }

// BenchmarkGuardTenant is the guard's own cost on a tenant's call, which
// it checks.
func BenchmarkGuardTenant(b *testing.B) { benchGuard(b, security.Tenant("acme"), false) }

// BenchmarkGuardNodeAuthorized is a node's call through the authorizer
// (which puts the identity in the context) and the guard.
func BenchmarkGuardNodeAuthorized(b *testing.B) { benchGuard(b, security.Node("n1"), true) }

// BenchmarkGuardTenantAuthorized is a tenant's call through the
// authorizer and the guard.
func BenchmarkGuardTenantAuthorized(b *testing.B) { benchGuard(b, security.Tenant("acme"), true) }
