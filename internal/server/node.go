package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/buildinfo"
	"github.com/arbor-storage/arbor/internal/faults"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
)

// Limits of the HTTP server.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpIdleTimeout       = 2 * time.Minute
)

// Run runs a node with the modules its configuration calls for (Modules)
// until ctx is cancelled, then shuts it down cleanly within
// cfg.Timeouts.Shutdown. It returns an error if the node cannot start or a
// server fails while it runs.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.Normalize()
	if err != nil {
		return err
	}
	n, err := Start(ctx, cfg, Modules(cfg))
	if err != nil {
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
		n.logger.Info("shutting down", "reason", context.Cause(ctx))
	case runErr = <-n.failed:
		n.logger.Error("server failed, shutting down", "err", runErr)
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.Timeouts.Shutdown)
	defer cancel()
	return errors.Join(runErr, n.Shutdown(shutdownCtx))
}

// Node is a running node. Start it with Start, stop it with Shutdown.
type Node struct {
	cfg    Config
	logger *slog.Logger
	env    *Env

	lock       *dataDirLock
	store      *raftengine.Store
	grpcServer *grpc.Server
	grpcLis    net.Listener
	httpServer *http.Server
	httpLis    net.Listener
	modules    []Module // those whose Init succeeded, in order
	gate       *rpcGate

	// failed receives the first error of a server that stops serving by
	// itself.
	failed chan error

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start starts a node: it locks the data directory and writes its pid
// file, opens the DB and checks the node's identity, inits the modules,
// starts the gRPC and HTTP servers and then the modules. When Start
// returns without error the node is serving. On error everything started
// so far is stopped again.
func Start(ctx context.Context, cfg Config, modules []Module) (n *Node, err error) {
	cfg, err = cfg.Normalize()
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		if logger, err = NewLogger(os.Stderr, cfg.Log); err != nil {
			return nil, err
		}
	}
	logger = logger.With("node", cfg.NodeID)
	n = &Node{cfg: cfg, logger: logger, failed: make(chan error, 2)}
	defer func() {
		if err != nil {
			// Shut down what started; the start error is what matters.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeouts.Shutdown)
			defer cancel()
			if serr := n.Shutdown(sctx); serr != nil {
				logger.Error("cleanup after failed start", "err", serr)
			}
		}
	}()

	if n.lock, err = lockDataDir(cfg.DataDir); err != nil {
		return n, err
	}
	n.store, err = raftengine.OpenStoreWith(filepath.Join(cfg.DataDir, dbDirName), raftengine.StoreOptions{Logger: logger, BallastBytes: cfg.DiskReserve})
	if err != nil {
		return n, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	created, err := checkIdentity(n.store.DB, cfg.NodeID, cfg.ClusterID, time.Now())
	if err != nil {
		return n, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	if created {
		logger.Info("new data dir: recorded node identity", "cluster", cfg.ClusterID, "data_dir", cfg.DataDir)
	}

	creds, err := loadCredentials(cfg, logger, time.Now())
	if err != nil {
		return n, err
	}
	inj, err := faults.New(faults.Options{NodeID: cfg.NodeID, Config: cfg.Faults, Logger: logger})
	if err != nil {
		return n, err
	}
	reg := prometheus.NewRegistry()
	info := buildinfo.Get()
	rm := newRPCMetrics()
	for _, c := range []prometheus.Collector{
		rm.handled, rm.seconds,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		inj.Collector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "arbor_build_info", Help: "Build of the running binary (always 1).",
			ConstLabels: prometheus.Labels{"version": info.Version, "revision": info.Revision, "go_version": info.GoVersion},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "arbor_node_info", Help: "Identity of this node (always 1).",
			ConstLabels: prometheus.Labels{"node_id": strconv.FormatUint(cfg.NodeID, 10), "cluster_id": cfg.ClusterID, "domain": cfg.FailureDomain},
		}, func() float64 { return 1 }),
	} {
		if err := reg.Register(c); err != nil {
			return n, fmt.Errorf("register metrics: %w", err)
		}
	}

	if n.grpcLis, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
		return n, fmt.Errorf("listen (--listen): %w", err)
	}
	if n.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return n, fmt.Errorf("listen (--http): %w", err)
	}
	advertise, err := resolveAdvertise(cfg, n.grpcLis.Addr())
	if err != nil {
		return n, err
	}

	health := newHealth(cfg.NodeID, cfg.ClusterID)
	n.gate = newRPCGate(cfg.NodeID)
	sopts, err := serverOptions(cfg, logger, inj, rm, n.gate, crashOnStoreFailure(logger), creds)
	if err != nil {
		return n, err
	}
	n.grpcServer = grpc.NewServer(sopts...)
	faultspb.RegisterAdminServer(n.grpcServer, faults.NewAdminServer(inj, logger))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("GET /healthz", health)
	if cfg.PProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	n.httpServer = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		IdleTimeout:       httpIdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	n.env = &Env{
		Config:        cfg,
		AdvertiseAddr: advertise,
		HTTPAddr:      n.httpLis.Addr().String(),
		Logger:        logger,
		Store:         n.store,
		DB:            n.store.DB,
		GRPC:          n.grpcServer,
		HTTP:          mux,
		Metrics:       reg,
		Faults:        inj,
		Dialer:        newDialer(cfg.ClusterID, inj, creds),
		Health:        health,
	}
	for _, m := range modules {
		// Each module registers its services through the gate, which
		// refuses calls to them until the module has started.
		menv := *n.env
		menv.GRPC = n.gate.registrar(n.grpcServer, m.Name())
		if err := m.Init(ctx, &menv); err != nil {
			return n, fmt.Errorf("init %s: %w", m.Name(), err)
		}
		n.modules = append(n.modules, m)
	}

	go func() {
		if err := n.grpcServer.Serve(n.grpcLis); err != nil {
			n.failed <- fmt.Errorf("gRPC server: %w", err)
		}
	}()
	go func() {
		if err := n.httpServer.Serve(n.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.failed <- fmt.Errorf("HTTP server: %w", err)
		}
	}()
	for _, m := range n.modules {
		if err := m.Start(ctx); err != nil {
			return n, fmt.Errorf("start %s: %w", m.Name(), err)
		}
		n.gate.setRunning(m.Name(), true)
	}
	health.setPhase(phaseServing)
	logger.Info("node serving", "cluster", cfg.ClusterID, "grpc", advertise, "http", n.httpLis.Addr().String(),
		"domain", cfg.FailureDomain, "roles", cfg.Roles, "data_dir", cfg.DataDir, "version", info.Version, "pid", os.Getpid())
	return n, nil
}

