// Package bench holds Arbor's benchmarks. Each measures a reference in the
// same run (the raw library, the local disk or a peer system) and reports
// the ratio; BENCHMARKS.md records the figures and the command that produced
// them. Run them with `make bench`.
package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// benchPayloadBytes is the size of each committed command.
const benchPayloadBytes = 128

// referenceDuration is how long the raw pebble reference runs.
const referenceDuration = 2 * time.Second

// pebbleSyncedWritesPerSec measures raw synced pebble writes with the given
// number of concurrent writers, on the same disk the engines use.
func pebbleSyncedWritesPerSec(b *testing.B, writers int) float64 {
	b.Helper()
	st, err := raftengine.OpenStore(filepath.Join(b.TempDir(), "ref"), nil, quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	val := make([]byte, benchPayloadBytes)
	var ops atomic.Int64
	deadline := time.Now().Add(referenceDuration)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := make([]byte, 16)
			for i := uint64(0); time.Now().Before(deadline); i++ {
				binary.BigEndian.PutUint64(key, uint64(w))
				binary.BigEndian.PutUint64(key[8:], i)
				if err := st.DB.Set(key, val, pebble.Sync); err != nil {
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

// counterSM is the smallest useful state machine: it stores each command
// under its index.
type counterSM struct{}

func (counterSM) Apply(w raftengine.Writer, index uint64, cmd []byte) (any, error) {
	return nil, w.Set(binary.BigEndian.AppendUint64(nil, index), cmd)
}
func (counterSM) Load(raftengine.Reader) error { return nil }

// benchCluster is three engines in one process, each with its own pebble
// on the real disk and its own gRPC server on loopback.
type benchCluster struct {
	engines []*raftengine.Engine
	closers []func()
}

func newBenchCluster(b *testing.B, groups int) *benchCluster {
	b.Helper()
	dir := b.TempDir()
	addrs := map[uint64]string{}
	var mu sync.Mutex
	resolve := func(_ context.Context, id uint64) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return addrs[id], nil
	}
	c := &benchCluster{}
	for id := uint64(1); id <= 3; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		addrs[id] = lis.Addr().String()
		mu.Unlock()
		srv := grpc.NewServer(grpc.MaxRecvMsgSize(raftengine.MaxGRPCMessageBytes))
		tr := raftengine.NewGRPCTransport(id, resolve, quietLogger(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		tr.Register(srv)
		go func() { _ = srv.Serve(lis) }()
		st, err := raftengine.OpenStore(filepath.Join(dir, fmt.Sprint(id)), nil, quietLogger())
		if err != nil {
			b.Fatal(err)
		}
		e, err := raftengine.Open(raftengine.Config{
			NodeID: id, Store: st, Transport: tr, Logger: quietLogger(),
			Factory: func(raftengine.GroupDescriptor) (raftengine.StateMachine, error) { return counterSM{}, nil },
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.Start(); err != nil {
			b.Fatal(err)
		}
		c.engines = append(c.engines, e)
		c.closers = append(c.closers, func() { srv.Stop(); e.Stop(); _ = tr.Close(); _ = st.Close() })
	}
	b.Cleanup(func() {
		for _, f := range c.closers {
			f()
		}
	})
	for gid := uint64(1); gid <= uint64(groups); gid++ {
		for _, e := range c.engines {
			if err := e.CreateGroup(context.Background(), raftengine.GroupDescriptor{GroupID: gid, Kind: "bench"}, []uint64{1, 2, 3}); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Spread leadership over the nodes, as a real cluster would.
	for gid := uint64(1); gid <= uint64(groups); gid++ {
		if err := c.moveLeader(gid, 1+gid%3); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// moveLeader makes node to the leader of gid.
func (c *benchCluster) moveLeader(gid, to uint64) error {
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

// metrics sums the engines' counters.
func (c *benchCluster) metrics() raftengine.Metrics {
	var sum raftengine.Metrics
	for _, e := range c.engines {
		m := e.Metrics()
		sum.ReadyBatches += m.ReadyBatches
		sum.SyncedReadies += m.SyncedReadies
		sum.RoundSyncs += m.RoundSyncs
		sum.Rounds += m.Rounds
	}
	return sum
}

// propose commits one command to gid, following leader hints.
func (c *benchCluster) propose(gid uint64, cmd []byte) error {
	target := 0
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.engines[target].Propose(ctx, gid, cmd)
		cancel()
		if err == nil {
			return nil
		}
		if nl, ok := raftengine.IsNotLeader(err); ok && nl.Leader != 0 {
			target = int(nl.Leader - 1)
			continue
		}
		target = (target + 1) % len(c.engines)
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("group %d: no leader accepted the proposal", gid)
}

// BenchmarkReplicationEngine measures synced, replicated commits per second
// (3 replicas, each fsyncing to the same local disk) next to raw synced
// pebble writes on that disk with the same concurrency.
func BenchmarkReplicationEngine(b *testing.B) {
	for _, tc := range []struct {
		groups, clients int
	}{
		{1, 1}, {1, 32}, {100, 1}, {100, 100},
	} {
		b.Run(fmt.Sprintf("groups=%d/clients=%d", tc.groups, tc.clients), func(b *testing.B) {
			ref := pebbleSyncedWritesPerSec(b, tc.clients)
			c := newBenchCluster(b, tc.groups)
			payload := make([]byte, benchPayloadBytes)
			var next atomic.Int64
			before := c.metrics()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for cl := range tc.clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						gid := uint64(1 + (int(i)+cl)%tc.groups)
						if err := c.propose(gid, payload); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "commits/s")
			b.ReportMetric(ref, "pebble-synced-writes/s")
			b.ReportMetric(rate/ref, "ratio")
			after := c.metrics()
			if syncs := after.RoundSyncs - before.RoundSyncs; syncs > 0 {
				b.ReportMetric(float64(after.SyncedReadies-before.SyncedReadies)/float64(syncs), "readies/sync")
			}
		})
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
