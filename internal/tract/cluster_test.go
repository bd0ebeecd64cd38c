package tract_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// longEnv turns on the full-size cluster tests (a 1 GiB blob, a few GiB
// for the balance check): `make test-long`.
const longEnv = "ARBOR_LONG"

func long() bool { return os.Getenv(longEnv) != "" }

// Cluster settings of these tests: a quick failure detector, and the
// tract store's timers short enough to watch.
var (
	serverArgs  = []string{"--heartbeat-interval=500ms", "--node-dead-timeout=4s"}
	tractEnv    = tract.OptionsEnv + "=drop-grace=2s,orphan-grace=1s,manager-settle=1s,manager-tick=500ms"
	startupWait = 2 * time.Minute
)

// clusterTractEnv is the tract store's settings: the default 4 MiB tracts
// for the full-size runs, 1 MiB ones for the short runs, so that their
// smaller blobs still have a few tracts in every TLT row.
func clusterTractEnv() string {
	if long() {
		return tractEnv
	}
	return tractEnv + ",tract-size=1MiB"
}

type harness struct {
	t      *testing.T
	c      *devcluster.Cluster
	bin    string
	dir    *directory.Client
	client *tract.Client
}

func startCluster(t *testing.T, nodes int) *harness {
	t.Helper()
	return startClusterWith(t, devcluster.Options{Nodes: nodes, ServerArgs: serverArgs, Env: []string{clusterTractEnv()}})
}

// startClusterWith starts a dev cluster, connects a tract client and waits
// until every row is in sync.
func startClusterWith(t *testing.T, opts devcluster.Options) *harness {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster test: starts real processes")
	}
	c := devclustertest.Start(t, opts)
	h := &harness{t: t, c: c, bin: devclustertest.Binary(t)}
	var err error
	h.dir, err = directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.dir.Close() })
	h.client, err = tract.NewClient(tract.ClientConfig{Directory: h.dir, DialOptions: c.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.client.Close() })
	h.waitInSync(startupWait)
	return h
}

// arbor runs the CLI against the cluster and returns its stdout; it fails
// the test on a non-zero exit unless wantFail.
func (h *harness) arbor(wantFail bool, args ...string) string {
	h.t.Helper()
	args = append(args, "--dir", h.c.Dir(), "--log-level=warn")
	cmd := exec.Command(h.bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if (err != nil) != wantFail {
		h.t.Fatalf("arbor %s: %v (want failure: %v)\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, wantFail, out.String(), errb.String())
	}
	return out.String() + errb.String()
}

// waitInSync waits until every row of the TLT is in sync on every member
// and returns the view.
func (h *harness) waitInSync(within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := h.inSync()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("rows not in sync after %v: %s", within, why)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (h *harness) inSync() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t, err := h.client.RefreshTLT(ctx)
	if err != nil {
		return false, err.Error()
	}
	statuses := map[uint64]*tpb.StatusResponse{}
	for _, s := range t.Servers() {
		if _, ok := statuses[s.Node]; ok {
			continue
		}
		st, err := h.client.NodeStatus(ctx, s.Node, true)
		if err != nil {
			return false, fmt.Sprintf("node %d: %v", s.Node, err)
		}
		statuses[s.Node] = st
	}
	for ri, r := range t.Rows {
		members := append([]tract.ServerID(nil), r.Slots...)
		for _, p := range r.Pending {
			members = append(members, p.Server)
		}
		for _, m := range members {
			found := false
			for _, d := range statuses[m.Node].Disks {
				for _, rs := range d.Rows {
					if d.Disk == m.Disk && int(rs.Row) == ri && rs.Version == r.Version && rs.InSync {
						found = true
					}
				}
			}
			if !found {
				return false, fmt.Sprintf("row %d: %s not in sync at version %d", ri, m, r.Version)
			}
		}
		if len(r.Pending) > 0 {
			return false, fmt.Sprintf("row %d has pending entries", ri)
		}
	}
	return true, ""
}

// tractsPerServer reads every tractserver's stored tract count.
func (h *harness) tractsPerServer() map[tract.ServerID]uint64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, err := h.client.RefreshTLT(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[tract.ServerID]uint64{}
	for _, s := range t.Servers() {
		st, err := h.client.NodeStatus(ctx, s.Node, false)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, d := range st.Disks {
			out[tract.ServerID{Node: s.Node, Disk: d.Disk}] = d.Tracts
		}
	}
	return out
}

// recoveredOn returns the bytes node id copied by catch-ups.
func (h *harness) recoveredOn(id uint64) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := h.client.NodeStatus(ctx, id, false)
	if err != nil {
		return 0
	}
	var sum uint64
	for _, d := range st.Disks {
		sum += d.RecoveredBytes
	}
	return sum
}

func (h *harness) recoveredBytes() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var sum uint64
	for _, n := range h.c.Nodes() {
		if !n.Running {
			continue
		}
		if st, err := h.client.NodeStatus(ctx, n.ID, false); err == nil {
			for _, d := range st.Disks {
				sum += d.RecoveredBytes
			}
		}
	}
	return sum
}

