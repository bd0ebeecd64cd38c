package tract

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

const testTractSize = 64 << 10

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// randomTracts returns n tracts of random data, the last one short.
func randomTracts(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([][]byte, n)
	for i := range out {
		size := testTractSize
		if i == n-1 {
			size = 1 + rng.IntN(testTractSize-1)
		}
		out[i] = make([]byte, size)
		for j := range out[i] {
			out[i][j] = byte(rng.Uint32())
		}
	}
	return out
}

// putBlob creates a blob and writes the tracts, all in flight at once.
func putBlob(t *testing.T, cl *Client, tracts [][]byte, replication int) GUID {
	t.Helper()
	ctx := ctxT(t)
	g := NewGUID()
	b, err := cl.CreateBlob(ctx, g, replication)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Extend(ctx, uint64(len(tracts))); err != nil || n != uint64(len(tracts)) {
		t.Fatalf("extend: %d, %v", n, err)
	}
	var ops []*Op[struct{}]
	for i, d := range tracts {
		ops = append(ops, b.WriteTractAsync(ctx, uint64(i), d))
	}
	for i, op := range ops {
		if _, err := op.Wait(); err != nil {
			t.Fatalf("write tract %d: %v", i, err)
		}
	}
	return g
}

// checkBlob reads every tract back.
func checkBlob(t *testing.T, cl *Client, g GUID, want [][]byte) {
	t.Helper()
	ctx := ctxT(t)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Size(ctx); err != nil || n != uint64(len(want)) {
		t.Fatalf("blob %s: size %d, %v; want %d", g, n, err, len(want))
	}
	for i := range want {
		got, err := b.ReadTract(ctx, uint64(i))
		if err != nil {
			t.Fatalf("read %s/%d: %v", g, i, err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("tract %s/%d: read %d bytes that differ from the %d written", g, i, len(got), len(want[i]))
		}
	}
}

func verifyOK(t *testing.T, cl *Client) *VerifyReport {
	t.Helper()
	rep, err := cl.Verify(ctxT(t), VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify: %d problems: %v", rep.ProblemsTotal, rep.Problems)
	}
	return rep
}

// replicaData reads a tract straight from one server (bypassing the
// client's choice).
func replicaData(t *testing.T, c *testCluster, s ServerID, g GUID, tract int64) *tpb.ReadTractResponse {
	t.Helper()
	cc, _ := c.dial(c.nodes[s.Node].addr)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, tract)]
	resp, err := tpb.NewTractServerClient(cc).ReadTract(ctxT(t), &tpb.ReadTractRequest{Disk: s.Disk, Guid: g[:], Tract: tract, RowVersion: row.Version})
	if err != nil {
		t.Fatalf("read %s/%d from %s: %v", g, tract, s, err)
	}
	return resp
}

func TestWriteReadReplicated(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(20, 1)
	g := putBlob(t, cl, want, 0)
	checkBlob(t, cl, g, want)
	// Every replica holds the same bytes.
	tab := c.table()
	for i := range want {
		row := tab.Rows[tab.Locate(g, int64(i))]
		for _, s := range row.Slots {
			if got := replicaData(t, c, s, g, int64(i)); !bytes.Equal(got.Data, want[i]) || got.Meta.Crc32C != Checksum(want[i]) {
				t.Fatalf("replica %s of tract %d differs", s, i)
			}
		}
	}
	// A single-replica blob lives on the primary only.
	one := randomTracts(6, 2)
	g1 := putBlob(t, cl, one, 1)
	checkBlob(t, cl, g1, one)
	for i := range one {
		row := tab.Rows[tab.Locate(g1, int64(i))]
		for j, s := range row.Slots {
			_, has := c.nodes[s.Node].svc.Store(0).Get(tractKey{g1, int64(i)})
			if has != (j == 0) {
				t.Fatalf("single-replica tract %d: slot %d (%s) has it: %v", i, j, s, has)
			}
		}
	}
	rep := verifyOK(t, cl)
	if rep.Blobs != 2 || rep.Tracts != 26 || rep.Replicas != 20*3+6 {
		t.Fatalf("verify counted %d blobs, %d tracts, %d replicas; want 2, 26, 66", rep.Blobs, rep.Tracts, rep.Replicas)
	}
	if got := cl.SimultaneousLimit(); got != maxSimultaneous {
		t.Fatalf("simultaneous limit %d with 64 KiB tracts and 256 MiB in flight, want the cap %d", got, maxSimultaneous)
	}
}

// storedState is everything the cluster stores, to show a refused request
// changed nothing.
func storedState(c *testCluster) string {
	var b bytes.Buffer
	for id := uint64(1); id <= uint64(len(c.nodes)); id++ {
		n := c.nodes[id]
		if n.svc == nil {
			continue
		}
		st := n.svc.Store(0)
		for _, k := range st.Keys() {
			m, _ := st.Get(k)
			fmt.Fprintf(&b, "%d %s %s %d %08x %v\n", id, k, stampString(m.Stamp), m.Length, m.Crc32C, m.Blob)
		}
	}
	return b.String()
}

