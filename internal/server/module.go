package server

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Module is one subsystem of a node: the raft engine, the directory group,
// the node agent, later the tract and extent servers. The node drives every
// module through the same life cycle (see the package doc):
//
//	Init   in order, before the gRPC server accepts calls
//	Start  in order, once the gRPC and HTTP servers are serving
//	Stop   in reverse order, for every module whose Init succeeded
type Module interface {
	// Name identifies the module in logs and errors.
	Name() string
	// Init builds the module: opens its state from env.DB, registers its
	// gRPC services on env.GRPC (only possible now), its metrics on
	// env.Metrics and its health checks on env.Health. It must not wait for
	// other nodes: they may not be up yet.
	Init(ctx context.Context, env *Env) error
	// Start starts the module's background work (it may now call other
	// nodes through env.Dialer). ctx bounds start-up only: work that
	// outlives Start runs under a context the module cancels in Stop.
	Start(ctx context.Context) error
	// Stop stops the module's work and releases what it holds. It is
	// called even if Start was not (a later module failed), so it must
	// cope with a module that never started. ctx bounds the shutdown.
	Stop(ctx context.Context) error
}

// Env is what a node gives its modules. Everything in it lives from before
// the first Init until after the last Stop.
type Env struct {
	// Config is the node's normalized configuration.
	Config Config
	// AdvertiseAddr is the address other nodes reach this one at
	// (Config.AdvertiseAddr with a port 0 resolved).
	AdvertiseAddr string
	// HTTPAddr is the address the HTTP server listens on (a port 0
	// resolved).
	HTTPAddr string
	Logger   *slog.Logger
	// Store is the node's one pebble database (DATA/db), opened the way
	// the raft engine needs it (raftengine.Config.Store); DB is Store.DB.
	// Key prefixes are owned by their packages: 'r', 'g', 's' by the raft
	// engine, 'n' by the server.
	Store *raftengine.Store
	DB    *pebble.DB
	// GRPC registers gRPC services; only during Init.
	GRPC grpc.ServiceRegistrar
	// HTTP registers extra HTTP handlers (debug pages); only during Init.
	HTTP *http.ServeMux
	// Metrics is the node's own Prometheus registry (never the global one).
	Metrics prometheus.Registerer
	// Faults is the node's fault injector; the Dialer already applies it.
	Faults *faults.Injector
	// Dialer makes connections to other nodes.
	Dialer *Dialer
	// Health collects health checks for /healthz.
	Health *Health
}

// ModuleFuncs adapts plain functions to Module; nil functions do nothing.
type ModuleFuncs struct {
	ModuleName string
	InitFunc   func(ctx context.Context, env *Env) error
	StartFunc  func(ctx context.Context) error
	StopFunc   func(ctx context.Context) error
}

// Name returns m.ModuleName.
func (m ModuleFuncs) Name() string { return m.ModuleName }

// Init calls m.InitFunc.
func (m ModuleFuncs) Init(ctx context.Context, env *Env) error {
	if m.InitFunc == nil {
		return nil
	}
	return m.InitFunc(ctx, env)
}

// Start calls m.StartFunc.
func (m ModuleFuncs) Start(ctx context.Context) error {
	if m.StartFunc == nil {
		return nil
	}
	return m.StartFunc(ctx)
}

// Stop calls m.StopFunc.
func (m ModuleFuncs) Stop(ctx context.Context) error {
	if m.StopFunc == nil {
		return nil
	}
	return m.StopFunc(ctx)
}