// writeFile writes size random bytes to a new file.
func writeFile(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		n := min(left, int64(len(buf)))
		rand.Read(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	fa, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fa, fb) {
		t.Fatalf("%s (%d bytes) and %s (%d bytes) differ", a, len(fa), b, len(fb))
	}
}

// putGet stores a file with the CLI, fetches it back and compares.
func (h *harness) putGet(size int64) (id, path string) {
	h.t.Helper()
	path = writeFile(h.t, size)
	start := time.Now()
	id = strings.TrimSpace(h.arbor(false, "blob", "put", path, "--progress=never"))
	put := time.Since(start)
	out := filepath.Join(h.t.TempDir(), "out")
	start = time.Now()
	h.arbor(false, "blob", "get", id, out, "--progress=never")
	get := time.Since(start)
	sameFiles(h.t, path, out)
	h.t.Logf("blob %s: %d MiB put in %v, got back byte-identical in %v", id, size>>20, put.Round(time.Millisecond), get.Round(time.Millisecond))
	return id, path
}

func (h *harness) checkBlob(id, path string) {
	h.t.Helper()
	out := filepath.Join(h.t.TempDir(), "check")
	h.arbor(false, "blob", "get", id, out, "--progress=never")
	sameFiles(h.t, path, out)
}

// TestClusterBlobs: a 5-node dev cluster with 3 replicas: a large file put
// and got back byte-identical with the CLI (1 GiB with ARBOR_LONG), the
// tracts-per-server balance, concurrent appenders, a corrupted replica on
// disk, bad input, and the operator commands.
func TestClusterBlobs(t *testing.T) {
	h := startCluster(t, 5)
	size := int64(160 << 20)
	if long() {
		size = 1 << 30
	}
	id, path := h.putGet(size)
	stat := h.arbor(false, "blob", "stat", id)
	if !strings.Contains(stat, fmt.Sprintf("bytes:       %d ", size)) || !strings.Contains(stat, "replication: 3") {
		t.Fatalf("blob stat:\n%s", stat)
	}
	// More blobs of several sizes, for the balance.
	total := size
	extra := int64(3<<30) - size
	if !long() {
		extra = 160 << 20
	}
	var blobs [][2]string
	for extra > 0 {
		n := min(extra, int64(96<<20)+int64(len(blobs))*(64<<20))
		bid, bpath := h.putGet(n)
		blobs = append(blobs, [2]string{bid, bpath})
		extra -= n
		total += n
	}
	per := h.tractsPerServer()
	var sum, top uint64
	for _, n := range per {
		sum += n
		top = max(top, n)
	}
	ratio := float64(top) / (float64(sum) / float64(len(per)))
	t.Logf("%d MiB in %d blobs: tracts per server %v, max/mean %.4f", total>>20, len(blobs)+1, per, ratio)
	// The must-show bound is for a few GiB (ARBOR_LONG: 3 GiB, 768 tracts);
	// the short run holds 80 tracts over 70 rows, where one tract more or
	// less on a server is several percent, so it checks a looser bound
	// (TestTractBalance checks 1.05 on the same layout at 3 GiB).
	bound := 1.05
	if !long() {
		bound = 1.15
	}
	if ratio > bound {
		t.Errorf("tracts per tractserver max/mean %.4f > %.2f", ratio, bound)
	}
	verify := h.arbor(false, "blob", "verify", "--progress=never")
	t.Logf("verify: %s", strings.TrimSpace(verify))
	if !strings.Contains(verify, "ok: every tract") {
		t.Fatalf("verify:\n%s", verify)
	}
	tlt := h.arbor(false, "tlt")
	if !strings.Contains(tlt, "every row in sync") || !strings.Contains(tlt, "SERVER") || !strings.Contains(tlt, "ROW") {
		t.Fatalf("arbor tlt:\n%s", tlt)
	}

	t.Run("appenders", func(t *testing.T) { concurrentAppenders(t, h) })
	t.Run("corrupt replica", func(t *testing.T) { corruptReplica(t, h, id, path) })
	t.Run("bad input", func(t *testing.T) { badInput(t, h, id) })
	t.Run("get to standard output", func(t *testing.T) { getToStdout(t, h) })
	t.Run("delete", func(t *testing.T) {
		h.arbor(false, "blob", "rm", blobs[0][0])
		out := h.arbor(true, "blob", "stat", blobs[0][0])
		if !strings.Contains(out, "does not exist") {
			t.Fatalf("stat of a deleted blob: %s", out)
		}
		time.Sleep(1100 * time.Millisecond) // the orphan grace
		var reclaimed uint64
		for _, n := range h.c.Nodes() {
			res, err := h.client.ScrubNode(context.Background(), n.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			reclaimed += res.ReclaimedTracts
		}
		if reclaimed == 0 {
			t.Fatal("the scrubbers reclaimed nothing of a deleted blob")
		}
		t.Logf("scrubbers reclaimed %d tracts of the deleted blob", reclaimed)
		h.arbor(false, "blob", "verify", "--progress=never")
	})
}

// concurrentAppenders: eight processes' worth of clients extend one blob
// and write their tract; none overwrites another.
func concurrentAppenders(t *testing.T, h *harness) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := tract.NewGUID()
	if _, err := h.client.CreateBlob(ctx, g, 0); err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := tract.NewClient(tract.ClientConfig{Directory: h.dir, DialOptions: h.c.DialOptions()})
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			b, err := cl.OpenBlob(ctx, g)
			if err != nil {
				errs <- err
				return
			}
			for i := range each {
				n, err := b.Extend(ctx, 1)
				if err != nil {
					errs <- err
					return
				}
				if err := b.WriteTract(ctx, n-1, []byte(fmt.Sprintf("writer %d record %d", w, i))); err != nil {
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
	b, err := h.client.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := b.Size(ctx)
	seen := map[string]bool{}
	for i := range n {
		d, err := b.ReadTract(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(d)] || len(d) == 0 {
			t.Fatalf("tract %d holds %q, already seen or empty: two appenders collided", i, d)
		}
		seen[string(d)] = true
	}
	if n != writers*each || len(seen) != writers*each {
		t.Fatalf("%d tracts, %d distinct records; want %d", n, len(seen), writers*each)
	}
}

// corruptReplica flips a byte of one replica's file on disk: verify
// fails, the scrubber repairs it, verify passes and the blob reads back.
func corruptReplica(t *testing.T, h *harness, id, path string) {
	g, _ := tract.ParseGUID(id)
	var victim string
	var node uint64
	for _, n := range h.c.Nodes() {
		matches, _ := filepath.Glob(filepath.Join(n.Dir, "tracts", g.String()[:2], g.String()+".5.*"))
		if len(matches) > 0 {
			victim, node = matches[0], n.ID
			break
		}
	}
	if victim == "" {
		t.Fatal("no replica file of tract 5 found on any node")
	}
	f, err := os.OpenFile(victim, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, 1000)
	b[0] ^= 0x5a
	f.WriteAt(b, 1000)
	f.Close()
	t.Logf("corrupted %s on node %d", victim, node)
	out := h.arbor(true, "blob", "verify", "--progress=never")
	if !strings.Contains(out, "fails its checksum") {
		t.Fatalf("verify of a corrupt replica:\n%s", out)
	}
	// Verify's read started a repair; the scrubber finishes any left.
	if _, err := h.client.ScrubNode(context.Background(), node, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.Command(h.bin, "blob", "verify", "--progress=never", "--dir", h.c.Dir())
		if cmd.Run() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the corrupt replica was not repaired")
		}
		time.Sleep(500 * time.Millisecond)
	}
	h.checkBlob(id, path)
}

// getToStdout: blob get ID - writes the blob to standard output and
// nothing else; no file named "-" appears.
func getToStdout(t *testing.T, h *harness) {
	path := writeFile(t, 5<<20+12345)
	id := strings.TrimSpace(h.arbor(false, "blob", "put", path, "--progress=never"))
	dir := t.TempDir()
	cmd := exec.Command(h.bin, "blob", "get", id, "-", "--progress=never", "--dir", h.c.Dir(), "--log-level=warn")
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("arbor blob get %s -: %v\n%s", id, err, errb.String())
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("standard output has %d bytes, the blob %d, or they differ", out.Len(), len(want))
	}
	if _, err := os.Stat(filepath.Join(dir, "-")); err == nil {
		t.Fatal("a file named - was written")
	}
}

