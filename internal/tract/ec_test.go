package tract

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

var ec52 = Layout{EC: ECLayout{Data: 5, Parity: 2}}

func TestParseLayout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Layout
		bad  bool
	}{
		{in: "replicas:3", want: Layout{Replicas: 3}},
		{in: "ec:5+2", want: ec52},
		{in: "ec", want: ec52},
		{in: "ec:4+1", want: Layout{EC: ECLayout{Data: 4, Parity: 1}}},
		{in: "ec:6+3", bad: true},
		{in: "ec:5+0", bad: true},
		{in: "ec:0+2", bad: true},
		{in: "ec:5-2", bad: true},
		{in: "replicas:0", bad: true},
		{in: "replicas:x", bad: true},
		{in: "mirror:2", bad: true},
		{in: "", bad: true},
	} {
		got, err := ParseLayout(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseLayout(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseLayout(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if again, err := ParseLayout(got.String()); err != nil || again != got {
			t.Errorf("ParseLayout(%q) = %v, %v; want %v back", got.String(), again, err, got)
		}
	}
}

// TestEncodeJoinStripe checks the codec on every tract length around the
// shard boundaries and every pattern of up to Parity lost shards.
func TestEncodeJoinStripe(t *testing.T) {
	var cs coders
	e := ec52.EC
	enc, err := cs.get(e)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 4, 5, 6, 99, 100, 101, 4096, 65536} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		shards, err := encodeStripe(enc, e, data)
		if err != nil {
			t.Fatal(err)
		}
		for lost := 0; lost < 1<<e.Width(); lost++ {
			if bitsSet(lost) > e.Parity {
				continue
			}
			in := make([][]byte, len(shards))
			for i := range shards {
				if lost&(1<<i) == 0 {
					in[i] = bytes.Clone(shards[i])
				}
			}
			got, err := joinStripe(enc, e, in, n)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("n=%d lost=%07b: %v (equal %v)", n, lost, err, bytes.Equal(got, data))
			}
		}
	}
}

func bitsSet(x int) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// putECBlob writes tracts to a new ec:5+2 blob, all in flight at once.
func putECBlob(t *testing.T, cl *Client, tracts [][]byte) GUID {
	t.Helper()
	ctx := ctxT(t)
	g := NewGUID()
	b, err := cl.CreateBlobLayout(ctx, g, ec52, uint64(len(tracts)))
	if err != nil {
		t.Fatal(err)
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

// shardOn reads what server s holds for tract of g.
func shardOn(t *testing.T, c *testCluster, s ServerID, g GUID, tract int64) *tpb.ReadTractResponse {
	t.Helper()
	cc, _ := c.dial(c.nodes[s.Node].addr)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, tract)]
	resp, err := tpb.NewTractServerClient(cc).ReadShard(ctxT(t), &tpb.ReadShardRequest{Disk: s.Disk, Guid: g[:], Tract: tract, RowVersion: row.Version})
	if err != nil {
		t.Fatalf("read shard %s/%d from %s: %v", g, tract, s, err)
	}
	return resp
}

func storedBytes(c *testCluster) uint64 {
	var total uint64
	for _, n := range c.nodes {
		if n.svc != nil {
			_, b := n.svc.Store(0).Usage()
			total += b
		}
	}
	return total
}

