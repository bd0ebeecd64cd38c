package server

import (
	"context"
	"net"
	"time"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/gateway/nfs"
)

// gatewayModule runs the node's NFSv3 gateway (DESIGN.md §2.7; FSS §8):
// a client of the cluster like any mount, serving on Config.NFSAddr, and
// announced in the directory (nfs.Register) for arbor status. It keeps no
// state of its own.
type gatewayModule struct {
	cluster *client.Cluster
	env     *Env
	srv     *nfs.Server
	addr    string
	// stopRegister ends the registration's attempts; done closes when
	// they end.
	stopRegister context.CancelFunc
	done         chan struct{}
}

func newGatewayModule() *gatewayModule { return &gatewayModule{} }

func (m *gatewayModule) Name() string { return "gateway" }

func (m *gatewayModule) Init(_ context.Context, env *Env) error {
	var addrs []string
	for _, p := range env.Config.DirectoryPeers {
		addrs = append(addrs, p.Addr)
	}
	c, err := client.Dial(client.Options{Addrs: addrs, DialOptions: env.Dialer.DialOptions(), Logger: env.Logger, DurableMetadata: true})
	if err != nil {
		return err
	}
	m.cluster, m.env = c, env
	return nil
}

// Start serves NFS only now, as the other modules serve their RPCs only
// once started (gate.go): a call must not reach a node still starting.
func (m *gatewayModule) Start(context.Context) error {
	env := m.env
	srv, err := nfs.Start(nfs.Config{Backend: nfs.ClusterBackend{Cluster: m.cluster}, Replies: &nfs.KVReplies{Open: m.cluster.KV}, Locks: nfs.KVLocks{Open: m.cluster.KV},
		Logger: env.Logger.With("module", "gateway")}, env.Config.NFSAddr, false)
	if err != nil {
		return err
	}
	if err := srv.Gateway().RegisterMetrics(env.Metrics); err != nil {
		_ = srv.Close(context.Background())
		return err
	}
	m.srv = srv
	m.addr = srv.Addr()
	if host, port, err := net.SplitHostPort(m.addr); err == nil && net.ParseIP(host).IsUnspecified() {
		if ahost, _, err := net.SplitHostPort(env.AdvertiseAddr); err == nil {
			m.addr = net.JoinHostPort(ahost, port)
		}
	}
	var rctx context.Context
	rctx, m.stopRegister = context.WithCancel(context.Background())
	m.done = make(chan struct{})
	reg := nfs.Registration{Addr: m.addr, Node: env.Config.NodeID, StartedUnixMs: time.Now().UnixMilli()}
	go m.register(rctx, env, reg)
	env.Logger.Info("serving NFSv3", "addr", m.addr)
	return nil
}

// register announces the gateway once the directory answers.
func (m *gatewayModule) register(ctx context.Context, env *Env, reg nfs.Registration) {
	defer close(m.done)
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := nfs.Register(actx, m.cluster.Directory(), reg)
		cancel()
		if err == nil {
			return
		}
		env.Logger.Debug("registering the gateway", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// gatewayStopTimeout bounds the gateway's stop: flushing what it buffered
// and closing its sessions ask metadata servers that may be stopping too,
// and must not eat the node's shutdown budget (the gRPC drain comes
// after). What it cannot flush was unstable: clients see the write
// verifier change and resend it.
const gatewayStopTimeout = 3 * time.Second

func (m *gatewayModule) Stop(ctx context.Context) error {
	if m.srv == nil {
		if m.cluster != nil {
			return m.cluster.Close() // initialised, never started
		}
		return nil
	}
	m.stopRegister()
	<-m.done
	ctx, cancel := context.WithTimeout(ctx, gatewayStopTimeout)
	defer cancel()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	derr := nfs.Deregister(dctx, m.cluster.Directory(), m.addr)
	cancel()
	if derr != nil {
		// The directory may be stopping too; a stale entry only makes
		// status probe an address that does not answer.
		m.srv.Gateway().Logger().Debug("deregistering the gateway", "err", derr)
	}
	if err := m.srv.Close(ctx); err != nil {
		m.srv.Gateway().Logger().Warn("closing the gateway", "err", err)
	}
	return m.cluster.Close()
}
