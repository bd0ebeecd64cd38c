package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/gateway/nfs"
)

// The NFS benchmarks run the file-system benchmarks' cluster (5 nodes, a
// gateway on each, the file system "bench" also mounted with FUSE) and
// measure, in the same run: creates, stats (LOOKUP) and removes through
// the gateways with one NFS client connection per worker (workers spread
// over the gateways), next to the same on the FUSE mount and on the
// local disk; and a sequential write (1 MiB UNSTABLE WRITEs, then
// COMMIT) and read (1 MiB READs, through another gateway) next to the
// mount's and the disk's. Command: make bench BENCH=BenchmarkNFS

// nfsSeqBytes is the size of the sequential write and read.
const nfsSeqBytes = 256 << 20

func dialGateway(b *testing.B, addr string) (*nfs.Client, []byte) {
	b.Helper()
	c, err := nfs.Dial(context.Background(), addr, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	root, err := c.Mount("/bench")
	if err != nil {
		b.Fatalf("MNT /bench at %s: %v", addr, err)
	}
	return c, root
}

// nfsMdtest is mdtest through the gateways: each worker creates, then
// looks up, then removes n files in its own directory.
func nfsMdtest(b *testing.B, gws []string, run string, workers, n int) (create, stat, remove float64) {
	b.Helper()
	type worker struct {
		c   *nfs.Client
		dir []byte
	}
	ws := make([]worker, workers)
	for w := range workers {
		c, root := dialGateway(b, gws[w%len(gws)])
		dir, err := c.Mkdir(root, fmt.Sprintf("nfsmd-%s-%d-%d", run, workers, w), 0o755)
		if err != nil {
			b.Fatal(err)
		}
		ws[w] = worker{c, dir}
	}
	phase := func(op func(w worker, name string) error) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for _, w := range ws {
			wg.Go(func() {
				for i := range n {
					if err := op(w, fmt.Sprintf("f%06d", i)); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return float64(workers*n) / time.Since(start).Seconds()
	}
	create = phase(func(w worker, name string) error { _, err := w.c.Create(w.dir, name, 0o644); return err })
	stat = phase(func(w worker, name string) error { _, err := w.c.Lookup(w.dir, name); return err })
	remove = phase(func(w worker, name string) error { return w.c.Remove(w.dir, name) })
	return create, stat, remove
}

// nfsSeqWriteRead writes size bytes through one gateway (1 MiB UNSTABLE
// writes, COMMIT at the end) and reads them back through another.
func nfsSeqWriteRead(b *testing.B, gws []string, name string, size int) (write, read float64) {
	b.Helper()
	wc, root := dialGateway(b, gws[0])
	rc, rroot := dialGateway(b, gws[1%len(gws)])
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	fh, err := wc.Create(root, name, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	var verf []byte
	for off := 0; off < size; off += len(buf) {
		v, err := wc.Write(fh, uint64(off), buf, nfs.Unstable)
		if err != nil {
			b.Fatal(err)
		}
		if verf != nil && string(v) != string(verf) {
			b.Fatal("write verifier changed during the run")
		}
		verf = v
	}
	if v, err := wc.Commit(fh); err != nil || string(v) != string(verf) {
		b.Fatalf("COMMIT: %v (verifier %x, writes' %x)", err, v, verf)
	}
	write = float64(size) / time.Since(start).Seconds()
	start = time.Now()
	rfh, err := rc.Lookup(rroot, name)
	if err != nil {
		b.Fatal(err)
	}
	total := 0
	for {
		data, eof, err := rc.Read(rfh, uint64(total), uint32(len(buf)))
		if err != nil {
			b.Fatal(err)
		}
		total += len(data)
		if eof || len(data) == 0 {
			break
		}
	}
	if total != size {
		b.Fatalf("read %d bytes, wrote %d", total, size)
	}
	read = float64(size) / time.Since(start).Seconds()
	if err := wc.Remove(root, name); err != nil {
		b.Fatal(err)
	}
	return write, read
}

func BenchmarkNFS(b *testing.B) {
	cluster, mnt := startFSMount(b)
	gws := cluster.NFSAddrs()
	if len(gws) < 2 {
		b.Fatalf("%d gateways", len(gws))
	}
	local := b.TempDir()
	b.Run("mdtest", func(b *testing.B) {
		for _, workers := range []int{1, 16} {
			b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
				var c, s, r, fc, fsr, fr, lc, ls, lr float64
				for i := 0; i < b.N; i++ {
					run := fmt.Sprint(i)
					c, s, r = nfsMdtest(b, gws, run, workers, fsFilesPerWorker)
					fc, fsr, fr, _ = mdtest(b, filepath.Join(mnt, "nfsbench"+run), workers, fsFilesPerWorker)
					lc, ls, lr, _ = mdtest(b, filepath.Join(local, "run"+run), workers, fsFilesPerWorker)
				}
				b.ReportMetric(c, "nfs-creates/s")
				b.ReportMetric(s, "nfs-lookups/s")
				b.ReportMetric(r, "nfs-removes/s")
				b.ReportMetric(fc, "fuse-creates/s")
				b.ReportMetric(fsr, "fuse-stats/s")
				b.ReportMetric(fr, "fuse-removes/s")
				b.ReportMetric(lc, "disk-creates/s")
				b.ReportMetric(ls, "disk-stats/s")
				b.ReportMetric(lr, "disk-removes/s")
				b.ReportMetric(c/fc, "create-vs-fuse")
				b.ReportMetric(c/lc, "create-vs-disk")
			})
		}
	})
	b.Run("seq256MiB", func(b *testing.B) {
		var w, r, fw, fr, lw, lr float64
		for i := 0; i < b.N; i++ {
			w, r = nfsSeqWriteRead(b, gws, fmt.Sprintf("seq-nfs-%d", i), nfsSeqBytes)
			fw, fr = seqWriteRead(b, mnt, nfsSeqBytes)
			lw, lr = seqWriteRead(b, local, nfsSeqBytes)
		}
		b.ReportMetric(w/(1<<20), "nfs-write-MiB/s")
		b.ReportMetric(r/(1<<20), "nfs-read-MiB/s")
		b.ReportMetric(fw/(1<<20), "fuse-write-MiB/s")
		b.ReportMetric(fr/(1<<20), "fuse-read-MiB/s")
		b.ReportMetric(lw/(1<<20), "disk-write-MiB/s")
		b.ReportMetric(lr/(1<<20), "disk-read-MiB/s")
		b.ReportMetric(w/fw, "write-vs-fuse")
		b.ReportMetric(r/fr, "read-vs-fuse")
	})
}