func TestECWriteRead(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(20, 7)
	want[3] = nil                // an empty tract
	want[4] = []byte("tiny")     // shorter than the data shards
	want[5] = want[5][:5*1000+3] // not a multiple of 5
	g := putECBlob(t, cl, want)
	checkBlob(t, cl, g, want)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if l := b.Info().Layout; l != ec52 || b.Info().Replication != 7 {
		t.Fatalf("layout %v replication %d; want ec:5+2 over 7 slots", l, b.Info().Replication)
	}
	if n, err := b.TractLength(ctx, 5); err != nil || n != len(want[5]) {
		t.Fatalf("tract length %d, %v; want %d", n, err, len(want[5]))
	}
	// Shard i of each stripe lives on slot i of the tract's row, in
	// distinct failure domains, and is a fifth of the tract.
	tab := c.table()
	for i := range want {
		row := tab.Rows[tab.Locate(g, int64(i))]
		for j, s := range row.Slots {
			r := shardOn(t, c, s, g, int64(i))
			if !r.Found || r.Meta.Shard == nil || int(r.Meta.Shard.Index) != j || len(r.Data) != (len(want[i])+4)/5 {
				t.Fatalf("tract %d slot %d on %s: found %v meta %v, %d bytes", i, j, s, r.Found, r.Meta, len(r.Data))
			}
		}
		// No replica of the tract exists: the replicated path sees nothing.
		if r := replicaData(t, c, row.Slots[0], g, int64(i)); r.Found && r.Meta.Shard == nil {
			t.Fatalf("tract %d has a replica", i)
		}
	}
	if c.nodes[1].svc.Metrics().TractsWritten == 0 {
		t.Fatal("no shard write counted")
	}
	// Bytes stored per byte of data: (D+P)/D = 1.4, plus padding.
	var data uint64
	for _, w := range want {
		data += uint64(len(w))
	}
	if ratio := float64(storedBytes(c)) / float64(data); ratio < 1.39 || ratio > 1.42 {
		t.Fatalf("stored %d bytes for %d: ratio %.3f, want 1.4", storedBytes(c), data, ratio)
	}
	rep := verifyOK(t, cl)
	if rep.Stripes != len(want)-1 || rep.Shards != 7*(len(want)-1) {
		// The empty tract is a stripe of empty shards: checked too.
		if rep.Stripes != len(want) {
			t.Fatalf("verify checked %d stripes, %d shards; want %d", rep.Stripes, rep.Shards, len(want))
		}
	}
	if cl.DegradedReads() != 0 {
		t.Fatalf("%d degraded reads with every server up", cl.DegradedReads())
	}
	// A replicated blob next to it keeps working, metadata and extend too.
	rg := putBlob(t, cl, randomTracts(5, 8), 3)
	checkBlob(t, cl, rg, randomTracts(5, 8))
	if n, err := b.Extend(ctx, 2); err != nil || n != uint64(len(want))+2 {
		t.Fatalf("extend: %d, %v", n, err)
	}
	if got, err := b.ReadTract(ctx, uint64(len(want))+1); err != nil || len(got) != 0 {
		t.Fatalf("unwritten tract of an ec blob: %d bytes, %v", len(got), err)
	}
}

func TestECRefused(t *testing.T) {
	ctx := ctxT(t)
	// Rows of 3 slots cannot hold a 7-shard stripe.
	c := newTestCluster(t, 7, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	before := storedState(c)
	_, err := cl.CreateBlobLayout(ctx, NewGUID(), ec52, 1)
	if CodeOf(err) != tpb.ErrorCode_INVALID_ARGUMENT || !strings.Contains(err.Error(), "distinct failure domains") {
		t.Fatalf("ec:5+2 on rows of 3: %v", err)
	}
	// The server refuses it too, whatever the client says.
	tab := c.table()
	g := NewGUID()
	row := tab.Rows[tab.Locate(g, MetadataTract)]
	cc, _ := c.dial(c.nodes[row.Slots[0].Node].addr)
	_, err = tpb.NewTractServerClient(cc).BlobOp(ctx, &tpb.BlobOpRequest{Disk: row.Slots[0].Disk, Guid: g[:], RowVersion: row.Version,
		Op: tpb.BlobOpKind_BLOB_OP_CREATE, Ec: ec52.EC.toProto()})
	if CodeOf(fromWire(err)) != tpb.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("server create of ec:5+2 on rows of 3: %v", err)
	}
	if after := storedState(c); after != before {
		t.Fatalf("a refused create changed the store:\n%s\n%s", before, after)
	}
}

