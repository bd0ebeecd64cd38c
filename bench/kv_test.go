package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/extentstore"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// The key-value benchmark: the B-tree over three real extents (the extent
// benchmark's cluster: 3 nodes in one process, each with pebble on the real
// disk and gRPC on loopback, 3 replicas per extent, leaders spread), next
// to pebble used directly on the same disk in the same run.
const (
	kvBenchKeys       = 100_000
	kvBenchValueBytes = 100
	kvBenchClients    = 16
	kvLoadParallel    = 8
)

func kvBenchKey(i int) []byte { return fmt.Appendf(nil, "user%08d", i) }

func kvBenchValue(i int) []byte {
	v := make([]byte, kvBenchValueBytes)
	for j := range v {
		v[j] = byte('a' + (i+j)%26)
	}
	return v
}

// kvBenchTree is a B-tree over a fresh extent bench cluster.
func kvBenchTree(b *testing.B) *btree.Tree {
	b.Helper()
	c := newExtentBenchCluster(b)
	cl, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, Logger: quietLogger(), CallTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cl.Close() })
	store := extentstore.New(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := btree.Create(ctx, store, c.extents[0], 1)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := btree.Open(ctx, btree.Config{Store: store, Root: root, Extents: c.extents, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(tr.Close)
	return tr
}

// kvLoad writes keys 0..n-1 in transactions of 15 consecutive keys.
func kvLoad(b *testing.B, tr *btree.Tree, n int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range kvLoadParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(btree.MaxTxnValues)) - btree.MaxTxnValues
				if lo >= n {
					return
				}
				err := tr.Update(context.Background(), func(tx *btree.Txn) error {
					for i := lo; i < min(lo+btree.MaxTxnValues, n); i++ {
						if err := tx.Put(kvBenchKey(i), kvBenchValue(i)); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// pebbleRef is pebble on the same disk with the same keys.
func pebbleRef(b *testing.B, n int) *pebble.DB {
	b.Helper()
	st, err := raftengine.OpenStore(filepath.Join(b.TempDir(), "ref"), nil, quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	batch := st.DB.NewBatch()
	for i := range n {
		_ = batch.Set(kvBenchKey(i), kvBenchValue(i), nil)
	}
	if err := batch.Commit(pebble.Sync); err != nil {
		b.Fatal(err)
	}
	return st.DB
}

// parallelFor runs fn(i) for i in [0, total) on clients goroutines and
// returns the rate per second.
func parallelFor(b *testing.B, clients, total int, fn func(r *rand.Rand, i int) error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), 1))
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				if err := fn(r, i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

// refOps is how many operations the pebble references run.
const refOps = 200_000

// BenchmarkKV measures the key-value API over real extents: point writes
// (one key per transaction, 16 clients), point reads (16 clients, after
// loading 100k keys) and full scans, each next to pebble on the same disk,
// and the key-to-page cache hit ratio.
//
// The tree and its 100k keys are built once and shared by the three
// sub-benchmarks: Go runs each of them several times to find b.N, and
// loading the keys each time took minutes.
func BenchmarkKV(b *testing.B) {
	tr := kvBenchTree(b)
	kvLoad(b, tr, kvBenchKeys)
	b.Run(fmt.Sprintf("op=put/clients=%d", kvBenchClients), func(b *testing.B) {
		db := pebbleRef(b, 0)
		ref := parallelFor(b, kvBenchClients, refOps/10, func(r *rand.Rand, _ int) error {
			i := r.IntN(kvBenchKeys)
			return db.Set(kvBenchKey(i), kvBenchValue(i), pebble.Sync)
		})
		before := tr.Metrics()
		b.ResetTimer()
		rate := parallelFor(b, kvBenchClients, b.N, func(r *rand.Rand, _ int) error {
			i := r.IntN(kvBenchKeys)
			return tr.Put(context.Background(), kvBenchKey(i), kvBenchValue(i+1))
		})
		b.StopTimer()
		reportKV(b, tr, before, rate, ref, "puts/s", "pebble-synced-sets/s")
	})
	b.Run(fmt.Sprintf("op=get/clients=%d", kvBenchClients), func(b *testing.B) {
		db := pebbleRef(b, kvBenchKeys)
		ref := parallelFor(b, kvBenchClients, refOps, func(r *rand.Rand, _ int) error {
			v, closer, err := db.Get(kvBenchKey(r.IntN(kvBenchKeys)))
			if err == nil {
				_ = v
				err = closer.Close()
			}
			return err
		})
		rtt := grpcUnaryRef(b, kvBenchClients, refOps/4)
		before := tr.Metrics()
		b.ResetTimer()
		rate := parallelFor(b, kvBenchClients, b.N, func(r *rand.Rand, _ int) error {
			i := r.IntN(kvBenchKeys)
			v, ok, err := tr.Get(context.Background(), kvBenchKey(i))
			if err == nil && (!ok || len(v) != kvBenchValueBytes) {
				err = fmt.Errorf("key %d: %d bytes, present %v", i, len(v), ok)
			}
			return err
		})
		b.StopTimer()
		reportKV(b, tr, before, rate, ref, "gets/s", "pebble-gets/s")
		// The issue-11 reference: a networked read cannot beat one unary
		// gRPC round trip on the same loopback.
		b.ReportMetric(rtt, "grpc-unary/s")
		b.ReportMetric(rate/rtt, "ratio-grpc")
	})
	// A read-only transaction over three random keys: three leaves,
	// mostly in different extents, validated together at the end.
	b.Run(fmt.Sprintf("op=view3/clients=%d", kvBenchClients), func(b *testing.B) {
		before := tr.Metrics()
		b.ResetTimer()
		rate := parallelFor(b, kvBenchClients, b.N, func(r *rand.Rand, _ int) error {
			return tr.View(context.Background(), func(tx *btree.Txn) error {
				for range 3 {
					i := r.IntN(kvBenchKeys)
					v, ok, err := tx.Get(kvBenchKey(i))
					if err == nil && (!ok || len(v) != kvBenchValueBytes) {
						err = fmt.Errorf("key %d: %d bytes, present %v", i, len(v), ok)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
		b.StopTimer()
		after := tr.Metrics()
		b.ReportMetric(rate, "views/s")
		b.ReportMetric(float64(after.Retries-before.Retries)/float64(max(b.N, 1)), "retries/op")
	})
	b.Run("op=scan", func(b *testing.B) {
		db := pebbleRef(b, kvBenchKeys)
		start := time.Now()
		it, err := db.NewIter(nil)
		if err != nil {
			b.Fatal(err)
		}
		refKeys := 0
		for it.First(); it.Valid(); it.Next() {
			refKeys++
		}
		_ = it.Close()
		ref := float64(refKeys) / time.Since(start).Seconds()
		before := tr.Metrics()
		b.ResetTimer()
		start = time.Now()
		keys := 0
		for range b.N {
			err := tr.Scan(context.Background(), nil, nil, func(k, v []byte) error {
				keys++
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		rate := float64(keys) / time.Since(start).Seconds()
		b.StopTimer()
		if keys != b.N*kvBenchKeys {
			b.Fatalf("scanned %d keys, want %d", keys, b.N*kvBenchKeys)
		}
		reportKV(b, tr, before, rate, ref, "keys/s", "pebble-iter-keys/s")
		b.ReportMetric(rate*float64(len(kvBenchKey(0))+kvBenchValueBytes)/(1<<20), "MiB/s")
	})
}

func reportKV(b *testing.B, tr *btree.Tree, before btree.Metrics, rate, ref float64, unit, refUnit string) {
	after := tr.Metrics()
	hits, misses := after.CacheHits-before.CacheHits, after.CacheMisses-before.CacheMisses
	ratio := 0.0
	if hits+misses > 0 {
		ratio = float64(hits) / float64(hits+misses)
	}
	b.ReportMetric(rate, unit)
	b.ReportMetric(ref, refUnit)
	b.ReportMetric(rate/ref, "ratio")
	b.ReportMetric(ratio, "cache-hit-ratio")
	b.ReportMetric(float64(after.Retries-before.Retries)/float64(max(b.N, 1)), "retries/op")
}

// grpcUnaryRef is the rate of bare unary gRPC round trips (the standard
// health check: a few bytes each way, no work on the server) on loopback
// with clients concurrent callers: the physical limit of a networked read.
func grpcUnaryRef(b *testing.B, clients, total int) float64 {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	return parallelFor(b, clients, total, func(*rand.Rand, int) error {
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err
	})
}
