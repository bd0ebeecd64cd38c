package bench

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/tract"
)

// startECCluster starts an 8-node dev cluster whose TLT rows have 7 slots:
// ec:5+2 stripes use all of them, 3-replica blobs the first 3; one node
// outside each row is the free failure domain a dead server's slot goes
// to. The failure detector is slow enough that a degraded read is over
// before a killed node is declared dead.
func startECCluster(b *testing.B) *tractBench {
	b.Helper()
	return startTractClusterWith(b, devcluster.Options{
		Nodes:      8,
		ServerArgs: []string{"--heartbeat-interval=500ms", "--node-dead-timeout=20s", "--log-level=warn"},
		Env:        []string{tract.OptionsEnv + "=replication=7,manager-settle=1s,manager-tick=500ms,drop-grace=2s,orphan-grace=1s"},
	})
}

// writeLayoutBlob is writeBlob with a layout.
func (tb *tractBench) writeLayoutBlob(b *testing.B, data []byte, l tract.Layout) tract.GUID {
	b.Helper()
	ctx := context.Background()
	ts, _ := tb.client.TractSize(ctx)
	n := uint64((len(data) + ts - 1) / ts)
	blob, err := tb.client.CreateBlobLayout(ctx, tract.NewGUID(), l, n)
	if err != nil {
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

// BenchmarkErasureCoding measures one client of an 8-node dev cluster
// (one tractserver per node, all on this machine's one disk, TLT rows of
// 7): sequential write and read of 256 MiB blobs as ec:5+2 stripes and
// with 3 replicas, a degraded read of the ec:5+2 blob with two nodes
// killed (not yet declared dead), the bytes stored per byte of data, and
// the recovery of the ec:5+2 blobs when a node dies (its slots go to the
// node outside each row, which decodes its shards from the survivors),
// next to fio on the same disk in the same run (as BenchmarkTractStore).
func BenchmarkErasureCoding(b *testing.B) {
	tb := startECCluster(b)
	fioWrite, fioRead := diskReference(b)
	data := make([]byte, tractBlobBytes)
	rand.Read(data)
	ec := tract.Layout{EC: tract.ECLayout{Data: tract.DefaultECData, Parity: tract.DefaultECParity}}
	layouts := []tract.Layout{ec, {Replicas: 3}}
	blobs := map[tract.Layout][]tract.GUID{}
	stored := map[tract.Layout]float64{}
	for _, l := range layouts {
		b.Run("write/"+l.String(), func(b *testing.B) {
			b.SetBytes(tractBlobBytes)
			before := tb.storedBytes()
			start := time.Now()
			for range b.N {
				blobs[l] = append(blobs[l], tb.writeLayoutBlob(b, data, l))
			}
			bw := float64(b.N*tractBlobBytes) / time.Since(start).Seconds()
			stored[l] = float64(tb.storedBytes()-before) / float64(b.N*tractBlobBytes)
			b.ReportMetric(bw/1e6, "MB/s")
			b.ReportMetric(fioWrite/1e6, "fio_MB/s")
			b.ReportMetric(bw/fioWrite, "ratio")
			b.ReportMetric(stored[l], "stored_bytes/byte")
			b.ReportMetric(stored[l]*bw/fioWrite, "disk_ratio")
		})
		b.Run("read/"+l.String(), func(b *testing.B) {
			b.SetBytes(tractBlobBytes)
			var elapsed time.Duration
			for range b.N {
				b.StopTimer()
				dropCaches()
				b.StartTimer()
				start := time.Now()
				if n := tb.readBlob(b, blobs[l][0]); n != tractBlobBytes {
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
	b.Run("degraded-read/"+ec.String()+"/2-nodes-down", func(b *testing.B) {
		// Nodes 7 and 8 (not directory voters) are killed; every stripe
		// in a row holding both misses 2 shards (6 rows in 8), the others
		// 1. The blob is opened first: its metadata row may have lost its
		// primary, which is replaced only once the node is declared dead.
		// Both come back before they are declared dead.
		ctx := context.Background()
		blob, err := tb.client.OpenBlob(ctx, blobs[ec][0])
		if err != nil {
			b.Fatal(err)
		}
		tb.waitInSync(b, 5*time.Minute)
		for _, n := range []uint64{7, 8} {
			if err := tb.c.Kill(n); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(tractBlobBytes)
		degraded := tb.client.DegradedReads()
		var elapsed time.Duration
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			dropCaches()
			b.StartTimer()
			start := time.Now()
			if n := readOpen(b, blob); n != tractBlobBytes {
				b.Fatalf("read %d bytes", n)
			}
			elapsed += time.Since(start)
		}
		b.StopTimer()
		bw := float64(b.N*tractBlobBytes) / elapsed.Seconds()
		b.ReportMetric(bw/1e6, "MB/s")
		b.ReportMetric(fioRead/1e6, "fio_MB/s")
		b.ReportMetric(bw/fioRead, "ratio")
		b.ReportMetric(float64(tb.client.DegradedReads()-degraded)/float64(b.N*int(blob.Info().Tracts)), "decoded_fraction")
		for _, n := range []uint64{7, 8} {
			if err := tb.c.StartNode(ctx, n); err != nil {
				b.Fatal(err)
			}
		}
		if err := tb.c.WaitHealthy(ctx); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("recovery/"+ec.String(), func(b *testing.B) {
		// Node 7 is killed; once it is declared dead its slot in each of
		// its rows goes to the row's free node, which decodes its shards
		// from the survivors (and copies the 3-replica tracts of rows
		// where node 7 held one of the first 3 slots). Measured: from the
		// TLT repair to every row in sync; the bytes are those the new
		// members wrote (they read about 5 times as many).
		copied, elapsed := tb.recoveries(b, 7)
		bw := float64(copied) / elapsed.Seconds()
		b.ReportMetric(bw/1e6, "MB/s")
		b.ReportMetric(float64(copied)/float64(b.N)/1e6, "MB_rebuilt/op")
		b.ReportMetric(fioWrite/1e6, "fio_write_MB/s")
		b.ReportMetric(bw/fioWrite, "ratio")
	})
	b.Logf("bytes stored per byte of data: %s %.3f, %s %.3f", ec, stored[ec], layouts[1], stored[layouts[1]])
}