func TestECRefusedSharedDomains(t *testing.T) {
	ctx := ctxT(t)
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	// Node 7 turns out to share node 1's failure domain.
	n := c.dir.Nodes()[6]
	n.FailureDomain = "d1"
	c.dir.setNode(n)
	_, err := cl.CreateBlobLayout(ctx, NewGUID(), ec52, 1)
	if CodeOf(err) != tpb.ErrorCode_INVALID_ARGUMENT || !strings.Contains(err.Error(), "6 failure domains") {
		t.Fatalf("ec:5+2 with 6 failure domains: %v", err)
	}
	// A narrower code fits.
	if _, err := cl.CreateBlobLayout(ctx, NewGUID(), Layout{EC: ECLayout{Data: 4, Parity: 2}}, 1); err == nil {
		t.Log("ec:4+2 accepted")
	}
}

// TestECDegradedRead: with two servers of every row down (not yet
// declared dead), every tract still reads back, reconstructed.
func TestECDegradedRead(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(14, 9)
	g := putECBlob(t, cl, want)
	// Open first: the blob's metadata row may have a crashed primary.
	ctx := ctxT(t)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	c.crash(2)
	c.crash(6)
	readAll := func() {
		t.Helper()
		for i := range want {
			got, err := b.ReadTract(ctx, uint64(i))
			if err != nil || !bytes.Equal(got, want[i]) {
				t.Fatalf("degraded read of tract %d: %v", i, err)
			}
		}
	}
	readAll()
	if cl.DegradedReads() == 0 {
		t.Fatal("no read was degraded with two servers down")
	}
	// With one server back, a corrupt shard on a live server is the
	// second lost shard of its stripe: the read still decodes.
	c.restart(2)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 4)]
	victim := row.Slots[0]
	if victim.Node == 6 {
		victim = row.Slots[1]
	}
	corruptFile(t, c.nodes[victim.Node], g, 4)
	readAll()
}

