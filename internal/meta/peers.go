package meta

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// peers finds metadata servers by node id: addresses from the directory's
// node table (refreshed at most once per peerRefresh when one is missing),
// one connection per address.
type peers struct {
	dir  Directory
	dial func(addr string) (grpc.ClientConnInterface, error)

	mu      sync.Mutex
	nodes   map[uint64]*dpb.Node
	fetched time.Time
	conns   map[string]pb.MetaClient
}

// peerRefresh is how long the node table is used before it is read
// again (each read is a linearized directory read): node addresses
// seldom change, and the states are hints (a server taken for alive
// that does not answer is skipped or retried; a move checks a fresh
// table, freshNode).
const peerRefresh = 2 * time.Second

// list returns the directory's node table (cached for peerRefresh unless
// fresh is asked).
func (p *peers) list(ctx context.Context, fresh bool) ([]*dpb.Node, error) {
	p.mu.Lock()
	if !fresh && p.nodes != nil && time.Since(p.fetched) < peerRefresh {
		out := make([]*dpb.Node, 0, len(p.nodes))
		for _, n := range p.nodes {
			out = append(out, n)
		}
		p.mu.Unlock()
		return out, nil
	}
	p.mu.Unlock()
	resp, err := p.dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("meta: list nodes: %w", err)
	}
	nodes := map[uint64]*dpb.Node{}
	for _, n := range resp.GetNodes() {
		nodes[n.GetId()] = n
	}
	p.mu.Lock()
	p.nodes, p.fetched = nodes, time.Now()
	p.mu.Unlock()
	return resp.GetNodes(), nil
}

// node returns node id's record.
func (p *peers) node(ctx context.Context, id uint64) (*dpb.Node, error) {
	p.mu.Lock()
	n := p.nodes[id]
	stale := time.Since(p.fetched) >= peerRefresh
	p.mu.Unlock()
	if n != nil && !stale {
		return n, nil
	}
	if _, err := p.list(ctx, n == nil); err != nil {
		if n != nil {
			return n, nil
		}
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n = p.nodes[id]; n == nil {
		return nil, fmt.Errorf("meta: node %d is not in the cluster", id)
	}
	return n, nil
}

// freshNode returns node id's record as the directory has it now.
func (p *peers) freshNode(ctx context.Context, id uint64) (*dpb.Node, error) {
	nodes, err := p.list(ctx, true)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.GetId() == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("meta: node %d is not in the cluster", id)
}

// client returns a Meta client of node id.
func (p *peers) client(ctx context.Context, id uint64) (pb.MetaClient, error) {
	n, err := p.node(ctx, id)
	if err != nil {
		return nil, err
	}
	return p.clientAt(n.GetAddress())
}

func (p *peers) clientAt(addr string) (pb.MetaClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	conn, err := p.dial(addr)
	if err != nil {
		return nil, fmt.Errorf("meta: dial %s: %w", addr, err)
	}
	if p.conns == nil {
		p.conns = map[string]pb.MetaClient{}
	}
	c := pb.NewMetaClient(conn)
	p.conns[addr] = c
	return c, nil
}
