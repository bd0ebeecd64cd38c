package extent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// TestLostQuorumRecoveredByOperator runs a real five-node cluster and the
// repairs of issue 13 on it:
//
//   - two of an extent's three replicas are killed at once: the extent has
//     no quorum, and `arbor extent recover ID` without its flag changes
//     nothing, then with --yes-lose-unreplicated-writes makes the most
//     up-to-date survivor the only voter, and the extent map lists it
//     alone; every write acknowledged before the kills reads back, new
//     writes commit, and the manager brings the extent back to three
//     replicas;
//   - a write request sent before the kills and resent afterwards, with
//     the same request id, to the recovered group (another leader, another
//     term, a restarted replica) answers the first reply: the duplicate
//     memory is in the replicated state;
//   - the killed nodes come back: every replica they still hold of an
//     extent that no longer counts them (the recovered extent, and the
//     extents re-replicated while they were dead) is removed as an orphan.
func TestLostQuorumRecoveredByOperator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real cluster")
	}
	bin := devclustertest.Binary(t)
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5, Binary: bin,
		ServerArgs: []string{"--node-dead-timeout=3s", "--heartbeat-interval=500ms"}})
	if keep := os.Getenv("ARBOR_TEST_KEEP_LOGS"); keep != "" {
		t.Cleanup(func() {
			if t.Failed() {
				_ = exec.Command("cp", "-r", c.Dir(), keep).Run()
			}
		})
	}
	dir, err := directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cl, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: c.DialOptions(), CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var views []extentJSON
	waitFor(t, "the first extents, fully replicated", time.Minute, func() error {
		var err error
		if views, err = listExtents(t, bin, c.Dir()); err != nil {
			return err
		}
		if len(views) < extent.DefaultInitialExtents {
			return fmt.Errorf("%d extents", len(views))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return fullyReplicated(ctx, cl, views, nil)
	})

	// An extent of our own, on two nodes that are not directory members
	// (they can die with the directory intact) and one member that does
	// not lead the directory: the survivor. The manager creates its
	// replicas (a new map entry at epoch 1).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := dir.Status(ctx, &dpb.StatusRequest{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var victims []uint64
	var survivor uint64
	for _, n := range st.Nodes {
		switch {
		case !slices.Contains(st.Voters, n.Id) && len(victims) < 2:
			victims = append(victims, n.Id)
		case slices.Contains(st.Voters, n.Id) && n.Id != st.LeaderId && survivor == 0:
			survivor = n.Id
		}
	}
	if len(victims) < 2 || survivor == 0 {
		t.Fatalf("directory voters %v (leader %d) leave no two other nodes and a survivor among %d nodes", st.Voters, st.LeaderId, len(st.Nodes))
	}
	g := extent.DefaultGeometry()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	created, err := dir.CreateExtent(ctx, &dpb.CreateExtentRequest{Replicas: []uint64{victims[0], victims[1], survivor},
		Geometry: &dpb.ExtentGeometry{PageSizeBytes: g.PageSizeBytes, BlockSizeBytes: g.BlockSizeBytes, ExtentSizeBytes: g.ExtentSizeBytes, Replication: 3}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	id := created.ExtentId
	var target extentJSON
	waitFor(t, "our extent, fully replicated", time.Minute, func() error {
		var err error
		if views, err = listExtents(t, bin, c.Dir()); err != nil {
			return err
		}
		for _, v := range views {
			if v.ID == id {
				target = v
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return fullyReplicated(ctx, cl, []extentJSON{v}, nil)
			}
		}
		return fmt.Errorf("extent %d not listed", id)
	})
	t.Logf("extent %d: replicas %v, leader %d; killing %v, survivor %d", id, target.Replicas, target.Leader, victims, survivor)

	// Acknowledged data, and a write request whose reply we keep.
	var blk extent.Pointer
	waitFor(t, "write to the extent", 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if blk == (extent.Pointer{}) {
			rs, err := cl.Commit(ctx, []extent.Element{extent.Allocate(id, 42)})
			if err != nil {
				return err
			}
			blk = rs[0].Block
		}
		_, err := cl.Commit(ctx, []extent.Element{extent.Write(blk.WithPage(blk.Page+1), 0, []byte("acknowledged"))})
		return err
	})
	dup := &pb.CommitRequest{ExtentId: id, RequestId: 0x5eed, Elements: []*pb.Element{{Op: &pb.Element_Write{Write: &pb.WriteOp{
		Page: &pb.Pointer{ExtentId: id, Page: blk.Page + 2, Generation: blk.Generation, Tenant: blk.Tenant}, Data: []byte("once")}}}}}
	first := sendRaw(t, cl, target.Replicas, dup)
	t.Logf("request %x applied at index %d", dup.RequestId, first.Index)
	waitFor(t, "every replica applied the same", 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return fullyReplicated(ctx, cl, []extentJSON{target}, nil)
	})

	for _, v := range victims {
		if err := c.Kill(v); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if _, err := cl.Commit(short, []extent.Element{extent.Allocate(id, 42)}); err == nil {
		t.Fatal("an extent with one replica of three committed")
	}
	cancel()

	// Without the flag: the plan and the warning, and nothing changes.
	out, err := exec.Command(bin, "extent", "recover", strconv.FormatUint(id, 10), "--dir", c.Dir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "WARNING") || !strings.Contains(string(out), fmt.Sprintf("from node %d", survivor)) {
		t.Fatalf("arbor extent recover without the flag: %v\n%s", err, out)
	}
	if rs, err := cl.ReplicaStatus(context.Background(), survivor, id, false); err != nil || len(rs.Voters) != 3 {
		t.Fatalf("recover without the flag changed the group: %+v %v", rs, err)
	}
	t.Logf("arbor extent recover (no flag):\n%s", out)
	start := time.Now()
	out, err = exec.Command(bin, "extent", "recover", strconv.FormatUint(id, 10), "--dir", c.Dir(), "--yes-lose-unreplicated-writes").CombinedOutput()
	if err != nil {
		t.Fatalf("arbor extent recover: %v\n%s", err, out)
	}
	t.Logf("arbor extent recover --yes-lose-unreplicated-writes:\n%s", out)

	read := func(p extent.Pointer, want string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pg, err := cl.ReadPage(ctx, p)
		if err != nil {
			return err
		}
		if string(pg.Data) != want {
			return fmt.Errorf("page %d reads %q, want %q", p.Page, pg.Data, want)
		}
		return nil
	}
	waitFor(t, "the acknowledged write after recovery", 30*time.Second, func() error { return read(blk.WithPage(blk.Page+1), "acknowledged") })
	t.Logf("extent %d serves again %v after the command started", id, time.Since(start).Round(time.Millisecond))
	if err := read(blk.WithPage(blk.Page+2), "once"); err != nil {
		t.Fatal(err)
	}
	again := sendRaw(t, cl, []uint64{survivor}, dup)
	if again.Index != first.Index || len(again.Results) != 1 || again.Results[0].Slot != first.Results[0].Slot {
		t.Fatalf("resent request answered index %d %v, want the first reply at index %d %v", again.Index, again.Results, first.Index, first.Results)
	}
	waitFor(t, "a new write", 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cl.Commit(ctx, []extent.Element{extent.Write(blk.WithPage(blk.Page+3), 0, []byte("after"))})
		return err
	})

	// Any other extent that had both victims lost its quorum too: the
	// operator recovers those the same way.
	for _, v := range views {
		if v.ID == id || !slices.Contains(v.Replicas, victims[0]) || !slices.Contains(v.Replicas, victims[1]) {
			continue
		}
		out, err := exec.Command(bin, "extent", "recover", strconv.FormatUint(v.ID, 10), "--dir", c.Dir(), "--yes-lose-unreplicated-writes").CombinedOutput()
		if err != nil {
			t.Fatalf("arbor extent recover %d: %v\n%s", v.ID, err, out)
		}
		t.Logf("extent %d lost its quorum too; recovered", v.ID)
	}
	waitFor(t, "every extent fully replicated without the killed nodes", 3*time.Minute, func() error {
		var err error
		if views, err = listExtents(t, bin, c.Dir()); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return fullyReplicated(ctx, cl, views, victims)
	})
	t.Logf("re-replicated %v after the command started: %+v", time.Since(start).Round(time.Millisecond), views)
	for p, want := range map[uint64]string{1: "acknowledged", 2: "once", 3: "after"} {
		if err := read(blk.WithPage(blk.Page+p), want); err != nil {
			t.Fatal(err)
		}
	}

	// The killed nodes return with their old replicas: orphans, removed.
	for _, v := range victims {
		if err := c.StartNode(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the returned nodes hold no replica the map does not list", 2*time.Minute, func() error {
		var err error
		if views, err = listExtents(t, bin, c.Dir()); err != nil {
			return err
		}
		for _, v := range views {
			for _, n := range victims {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				rs, err := cl.ReplicaStatus(ctx, n, v.ID, false)
				cancel()
				if err != nil {
					return fmt.Errorf("node %d: %w", n, err)
				}
				if rs.Exists && !slices.Contains(v.Replicas, n) {
					return fmt.Errorf("node %d still holds an orphan replica of extent %d (map %v, its voters %v)", n, v.ID, v.Replicas, rs.Voters)
				}
			}
		}
		return nil
	})
	// They did hold one (of the recovered extent at least), and removed
	// it themselves.
	for _, v := range victims {
		log, err := os.ReadFile(filepath.Join(c.Dir(), strconv.FormatUint(v, 10), "arbor.log"))
		if err != nil {
			t.Fatal(err)
		}
		n, found := 0, false
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "orphan extent replica removed") {
				n++
				found = found || strings.Contains(line, fmt.Sprintf(" extent=%d ", id))
			}
		}
		if !found {
			t.Fatalf("node %d's log shows no removal of its orphan replica of extent %d (%d removals)", v, id, n)
		}
		t.Logf("node %d removed %d orphan replicas", v, n)
	}
	for p, want := range map[uint64]string{1: "acknowledged", 2: "once", 3: "after"} {
		if err := read(blk.WithPage(blk.Page+p), want); err != nil {
			t.Fatal(err)
		}
	}
}

// sendRaw sends req to the extent's leader among nodes (following
// NOT_LEADER hints), as a client whose reply was lost would resend it.
func sendRaw(t *testing.T, cl *extent.Client, nodes []uint64, req *pb.CommitRequest) *pb.CommitResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			nc, err := cl.NodeClient(ctx, n)
			if err == nil {
				var resp *pb.CommitResponse
				resp, err = nc.Commit(ctx, req)
				if err == nil {
					cancel()
					return resp
				}
			}
			cancel()
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("request %x never answered: %v", req.RequestId, last)
	return nil
}
