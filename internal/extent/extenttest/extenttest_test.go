package extenttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
)

// TestClusterSurvivesALeaderCrash: the harness's own contract: a write
// acknowledged before the leader's crash reads back from the new leader,
// the crashed node starts again and catches up, and the directory answers
// with the real client's sentinels.
func TestClusterSurvivesALeaderCrash(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 3, Seed: 1})
	g := extent.Geometry{PageSizeBytes: 512, BlockSizeBytes: 2048, ExtentSizeBytes: 16 * 2048}
	ext := c.CreateExtent(g, 1, 2, 3)
	cl := c.Client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rs, err := cl.Commit(ctx, []extent.Element{extent.Allocate(ext, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := rs[0].Block.WithPage(1)
	if _, err := cl.Commit(ctx, []extent.Element{extent.Write(p, 0, []byte("kept"))}); err != nil {
		t.Fatal(err)
	}
	dead := c.Leader(ext)
	c.Crash(dead)
	if pg, err := cl.ReadPage(ctx, p); err != nil || string(pg.Data) != "kept" {
		t.Fatalf("read after the leader's crash: %q %v", pg.Data, err)
	}
	c.Start(dead)
	for deadline := time.Now().Add(15 * time.Second); len(c.StateMachines(ext)) < 3 || c.Node(dead) == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not come back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Directory().GetExtent(ctx, &dpb.GetExtentRequest{ExtentId: 1}); !errors.Is(err, directory.ErrNotFound) {
		t.Fatalf("unknown extent: %v, want directory.ErrNotFound", err)
	}
}