// badInput: each gets a clear error and changes nothing.
func badInput(t *testing.T, h *harness, id string) {
	before := h.tractsPerServer()
	unknown := tract.NewGUID().String()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"blob", "get", unknown, filepath.Join(t.TempDir(), "x")}, "does not exist"},
		{[]string{"blob", "stat", "not-a-blob-id"}, "want 32 hexadecimal digits"},
		{[]string{"blob", "rm", unknown}, "does not exist"},
		{[]string{"blob", "put", "/nonexistent/file"}, "no such file"},
		{[]string{"blob", "verify", unknown}, "no record"},
	} {
		out := h.arbor(true, tc.args...)
		if !strings.Contains(out, tc.want) {
			t.Errorf("arbor %s: want %q in:\n%s", strings.Join(tc.args, " "), tc.want, out)
		}
		if tc.args[1] == "get" {
			// A failed get leaves no file, not even an empty one.
			dir := filepath.Dir(tc.args[3])
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("arbor %s left %s behind", strings.Join(tc.args, " "), left[0].Name())
			}
		}
	}
	ctx := context.Background()
	g, _ := tract.ParseGUID(id)
	b, err := h.client.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := b.Size(ctx)
	ts, _ := h.client.TractSize(ctx)
	if err := b.WriteTract(ctx, 0, make([]byte, ts+1)); tract.CodeOf(err) != tpb.ErrorCode_INVALID_ARGUMENT {
		t.Errorf("oversize tract: %v", err)
	}
	if _, err := b.ReadTract(ctx, n); tract.CodeOf(err) != tpb.ErrorCode_PAST_END {
		t.Errorf("read past the end: %v", err)
	}
	if _, err := b.Extend(ctx, 1<<40); tract.CodeOf(err) != tpb.ErrorCode_INVALID_ARGUMENT {
		t.Errorf("oversize extend: %v", err)
	}
	// A request under a stale row version, straight to the primary.
	tab, _ := h.client.RefreshTLT(ctx)
	row := tab.Rows[tab.Locate(g, 0)]
	conn, err := h.c.Conn(row.Slots[0].Node)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tpb.NewTractServerClient(conn).WriteTract(ctx, &tpb.WriteTractRequest{Disk: row.Slots[0].Disk, Guid: g[:], Tract: 0,
		RowVersion: row.Version - 1, Replication: 3, Incarnation: b.Info().Incarnation, Data: []byte("x"), Crc32C: tract.Checksum([]byte("x"))})
	if tract.CodeOf(err) != tpb.ErrorCode_STALE_TLT {
		t.Errorf("stale row version: %v", err)
	}
	if after := h.tractsPerServer(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bad input changed the stored tracts: %v -> %v", before, after)
	}
	if size, _ := b.Size(ctx); size != n {
		t.Fatalf("bad input changed the blob's size: %d -> %d", n, size)
	}
}

