package security

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Class is who may call a method.
type Class int

const (
	// ClassUnknown: a method the policy does not name; every identity
	// is refused it (the policy fails closed).
	ClassUnknown Class = iota
	// ClassAny: any verified identity (node, admin, tenant). Tenancy of
	// data (which tenant may reach which file system, blob or key) is
	// checked by the services, from FromContext.
	ClassAny
	// ClassAdmin: administrators and nodes (nodes reconfigure the cluster
	// themselves: the extent manager moves replicas, metadata servers take
	// delegations); tenants are refused.
	ClassAdmin
	// ClassNode: nodes only (the raft transport, replication between
	// replicas, node registration and heartbeats).
	ClassNode
)

func (c Class) String() string {
	switch c {
	case ClassAny:
		return "any"
	case ClassAdmin:
		return "admin"
	case ClassNode:
		return "node"
	}
	return "unknown"
}

// holders says who may call a method of the class.
func (c Class) holders() string {
	switch c {
	case ClassAdmin:
		return "administrators and nodes"
	case ClassNode:
		return "nodes"
	case ClassAny:
		return "any identity of the cluster"
	}
	return "no one: the method is not in the policy"
}

func (c Class) allows(id Identity) bool {
	switch c {
	case ClassNode:
		return id.Kind == KindNode
	case ClassAdmin:
		return id.Kind == KindNode || id.Kind == KindAdmin
	case ClassAny:
		return id.Kind != KindNone
	}
	return false
}

// Policy maps full gRPC method names ("/pkg.Service/Method") to their
// class; a method it does not name is ClassUnknown, refused to everyone.
type Policy map[string]Class

// Class returns method's class (ClassUnknown if the policy does not name
// it).
func (p Policy) Class(method string) Class { return p[method] }

// DefaultPolicy is the cluster's policy: every method that changes the
// cluster's configuration is ClassAdmin, every method only nodes call of
// each other is ClassNode, and the methods of the data path and of reading
// the cluster's state are ClassAny (each service checks which tenant's data
// a tenant may reach). Every method of every service a node registers is
// named: TestDefaultPolicyClassifiesEveryMethod walks the services'
// descriptors and fails on an unclassified one.
func DefaultPolicy() Policy {
	p := Policy{}
	add := func(service string, c Class, methods ...string) {
		for _, m := range methods {
			p["/"+service+"/"+m] = c
		}
	}
	add("arbor.raftengine.v1.RaftTransport", ClassNode, "Send", "Snapshot")
	add("arbor.directory.v1.Directory", ClassAny,
		"Status", "ListNodes", "GetNode", "GetMemberStats",
		// A tenant reads and writes its own part of the configuration
		// only (directory.TenantConfigPrefix: its KV root).
		"GetConfig", "ListConfig", "PutConfig", "DeleteConfig",
		// A tenant gets and lists its own file systems only (the
		// directory checks).
		"GetFileSystem", "ListFileSystems",
		"GetTLT", "GetExtent", "ListExtents", "GetDelegationMap")
	add("arbor.directory.v1.Directory", ClassAdmin,
		// Nodes register and heartbeat; an operator may too (a node's
		// record by hand), a tenant never.
		"Register", "Heartbeat",
		"InitCluster", "Decommission",
		"InstallTLT", "UpdateTLTRows",
		// The extent manager (a node) creates extents.
		"CreateExtent",
		// File systems and snapshots are created and deleted through the
		// metadata service (which checks the caller's tenant), never by a
		// tenant at the directory.
		"CreateFileSystem", "DeleteFileSystem", "CreateSnapshot", "DeleteSnapshot",
		"ChangeExtentReplicas",
		"SetDelegation", "DeleteDelegation", "SplitDelegation",
		// Leases and delegations are the metadata servers' (nodes');
		// a tenant holding one could fence or keep alive a table owner.
		"GrantLease", "RenewLease", "ReleaseLease", "GetLease", "RenewDelegation", "RenewDelegations")
	add("arbor.tract.v1.TractServer", ClassAny,
		"WriteTract", "ReadTract", "BlobOp", "WriteShard", "ReadShard", "RepairStripe", "Status", "ListBlobs", "Inventory")
	add("arbor.tract.v1.TractServer", ClassNode, "Replicate", "FetchTract", "SyncRow", "BlobMetas")
	// ListRow lists every blob of a row: arbor blob verify calls it.
	add("arbor.tract.v1.TractServer", ClassAdmin, "Scrub", "ListRow")
	add("arbor.extent.v1.Extent", ClassAny, "Read", "Commit", "Check", "TxnStep", "QueryTxn", "FreeBlocks", "Info", "ReplicaStatus")
	add("arbor.extent.v1.Extent", ClassNode, "CreateReplica")
	add("arbor.extent.v1.Extent", ClassAdmin, "ChangeReplicas", "Recover")
	add("arbor.meta.v1.Meta", ClassAny,
		"Lookup", "GetAttr", "SetAttr", "Create", "Readlink", "Link", "Remove", "Rename", "ReadDir", "Xattr",
		"Open", "Release", "SyncOpens", "StatFS", "FileBlocks", "CommitBlocks", "Session", "WaitSafe",
		"CreateFileSystem", "DeleteFileSystem", "CreateSnapshot", "DeleteSnapshot", "Check",
		"TableStats", "Progress")
	// Tables is the metadata servers' order to each other (refresh, sweep,
	// drain a file system's tables).
	add("arbor.meta.v1.Meta", ClassAdmin, "MoveTable", "SplitTable", "Tables")
	add("arbor.faults.v1.Admin", ClassAny, "GetFaults")
	add("arbor.faults.v1.Admin", ClassAdmin, "SetFaults")
	return p
}