// TestECRecovery: two servers die; their slots go to servers in free
// failure domains, which rebuild every shard they lack from the survivors;
// reads work during and after, and verify passes after.
func TestECRecovery(t *testing.T) {
	c := newTestCluster(t, 9, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	blobs := map[GUID][][]byte{}
	for i := range 3 {
		want := randomTracts(20, uint64(30+i))
		blobs[putECBlob(t, cl, want)] = want
	}
	verifyOK(t, cl)
	for _, id := range []uint64{3, 8} {
		c.crash(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_DEAD)
	}
	c.step()
	// During the recovery.
	for g, want := range blobs {
		checkBlob(t, cl, g, want)
	}
	c.settle()
	var rebuilt uint64
	for id, n := range c.nodes {
		if id != 3 && id != 8 {
			rebuilt += n.svc.Metrics().TractsRecovered
		}
	}
	if rebuilt == 0 {
		t.Fatal("no shard was rebuilt")
	}
	rep := verifyOK(t, cl)
	if rep.Stripes != 60 {
		t.Fatalf("verify checked %d stripes, want 60", rep.Stripes)
	}
	for g, want := range blobs {
		checkBlob(t, cl, g, want)
	}
	t.Logf("rebuilt %d shards", rebuilt)
}

// TestECPromotedPrimary: with no free failure domain, a dead primary's row
// promotes a survivor that holds another shard; it rebuilds shard 0 over
// it and the row still decodes. When the dead servers come back they get
// their rows back and rebuild what was written meanwhile.
func TestECPromotedPrimary(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	want := randomTracts(21, 11)
	g := putECBlob(t, cl, want)
	for _, id := range []uint64{1, 5} {
		c.crash(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_DEAD)
	}
	c.step()
	checkBlob(t, cl, g, want)
	// No server can take the dead slots (every domain is in every row), so
	// the manager never sees the rows settle: wait for the live members.
	c.waitFor("the live members in sync", func() bool { c.step(); return liveInSync(t, cl, c) })
	checkBlob(t, cl, g, want)
	// Write while they are away, then bring them back.
	ctx := ctxT(t)
	b, _ := cl.OpenBlob(ctx, g)
	want[2] = bytes.Repeat([]byte("rewritten "), 100)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := b.WriteTract(wctx, 2, want[2]); err == nil {
		t.Fatal("a stripe write was acknowledged with two of its shards' servers dead")
	}
	for _, id := range []uint64{1, 5} {
		c.restart(id)
		c.dir.setState(id, dpb.NodeState_NODE_STATE_ALIVE)
	}
	c.settle()
	if err := b.WriteTract(ctx, 2, want[2]); err != nil {
		t.Fatal(err)
	}
	checkBlob(t, cl, g, want)
	verifyOK(t, cl)
}

// liveInSync reports whether every live node has every row in sync.
func liveInSync(t *testing.T, cl *Client, c *testCluster) bool {
	for id, n := range c.nodes {
		if n.srv == nil {
			continue
		}
		st, err := cl.NodeStatus(ctxT(t), id, false)
		if err != nil || !st.Serving {
			return false
		}
		for _, d := range st.Disks {
			if d.RowsCatchingUp > 0 {
				return false
			}
		}
	}
	return true
}

func TestECCorruptShardRepaired(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(10, 12)
	g := putECBlob(t, cl, want)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 3)]
	// A parity shard: the scrubber finds it and decodes it again.
	parity := c.nodes[row.Slots[6].Node]
	corruptFile(t, parity, g, 3)
	res, err := cl.ScrubNode(ctx, parity.id, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.CorruptTracts != 1 || res.RepairedTracts != 1 {
		t.Fatalf("scrub: %+v; want one corrupt shard repaired", res)
	}
	verifyOK(t, cl)
	// Verify notices a corrupt shard (and its repair starts).
	corruptFile(t, parity, g, 3)
	rep, err := cl.Verify(ctx, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatal("verify did not notice a corrupt shard")
	}
	c.waitFor("the repair verify started", func() bool {
		rep, err := cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	// A corrupt data shard: the read reconstructs it, and repairs it.
	data := c.nodes[row.Slots[1].Node]
	corruptFile(t, data, g, 3)
	b, _ := cl.OpenBlob(ctx, g)
	got, err := b.ReadTract(ctx, 3)
	if err != nil || !bytes.Equal(got, want[3]) {
		t.Fatalf("read with a corrupt data shard: %v", err)
	}
	if cl.DegradedReads() == 0 {
		t.Fatal("the read did not reconstruct")
	}
	c.waitFor("the read-triggered repair", func() bool {
		rep, err := cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	if m := data.svc.Metrics(); m.ChecksumFailures == 0 || m.Repairs == 0 {
		t.Fatalf("metrics %+v: want a checksum failure and a repair", m)
	}
}

// TestECRangeModel checks partial writes and appends (read-modify-write of
// stripes) against a byte array, for an erasure-coded and a replicated
// blob, with a server dying half way (degraded reads inside the
// read-modify-writes, and rebuilds under the writes).
func TestECRangeModel(t *testing.T) {
	c := newTestCluster(t, 8, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, l := range []Layout{ec52, {Replicas: 3}} {
		b, err := cl.CreateBlobLayout(ctx, NewGUID(), l, 0)
		if err != nil {
			t.Fatal(err)
		}
		var model []byte
		for step := range 60 {
			if step == 30 && l.IsEC() {
				c.crash(4)
				c.dir.setState(4, dpb.NodeState_NODE_STATE_DEAD)
				c.step()
			}
			var off int64
			var n int
			switch rng.IntN(4) {
			case 0: // append
				off, n = int64(len(model)), 1+rng.IntN(testTractSize/2)
			case 1: // small write anywhere (or just past the end)
				off, n = rng.Int64N(int64(len(model))+100), 1+rng.IntN(300)
			case 2: // across tract boundaries
				off, n = rng.Int64N(int64(len(model))+1), 1+rng.IntN(3*testTractSize)
			default: // a whole tract
				off, n = int64(rng.IntN(len(model)/testTractSize+1))*testTractSize, testTractSize
			}
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if _, err := b.WriteAt(ctx, p, off); err != nil {
				t.Fatalf("%v step %d: write %d at %d: %v", l, step, n, off, err)
			}
			if end := off + int64(n); end > int64(len(model)) {
				model = append(model, make([]byte, end-int64(len(model)))...)
			}
			copy(model[off:], p)
			got := make([]byte, len(model))
			if _, err := b.ReadAt(ctx, got, 0); err != nil {
				t.Fatalf("%v step %d: read: %v", l, step, err)
			}
			if !bytes.Equal(got, model) {
				t.Fatalf("%v step %d: the blob differs from the model (%d bytes)", l, step, len(model))
			}
		}
	}
}

// TestECConcurrentWriters: many tracts written at once by several clients
// while the table changes under them; every acknowledged stripe reads back.
func TestECConcurrentWriters(t *testing.T) {
	c := newTestCluster(t, 8, 7, testTractSize)
	ctx := ctxT(t)
	cl := c.client()
	defer cl.Close()
	g := NewGUID()
	if _, err := cl.CreateBlobLayout(ctx, g, ec52, 0); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 6
	results := make(chan map[uint64][]byte, writers)
	for w := range writers {
		go func() {
			wc := c.client()
			defer wc.Close()
			b, err := wc.OpenBlob(ctx, g)
			if err != nil {
				results <- nil
				return
			}
			out := map[uint64][]byte{}
			for i := range each {
				n, err := b.Extend(ctx, 1)
				if err != nil {
					t.Error(err)
					break
				}
				data := bytes.Repeat([]byte{byte(w), byte(i)}, 1000+w*100+i)
				if err := b.WriteTract(ctx, n-1, data); err != nil {
					t.Error(err)
					break
				}
				out[n-1] = data
			}
			results <- out
		}()
	}
	c.crash(5)
	c.dir.setState(5, dpb.NodeState_NODE_STATE_DEAD)
	c.step()
	all := map[uint64][]byte{}
	for range writers {
		for k, v := range <-results {
			if _, dup := all[k]; dup {
				t.Fatalf("tract %d written by two appenders", k)
			}
			all[k] = v
		}
	}
	c.settle()
	b, _ := cl.OpenBlob(ctx, g)
	for i, want := range all {
		got, err := b.ReadTract(ctx, i)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("tract %d: %v", i, err)
		}
	}
	verifyOK(t, cl)
}

// TestECScrubParity: the scrubber of a stripe's slot-0 server rewrites a
// shard of another write than the stripe's, and reports a stripe whose parity does not match
// its data (a shard rewritten with a valid checksum but wrong bytes), as
// verify does.
func TestECScrubParity(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(6, 13)
	g := putECBlob(t, cl, want)
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 2)]
	primary := row.Slots[0].Node
	// Slot 4 holds a shard of another write (as a writer that died half
	// way through a stripe leaves): catch-ups keep it (it may be a write
	// in progress), the scrubber rewrites it once the stripe is older than
	// the grace.
	r4 := shardOn(t, c, row.Slots[4], g, 2)
	other := proto.Clone(r4.Meta.Shard).(*tpb.Shard)
	other.WriteId++
	other.Generation++
	stale := bytes.Repeat([]byte{0x33}, len(r4.Data))
	cc4, _ := c.dial(c.nodes[row.Slots[4].Node].addr)
	if _, err := tpb.NewTractServerClient(cc4).WriteShard(ctx, &tpb.WriteShardRequest{Disk: 0, Guid: g[:], Tract: 2, RowVersion: row.Version,
		Incarnation: r4.Meta.Incarnation, Shard: other, Data: stale, Crc32C: Checksum(stale)}); err != nil {
		t.Fatal(err)
	}
	checkBlob(t, cl, g, want)
	if rep, err := cl.Verify(ctx, VerifyOptions{}); err != nil || rep.OK() {
		t.Fatalf("verify with a shard of another write: %v %v", rep, err)
	}
	res, err := cl.ScrubNode(ctx, primary, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.CheckedStripes == 0 || res.RewrittenShards != 1 || res.ParityMismatches != 0 {
		t.Fatalf("scrub: %+v; want one shard rewritten", res)
	}
	verifyOK(t, cl)
	checkBlob(t, cl, g, want)
	// Slot 6's parity shard is replaced by other bytes of the same write,
	// with a checksum that matches them.
	r := shardOn(t, c, row.Slots[6], g, 2)
	bogus := bytes.Repeat([]byte{0x5a}, len(r.Data))
	cc, _ := c.dial(c.nodes[row.Slots[6].Node].addr)
	if _, err := tpb.NewTractServerClient(cc).WriteShard(ctx, &tpb.WriteShardRequest{Disk: 0, Guid: g[:], Tract: 2, RowVersion: row.Version,
		Incarnation: r.Meta.Incarnation, Shard: r.Meta.Shard, Data: bogus, Crc32C: Checksum(bogus)}); err != nil {
		t.Fatal(err)
	}
	res, err = cl.ScrubNode(ctx, primary, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.ParityMismatches != 1 {
		t.Fatalf("scrub: %+v; want one parity mismatch", res)
	}
	rep, err := cl.Verify(ctx, VerifyOptions{})
	if err != nil || rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), "parity does not match") {
		t.Fatalf("verify with a bad parity shard: %v %v", rep, err)
	}
	// The data shards are intact: reads are right.
	checkBlob(t, cl, g, want)
}

// FuzzParseLayout: any input is refused with an error or parsed into a
// layout that prints back to itself.
func FuzzParseLayout(f *testing.F) {
	for _, s := range []string{"ec:5+2", "ec", "replicas:3", "ec:8+0", "ec:+", "ec:1+1", "replicas:", "ec:99999999999999999999+1", " ec:4+2 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLayout(s)
		if err != nil {
			return
		}
		if l.IsEC() && (l.EC.check(0) != nil || l.Replicas != 0) || !l.IsEC() && (l.Replicas < 1 || l.Replicas > maxReplication) {
			t.Fatalf("ParseLayout(%q) = %+v: out of bounds", s, l)
		}
		if again, err := ParseLayout(l.String()); err != nil || again != l {
			t.Fatalf("ParseLayout(%q) = %v; its String %q parses to %v, %v", s, l, l.String(), again, err)
		}
	})
}

// TestECTornStripe: a stripe left with shards of two writes, neither with
// D of them (a writer that died between its shard writes), reads as an
// error, never as wrong data; verify reports it; and it does not hold back
// the catch-up of its row when a server dies, whose other stripes are
// rebuilt.
func TestECTornStripe(t *testing.T) {
	c := newTestCluster(t, 8, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(8, 14)
	g := putECBlob(t, cl, want)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	tab := c.table()
	row := tab.Rows[tab.Locate(g, 5)]
	// Slots 0..2 get shards of another write: 3 of it, 4 of the first.
	for j := range 3 {
		r := shardOn(t, c, row.Slots[j], g, 5)
		other := proto.Clone(r.Meta.Shard).(*tpb.Shard)
		other.WriteId++
		other.Generation++
		junk := bytes.Repeat([]byte{byte(j)}, len(r.Data))
		cc, _ := c.dial(c.nodes[row.Slots[j].Node].addr)
		if _, err := tpb.NewTractServerClient(cc).WriteShard(ctx, &tpb.WriteShardRequest{Disk: 0, Guid: g[:], Tract: 5, RowVersion: row.Version,
			Incarnation: r.Meta.Incarnation, Shard: other, Data: junk, Crc32C: Checksum(junk)}); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if got, err := b.ReadTract(rctx, 5); err == nil {
		t.Fatalf("a torn stripe read as %d bytes", len(got))
	}
	if rep, err := cl.Verify(ctx, VerifyOptions{}); err != nil || rep.OK() {
		t.Fatalf("verify of a torn stripe: %v %v", rep, err)
	}
	// A member of that row dies: the row's new member cannot rebuild the
	// torn stripe but catches up the rest.
	dead := row.Slots[4].Node
	c.crash(dead)
	c.dir.setState(dead, dpb.NodeState_NODE_STATE_DEAD)
	c.settle()
	for i := range want {
		if i == 5 {
			continue
		}
		got, err := b.ReadTract(ctx, uint64(i))
		if err != nil || !bytes.Equal(got, want[i]) {
			t.Fatalf("tract %d after the recovery: %v", i, err)
		}
	}
}

// TestScrubKeepsAFileBeingRecorded: a data file written but not yet named
// by its record (its writer holds the tract's lock through a slow sync) is
// not taken for an orphan by the scrubber, however old it is.
func TestScrubKeepsAFileBeingRecorded(t *testing.T) {
	c := newTestCluster(t, 1, 1, testTractSize)
	d := c.nodes[1].svc.disks[0]
	k := tractKey{guid: NewGUID(), tract: 0}
	data := bytes.Repeat([]byte("x"), DefaultEmbedBytes+1)
	m := &tpb.TractMeta{Stamp: &tpb.Stamp{RowVersion: 1, Seq: 1}, Length: uint32(len(data)), Crc32C: Checksum(data), Replication: 1, Incarnation: 1}
	path := d.store.fileName(k, m.Stamp)
	unlock := d.locks.lock(k)
	if err := d.store.writeFile(path, data); err != nil {
		t.Fatal(err)
	}
	removed := make(chan bool, 1)
	go func() { removed <- d.removeUnreferenced(path) }()
	select {
	case <-removed:
		t.Fatal("the scrubber did not wait for the tract's writer")
	case <-time.After(100 * time.Millisecond):
	}
	if err := d.store.Put(k, m, data); err != nil {
		t.Fatal(err)
	}
	unlock()
	if <-removed {
		t.Fatal("the scrubber removed a file its record names")
	}
	if got, err := d.store.ReadData(k, m); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the scrub: %v", err)
	}
	// A file no record names is removed.
	orphan := d.store.fileName(k, &tpb.Stamp{RowVersion: 1, Seq: 7})
	if err := d.store.writeFile(orphan, data); err != nil {
		t.Fatal(err)
	}
	if !d.removeUnreferenced(orphan) {
		t.Fatal("an orphan file was kept")
	}
}

// TestECDegradedWrite: on 7 servers with ec:5+2 (no server can take a
// dead one's slot), writes go on with a member down and are acknowledged
// with D+1 shards or more; a second member lost meanwhile still leaves
// every acknowledged write readable; the stale shards of the member that
// comes back (same row versions, older generations) are never read as the
// tract's, its restart rebuilds them, and verify passes.
func TestECDegradedWrite(t *testing.T) {
	c := newTestCluster(t, 7, 7, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)
	want := randomTracts(14, 21)
	g := putECBlob(t, cl, want)
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	// A second blob made before the failure (blob metadata operations
	// still need every member of the metadata row), written after it.
	g2 := NewGUID()
	b2, err := cl.CreateBlobLayout(ctx, g2, ec52, 6)
	if err != nil {
		t.Fatal(err)
	}
	want2 := make([][]byte, 6)
	const down = 3
	c.crash(down)
	c.dir.setState(down, dpb.NodeState_NODE_STATE_DEAD)
	c.step()
	rng := rand.New(rand.NewPCG(21, 1))
	write := func(bl *Blob, w [][]byte, i int, data []byte) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := bl.WriteTract(wctx, uint64(i), data); err != nil {
			t.Fatalf("write tract %d with node %d down: %v", i, down, err)
		}
		w[i] = data
	}
	for round := range 3 {
		for i := range want {
			if rng.IntN(2) == 0 {
				write(b, want, i, randomTracts(2, uint64(100*round+i))[0][:1+rng.IntN(testTractSize)])
			}
		}
		for i := range want2 {
			write(b2, want2, i, randomTracts(2, uint64(1000*round+i))[0][:1+rng.IntN(testTractSize)])
		}
		checkBlob(t, cl, g, want)
		checkBlob(t, cl, g2, want2)
	}
	// An empty tract (a file system empties the tracts it frees): its
	// shards are empty, and rebuilding one must not take them for missing.
	write(b2, want2, 4, []byte{})
	// A partial write (read-modify-write of a degraded stripe).
	patch := []byte("patched while a shard's server is down")
	if _, err := b.WriteAt(ctx, patch, int64(testTractSize)+100); err != nil {
		t.Fatal(err)
	}
	if len(want[1]) < 100+len(patch) {
		want[1] = append(want[1], make([]byte, 100+len(patch)-len(want[1]))...)
	}
	copy(want[1][100:], patch)
	if cl.DegradedWrites() == 0 {
		t.Fatal("no write was acknowledged degraded with a member down")
	}
	// One more member lost: the degraded writes keep D shards. (Read
	// through the open blobs: a blob's metadata primary may be the one
	// lost, and opening asks it.)
	const also = 6
	c.crash(also)
	for _, x := range []struct {
		b    *Blob
		want [][]byte
	}{{b, want}, {b2, want2}} {
		for i, w := range x.want {
			if got, err := x.b.ReadTract(ctx, uint64(i)); err != nil || !bytes.Equal(got, w) {
				t.Fatalf("tract %d of %s with nodes %d and %d down: %d bytes, %v", i, x.b.GUID(), down, also, len(got), err)
			}
		}
	}
	c.restart(also)
	// The first comes back with shards of older generations: reads never
	// use them, its restart rebuilds them.
	c.restart(down)
	checkBlob(t, cl, g, want)
	c.dir.setState(down, dpb.NodeState_NODE_STATE_ALIVE)
	c.settle()
	c.waitFor("the returned member's shards rebuilt", func() bool {
		rep, err := cl.Verify(ctx, VerifyOptions{})
		return err == nil && rep.OK()
	})
	checkBlob(t, cl, g, want)
	checkBlob(t, cl, g2, want2)
	if c.nodes[down].svc.Metrics().TractsRecovered == 0 {
		t.Fatal("the returned member rebuilt no shard")
	}
}

// TestChooseWrite: the stripe's write is the newest of which Data shards
// are found, whatever the counts of older ones; with none decodable, the
// one with most shards.
func TestChooseWrite(t *testing.T) {
	w := func(gen, id uint64) stripeWrite { return stripeWrite{incarnation: 1, generation: gen, writeID: id} }
	shards := func(idx ...int) map[int]bool {
		m := map[int]bool{}
		for _, i := range idx {
			m[i] = true
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		groups map[stripeWrite]map[int]bool
		want   stripeWrite
	}{
		{"one", map[stripeWrite]map[int]bool{w(1, 9): shards(0, 1, 2, 3, 4, 5, 6)}, w(1, 9)},
		{"stale shard", map[stripeWrite]map[int]bool{w(3, 1): shards(0, 1, 2, 4, 5, 6), w(2, 7): shards(3)}, w(3, 1)},
		{"newer decodable wins", map[stripeWrite]map[int]bool{w(3, 1): shards(0, 1, 2, 3, 4), w(2, 7): shards(5, 6)}, w(3, 1)},
		{"newer undecodable loses", map[stripeWrite]map[int]bool{w(4, 1): shards(0, 1), w(3, 7): shards(2, 3, 4, 5, 6)}, w(3, 7)},
		{"none decodable: most", map[stripeWrite]map[int]bool{w(4, 1): shards(0, 1, 2), w(3, 7): shards(3, 4, 5, 6)}, w(3, 7)},
		{"none decodable: tie newest", map[stripeWrite]map[int]bool{w(4, 1): shards(0, 1), w(3, 7): shards(3, 4)}, w(4, 1)},
	} {
		if got, _ := chooseWrite(tc.groups, 5); got != tc.want {
			t.Errorf("%s: chose %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