// loadCredentials loads the node's TLS credentials (Config.TLS) and checks
// that they are a node's and valid now; with Config.Insecure it returns
// none and says loudly that the node authenticates no one.
func loadCredentials(cfg Config, logger *slog.Logger, now time.Time) (*security.Credentials, error) {
	if cfg.Insecure {
		logger.Warn("INSECURE: --insecure given: gRPC is served in plain text without client certificates; " +
			"anyone who reaches this node's port can read and change everything")
		return nil, nil
	}
	creds, err := security.LoadFiles(cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.CAFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	if creds.Identity.Kind != security.KindNode {
		return nil, fmt.Errorf("tls: %s is the certificate of %s, not of a node", cfg.TLS.CertFile, creds.Identity)
	}
	if err := creds.CheckValid(now); err != nil {
		return nil, fmt.Errorf("tls: %s: %w", cfg.TLS.CertFile, err)
	}
	logger.Info("mutual TLS", "identity", creds.Identity.String(), "not_after", creds.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return creds, nil
}

// crashOnStoreFailure returns what a gRPC handler's store panic does: the
// process crashes, as it does when the raft engine's own commit hits the
// same fatal error. Nothing can be shut down cleanly over a store that
// refuses writes (a graceful shutdown waits on it), and a node left
// serving on it stays registered but cannot serve (the nemesis's disk-full
// fault found such a node); a crashed node is restarted by its supervisor.
func crashOnStoreFailure(logger *slog.Logger) func(error) {
	return func(err error) {
		logger.Error("the node's store failed; crashing", "err", err)
		go func() { panic(err) }()
	}
}

// resolveAdvertise fills in the port of an advertise address that
// inherited port 0 from the listen address, and re-checks the node's own
// directory peer entry against the result.
func resolveAdvertise(cfg Config, bound net.Addr) (string, error) {
	addr := cfg.AdvertiseAddr
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("advertise address: %w", err)
	}
	if port == "0" {
		_, boundPort, err := net.SplitHostPort(bound.String())
		if err != nil {
			return "", fmt.Errorf("advertise address: %w", err)
		}
		addr = net.JoinHostPort(host, boundPort)
	}
	for _, p := range cfg.DirectoryPeers {
		if p.ID == cfg.NodeID && p.Addr != addr {
			return "", fmt.Errorf("directory peers list node %d at %s, but it advertises %s", p.ID, p.Addr, addr)
		}
	}
	return addr, nil
}

// Env returns what the node gave its modules.
func (n *Node) Env() *Env { return n.env }

// Addr returns the gRPC address the node advertises.
func (n *Node) Addr() string { return n.env.AdvertiseAddr }

// HTTPAddr returns the address of the HTTP server.
func (n *Node) HTTPAddr() string { return n.httpLis.Addr().String() }

// Shutdown stops the node: /healthz turns unhealthy; modules stop in
// reverse order (one slow to stop is logged); the gRPC server drains (at
// most grpcDrainMax, and half of what is left of ctx) and then stops,
// waiting for running handlers; the HTTP server stops; outgoing
// connections close; the DB closes; the pid file is removed and the data
// directory unlocked. It is safe to call more than once; later calls
// return the first call's result.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdownOnce.Do(func() { n.shutdownErr = n.shutdown(ctx) })
	return n.shutdownErr
}