// TestClusterKillRecovery: kill -9 of a node holding data; the TLT is
// repaired, re-replication finishes, verify passes and every blob reads
// back; a second kill during the recovery is survived the same way.
func TestClusterKillRecovery(t *testing.T) {
	h := startCluster(t, 5)
	size := int64(96 << 20)
	if long() {
		size = 1 << 30
	}
	var blobs [][2]string
	for range 2 {
		id, path := h.putGet(size)
		blobs = append(blobs, [2]string{id, path})
	}
	per := h.tractsPerServer()
	victim := tract.ServerID{Node: 4}
	t.Logf("node 4 holds %d tracts; killing it with SIGKILL", per[victim])
	before := h.recoveredBytes()
	tab, _ := h.client.RefreshTLT(context.Background())
	start := time.Now()
	if err := h.c.Kill(4); err != nil {
		t.Fatal(err)
	}
	// Wait for the TLT repair (the node must be declared dead first), then
	// kill a second node while the rows are catching up.
	h.waitFor("the TLT repair", 90*time.Second, func() bool {
		now, err := h.client.RefreshTLT(context.Background())
		return err == nil && now.Version > tab.Version
	})
	repaired := time.Since(start)
	if ok, why := h.inSync(); ok {
		t.Log("recovery finished before the second kill could land in it")
	} else {
		t.Logf("recovery in progress (%s); killing node 5", why)
	}
	if err := h.c.Kill(5); err != nil {
		t.Fatal(err)
	}
	// Generous bounds: node 5 must first be declared dead (the failure
	// timeout), and on a loaded 2-core machine the manager's rounds slow.
	var stuck string
	h.waitForWith("the second repair", 90*time.Second, func() bool {
		now, err := h.client.RefreshTLT(context.Background())
		if err != nil {
			stuck = err.Error()
			return false
		}
		for i, r := range now.Rows {
			if r.Has(tract.ServerID{Node: 4}) || r.Has(tract.ServerID{Node: 5}) {
				stuck = fmt.Sprintf("TLT version %d row %d: slots %v pending %v", now.Version, i, r.Slots, r.Pending)
				return false
			}
		}
		return true
	}, func() string { return stuck })
	h.waitInSync(5 * time.Minute)
	took := time.Since(start)
	moved := h.recoveredBytes() - before
	t.Logf("recovery: TLT repaired %v after the kill; both failures re-replicated %v after the first kill; %d MiB copied (%.1f MiB/s)",
		repaired.Round(time.Millisecond), took.Round(time.Millisecond), moved>>20, float64(moved)/(1<<20)/took.Seconds())
	out := h.arbor(false, "blob", "verify", "--progress=never")
	t.Logf("verify: %s", strings.TrimSpace(out))
	for _, b := range blobs {
		h.checkBlob(b[0], b[1])
	}
	tlt := h.arbor(false, "tlt", "--wait", "--no-rows")
	t.Logf("arbor tlt:\n%s", tlt)
}

