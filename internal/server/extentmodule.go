package server

import (
	"context"
	"errors"

	"github.com/arbor-storage/arbor/internal/directory"
	"github.com/arbor-storage/arbor/internal/extent"
)

// extentModule runs the extent store on the node (DESIGN.md §2.4): the
// Extent service over the node's extent replicas, background recovery of
// abandoned transactions, and, on directory members, the extent manager
// (which acts while this node leads the directory). All of it lives in
// internal/extent; this is the wiring.
type extentModule struct {
	engine *EngineModule
	dir    *directory.Client
	node   *extent.Node
}

func newExtentModule(engine *EngineModule) *extentModule {
	engine.RegisterKind(extent.Kind, extent.NewStateMachine)
	return &extentModule{engine: engine}
}

func (m *extentModule) Name() string { return "extent" }

func (m *extentModule) Init(_ context.Context, env *Env) error {
	addrs := make([]string, 0, len(env.Config.DirectoryPeers))
	for _, p := range env.Config.DirectoryPeers {
		addrs = append(addrs, p.Addr)
	}
	dir, err := directory.NewClient(directory.ClientConfig{Addresses: addrs, DialOptions: env.Dialer.DialOptions(), Logger: env.Logger})
	if err != nil {
		return err
	}
	m.dir = dir
	var mc *extent.ManagerConfig
	if env.Config.HasRole(RoleDirectory) {
		e := m.engine.Engine
		mc = &extent.ManagerConfig{
			Directory: dir,
			Geometry:  env.Config.MetadataGeometry(),
			IsLeader: func() bool {
				st, err := e.Status(directory.GroupID)
				return err == nil && st.IsLeader()
			},
		}
	}
	n, err := extent.NewNode(extent.NodeConfig{
		Engine:      m.engine.Engine,
		Directory:   dir,
		DialOptions: env.Dialer.DialOptions(),
		Logger:      env.Logger,
		Metrics:     env.Metrics,
		Manager:     mc,
	})
	if err != nil {
		return err
	}
	m.node = n
	n.Register(env.GRPC)
	return nil
}

func (m *extentModule) Start(context.Context) error {
	m.node.Start()
	return nil
}

func (m *extentModule) Stop(context.Context) error {
	var errs []error
	if m.node != nil {
		errs = append(errs, m.node.Stop())
	}
	if m.dir != nil {
		errs = append(errs, m.dir.Close())
	}
	return errors.Join(errs...)
}
