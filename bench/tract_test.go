package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// tractBlobBytes is the size of each blob the tract benchmarks write and
// read: 64 tracts of the default 4 MiB.
const tractBlobBytes = 256 << 20

// fioBytes is how much fio writes and reads for the disk reference, in
// fioJobs parallel streams (the tract store keeps many tracts in flight,
// so the disk's reference is its parallel bandwidth).
const (
	fioBytes = 1 << 30
	fioJobs  = 8
)

// fioResult runs fio with args on a file in dir and returns the job's
// bandwidth in bytes per second for op ("read" or "write").
func fioResult(b *testing.B, dir, op string, args ...string) float64 {
	b.Helper()
	full := append([]string{"--name=ref", "--directory=" + dir, "--size=" + strconv.Itoa(fioBytes/fioJobs), "--numjobs=" + strconv.Itoa(fioJobs),
		"--group_reporting", "--ioengine=psync", "--output-format=json"}, args...)
	out, err := exec.Command("fio", full...).Output()
	if err != nil {
		b.Fatalf("fio %s: %v (install it with scripts/install-deps.sh)", strings.Join(full, " "), err)
	}
	var res struct {
		Jobs []map[string]json.RawMessage `json:"jobs"`
	}
	var stats struct {
		BWBytes float64 `json:"bw_bytes"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	if err := json.Unmarshal(res.Jobs[0][op], &stats); err != nil || stats.BWBytes == 0 {
		b.Fatalf("fio %s bandwidth: %v\n%s", op, err, out)
	}
	return stats.BWBytes
}

// dropCaches empties the page cache so reads come from the disk; it
// reports whether it could (it needs root).
func dropCaches() bool {
	exec.Command("sync").Run()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0) == nil
}

type tractBench struct {
	c      *devcluster.Cluster
	dir    *directory.Client
	client *tract.Client
}

func startTractCluster(b *testing.B) *tractBench {
	b.Helper()
	return startTractClusterWith(b, devcluster.Options{
		Nodes:      5,
		ServerArgs: []string{"--heartbeat-interval=500ms", "--node-dead-timeout=4s", "--log-level=warn"},
		Env:        []string{tract.OptionsEnv + "=manager-settle=1s,manager-tick=500ms,drop-grace=2s"},
	})
}

// startTractClusterWith starts a dev cluster, connects a tract client and
// waits until every row is in sync.
func startTractClusterWith(b *testing.B, opts devcluster.Options) *tractBench {
	b.Helper()
	c := devclustertest.Start(b, opts)
	dir, err := directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dir.Close() })
	cl, err := tract.NewClient(tract.ClientConfig{Directory: dir, DialOptions: c.DialOptions()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	tb := &tractBench{c: c, dir: dir, client: cl}
	tb.waitInSync(b, 2*time.Minute)
	return tb
}

// waitInSync waits until no tractserver reports a row catching up and the
// TLT has no pending entry.
func (tb *tractBench) waitInSync(b *testing.B, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for {
		ok := true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t, err := tb.client.RefreshTLT(ctx)
		if err != nil {
			ok = false
		} else {
			for _, r := range t.Rows {
				if len(r.Pending) > 0 {
					ok = false
				}
			}
			seen := map[uint64]bool{}
			for _, s := range t.Servers() {
				if seen[s.Node] {
					continue
				}
				seen[s.Node] = true
				st, err := tb.client.NodeStatus(ctx, s.Node, false)
				if err != nil {
					ok = false
					break
				}
				for _, d := range st.Disks {
					if d.RowsCatchingUp > 0 || st.TltVersion != t.Version {
						ok = false
					}
				}
			}
		}
		cancel()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("rows not in sync after %v", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeBlob writes a new blob of size bytes with the client's simultaneous
// limit of writes in flight, in tract order.
func (tb *tractBench) writeBlob(b *testing.B, data []byte, replication int) tract.GUID {
	b.Helper()
	ctx := context.Background()
	ts, _ := tb.client.TractSize(ctx)
	blob, err := tb.client.CreateBlob(ctx, tract.NewGUID(), replication)
	if err != nil {
		b.Fatal(err)
	}
	n := uint64((len(data) + ts - 1) / ts)
	if _, err := blob.Extend(ctx, n); err != nil {
		b.Fatal(err)
	}
	ops := make([]*tract.Op[struct{}], 0, n)
	for i := range n {
		ops = append(ops, blob.WriteTractAsync(ctx, i, data[int(i)*ts:min(len(data), int(i+1)*ts)]))
	}
	for _, op := range ops {
		if _, err := op.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	return blob.GUID()
}

func (tb *tractBench) readBlob(b *testing.B, g tract.GUID) int {
	b.Helper()
	blob, err := tb.client.OpenBlob(context.Background(), g)
	if err != nil {
		b.Fatal(err)
	}
	return readOpen(b, blob)
}

// readOpen reads every tract of an open blob, all in flight at once.
func readOpen(b *testing.B, blob *tract.Blob) int {
	b.Helper()
	ctx := context.Background()
	n := blob.Info().Tracts
	ops := make([]*tract.Op[[]byte], 0, n)
	for i := range n {
		ops = append(ops, blob.ReadTractAsync(ctx, i))
	}
	total := 0
	for _, op := range ops {
		d, err := op.Wait()
		if err != nil {
			b.Fatal(err)
		}
		total += len(d)
	}
	return total
}

func (tb *tractBench) waitFor(b *testing.B, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (tb *tractBench) recoveredBytes() uint64 {
	return tb.sumDisks(func(d *tpb.DiskStatus) uint64 { return d.RecoveredBytes })
}

// storedBytes sums the bytes every running tractserver stores.
func (tb *tractBench) storedBytes() uint64 {
	return tb.sumDisks(func(d *tpb.DiskStatus) uint64 { return d.Bytes })
}

// sumDisks sums a figure over the disks of every running node (a node
// that does not answer counts nothing).
func (tb *tractBench) sumDisks(f func(*tpb.DiskStatus) uint64) uint64 {
	var sum uint64
	for _, n := range tb.c.Nodes() {
		if !n.Running {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := tb.client.NodeStatus(ctx, n.ID, false)
		cancel()
		if err != nil {
			continue
		}
		for _, d := range st.Disks {
			sum += f(d)
		}
	}
	return sum
}

// diskReference measures this disk with fio: sequential synced writes (an
// fsync per 4 MiB, as every tract write is synced) and reads with a cold
// page cache (dropped, or O_DIRECT without root), fioJobs streams each.
func diskReference(b *testing.B) (write, read float64) {
	b.Helper()
	refDir := b.TempDir()
	write = fioResult(b, refDir, "write", "--rw=write", "--bs=4M", "--fsync=1")
	canDrop := dropCaches()
	readArgs := []string{"--rw=read", "--bs=4M"}
	if !canDrop {
		readArgs = append(readArgs, "--direct=1")
	}
	read = fioResult(b, refDir, "read", readArgs...)
	if files, _ := filepath.Glob(filepath.Join(refDir, "ref.*")); len(files) > 0 {
		for _, f := range files {
			os.Remove(f)
		}
	}
	b.Logf("fio on this disk, %d streams: sequential write (fsync per 4 MiB) %.0f MB/s, read %.0f MB/s (page cache dropped: %v)", fioJobs,
		write/1e6, read/1e6, canDrop)
	return write, read
}

// recoveries runs b.N recoveries of node: it is killed, and once the TLT
// is repaired (it was declared dead) the time until every row is in sync
// is measured, with the bytes the catch-ups copied; then it comes back and
// gets rows again. Only the catch-ups are timed.
func (tb *tractBench) recoveries(b *testing.B, node uint64) (copied uint64, elapsed time.Duration) {
	b.Helper()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		tb.waitInSync(b, 5*time.Minute)
		t0, err := tb.client.RefreshTLT(ctx)
		if err != nil {
			b.Fatal(err)
		}
		before := tb.recoveredBytes()
		if err := tb.c.Kill(node); err != nil {
			b.Fatal(err)
		}
		tb.waitFor(b, "the TLT repair", func() bool {
			t, err := tb.client.RefreshTLT(ctx)
			return err == nil && t.Version > t0.Version
		})
		b.StartTimer()
		start := time.Now()
		tb.waitInSync(b, 10*time.Minute)
		elapsed += time.Since(start)
		b.StopTimer()
		copied += tb.recoveredBytes() - before
		// The node comes back for the next round (it gets rows again).
		if err := tb.c.StartNode(ctx, node); err != nil {
			b.Fatal(err)
		}
		if err := tb.c.WaitHealthy(ctx); err != nil {
			b.Fatal(err)
		}
		tb.waitFor(b, fmt.Sprintf("node %d to be given rows again", node), func() bool {
			t, err := tb.client.RefreshTLT(ctx)
			return err == nil && t.Appearances()[tract.ServerID{Node: node}] > 0
		})
		tb.waitInSync(b, 5*time.Minute)
		b.StartTimer()
	}
	return copied, elapsed
}

// BenchmarkTractStore measures one client of a 5-node dev cluster (one
// tractserver per node, all on this machine's one disk): sequential write
// and read of 256 MiB blobs with 1 and 3 replicas, and failure recovery
// bandwidth, next to fio on the same disk in the same run. Every write is
// synced (the tract store's default), so the write reference is fio
// writing 4 MiB blocks with an fsync after each; the read reference reads
// with a cold page cache, as the tract reads do when the caches can be
// dropped (root). fio runs 8 streams, as the client keeps many tracts in
// flight. With every node on one disk, a 3-replica write puts
// three times its bytes on the disk: disk_ratio counts them.
func BenchmarkTractStore(b *testing.B) {
	tb := startTractCluster(b)
	fioWrite, fioRead := diskReference(b)
	data := make([]byte, tractBlobBytes)
	rand.Read(data)
	blobs := map[int]tract.GUID{}
	for _, k := range []int{1, 3} {
		b.Run(fmt.Sprintf("write/replication=%d", k), func(b *testing.B) {
			b.SetBytes(tractBlobBytes)
			start := time.Now()
			for range b.N {
				blobs[k] = tb.writeBlob(b, data, k)
			}
			bw := float64(b.N*tractBlobBytes) / time.Since(start).Seconds()
			b.ReportMetric(bw/1e6, "MB/s")
			b.ReportMetric(fioWrite/1e6, "fio_MB/s")
			b.ReportMetric(bw/fioWrite, "ratio")
			b.ReportMetric(float64(k)*bw/fioWrite, "disk_ratio")
		})
		b.Run(fmt.Sprintf("read/replication=%d", k), func(b *testing.B) {
			b.SetBytes(tractBlobBytes)
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				dropCaches()
				b.StartTimer()
				start := time.Now()
				if n := tb.readBlob(b, blobs[k]); n != tractBlobBytes {
					b.Fatalf("read %d bytes", n)
				}
				elapsed += time.Since(start)
			}
			bw := float64(b.N*tractBlobBytes) / elapsed.Seconds()
			b.ReportMetric(bw/1e6, "MB/s")
			b.ReportMetric(fioRead/1e6, "fio_MB/s")
			b.ReportMetric(bw/fioRead, "ratio")
		})
	}
	b.Run("recovery", func(b *testing.B) {
		// About 1 GiB of 3-replica data in the cluster, then node 5 is
		// killed; measured: from the TLT repair to every row in sync.
		for range 3 {
			tb.writeBlob(b, data, 3)
		}
		copied, elapsed := tb.recoveries(b, 5)
		bw := float64(copied) / elapsed.Seconds()
		b.ReportMetric(bw/1e6, "MB/s")
		b.ReportMetric(float64(copied)/float64(b.N)/1e6, "MB_copied/op")
		b.ReportMetric(fioWrite/1e6, "fio_write_MB/s")
		b.ReportMetric(bw/fioWrite, "ratio")
	})
}
