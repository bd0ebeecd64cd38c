package server

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcGate keeps calls away from a module that is not running. The gRPC
// server serves before the modules start (a module's Start may need its
// own node's services, and peers' calls arrive as soon as the port is
// open), so every service a module registers in Init is refused with
// codes.Unavailable until that module's Start has returned, and again from
// the moment its Stop begins. Unavailable is what every client already
// retries: to the caller a starting node looks like a node that is briefly
// down. Services registered outside a module (the faults Admin service)
// are never gated.
//
// This is package invariant 6 (see doc.go): no RPC reaches a module before
// it is started or after it is stopped.
type rpcGate struct {
	nodeID uint64

	mu      sync.RWMutex
	owner   map[string]string // gRPC service name -> module name
	running map[string]bool   // module name -> between Start and Stop
}

func newRPCGate(nodeID uint64) *rpcGate {
	return &rpcGate{nodeID: nodeID, owner: map[string]string{}, running: map[string]bool{}}
}

// registrar returns the service registrar module gives its services to:
// the server's, recording that module owns them.
func (g *rpcGate) registrar(inner grpc.ServiceRegistrar, module string) grpc.ServiceRegistrar {
	return gatedRegistrar{inner: inner, gate: g, module: module}
}

// setRunning opens (true) or closes (false) module's services.
func (g *rpcGate) setRunning(module string, running bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running[module] = running
}

// check refuses a call to a service whose module is not running.
func (g *rpcGate) check(fullMethod string) error {
	service := serviceOf(fullMethod)
	g.mu.RLock()
	module, owned := g.owner[service]
	running := g.running[module]
	g.mu.RUnlock()
	if owned && !running {
		return status.Errorf(codes.Unavailable, "node %d: %s is not serving (module %s is starting or stopping)", g.nodeID, service, module)
	}
	return nil
}

// serviceOf returns the service part of a gRPC full method name,
// "/package.Service/Method".
func serviceOf(fullMethod string) string {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return s
}

func (g *rpcGate) unaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := g.check(info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (g *rpcGate) streamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := g.check(info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

type gatedRegistrar struct {
	inner  grpc.ServiceRegistrar
	gate   *rpcGate
	module string
}

func (r gatedRegistrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	r.gate.mu.Lock()
	r.gate.owner[desc.ServiceName] = r.module
	r.gate.mu.Unlock()
	r.inner.RegisterService(desc, impl)
}
