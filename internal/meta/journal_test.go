package meta

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/fs"
)

// TestWaitSafePaced: while a session keeps its server busy, its journal's
// poller asks WaitSafe at most once per safePollPace (the answers carry
// the store's durable entry meanwhile), not once per group commit; a sync
// still asks at once and finds everything durable.
func TestWaitSafePaced(t *testing.T) {
	var waitSafes atomic.Int64
	c := newTestCluster(t, 1, func(c *testCluster) {
		c.serverOpts = append(c.serverOpts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod == "/arbor.meta.v1.Meta/WaitSafe" {
				waitSafes.Add(1)
			}
			return h(ctx, req)
		}))
	})
	x := c.newFS("paced")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := x.main.Mkdir(ctx, fs.RootHandle, "d", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	before := waitSafes.Load()
	start := time.Now()
	n := 0
	for time.Since(start) < 2*time.Second {
		a, err := x.main.Create(ctx, d.Handle, fmt.Sprintf("f%d", n), 0o644, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.main.Release(ctx, a.Handle); err != nil {
			t.Fatal(err)
		}
		n++
	}
	busy := time.Since(start)
	polls := waitSafes.Load() - before
	early := x.mainMD.JournalStats().Early
	t.Logf("%d creates (%d answered early) in %v: %d WaitSafe calls", n, early, busy, polls)
	if early == 0 {
		t.Fatal("no create was answered early")
	}
	if limit := int64(busy/safePollPace)*3/2 + 5; polls > limit {
		t.Fatalf("%d WaitSafe calls in %v of creates, want at most %d (about one per %v)", polls, busy, limit, safePollPace)
	}
	syncStart := time.Now()
	if err := x.main.SyncMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(syncStart); took > 2*time.Second {
		t.Fatalf("a sync after the creates took %v", took)
	}
	if u := x.mainMD.Unsafe(); u != 0 {
		t.Fatalf("%d operations not durable after a sync", u)
	}
}