// grpcDrainMax bounds the wait for running calls at stop before they are
// cut off. Every call has a deadline of its own and the raft transport's
// streams end when the engine stops (its transport closes them), so a
// call still running after this is stuck, and a node stopping with its
// peers must not wait for them.
const grpcDrainMax = 3 * time.Second

// slowModuleStop is how long a module's Stop may take before the node
// logs it: a graceful stop must end within a few seconds, and the log
// says which module held it up.
const slowModuleStop = 500 * time.Millisecond

func (n *Node) shutdown(ctx context.Context) error {
	var errs []error
	if n.env != nil {
		n.env.Health.setPhase(phaseStopping)
	}
	for i := len(n.modules) - 1; i >= 0; i-- {
		n.gate.setRunning(n.modules[i].Name(), false)
		began := time.Now()
		if err := n.modules[i].Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", n.modules[i].Name(), err))
		}
		if took := time.Since(began); took > slowModuleStop {
			n.logger.Info("a module was slow to stop", "module", n.modules[i].Name(), "took", took.Round(time.Millisecond))
		}
	}
	if n.grpcServer != nil {
		drainFor := grpcDrainMax
		if dl, ok := ctx.Deadline(); ok {
			drainFor = min(drainFor, time.Until(dl)/2)
		}
		drained := make(chan struct{})
		go func() { n.grpcServer.GracefulStop(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(drainFor):
			n.logger.Info("gRPC calls still open after drain period; stopping them")
			n.grpcServer.Stop()
			<-drained
		}
	} else if n.grpcLis != nil {
		n.grpcLis.Close()
	}
	if n.httpServer != nil {
		if err := n.httpServer.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop HTTP server: %w", err))
			n.httpServer.Close()
		}
	} else if n.httpLis != nil {
		n.httpLis.Close()
	}
	if n.env != nil {
		if err := n.env.Dialer.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.store != nil {
		if err := n.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close DB: %w", err))
		}
	}
	if n.lock != nil {
		if err := n.lock.release(); err != nil {
			errs = append(errs, fmt.Errorf("unlock data dir: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		n.logger.Error("node stopped with errors", "err", err)
		return err
	}
	n.logger.Info("node stopped")
	return nil
}