func (h *harness) waitFor(what string, within time.Duration, cond func() bool) {
	h.t.Helper()
	h.waitForWith(what, within, cond, func() string { return "" })
}

// waitForWith is waitFor whose timeout also reports state(): what the
// condition last saw.
func (h *harness) waitForWith(what string, within time.Duration, cond func() bool, state func() string) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %v waiting for %s %s", within, what, state())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startExtraNode starts a storage node the dev cluster's layout does not
// know (devcluster grows a layout only when it is reopened, which restarts
// every node), with the same cluster id, directory peers and settings.
func (h *harness) startExtraNode(id uint64) {
	h.t.Helper()
	var peers []string
	for _, n := range h.c.Nodes() {
		for _, r := range n.Roles {
			if r == "directory" {
				peers = append(peers, strconv.FormatUint(n.ID, 10)+"="+n.Addr)
			}
		}
	}
	dataDir := filepath.Join(h.c.Dir(), strconv.FormatUint(id, 10))
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		h.t.Fatal(err)
	}
	args := append([]string{"server", "--node-id=" + strconv.FormatUint(id, 10), "--cluster-id=" + h.c.ClusterID(),
		"--data-dir=" + dataDir, "--listen=127.0.0.1:0", "--http=127.0.0.1:0", fmt.Sprintf("--domain=dev-%d", id),
		"--roles=storage", "--directory-peers=" + strings.Join(peers, ",")}, serverArgs...)
	tlsArgs, err := h.c.NodeTLSArgs(id)
	if err != nil {
		h.t.Fatal(err)
	}
	args = append(args, tlsArgs...)
	log, err := os.Create(filepath.Join(dataDir, devcluster.LogFileName))
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command(h.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), clusterTractEnv())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
	})
}