// PeerIdentity derives the caller's identity from the verified client
// certificate of ctx's connection. A connection without TLS has no
// identity (KindNone); a TLS connection whose certificate was not verified
// or names no identity is an error. A connection accepted with
// ServerCredentials carries the identity its handshake derived
// (IdentityInfo); any other TLS connection's certificate is parsed here.
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Identity{}, nil
	}
	switch info := p.AuthInfo.(type) {
	case IdentityInfo:
		return info.Identity, info.Err
	case credentials.TLSInfo:
		return tlsIdentity(info)
	}
	return Identity{}, nil
}

// tlsIdentity is the identity of a TLS connection's verified client
// certificate.
func tlsIdentity(info credentials.TLSInfo) (Identity, error) {
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	id, err := IdentityOf(info.State.VerifiedChains[0][0])
	if err != nil {
		return Identity{}, status.Error(codes.Unauthenticated, err.Error())
	}
	return id, nil
}

// Authorizer derives the caller's identity (invariant 3) and checks it
// against the policy (invariant 4).
type Authorizer struct {
	policy Policy
	// insecure: the server runs without TLS (--insecure); every caller is
	// let through with no identity.
	insecure bool
}

// NewAuthorizer returns an authorizer of policy; insecure lets every call
// through (a server without TLS).
func NewAuthorizer(policy Policy, insecure bool) *Authorizer {
	return &Authorizer{policy: policy, insecure: insecure}
}

// authorize returns ctx with the caller's identity, or the refusal.
func (a *Authorizer) authorize(ctx context.Context, method string) (context.Context, error) {
	id, err := PeerIdentity(ctx)
	if err != nil {
		return ctx, err
	}
	if id.Kind == KindNone {
		if a.insecure {
			return ctx, nil
		}
		return ctx, status.Error(codes.Unauthenticated, "no client certificate")
	}
	if c := a.policy.Class(method); !c.allows(id) {
		return ctx, status.Errorf(codes.PermissionDenied, "permission denied: %s may not call %s (%s only)", id, method, c.holders())
	}
	return WithIdentity(ctx, id), nil
}

// UnaryServerInterceptor authorizes unary calls.
func (a *Authorizer) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor authorizes streams.
func (a *Authorizer) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
	}
}

type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }
