package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// tractModule runs the tract store (DESIGN §2.3): on storage nodes, one
// tractserver per configured disk (tract.Service); on directory members,
// the TLT manager, which acts while the member leads the directory group.
// Its settings are the server configuration's Tract options.
type tractModule struct {
	cfg    Config
	engine *EngineModule
	dir    *directoryModule
	agent  *agentModule

	log     *slog.Logger
	svc     *tract.Service
	manager *tract.Manager
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// newTractModule finds the directory and agent modules among the ones
// built before it.
func newTractModule(cfg Config, engine *EngineModule, earlier []Module) *tractModule {
	m := &tractModule{cfg: cfg, engine: engine}
	for _, e := range earlier {
		switch e := e.(type) {
		case *directoryModule:
			m.dir = e
		case *agentModule:
			m.agent = e
		}
	}
	return m
}

func (m *tractModule) Name() string { return "tract" }

func (m *tractModule) Init(ctx context.Context, env *Env) error {
	m.log = env.Logger
	opts := env.Config.Tract
	var err error
	dial := func(addr string) (grpc.ClientConnInterface, error) { return env.Dialer.Conn(addr) }
	if env.Config.HasRole(RoleStorage) {
		if m.agent == nil {
			return errors.New("tract: a storage node needs the node agent")
		}
		disks := make([]tract.DiskConfig, len(env.Config.Disks))
		for i, d := range env.Config.Disks {
			disks[i] = tract.DiskConfig{Path: d}
		}
		epoch := func() uint64 {
			if m.agent.agent == nil {
				return 0
			}
			return m.agent.agent.Epoch()
		}
		// The service shares the agent's directory client: the agent's
		// Init ran before ours and its Stop runs after ours.
		m.svc, err = tract.NewService(tract.Config{
			NodeID:         env.Config.NodeID,
			Disks:          disks,
			DB:             env.DB,
			SyncWrites:     !opts.NoSync,
			Directory:      m.agent.client,
			Dial:           dial,
			Epoch:          epoch,
			TLTValidity:    max(min(env.Config.Timeouts.NodeDead/2, 5*env.Config.Timeouts.Heartbeat), time.Second),
			ScrubInterval:  opts.ScrubInterval,
			VerifyInterval: opts.VerifyInterval,
			OrphanGrace:    opts.OrphanGrace,
			DropGrace:      opts.DropGrace,
			ReturnGrace:    opts.ReturnGrace,
			Logger:         env.Logger,
			DiskFull:       env.Store.Full,
		})
		if err != nil {
			return err
		}
		m.svc.Register(env.GRPC)
		if err := env.Metrics.Register(m.svc.Collector()); err != nil {
			return err
		}
		// Ready only with a current TLT: before the directory installs
		// one, every blob call fails.
		if err := env.Health.AddCheck("tract-tlt", func(ctx context.Context) error {
			st, err := m.svc.Status(ctx, &tpb.StatusRequest{})
			if err != nil {
				return err
			}
			if !st.GetServing() {
				if st.GetTltVersion() == 0 {
					return errors.New("no TLT installed yet")
				}
				return fmt.Errorf("TLT version %d is not current", st.GetTltVersion())
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if m.dir != nil {
		m.manager, err = tract.NewManager(tract.ManagerConfig{
			Directory:      managerDirectory{m},
			Dial:           dial,
			ClusterID:      env.Config.ClusterID,
			TractSizeBytes: opts.TractSizeBytes,
			Replication:    opts.Replication,
			MinRows:        opts.MinRows,
			StorageRole:    string(RoleStorage),
			Tick:           opts.ManagerTick,
			Settle:         opts.ManagerSettle,
			Logger:         env.Logger,
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *tractModule) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	run := func(name string, f func(context.Context) error) {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) {
				m.log.Error(name+" stopped", "err", err)
			}
		}()
	}
	if m.svc != nil {
		run("tract service", m.svc.Run)
	}
	if m.manager != nil {
		run("TLT manager", m.manager.Run)
	}
	return nil
}

func (m *tractModule) Stop(context.Context) error {
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
	}
	return nil
}

// managerDirectory gives the TLT manager the local directory replica's
// state and the service's write path (tract.ManagerDirectory).
type managerDirectory struct{ m *tractModule }

func (d managerDirectory) IsLeader() bool {
	st, err := d.m.engine.Engine.Status(directory.GroupID)
	return err == nil && st.IsLeader()
}

func (d managerDirectory) Cluster() *pb.ClusterInfo { return d.m.dir.sm.Cluster() }
func (d managerDirectory) Nodes() []*pb.Node        { return d.m.dir.sm.Nodes() }
func (d managerDirectory) TLT() *pb.TLT             { return d.m.dir.sm.TLT() }

func (d managerDirectory) InitCluster(ctx context.Context, req *pb.InitClusterRequest) (*pb.ClusterInfo, error) {
	return d.m.dir.svc.InitCluster(ctx, req)
}

func (d managerDirectory) InstallTLT(ctx context.Context, req *pb.InstallTLTRequest) (*pb.TLTVersion, error) {
	return d.m.dir.svc.InstallTLT(ctx, req)
}

func (d managerDirectory) UpdateTLTRows(ctx context.Context, req *pb.UpdateTLTRowsRequest) (*pb.TLTVersion, error) {
	return d.m.dir.svc.UpdateTLTRows(ctx, req)
}
