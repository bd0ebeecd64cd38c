package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// extentBenchRawGroup is the raft group of the reference: raw proposals of
// the replication engine, in the same cluster as the extents.
const extentBenchRawGroup = 1

// extentBenchDirectory is a fixed extent map and node table.
type extentBenchDirectory struct {
	mu      sync.Mutex
	extents map[uint64]*dpb.Extent
	addrs   map[uint64]string
}

func (d *extentBenchDirectory) GetExtent(_ context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.extents[req.ExtentId]; e != nil {
		return e, nil
	}
	return nil, status.Errorf(codes.NotFound, "extent %d", req.ExtentId)
}

func (d *extentBenchDirectory) ListExtents(context.Context, *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp := &dpb.ListExtentsResponse{}
	for _, e := range d.extents {
		resp.Extents = append(resp.Extents, e)
	}
	return resp, nil
}

func (d *extentBenchDirectory) GetNode(_ context.Context, req *dpb.GetNodeRequest) (*dpb.Node, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &dpb.Node{Id: req.NodeId, Address: d.addrs[req.NodeId]}, nil
}

// extentBenchCluster is three nodes in one process, each with its own
// pebble on the real disk, its raft transport and Extent service on one
// loopback gRPC server: three extents (leaders on nodes 1, 2, 3) and the
// raw reference group (leader on node 1).
type extentBenchCluster struct {
	engines []*raftengine.Engine
	dir     *extentBenchDirectory
	extents []uint64
	closers []func()
}

