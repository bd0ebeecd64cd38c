package security

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Guard is a service's own check of a tenant's call, beyond the policy's
// class: the tenancy of the data a request names (which tenant's file
// system, blob or pages). It runs for tenants only (CallerTenant): nodes
// and administrators reach every tenant's data, and their calls skip it
// at no cost. Check runs before the handler and refuses by returning an
// error (PermissionDenied); Filter, if set, may change or refuse the
// handler's answer (drop what is another tenant's); FilterError, if set,
// may change the handler's error (drop another tenant's identities from a
// refusal's details).
type Guard struct {
	Check       func(ctx context.Context, method string, req any) error
	Filter      func(ctx context.Context, method string, resp any) (any, error)
	FilterError func(ctx context.Context, method string, err error) error
}

// GuardService returns a copy of desc whose every unary method runs g
// around its handler. The guard runs inside the server's interceptor
// chain (after the Authorizer put the caller's identity in the context,
// and only for calls it let through); streaming methods are refused to
// tenants, as a guard cannot see their messages.
//
// A call on a connection whose verified certificate names a node or an
// administrator (ServerCredentials' IdentityInfo) goes straight to the
// method's handler, with nothing allocated: the Authorizer derives the
// caller's identity from that same certificate (invariant 3), so the
// guard would let it through unchanged. Any other call (a tenant's, or
// one whose identity an interceptor supplies, as tests do) takes the
// guarded path, which decides by the identity in the context.
func GuardService(desc *grpc.ServiceDesc, g Guard) *grpc.ServiceDesc {
	guard := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := CallerTenant(ctx); !ok {
			return handler(ctx, req)
		}
		if err := g.Check(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		resp, err := handler(ctx, req)
		if err != nil && g.FilterError != nil {
			return resp, g.FilterError(ctx, info.FullMethod, err)
		}
		if err != nil || g.Filter == nil {
			return resp, err
		}
		return g.Filter(ctx, info.FullMethod, resp)
	}
	out := *desc
	out.Methods = slices.Clone(desc.Methods)
	for i := range out.Methods {
		inner := out.Methods[i].Handler
		out.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			if peerIsNodeOrAdmin(ctx) {
				return inner(srv, ctx, dec, ic)
			}
			if ic == nil {
				return inner(srv, ctx, dec, guard)
			}
			return inner(srv, ctx, dec, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				return ic(ctx, req, info, func(ctx context.Context, req any) (any, error) {
					return guard(ctx, req, info, handler)
				})
			})
		}
	}
	out.Streams = slices.Clone(desc.Streams)
	for i := range out.Streams {
		inner := out.Streams[i].Handler
		out.Streams[i].Handler = func(srv any, stream grpc.ServerStream) error {
			if _, ok := CallerTenant(stream.Context()); ok {
				return PermissionDenied("streams of %s are not open to tenants", desc.ServiceName)
			}
			return inner(srv, stream)
		}
	}
	return &out
}

// peerIsNodeOrAdmin reports whether ctx's connection was accepted with
// ServerCredentials and its verified certificate names a node or an
// administrator. It reads what the handshake derived and allocates
// nothing.
func peerIsNodeOrAdmin(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	info, ok := p.AuthInfo.(IdentityInfo)
	return ok && info.Err == nil && (info.Identity.Kind == KindNode || info.Identity.Kind == KindAdmin)
}

// CallerTenant returns the tenant the caller's certificate names; ok is
// false for nodes, administrators and the callers of an insecure server
// (no identity), which reach every tenant's data.
func CallerTenant(ctx context.Context) (string, bool) {
	id, ok := FromContext(ctx)
	return id.Name, ok && id.Kind == KindTenant
}

// PermissionDenied is the refusal of data that is not the caller's.
func PermissionDenied(format string, args ...any) error {
	return status.Errorf(codes.PermissionDenied, "permission denied: "+format, args...)
}
