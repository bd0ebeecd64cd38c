package tract

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMissedShardRepairedPromptly: a server whose shard writes fail (its
// connection refused) while it neither restarts nor leaves the directory
// misses its shards of stripes acknowledged with 6 of 7; the writer asks
// a member that stored its shard to repair each stripe, and once the
// server answers again the missed shards are rewritten, without a
// scrubber pass (the harness's scrubber runs hourly) or a catch-up.
func TestMissedShardRepairedPromptly(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	// Stripes first written whole, then rewritten while one server
	// misses them (its shards stale), and new ones it never gets.
	want := randomTracts(6, 61)
	g := putECBlob(t, cl, want)
	const away = 4
	refuse := func(node uint64, method string) error {
		if node == away && strings.HasSuffix(method, "/WriteShard") {
			return status.Error(codes.Unavailable, "injected: shard writes to node 4 refused")
		}
		return nil
	}
	c.refuse.Store(&refuse)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := randomTracts(3, 62)
	for i, d := range rewrite {
		if err := b.WriteTract(ctx, uint64(i), d); err != nil {
			t.Fatal(err)
		}
		want[i] = d
	}
	more := randomTracts(4, 63)
	g2 := putECBlob(t, cl, more)
	if cl.DegradedWrites() < 7 || cl.RepairsRequested() < 7 {
		t.Fatalf("%d writes acknowledged with shards missing, %d repairs requested; want 7 of each", cl.DegradedWrites(), cl.RepairsRequested())
	}
	rep, err := cl.Verify(ctx, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatalf("verify passed with node 4's shards missed: %+v", rep)
	}
	c.refuse.Store(nil)
	c.waitFor("the missed shards rewritten", func() bool {
		rep, err = cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	var repaired uint64
	for _, n := range c.nodes {
		repaired += n.svc.Metrics().StripesRepaired
	}
	if repaired < 7 {
		t.Fatalf("%d stripes made whole by the repair queue, want 7", repaired)
	}
	checkBlob(t, cl, g, want)
	checkBlob(t, cl, g2, more)
	// Node 4's shards are whole: with two others down, reads need them.
	b2, err := cl.OpenBlob(ctx, g2)
	if err != nil {
		t.Fatal(err)
	}
	c.crash(1)
	c.crash(2)
	for i, w := range more {
		if got, err := b2.ReadTract(ctx, uint64(i)); err != nil || !bytes.Equal(got, w) {
			t.Fatalf("tract %d with nodes 1 and 2 down: %d bytes, %v", i, len(got), err)
		}
	}
}
