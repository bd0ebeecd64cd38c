package tract

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Directory is what the tract store reads from the directory
// (*directory.Client implements it).
type Directory interface {
	GetTLT(ctx context.Context, req *dpb.GetTLTRequest) (*dpb.TLT, error)
	ListNodes(ctx context.Context, req *dpb.ListNodesRequest) (*dpb.ListNodesResponse, error)
}

// DialFunc returns a connection to a node's gRPC address. Connections may
// be shared; callers never close them.
type DialFunc func(addr string) (grpc.ClientConnInterface, error)

// addressRefresh is the least time between two node-list fetches, and
// addressTTL how long a fetched address is trusted.
const (
	addressRefresh = time.Second
	addressTTL     = 10 * time.Second
)

// peers maps node ids to tractserver clients through the directory's node
// table.
type peers struct {
	dir  Directory
	dial DialFunc

	// fetchMu makes concurrent fetches of the node table one.
	fetchMu sync.Mutex

	mu      sync.Mutex
	addrs   map[uint64]string
	states  map[uint64]dpb.NodeState
	fetched time.Time
}

func newPeers(dir Directory, dial DialFunc) *peers {
	return &peers{dir: dir, dial: dial, addrs: map[uint64]string{}}
}

// address returns node id's gRPC address, fetching the node table when it
// is unknown or old.
func (p *peers) address(ctx context.Context, id uint64) (string, error) {
	p.mu.Lock()
	a, ok := p.addrs[id]
	fresh := time.Since(p.fetched) < addressTTL
	canFetch := time.Since(p.fetched) >= addressRefresh
	p.mu.Unlock()
	if ok && fresh {
		return a, nil
	}
	if canFetch {
		if err := p.refresh(ctx); err != nil && !ok {
			return "", fmt.Errorf("address of node %d: %w", id, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.addrs[id]; ok {
		return a, nil
	}
	return "", fmt.Errorf("node %d is not registered with the directory", id)
}

func (p *peers) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return err
	}
	addrs := make(map[uint64]string, len(resp.GetNodes()))
	states := make(map[uint64]dpb.NodeState, len(resp.GetNodes()))
	for _, n := range resp.GetNodes() {
		addrs[n.GetId()] = n.GetAddress()
		states[n.GetId()] = n.GetState()
	}
	p.mu.Lock()
	p.addrs, p.states, p.fetched = addrs, states, time.Now()
	p.mu.Unlock()
	return nil
}

// nodeState returns the directory's state of node id from a node table
// fetched at most addressRefresh ago (fetching one if need be, once for
// all concurrent callers: the failures of one stripe's or one record's
// writes cost one ListNodes, not one each). ok is false when the
// directory could not be asked or does not know the node.
func (p *peers) nodeState(ctx context.Context, id uint64) (st dpb.NodeState, ok bool) {
	p.fetchMu.Lock()
	p.mu.Lock()
	recent := !p.fetched.IsZero() && time.Since(p.fetched) < addressRefresh
	p.mu.Unlock()
	var err error
	if !recent {
		err = p.refresh(ctx)
	}
	p.fetchMu.Unlock()
	if err != nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok = p.states[id]
	return st, ok
}

// client returns a TractServer client of node id.
func (p *peers) client(ctx context.Context, id uint64) (tpb.TractServerClient, error) {
	addr, err := p.address(ctx, id)
	if err != nil {
		return nil, err
	}
	cc, err := p.dial(addr)
	if err != nil {
		return nil, fmt.Errorf("node %d at %s: %w", id, addr, err)
	}
	return tpb.NewTractServerClient(cc), nil
}