// TestClusterGrowth: a sixth node joins a 5-node cluster; it takes about a
// sixth of the data as pending entries, is committed once caught up, the
// replaced servers drop their copies, and no read or write fails.
func TestClusterGrowth(t *testing.T) {
	h := startCluster(t, 5)
	tab, err := h.client.RefreshTLT(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Two tracts per row (at least 1 GiB with ARBOR_LONG), so every row
	// holds about as much and a sixth of the slots is a sixth of the data.
	size := int64(2 * len(tab.Rows) * tab.TractSize)
	if long() {
		size = max(size, 1<<30)
	}
	id, path := h.putGet(size)
	var total uint64
	for _, n := range h.tractsPerServer() {
		total += n
	}
	// Traffic during the move: rewrite and read back a blob's tracts.
	ctx, cancel := context.WithCancel(context.Background())
	g := tract.NewGUID()
	b, err := h.client.CreateBlob(ctx, g, 0)
	if err != nil {
		t.Fatal(err)
	}
	trafficTracts := len(tab.Rows)
	if _, err := b.Extend(ctx, uint64(trafficTracts)); err != nil {
		t.Fatal(err)
	}
	var ops, failures atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				tr := uint64((i*2 + w) % trafficTracts)
				data := []byte(fmt.Sprintf("tract %d", tr))
				octx, ocancel := context.WithTimeout(context.Background(), time.Minute)
				err := b.WriteTract(octx, tr, data)
				if err == nil {
					var got []byte
					got, err = b.ReadTract(octx, tr)
					if err == nil && !bytes.Equal(got, data) {
						err = fmt.Errorf("read %q", got)
					}
				}
				ocancel()
				ops.Add(1)
				if err != nil {
					failures.Add(1)
					t.Logf("operation on tract %d failed during growth: %v", tr, err)
				}
			}
		}()
	}
	start := time.Now()
	h.startExtraNode(6)
	h.waitFor("the sixth node's rows", time.Minute, func() bool {
		tab, err := h.client.RefreshTLT(context.Background())
		return err == nil && tab.Appearances()[tract.ServerID{Node: 6}] > 0
	})
	h.waitInSync(5 * time.Minute)
	h.waitFor("the replaced servers to drop the moved rows", time.Minute, func() bool {
		var sum uint64
		for _, n := range h.tractsPerServer() {
			sum += n
		}
		return sum <= total+uint64(3*trafficTracts+3)
	})
	moved := time.Since(start)
	cancel()
	wg.Wait()
	per := h.tractsPerServer()
	sixth := per[tract.ServerID{Node: 6}]
	var sum uint64
	for _, n := range per {
		sum += n
	}
	share := float64(sixth) / float64(sum)
	t.Logf("growth took %v; the sixth node holds %d of %d tracts (%.3f, a sixth is %.3f), %d MiB copied to it; %d reads and writes during the move, %d failed",
		moved.Round(time.Millisecond), sixth, sum, share, 1.0/6, h.recoveredOn(6)>>20, ops.Load(), failures.Load())
	if failures.Load() != 0 {
		t.Errorf("%d reads or writes failed during the move", failures.Load())
	}
	if ops.Load() == 0 {
		t.Error("no traffic ran during the move")
	}
	if math.Abs(share-1.0/6) > 0.04 {
		t.Errorf("the sixth node holds %.3f of the tracts, want about 1/6", share)
	}
	h.arbor(false, "blob", "verify", "--progress=never")
	h.checkBlob(id, path)
	st, err := h.dir.ListNodes(context.Background(), &dpb.ListNodesRequest{})
	if err != nil || len(st.Nodes) != 6 {
		t.Fatalf("nodes: %v, %v", st, err)
	}
}

