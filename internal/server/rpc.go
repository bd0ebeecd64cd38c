package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
)

// Limits of the RPC layer.
const (
	// maxRPCMessageBytes bounds one gRPC message: the raft transport's
	// batches and snapshot chunks, and a 4 MiB tract (the default tract
	// size, DESIGN §2.3) with its header, must fit. Clients and servers
	// use the same bound.
	maxRPCMessageBytes = raftengine.MaxGRPCMessageBytes
	// keepaliveInterval is how often an idle connection is probed, so a
	// dead or partitioned peer is noticed without waiting for TCP.
	keepaliveInterval = 10 * time.Second
	// keepaliveTimeout is how long a probe may go unanswered.
	keepaliveTimeout = 5 * time.Second
	// minClientPingInterval is the most often a server lets a client ping.
	minClientPingInterval = 5 * time.Second
)

// checkCluster enforces the cluster id of a call: a call from a node must
// carry this cluster's id; a call from a tool (no node id) may omit it,
// but if it gives one it must match.
func checkCluster(ctx context.Context, clusterID string, nodeID uint64) error {
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get(client.ClusterMetadataKey)
	fromNode := len(md.Get(faults.NodeMetadataKey)) > 0
	switch {
	case len(ids) == 0 && !fromNode:
		return nil
	case len(ids) == 0:
		return status.Errorf(codes.FailedPrecondition,
			"cluster check: call from node %v carries no cluster id; node %d belongs to cluster %q",
			md.Get(faults.NodeMetadataKey), nodeID, clusterID)
	case len(ids) != 1 || ids[0] != clusterID:
		return status.Errorf(codes.FailedPrecondition,
			"cluster check: call is for cluster %q, but node %d belongs to cluster %q", ids, nodeID, clusterID)
	}
	return nil
}

func clusterUnaryServerInterceptor(clusterID string, nodeID uint64) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := checkCluster(ctx, clusterID, nodeID); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func clusterStreamServerInterceptor(clusterID string, nodeID uint64) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := checkCluster(ss.Context(), clusterID, nodeID); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// recoveryUnaryServerInterceptor turns a handler panic into an Internal
// error and logs it with its stack, so one bad request cannot kill a node
// that serves many. A panic of the node's store is different: the store
// cannot be used any more (pebble's fatal errors: a failed commit, a full
// disk), so it is handed to fatal, which stops the node (fail-stop; its
// supervisor restarts it) instead of leaving it serving on a dead store.
func recoveryUnaryServerInterceptor(logger *slog.Logger, fatal func(error)) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(logger, fatal, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

func recoveryStreamServerInterceptor(logger *slog.Logger, fatal func(error)) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(logger, fatal, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

func recovered(logger *slog.Logger, fatal func(error), method string, r any) error {
	logger.Error("panic in gRPC handler", "method", method, "panic", r, "stack", string(debug.Stack()))
	if storeFatal(r) {
		fatal(fmt.Errorf("the store failed in %s: %v", method, r))
	}
	return status.Errorf(codes.Internal, "internal error in %s", method)
}

// storeFatal reports whether a panic is the node's store giving up: pebble
// reports a fatal error through its logger's Fatalf, which panics with a
// *raftengine.StoreFatalError (internal/raftengine store.go).
func storeFatal(r any) bool {
	err, ok := r.(error)
	if !ok {
		return false
	}
	var sf *raftengine.StoreFatalError
	return errors.As(err, &sf)
}

// serverOptions are the gRPC server options of a node: interceptors in the
// order metrics, recovery, cluster check, faults (partitions and stream
// faults), module gate (no call reaches a module that is not running).
func serverOptions(cfg Config, logger *slog.Logger, inj *faults.Injector, rm *rpcMetrics, gate *rpcGate, fatal func(error), creds *security.Credentials) ([]grpc.ServerOption, error) {
	policy := cfg.Policy
	if policy == nil {
		policy = security.DefaultPolicy()
	}
	authz := security.NewAuthorizer(policy, creds == nil)
	transport := insecure.NewCredentials()
	if creds != nil {
		var err error
		if transport, err = security.ServerCredentials(creds); err != nil {
			return nil, err
		}
	}
	return []grpc.ServerOption{
		grpc.Creds(transport),
		grpc.ChainUnaryInterceptor(
			rm.unaryInterceptor(),
			recoveryUnaryServerInterceptor(logger, fatal),
			authz.UnaryServerInterceptor(),
			clusterUnaryServerInterceptor(cfg.ClusterID, cfg.NodeID),
			inj.UnaryServerInterceptor(),
			gate.unaryInterceptor(),
		),
		grpc.ChainStreamInterceptor(
			rm.streamInterceptor(),
			recoveryStreamServerInterceptor(logger, fatal),
			authz.StreamServerInterceptor(),
			clusterStreamServerInterceptor(cfg.ClusterID, cfg.NodeID),
			inj.StreamServerInterceptor(),
			gate.streamInterceptor(),
		),
		grpc.MaxRecvMsgSize(maxRPCMessageBytes),
		grpc.MaxSendMsgSize(maxRPCMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minClientPingInterval, PermitWithoutStream: true}),
		// Stop waits for running handlers, so the DB outlives them.
		grpc.WaitForHandlers(true),
	}, nil
}

// Dialer makes the node's outgoing gRPC connections. Every call through
// them presents the node's certificate (mutual TLS, unless --insecure),
// carries the cluster id and the node id, and passes the fault
// injector (DESIGN §1), so all node-to-node traffic can be faulted and
// partitioned. Modules must dial peers only through it.
type Dialer struct {
	opts []grpc.DialOption

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

func newDialer(clusterID string, inj *faults.Injector, creds *security.Credentials) *Dialer {
	opts := client.DialOptions("", creds)
	opts = append(opts,
		grpc.WithChainUnaryInterceptor(client.ClusterUnaryInterceptor(clusterID), inj.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(client.ClusterStreamInterceptor(clusterID), inj.StreamClientInterceptor()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveInterval, Timeout: keepaliveTimeout, PermitWithoutStream: true}),
	)
	return &Dialer{opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// DialOptions returns the options behind Conn, for clients that manage
// their own connections (they must close them).
func (d *Dialer) DialOptions() []grpc.DialOption { return append([]grpc.DialOption(nil), d.opts...) }

// Conn returns the shared connection to addr (host:port), creating it on
// first use. It does not block on the network: gRPC connects lazily and
// reconnects by itself. Callers must not close it; the node closes all of
// them at shutdown, after every module has stopped.
func (d *Dialer) Conn(addr string) (*grpc.ClientConn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("dialer: node is shutting down")
	}
	if cc := d.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, d.opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	d.conns[addr] = cc
	return cc, nil
}

// close closes every shared connection.
func (d *Dialer) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	var errs []error
	for addr, cc := range d.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to %s: %w", addr, err))
		}
	}
	d.conns = nil
	return errors.Join(errs...)
}
