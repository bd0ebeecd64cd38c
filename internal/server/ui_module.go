package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/overview"
	"github.com/arbor-storage/arbor/internal/ui"
)

// uiModule serves the web dashboard (package ui) on the node's HTTP port
// at /ui/, on every node: an operator can open any node's port, and a node
// that answers shows the cluster even when others are dead. The cluster
// overview is gathered through the directory like `arbor status` does; the
// charts scrape the live nodes' /metrics, whose HTTP addresses the
// directory's node table holds.
type uiModule struct {
	dashboard *ui.Dashboard
	gatherer  *overview.Gatherer
	dir       *directory.Client
}

func newUIModule() *uiModule { return &uiModule{} }

func (m *uiModule) Name() string { return "ui" }

func (m *uiModule) Init(_ context.Context, env *Env) error {
	addrs := make([]string, 0, len(env.Config.DirectoryPeers))
	for _, p := range env.Config.DirectoryPeers {
		addrs = append(addrs, p.Addr)
	}
	var err error
	if m.gatherer, err = overview.NewGatherer(addrs, env.Dialer.DialOptions()...); err != nil {
		return fmt.Errorf("dashboard overview: %w", err)
	}
	if m.dir, err = directory.NewClient(directory.ClientConfig{Addresses: addrs, DialOptions: env.Dialer.DialOptions(), Logger: env.Logger}); err != nil {
		return fmt.Errorf("dashboard directory client: %w", err)
	}
	sampler, err := ui.NewSampler(ui.SamplerOptions{Targets: m.liveHTTPAddrs, Logger: env.Logger})
	if err != nil {
		return err
	}
	if m.dashboard, err = ui.New(ui.Options{Overview: overview.Handler(m.gatherer), Sampler: sampler, Logger: env.Logger}); err != nil {
		return err
	}
	m.dashboard.Register(env.HTTP)
	return nil
}

// liveHTTPAddrs lists the HTTP addresses of the nodes the directory holds
// alive: dead ones would only time out every sample.
func (m *uiModule) liveHTTPAddrs(ctx context.Context) ([]string, error) {
	resp, err := m.dir.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var addrs []string
	for _, n := range resp.GetNodes() {
		if n.GetState() == pb.NodeState_NODE_STATE_ALIVE && n.GetHttpAddress() != "" {
			addrs = append(addrs, n.GetHttpAddress())
		}
	}
	return addrs, nil
}

func (m *uiModule) Start(context.Context) error { return nil }

func (m *uiModule) Stop(context.Context) error {
	if m.dashboard != nil {
		m.dashboard.Close()
	}
	var errs []error
	if m.gatherer != nil {
		errs = append(errs, m.gatherer.Close())
	}
	if m.dir != nil {
		errs = append(errs, m.dir.Close())
	}
	return errors.Join(errs...)
}