// TestClusterOrphanTractsCollected: a node holding replicas of a blob is
// stopped, declared dead and replaced; the blob is deleted while it is
// away; when the node returns, the replicas it still holds of the deleted
// blob are collected (issue 13 item 3: orphan tracts), and verify passes.
func TestClusterOrphanTractsCollected(t *testing.T) {
	h := startCluster(t, 5)
	keep, keepPath := h.putGet(8 << 20)
	gone, _ := h.putGet(24 << 20)
	const victim = 4
	nodeDir := filepath.Join(h.c.Dir(), strconv.Itoa(victim))
	files := func() int {
		n := 0
		_ = filepath.WalkDir(nodeDir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), gone+".") {
				n++
			}
			return nil
		})
		return n
	}
	held := files()
	if held == 0 {
		t.Fatalf("node %d holds no tract of blob %s: nothing to orphan", victim, gone)
	}
	ctx := context.Background()
	tab, err := h.client.RefreshTLT(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.StopNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the TLT repair", 90*time.Second, func() bool {
		now, err := h.client.RefreshTLT(ctx)
		if err != nil || now.Version == tab.Version {
			return false
		}
		for _, r := range now.Rows {
			if r.Has(tract.ServerID{Node: victim}) {
				return false
			}
		}
		return true
	})
	h.arbor(false, "blob", "rm", gone)
	if n := files(); n != held {
		t.Fatalf("node %d's files changed while it was stopped: %d, was %d", victim, n, held)
	}
	if err := h.c.StartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d returned holding %d tracts of the deleted blob %s", victim, held, gone)
	h.waitForWith("the orphan tracts to be collected", 3*time.Minute, func() bool {
		// The scrubber runs on its own too; a pass is asked for so that
		// the test need not wait for its interval.
		_, _ = h.client.ScrubNode(ctx, victim, false)
		return files() == 0
	}, func() string { return fmt.Sprintf("(%d files left on node %d)", files(), victim) })
	h.waitInSync(5 * time.Minute)
	h.arbor(false, "blob", "verify", "--progress=never")
	h.checkBlob(keep, keepPath)
	if out := h.arbor(true, "blob", "stat", gone); !strings.Contains(out, "does not exist") {
		t.Fatalf("stat of the deleted blob: %s", out)
	}
}