func newExtentBenchCluster(b *testing.B) *extentBenchCluster {
	b.Helper()
	root := b.TempDir()
	c := &extentBenchCluster{dir: &extentBenchDirectory{extents: map[uint64]*dpb.Extent{}, addrs: map[uint64]string{}}}
	resolve := func(_ context.Context, id uint64) (string, error) {
		c.dir.mu.Lock()
		defer c.dir.mu.Unlock()
		return c.dir.addrs[id], nil
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	factory := func(desc raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
		if desc.Kind == extent.Kind {
			return extent.NewStateMachine(desc)
		}
		return counterSM{}, nil
	}
	for id := uint64(1); id <= 3; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		c.dir.mu.Lock()
		c.dir.addrs[id] = lis.Addr().String()
		c.dir.mu.Unlock()
		srv := grpc.NewServer(grpc.MaxRecvMsgSize(raftengine.MaxGRPCMessageBytes))
		tr := raftengine.NewGRPCTransport(id, resolve, quietLogger(), dialOpts...)
		tr.Register(srv)
		st, err := raftengine.OpenStore(filepath.Join(root, fmt.Sprint(id)), nil, quietLogger())
		if err != nil {
			b.Fatal(err)
		}
		e, err := raftengine.Open(raftengine.Config{NodeID: id, Store: st, Transport: tr, Logger: quietLogger(), Factory: factory,
			DisableLeaseReads: os.Getenv("ARBOR_BENCH_NO_LEASE") != ""})
		if err != nil {
			b.Fatal(err)
		}
		peers, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, DialOptions: dialOpts, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		es, err := extent.NewServer(extent.ServerConfig{Engine: e, Peers: peers.NodeClient, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		extentpb.RegisterExtentServer(srv, es)
		go func() { _ = srv.Serve(lis) }()
		if err := e.Start(); err != nil {
			b.Fatal(err)
		}
		c.engines = append(c.engines, e)
		c.closers = append(c.closers, func() { srv.Stop(); _ = peers.Close(); e.Stop(); _ = tr.Close(); _ = st.Close() })
	}
	b.Cleanup(func() {
		for _, f := range c.closers {
			f()
		}
	})
	voters := []uint64{1, 2, 3}
	for _, e := range c.engines {
		if err := e.CreateGroup(context.Background(), raftengine.GroupDescriptor{GroupID: extentBenchRawGroup, Kind: "bench"}, voters); err != nil {
			b.Fatal(err)
		}
	}
	g := extent.DefaultGeometry()
	for i := range 3 {
		id := extent.FirstExtentID + uint64(i)
		desc, err := extent.GroupDescriptor(id, g)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range c.engines {
			if err := e.CreateGroup(context.Background(), desc, voters); err != nil {
				b.Fatal(err)
			}
		}
		c.dir.extents[id] = &dpb.Extent{ExtentId: id, Replicas: voters, Epoch: 1, Geometry: &dpb.ExtentGeometry{
			PageSizeBytes: g.PageSizeBytes, BlockSizeBytes: g.BlockSizeBytes, ExtentSizeBytes: g.ExtentSizeBytes, Replication: g.Replication}}
		c.extents = append(c.extents, id)
	}
	for gid, leader := range map[uint64]uint64{extentBenchRawGroup: 1, c.extents[0]: 1, c.extents[1]: 2, c.extents[2]: 3} {
		if err := c.moveLeader(gid, leader); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

func (c *extentBenchCluster) moveLeader(gid, to uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	target := 0
	for {
		err := c.engines[target].TransferLeadership(ctx, gid, to)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if nl, ok := raftengine.IsNotLeader(err); ok && nl.Leader != 0 {
			target = int(nl.Leader - 1)
			continue
		}
		target = (target + 1) % len(c.engines)
		time.Sleep(10 * time.Millisecond)
	}
}

// rawProposalsPerSec measures the reference: proposals of
// benchPayloadBytes to the raw group at its leader (node 1), by clients
// concurrent proposers, for referenceDuration.
func (c *extentBenchCluster) rawProposalsPerSec(b *testing.B, clients int) float64 {
	b.Helper()
	payload := make([]byte, benchPayloadBytes)
	var ops atomic.Int64
	deadline := time.Now().Add(referenceDuration)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := c.engines[0].Propose(ctx, extentBenchRawGroup, payload)
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(ops.Load()) / referenceDuration.Seconds()
}

// BenchmarkExtentMPSC measures MPSC commits per second through the extent
// client (gRPC to the leaders): within one extent (one raft entry) and
// across three extents led by three nodes (FSS §6's two-phase commit, 6
// raft entries), with 1 and 32 concurrent clients, each writing its own
// benchPayloadBytes pages conditioned on their slots. The reference is raw
// replication-engine proposals of the same size at the same concurrency in
// the same cluster, measured in the same run.
func BenchmarkExtentMPSC(b *testing.B) {
	for _, tc := range []struct{ extents, clients int }{{1, 1}, {1, 32}, {3, 1}, {3, 32}} {
		b.Run(fmt.Sprintf("extents=%d/clients=%d", tc.extents, tc.clients), func(b *testing.B) {
			c := newExtentBenchCluster(b)
			ref := c.rawProposalsPerSec(b, tc.clients)
			cl, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, Logger: quietLogger(), CallTimeout: 10 * time.Second,
				DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			// One block per extent; client w owns page w of each.
			blocks := make([]extent.Pointer, tc.extents)
			for i := range tc.extents {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				rs, err := cl.Commit(ctx, []extent.Element{extent.Allocate(c.extents[i], 1)})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				blocks[i] = rs[0].Block
			}
			payload := make([]byte, benchPayloadBytes)
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range tc.clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					slots := make([]uint64, tc.extents)
					elems := make([]extent.Element, tc.extents)
					for next.Add(1) <= int64(b.N) {
						for i, blk := range blocks {
							elems[i] = extent.Write(blk.WithPage(blk.Page+uint64(w)), slots[i], payload)
						}
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						rs, err := cl.Commit(ctx, elems)
						cancel()
						if err != nil {
							b.Error(err)
							return
						}
						for i := range slots {
							slots[i] = rs[i].Slot
						}
						if slices.Contains(slots, 0) {
							b.Error("commit reply without slots")
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "mpsc/s")
			b.ReportMetric(ref, "raft-proposals/s")
			b.ReportMetric(rate/ref, "ratio")
		})
	}
}