func TestBadInputChangesNothing(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(3, 3)
	g := putBlob(t, cl, want, 0)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	before := storedState(c)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 0)]
	primary := row.Slots[0]
	cc, _ := c.dial(c.nodes[primary.Node].addr)
	raw := tpb.NewTractServerClient(cc)
	big := make([]byte, testTractSize+1)
	info := b.Info()
	for _, tc := range []struct {
		name string
		call func() error
		want tpb.ErrorCode
	}{
		{"client: tract too big", func() error { return b.WriteTract(ctx, 0, big) }, tpb.ErrorCode_INVALID_ARGUMENT},
		{"raw: tract too big", func() error {
			_, err := raw.WriteTract(ctx, &tpb.WriteTractRequest{Guid: g[:], Tract: 0, RowVersion: row.Version, Replication: 3,
				Incarnation: info.Incarnation, Data: big, Crc32C: Checksum(big)})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
		{"write past the end", func() error { return b.WriteTract(ctx, 3, want[0]) }, tpb.ErrorCode_PAST_END},
		{"read past the end", func() error { _, err := b.ReadTract(ctx, 3); return err }, tpb.ErrorCode_PAST_END},
		{"unknown blob", func() error { _, err := cl.OpenBlob(ctx, NewGUID()); return err }, tpb.ErrorCode_BLOB_NOT_FOUND},
		{"delete unknown blob", func() error { return cl.DeleteBlob(ctx, NewGUID()) }, tpb.ErrorCode_BLOB_NOT_FOUND},
		{"create existing blob", func() error { _, err := cl.CreateBlob(ctx, g, 0); return err }, tpb.ErrorCode_BLOB_EXISTS},
		{"stale row version", func() error {
			_, err := raw.WriteTract(ctx, &tpb.WriteTractRequest{Guid: g[:], Tract: 0, RowVersion: row.Version - 1, Replication: 3,
				Incarnation: info.Incarnation, Data: want[1], Crc32C: Checksum(want[1])})
			return err
		}, tpb.ErrorCode_STALE_TLT},
		{"oversize extend", func() error { _, err := b.Extend(ctx, maxExtendTracts+1); return err }, tpb.ErrorCode_INVALID_ARGUMENT},
		{"raw oversize extend", func() error {
			mrow := tab.Rows[tab.Locate(g, MetadataTract)]
			mc, _ := c.dial(c.nodes[mrow.Slots[0].Node].addr)
			_, err := tpb.NewTractServerClient(mc).BlobOp(ctx, &tpb.BlobOpRequest{Disk: mrow.Slots[0].Disk, Guid: g[:], RowVersion: mrow.Version,
				Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: maxExtendTracts + 1})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
		{"checksum mismatch", func() error {
			_, err := raw.WriteTract(ctx, &tpb.WriteTractRequest{Guid: g[:], Tract: 0, RowVersion: row.Version, Replication: 3,
				Incarnation: info.Incarnation, Data: want[1], Crc32C: Checksum(want[1]) ^ 1})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
		{"short guid", func() error {
			_, err := raw.WriteTract(ctx, &tpb.WriteTractRequest{Guid: g[:8], Tract: 0, RowVersion: row.Version, Replication: 3, Incarnation: 1})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
		{"negative tract", func() error {
			_, err := raw.ReadTract(ctx, &tpb.ReadTractRequest{Guid: g[:], Tract: -5, RowVersion: row.Version})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
		{"replication above the TLT's", func() error { _, err := cl.CreateBlob(ctx, NewGUID(), 4); return err }, tpb.ErrorCode_INVALID_ARGUMENT},
		{"write to a replica, not the primary", func() error {
			rc, _ := c.dial(c.nodes[row.Slots[1].Node].addr)
			_, err := tpb.NewTractServerClient(rc).WriteTract(ctx, &tpb.WriteTractRequest{Disk: row.Slots[1].Disk, Guid: g[:], Tract: 0,
				RowVersion: row.Version, Replication: 3, Incarnation: info.Incarnation, Data: want[1], Crc32C: Checksum(want[1])})
			return err
		}, tpb.ErrorCode_WRONG_SERVER},
		{"no such disk", func() error {
			_, err := raw.ReadTract(ctx, &tpb.ReadTractRequest{Disk: 7, Guid: g[:], Tract: 0, RowVersion: row.Version})
			return err
		}, tpb.ErrorCode_INVALID_ARGUMENT},
	} {
		err := tc.call()
		if got := CodeOf(err); got != tc.want {
			t.Errorf("%s: got %v (%v), want %v", tc.name, got, err, tc.want)
			continue
		}
		if te, _ := ErrorOf(err); te.Message == "" {
			t.Errorf("%s: error without a message", tc.name)
		}
		if after := storedState(c); after != before {
			t.Fatalf("%s changed the stored state:\n%s\nbefore:\n%s", tc.name, after, before)
		}
	}
	// A stale refusal names the current version; the client library
	// refreshes by itself.
	_, err = raw.ReadTract(ctx, &tpb.ReadTractRequest{Guid: g[:], Tract: 0, RowVersion: row.Version - 1})
	if te, ok := ErrorOf(err); !ok || te.Code != tpb.ErrorCode_STALE_TLT || te.RowVersion != row.Version {
		t.Fatalf("stale read: %v; want STALE_TLT naming version %d", err, row.Version)
	}
	checkBlob(t, cl, g, want)
}

func TestClientRefreshesAStaleTLT(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(12, 4)
	g := putBlob(t, cl, want, 0)
	old, _ := cl.TLT(ctxT(t))
	// Node 4 dies; the client still holds the old table.
	c.crash(4)
	c.dir.setState(4, dpb.NodeState_NODE_STATE_DEAD)
	c.settle()
	if cached, _ := cl.TLT(ctxT(t)); cached.Version != old.Version {
		t.Fatal("the client refreshed on its own")
	}
	checkBlob(t, cl, g, want)
	more := randomTracts(12, 5)
	g2 := putBlob(t, cl, more, 0)
	checkBlob(t, cl, g2, more)
	if cached, _ := cl.TLT(ctxT(t)); cached.Version == old.Version {
		t.Fatal("the client never refreshed its TLT")
	}
}

// TestConcurrentAppenders: eight appenders extend one blob by a tract and
// write their tract; none overwrites another's.
func TestConcurrentAppenders(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	ctx := ctxT(t)
	const writers, each = 8, 12
	g := NewGUID()
	first := c.client()
	defer first.Close()
	if _, err := first.CreateBlob(ctx, g, 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.client() // each appender is its own client
			defer cl.Close()
			b, err := cl.OpenBlob(ctx, g)
			if err != nil {
				errs <- err
				return
			}
			for i := range each {
				size, err := b.Extend(ctx, 1)
				if err != nil {
					errs <- err
					return
				}
				data := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(w)), uint32(i))
				if err := b.WriteTract(ctx, size-1, data); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	b, _ := first.OpenBlob(ctx, g)
	n, _ := b.Size(ctx)
	if n != writers*each {
		t.Fatalf("blob has %d tracts, want %d", n, writers*each)
	}
	seen := map[[2]uint32]bool{}
	for i := range n {
		d, err := b.ReadTract(ctx, i)
		if err != nil || len(d) != 8 {
			t.Fatalf("tract %d: %d bytes, %v", i, len(d), err)
		}
		k := [2]uint32{binary.BigEndian.Uint32(d), binary.BigEndian.Uint32(d[4:])}
		if seen[k] {
			t.Fatalf("tract %d repeats appender %d's record %d: two appenders got one tract", i, k[0], k[1])
		}
		seen[k] = true
	}
	if len(seen) != writers*each {
		t.Fatalf("%d distinct records, want %d", len(seen), writers*each)
	}
}

func TestExtendRetryIsAppliedOnce(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	ctx := ctxT(t)
	cl := c.client()
	defer cl.Close()
	g := NewGUID()
	if _, err := cl.CreateBlob(ctx, g, 0); err != nil {
		t.Fatal(err)
	}
	id := []byte("retry-of-one-extend")
	var sizes []uint64
	for range 3 {
		m, err := cl.blobOp(ctx, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: 5, RequestId: id})
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, m.LengthTracts)
	}
	if !slices.Equal(sizes, []uint64{5, 5, 5}) {
		t.Fatalf("three sends of one extend returned %v, want 5 each time", sizes)
	}
}

// tractsOn counts the tracts node id stores.
func tractsOn(c *testCluster, id uint64) uint64 {
	n, _ := c.nodes[id].svc.Store(0).Usage()
	return n
}

func TestFailureRecovery(t *testing.T) {
	c := newTestCluster(t, 5, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	blobs := map[GUID][][]byte{}
	for i := range 4 {
		want := randomTracts(30, uint64(10+i))
		blobs[putBlob(t, cl, want, 0)] = want
	}
	before := c.table()
	// Node 2 crashes and is declared dead: its rows get new versions and
	// new members, which copy from the primaries.
	c.crash(2)
	c.dir.setState(2, dpb.NodeState_NODE_STATE_DEAD)
	c.step()
	mid := c.table()
	for ri, r := range mid.Rows {
		was := before.Rows[ri]
		if was.Has(ServerID{Node: 2}) != (r.Version != was.Version) {
			t.Fatalf("row %d: had node 2 %v, version %d -> %d", ri, was.Has(ServerID{Node: 2}), was.Version, r.Version)
		}
		if r.Has(ServerID{Node: 2}) {
			t.Fatalf("row %d still has the dead node", ri)
		}
	}
	// A second failure during the recovery goes the same way.
	c.crash(4)
	c.dir.setState(4, dpb.NodeState_NODE_STATE_DEAD)
	c.settle()
	var recovered uint64
	for _, id := range []uint64{1, 3, 5} {
		recovered += c.nodes[id].svc.Metrics().TractsRecovered
	}
	if recovered == 0 {
		t.Fatal("nothing was copied")
	}
	rep := verifyOK(t, cl)
	if rep.Tracts != 4*30 {
		t.Fatalf("verify saw %d tracts, want %d", rep.Tracts, 4*30)
	}
	for g, want := range blobs {
		checkBlob(t, cl, g, want)
	}
}

// TestReturningServerCopiesOnlyMissedWrites: a server declared dead comes
// back with its data; it is given its old rows back and copies only what
// was written while it was away (Boxwood's degraded-mode catch-up).
func TestReturningServerCopiesOnlyMissedWrites(t *testing.T) {
	c := newTestCluster(t, 5, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	// Two tracts per row, so every row the server was in holds data.
	want := randomTracts(2*len(c.table().Rows), 20)
	g := putBlob(t, cl, want, 0)
	held := tractsOn(c, 3)
	c.crash(3)
	c.dir.setState(3, dpb.NodeState_NODE_STATE_DEAD)
	c.settle()
	// While it is away, a few tracts of its old rows change.
	tab := c.table()
	ctx := ctxT(t)
	b, _ := cl.OpenBlob(ctx, g)
	rewritten := 0
	for i := range 10 {
		want[i] = randomTracts(1, uint64(100+i))[0]
		if err := b.WriteTract(ctx, uint64(i), want[i]); err != nil {
			t.Fatal(err)
		}
		rewritten++
	}
	_ = tab
	c.restart(3)
	c.dir.setState(3, dpb.NodeState_NODE_STATE_ALIVE)
	c.settle()
	m := c.nodes[3].svc.Metrics()
	t.Logf("node 3 held %d tracts, copied %d on return (%d rewritten while away)", held, m.TractsRecovered, rewritten)
	if m.TractsRecovered == 0 || m.TractsRecovered > uint64(rewritten)+1 {
		t.Fatalf("the returning server copied %d tracts; want at most the %d rewritten (+ metadata) of the %d it held", m.TractsRecovered, rewritten, held)
	}
	verifyOK(t, cl)
	checkBlob(t, cl, g, want)
}

func TestRestartBeforeDeathKeepsEverything(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(20, 30)
	g := putBlob(t, cl, want, 0)
	version := c.table().Version
	c.crash(2)
	c.restart(2)
	c.settle()
	if c.table().Version != version {
		t.Fatal("a quick restart changed the TLT")
	}
	if m := c.nodes[2].svc.Metrics(); m.TractsRecovered != 0 {
		t.Fatalf("the restarted server copied %d tracts", m.TractsRecovered)
	}
	verifyOK(t, cl)
	checkBlob(t, cl, g, want)
}

// TestCatchUpWithoutStripesAsksThePrimaryOnly: a server restarted into a
// cluster that holds no erasure-coded blob catches its rows up asking only
// each row's primary whether the row holds shards, not every member (one
// member that does not answer used to hold every row's catch-up for an
// RPC timeout: a graceful restart in the nemesis took 35 s to serve
// again).
func TestCatchUpWithoutStripesAsksThePrimaryOnly(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(20, 31)
	g := putBlob(t, cl, want, 0)
	tbl := c.table()
	// Every server rechecks the shards of the rows it leads once it has
	// started (recheckShards, retried until every member answers): wait
	// until those listings of every member are over, so that only the
	// restart's are counted.
	var lastListing atomic.Int64
	quiet := func(_ uint64, method string, req any) {
		if lr, ok := req.(*tpb.ListRowRequest); ok && lr.Shards {
			lastListing.Store(time.Now().UnixNano())
		}
	}
	lastListing.Store(time.Now().UnixNano())
	c.watch.Store(&quiet)
	c.waitFor("the servers' start-up rechecks of their rows' shards", func() bool {
		return time.Since(time.Unix(0, lastListing.Load())) > 2*time.Second
	})
	var atPrimary, elsewhere atomic.Int64
	watch := func(node uint64, method string, req any) {
		lr, ok := req.(*tpb.ListRowRequest)
		if !ok || !lr.Shards || int(lr.Row) >= len(tbl.Rows) {
			return
		}
		if tbl.Rows[lr.Row].Slots[0].Node == 2 {
			// The restarted server's own rows: its members may ask it
			// before it has seen the table again, and then ask everyone
			// (it is not known to be in sync).
			return
		}
		if tbl.Rows[lr.Row].Slots[0].Node == node {
			atPrimary.Add(1)
		} else {
			elsewhere.Add(1)
		}
	}
	c.watch.Store(&watch)
	c.crash(2)
	c.restart(2)
	c.settle()
	c.waitFor("the restarted server to catch up", func() bool { return c.nodes[2].svc.disks[0].catchingUp() == 0 })
	c.watch.Store(nil)
	if c.table().Version != tbl.Version {
		t.Fatal("a quick restart changed the TLT")
	}
	if atPrimary.Load() == 0 {
		t.Fatal("no catch-up asked a primary for the row's shards")
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("%d shard listings reached members other than the row's primary (%d reached primaries)", n, atPrimary.Load())
	}
	verifyOK(t, cl)
	checkBlob(t, cl, g, want)
}

// TestGrowth: a new server takes a share of the rows as pending entries,
// is written to while it catches up, is committed, and the servers it
// replaced drop the rows' data; reads and writes never fail meanwhile.
func TestGrowth(t *testing.T) {
	c := newTestCluster(t, 5, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	blobs := map[GUID][][]byte{}
	// Blobs as long as the table, so every row holds as much.
	rows := len(c.table().Rows)
	for i := range 3 {
		want := randomTracts(rows, uint64(40+i))
		blobs[putBlob(t, cl, want, 0)] = want
	}
	var total uint64
	for id := uint64(1); id <= 5; id++ {
		total += tractsOn(c, id)
	}
	// Traffic during the move.
	stop := make(chan struct{})
	var failures atomic.Int64
	var ops atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		var gs []GUID
		for g := range blobs {
			gs = append(gs, g)
		}
		b, err := cl.OpenBlob(ctx, gs[0])
		if err != nil {
			failures.Add(1)
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tr := uint64(i % rows)
			if i%2 == 0 {
				if err := b.WriteTract(ctx, tr, blobs[gs[0]][tr]); err != nil {
					t.Logf("write during growth: %v", err)
					failures.Add(1)
				}
			} else if got, err := b.ReadTract(ctx, tr); err != nil || !bytes.Equal(got, blobs[gs[0]][tr]) {
				t.Logf("read during growth: %v", err)
				failures.Add(1)
			}
			ops.Add(1)
		}
	}()
	c.addNode(6)
	c.settle()
	time.Sleep(2 * c.cfg.DropGrace)
	c.waitFor("the replaced servers to drop their rows", func() bool {
		var sum uint64
		for id := uint64(1); id <= 6; id++ {
			sum += tractsOn(c, id)
		}
		return sum == total
	})
	close(stop)
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d of %d reads and writes failed during the move", failures.Load(), ops.Load())
	}
	share := float64(tractsOn(c, 6)) / float64(total)
	t.Logf("the sixth server holds %d of %d tracts (%.3f); %d operations during the move", tractsOn(c, 6), total, share, ops.Load())
	if share < 0.10 || share > 0.23 {
		t.Fatalf("the sixth server holds %.3f of the tracts, want about 1/6", share)
	}
	verifyOK(t, cl)
	for g, want := range blobs {
		checkBlob(t, cl, g, want)
	}
}

// corruptFile flips a byte of a replica's file on its disk (of its data
// in the database, for an embedded tract).
func corruptFile(t *testing.T, n *testNode, g GUID, tract int64) {
	t.Helper()
	k := tractKey{guid: g, tract: tract}
	if m, ok := n.svc.Store(0).Get(k); ok && m.Embedded {
		v, closer, err := n.db.Get(tractDataKey(0, k))
		if err != nil {
			t.Fatal(err)
		}
		b := bytes.Clone(v)
		closer.Close()
		b[100] ^= 0xff
		if err := n.db.Set(tractDataKey(0, k), b, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		return
	}
	path, ok := n.svc.Store(0).TractPath(g, tract)
	if !ok {
		t.Fatalf("node %d holds no tract %s/%d", n.id, g, tract)
	}
	f, err := n.fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 100); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, 100); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptReplicaDetectedAndRepaired(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(10, 50)
	g := putBlob(t, cl, want, 0)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 3)]
	replica := c.nodes[row.Slots[2].Node]
	corruptFile(t, replica, g, 3)
	// The scrubber (here run at once) finds it and repairs it from a good
	// replica.
	res, err := cl.ScrubNode(ctx, replica.id, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.CorruptTracts != 1 || res.RepairedTracts != 1 {
		t.Fatalf("scrub: %+v; want one corrupt tract repaired", res)
	}
	verifyOK(t, cl)
	// Verify notices a corrupt replica (and starts its repair).
	corruptFile(t, replica, g, 3)
	rep, err := cl.Verify(ctx, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatal("verify did not notice a corrupt replica")
	}
	t.Logf("verify: %v", rep.Problems)
	c.waitFor("the repair verify started", func() bool {
		rep, err := cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	// A corrupt primary copy: reads still succeed from another replica,
	// and the read repairs it.
	primary := c.nodes[row.Slots[0].Node]
	corruptFile(t, primary, g, 3)
	b, _ := cl.OpenBlob(ctx, g)
	for range 10 {
		got, err := b.ReadTract(ctx, 3)
		if err != nil || !bytes.Equal(got, want[3]) {
			t.Fatalf("read with a corrupt replica: %v", err)
		}
	}
	c.waitFor("the read-triggered repair", func() bool {
		rep, err := cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	if m := primary.svc.Metrics(); m.ChecksumFailures == 0 || m.Repairs == 0 {
		t.Fatalf("primary metrics %+v: want a checksum failure and a repair", m)
	}
}

func TestScrubberReclaimsDeletedBlobs(t *testing.T) {
	c := newTestCluster(t, 4, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	keep := randomTracts(8, 60)
	gk := putBlob(t, cl, keep, 0)
	gone := randomTracts(8, 61)
	gd := putBlob(t, cl, gone, 0)
	if err := cl.DeleteBlob(ctx, gd); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.OpenBlob(ctx, gd); CodeOf(err) != tpb.ErrorCode_BLOB_NOT_FOUND {
		t.Fatalf("open a deleted blob: %v", err)
	}
	var reclaimed uint64
	for id := range c.nodes {
		res, err := cl.ScrubNode(ctx, id, false)
		if err != nil {
			t.Fatal(err)
		}
		reclaimed += res.ReclaimedTracts
	}
	if reclaimed != 8*3 {
		t.Fatalf("reclaimed %d tracts, want the deleted blob's 24", reclaimed)
	}
	for id, n := range c.nodes {
		for _, k := range n.svc.Store(0).Keys() {
			if k.guid == gd && k.tract != MetadataTract {
				t.Fatalf("node %d still holds %s", id, k)
			}
		}
	}
	verifyOK(t, cl)
	checkBlob(t, cl, gk, keep)
	// The GUID can be used again; the new blob does not see the old data.
	b, err := cl.CreateBlob(ctx, gd, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, err := b.ReadTract(ctx, 0); err != nil || len(got) != 0 {
		t.Fatalf("a new blob under an old id reads %d bytes, %v; want an empty tract", len(got), err)
	}
}

func TestDirectoryUnreachableStopsServing(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(4, 70)
	g := putBlob(t, cl, want, 0)
	c.dir.mu.Lock()
	c.dir.down = true
	c.dir.mu.Unlock()
	time.Sleep(c.cfg.TLTValidity + 200*time.Millisecond)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 0)]
	cc, _ := c.dial(c.nodes[row.Slots[0].Node].addr)
	_, err := tpb.NewTractServerClient(cc).ReadTract(ctxT(t), &tpb.ReadTractRequest{Guid: g[:], Tract: 0, RowVersion: row.Version})
	if CodeOf(err) != tpb.ErrorCode_TLT_BEHIND {
		t.Fatalf("a tractserver cut off from the directory served a read: %v", err)
	}
	c.dir.mu.Lock()
	c.dir.down = false
	c.dir.mu.Unlock()
	c.settle()
	checkBlob(t, cl, g, want)
}

// TestBlobMetas checks the scrubber's batched question: a record for a
// live blob, BLOB_NOT_FOUND for a deleted one, a per-blob refusal for a
// malformed id, and a whole-call refusal past maxBlobMetas.
func TestBlobMetas(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	live := putBlob(t, cl, randomTracts(1, 80), 0)
	gone := putBlob(t, cl, randomTracts(1, 81), 0)
	if err := cl.DeleteBlob(ctx, gone); err != nil {
		t.Fatal(err)
	}
	ask := func(g GUID, refs ...*tpb.BlobRef) (*tpb.BlobMetasResponse, error) {
		tab := c.table()
		row := tab.Rows[tab.Locate(g, MetadataTract)]
		cc, err := c.dial(c.nodes[row.Slots[0].Node].addr)
		if err != nil {
			t.Fatal(err)
		}
		return tpb.NewTractServerClient(cc).BlobMetas(ctx, &tpb.BlobMetasRequest{Disk: row.Slots[0].Disk, Blobs: refs})
	}
	ref := func(g GUID) *tpb.BlobRef {
		tab := c.table()
		return &tpb.BlobRef{Guid: bytes.Clone(g[:]), RowVersion: tab.Rows[tab.Locate(g, MetadataTract)].Version}
	}
	resp, err := ask(live, ref(live), &tpb.BlobRef{Guid: []byte("short")})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Results) != 2 {
		t.Fatalf("%d results for 2 blobs", len(resp.Results))
	}
	b, err := cl.OpenBlob(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[0]; r.Meta == nil || r.Code != tpb.ErrorCode_OK || r.Meta.Incarnation != b.Info().Incarnation {
		t.Fatalf("live blob: %v; want its record (incarnation %d)", r, b.Info().Incarnation)
	}
	if r := resp.Results[1]; r.Meta != nil || r.Code != tpb.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("malformed id: %v; want INVALID_ARGUMENT", r)
	}
	resp, err = ask(gone, ref(gone))
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[0]; r.Meta != nil || r.Code != tpb.ErrorCode_BLOB_NOT_FOUND {
		t.Fatalf("deleted blob: %v; want BLOB_NOT_FOUND", r)
	}
	many := make([]*tpb.BlobRef, maxBlobMetas+1)
	for i := range many {
		many[i] = ref(live)
	}
	if _, err := ask(live, many...); CodeOf(err) != tpb.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("%d blobs in one call: %v; want INVALID_ARGUMENT", len(many), err)
	}
	checkBlob(t, cl, live, randomTracts(1, 80))
}

// TestBlobOpRetryForwardsAgain: a blob operation applied by the primary
// whose forward failed must reach the replicas on the client's retry, not
// be answered from the primary's memory of the request alone; otherwise
// the replicas keep the old metadata and the blob is lost (or shrinks)
// when the primary dies (found by the nemesis, issue 13).
func TestBlobOpRetryForwardsAgain(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	ctx := ctxT(t)
	cl := c.client()
	defer cl.Close()
	g := NewGUID()
	if _, err := cl.CreateBlob(ctx, g, 0); err != nil {
		t.Fatal(err)
	}
	tbl := c.table()
	row := tbl.Rows[tbl.Locate(g, MetadataTract)]
	replica := row.Slots[1].Node
	refuse := func(node uint64, method string) error {
		if node == replica && strings.HasSuffix(method, "/Replicate") {
			return status.Error(codes.Unavailable, "injected: replica unreachable")
		}
		return nil
	}
	c.refuse.Store(&refuse)
	id := []byte("extend-whose-forward-failed")
	req := func() *tpb.BlobOpRequest {
		return &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: 4, RequestId: id}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cl.blobOp(short, g, req())
	cancel()
	if err == nil {
		t.Fatal("extend succeeded while a replica refused every forward")
	}
	c.refuse.Store(nil)
	m, err := cl.blobOp(ctx, g, req())
	if err != nil {
		t.Fatalf("retry of the extend: %v", err)
	}
	if m.LengthTracts != 4 {
		t.Fatalf("retry answered %d tracts, want 4", m.LengthTracts)
	}
	k := tractKey{guid: g, tract: MetadataTract}
	for _, s := range row.Slots[:3] {
		got, ok := c.nodes[s.Node].svc.Store(0).Get(k)
		if !ok || got.Blob.GetLengthTracts() != 4 {
			t.Fatalf("member %s of the metadata row holds %v after the acknowledged retry, want 4 tracts", s, got.GetBlob())
		}
	}
}

// TestUnacknowledgedWritesReachTheReplicas: a write and a blob operation
// whose forward failed were refused to their client but stay on the
// primary; once the replica answers again, the primary forwards them on
// its own, so that its replicas agree with what it serves and a later
// primary cannot serve the older version.
func TestUnacknowledgedWritesReachTheReplicas(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	ctx := ctxT(t)
	cl := c.client()
	defer cl.Close()
	g := NewGUID()
	b, err := cl.CreateBlob(ctx, g, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tbl := c.table()
	metaRow := tbl.Rows[tbl.Locate(g, MetadataTract)]
	dataRow := tbl.Rows[tbl.Locate(g, 0)]
	refused := map[uint64]bool{metaRow.Slots[1].Node: true, dataRow.Slots[1].Node: true}
	refuse := func(node uint64, method string) error {
		if refused[node] && strings.HasSuffix(method, "/Replicate") {
			return status.Error(codes.Unavailable, "injected: replica unreachable")
		}
		return nil
	}
	c.refuse.Store(&refuse)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, extendErr := cl.blobOp(short, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: 2, RequestId: []byte("refused-extend")})
	cancel()
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	writeErr := b.WriteTract(short, 0, []byte("refused write"))
	cancel()
	if extendErr == nil || writeErr == nil {
		t.Fatalf("extend (%v) and write (%v) succeeded while a replica refused every forward", extendErr, writeErr)
	}
	c.refuse.Store(nil)
	metaKey, dataKey := tractKey{guid: g, tract: MetadataTract}, tractKey{guid: g, tract: 0}
	primaryMeta, _ := c.nodes[metaRow.Slots[0].Node].svc.Store(0).Get(metaKey)
	primaryData, _ := c.nodes[dataRow.Slots[0].Node].svc.Store(0).Get(dataKey)
	c.waitFor("the replicas to hold the primaries' versions", func() bool {
		for _, s := range metaRow.Slots[:3] {
			if m, ok := c.nodes[s.Node].svc.Store(0).Get(metaKey); !ok || !stampEqual(m.Stamp, primaryMeta.Stamp) {
				return false
			}
		}
		for _, s := range dataRow.Slots[:3] {
			if m, ok := c.nodes[s.Node].svc.Store(0).Get(dataKey); !ok || !stampEqual(m.Stamp, primaryData.Stamp) {
				return false
			}
		}
		return true
	})
}

// TestUnforwardedSurvivesPrimaryRestart: a write and a blob operation
// whose forward failed stay on their primaries, which crash before they
// could forward them again and restart into unchanged rows. The mark
// stored with each version brings them back into the set, and the
// primaries forward them once the replicas answer: the replicas end up
// with the versions the primaries serve (the nemesis's blob verify saw
// them differ, issue 13).
func TestUnforwardedSurvivesPrimaryRestart(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	ctx := ctxT(t)
	cl := c.client()
	defer cl.Close()
	g := NewGUID()
	b, err := cl.CreateBlob(ctx, g, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteTract(ctx, 0, []byte("acknowledged")); err != nil {
		t.Fatal(err)
	}
	tbl := c.table()
	metaRow := tbl.Rows[tbl.Locate(g, MetadataTract)]
	dataRow := tbl.Rows[tbl.Locate(g, 0)]
	replicas := map[uint64]bool{}
	for _, s := range append(append([]ServerID(nil), metaRow.Slots[1:3]...), dataRow.Slots[1:3]...) {
		replicas[s.Node] = true
	}
	refuse := func(node uint64, method string) error {
		if replicas[node] && strings.HasSuffix(method, "/Replicate") {
			return status.Error(codes.Unavailable, "injected: replica unreachable")
		}
		return nil
	}
	c.refuse.Store(&refuse)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, extendErr := cl.blobOp(short, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: 2, RequestId: []byte("refused-extend")})
	cancel()
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	writeErr := b.WriteTract(short, 0, []byte("refused write"))
	cancel()
	if extendErr == nil || writeErr == nil {
		t.Fatalf("extend (%v) and write (%v) succeeded while the replicas refused every forward", extendErr, writeErr)
	}
	metaKey, dataKey := tractKey{guid: g, tract: MetadataTract}, tractKey{guid: g, tract: 0}
	primaries := map[uint64]bool{metaRow.Slots[0].Node: true, dataRow.Slots[0].Node: true}
	primaryMeta, _ := c.nodes[metaRow.Slots[0].Node].svc.Store(0).Get(metaKey)
	primaryData, _ := c.nodes[dataRow.Slots[0].Node].svc.Store(0).Get(dataKey)
	if primaryMeta.GetBlob().GetLengthTracts() != 3 || primaryData.GetLength() != uint32(len("refused write")) {
		t.Fatalf("the primaries hold %v and %v, not the refused operations", primaryMeta.GetBlob(), primaryData)
	}
	// Crash the primaries while the replicas still refuse (the in-memory
	// set is lost with them), and restart them into the same rows. A
	// restarted primary asks its rows' members once to catch up from it
	// (pushSync); those requests are refused too, as they are when a
	// replica is partitioned or down at that moment, so only the marks can
	// bring the versions to the replicas.
	for id := range primaries {
		c.crash(id)
	}
	pushes := 0 // SyncRow requests the restarted primaries will send
	for _, row := range tbl.Rows {
		if !primaries[row.Slots[0].Node] {
			continue
		}
		for _, m := range row.Slots[1:] {
			if !primaries[m.Node] {
				pushes++
			}
		}
	}
	var refusedPushes atomic.Int64
	refuseRestart := func(node uint64, method string) error {
		if strings.HasSuffix(method, "/SyncRow") && !primaries[node] {
			refusedPushes.Add(1)
			return status.Error(codes.Unavailable, "injected: member unreachable")
		}
		return refuse(node, method)
	}
	c.refuse.Store(&refuseRestart)
	for id := range primaries {
		c.restart(id)
	}
	c.waitFor("the restarted primaries to ask their members to catch up", func() bool { return refusedPushes.Load() >= int64(pushes) })
	c.refuse.Store(nil)
	c.waitFor("the replicas to hold the restarted primaries' versions", func() bool {
		for _, s := range metaRow.Slots[:3] {
			if m, ok := c.nodes[s.Node].svc.Store(0).Get(metaKey); !ok || !stampEqual(m.Stamp, primaryMeta.Stamp) {
				return false
			}
		}
		for _, s := range dataRow.Slots[:3] {
			if m, ok := c.nodes[s.Node].svc.Store(0).Get(dataKey); !ok || !stampEqual(m.Stamp, primaryData.Stamp) {
				return false
			}
		}
		return true
	})
	// Once forwarded, nothing stays marked, and a verify finds no
	// difference between the replicas: its only findings are the two
	// tracts the refused extend added and nothing wrote (a named blob's
	// unwritten tracts are problems of their own, TestVerifyReportsTractsNoReplicaHolds).
	c.waitFor("the marks to be cleared", func() bool {
		for id := range primaries {
			if n := len(c.nodes[id].svc.Store(0).Unforwarded()); n != 0 {
				return false
			}
		}
		return true
	})
	rep, err := cl.Verify(ctx, VerifyOptions{Blobs: []GUID{g}})
	if err != nil {
		t.Fatal(err)
	}
	unwritten := fmt.Sprintf("[tract %s: no replica holds it (lost, or never written) tract %s: no replica holds it (lost, or never written)]",
		tractKey{g, 1}, tractKey{g, 2})
	if rep.ProblemsTotal != 2 || fmt.Sprint(rep.Problems) != unwritten {
		t.Fatalf("verify after the restart: %v, want only the unwritten tracts 1 and 2", rep.Problems)
	}
}
