package server

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/meta"
	"github.com/arbor-storage/arbor/internal/tract"
)

// metaLeafCacheBytes is how much of the B-tree's leaves a metadata server
// keeps (btree.Config.LeafCacheBytes): it writes most of the leaves it
// reads, so it reads them from the store only once.
const metaLeafCacheBytes = 256 << 20

// metaModule runs the node's metadata server (DESIGN.md §2.6): it serves
// the tables the directory delegates to the node and answers the Meta
// service. Its B-tree and tract-store clients are opened once the cluster
// is up (meta.Config.OpenStores); all of it lives in internal/meta.
type metaModule struct {
	agent *agentModule
	srv   *meta.Server

	mu   sync.Mutex
	ec   *extent.Client
	tc   *tract.Client
	tree *btree.Tree
}

func newMetaModule(earlier []Module) *metaModule {
	m := &metaModule{}
	for _, e := range earlier {
		if a, ok := e.(*agentModule); ok {
			m.agent = a
		}
	}
	return m
}

func (m *metaModule) Name() string { return "meta" }

func (m *metaModule) Init(_ context.Context, env *Env) error {
	if m.agent == nil {
		return errors.New("meta: a metadata server needs the node agent")
	}
	dir := m.agent.client
	srv, err := meta.NewServer(meta.Config{
		Node:      env.Config.NodeID,
		NodeEpoch: func() uint64 { return m.agent.agent.Epoch() },
		Directory: dir,
		Dial:      func(addr string) (grpc.ClientConnInterface, error) { return env.Dialer.Conn(addr) },
		OpenStores: func(ctx context.Context) (*btree.Tree, fs.DataStore, error) {
			ec, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: env.Dialer.DialOptions(), Logger: env.Logger})
			if err != nil {
				return nil, nil, err
			}
			tree, err := kv.OpenOnExtents(ctx, dir, ec, kv.SystemSpace(), btree.Config{Logger: env.Logger, LeafCacheBytes: metaLeafCacheBytes})
			if err != nil {
				ec.Close()
				return nil, nil, err
			}
			tc, err := tract.NewClient(tract.ClientConfig{Directory: dir, Dial: func(addr string) (grpc.ClientConnInterface, error) { return env.Dialer.Conn(addr) }, Logger: env.Logger})
			if err != nil {
				tree.Close()
				ec.Close()
				return nil, nil, err
			}
			data, err := fs.NewTractData(ctx, tc, 0)
			if err != nil {
				tc.Close()
				tree.Close()
				ec.Close()
				return nil, nil, err
			}
			m.mu.Lock()
			m.ec, m.tc, m.tree = ec, tc, tree
			m.mu.Unlock()
			// The metadata servers' B-tree counters (page reads, splits,
			// leaf-cache hits and misses) as arbor_btree_*: the server
			// opens its tree once.
			if err := tree.RegisterMetrics(env.Metrics); err != nil {
				env.Logger.Warn("the metadata tree's counters are not exported", "err", err)
			}
			return tree, data, nil
		},
		Logger:  env.Logger,
		Metrics: env.Metrics,
	})
	if err != nil {
		return err
	}
	m.srv = srv
	srv.Register(env.GRPC)
	return nil
}

func (m *metaModule) Start(context.Context) error {
	m.srv.Start()
	return nil
}

func (m *metaModule) Stop(context.Context) error {
	if m.srv != nil {
		m.srv.Stop()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	if m.tree != nil {
		m.tree.Close()
	}
	if m.tc != nil {
		errs = append(errs, m.tc.Close())
	}
	if m.ec != nil {
		errs = append(errs, m.ec.Close())
	}
	return errors.Join(errs...)
}
