package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/extentstore"
	"github.com/arbor-storage/arbor/internal/btree/tuple"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/fuse"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/tract"
)

// The file-system benchmarks run a 5-node dev cluster (3 replicas), mount
// its file system with a real `arbor mount` process, and run the same
// workload on the mount and on a directory of the local disk in the same
// run. Command: make bench BENCH=BenchmarkFS

// fsFilesPerWorker is how many files each mdtest-style worker creates,
// stats and removes.
const fsFilesPerWorker = 250

// fsSeqBytes is the size of the sequential write and read.
const fsSeqBytes = 1 << 30

// startFSMount starts a cluster, creates the file system "bench" and
// mounts it.
func startFSMount(b *testing.B) (*devcluster.Cluster, string) {
	b.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		b.Skipf("no /dev/fuse: %v", err)
	}
	bin := devclustertest.Binary(b)
	c := devclustertest.Start(b, devcluster.Options{Nodes: 5, Binary: bin, ServerArgs: []string{"--log-level=warn"}})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.Command(bin, "fs", "create", "bench", "--dir", c.Dir()).CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("arbor fs create: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "mount", "bench", dir, "--dir", c.Dir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	for !fuse.Mounted(dir) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			b.Fatalf("not mounted:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			_ = exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
	})
	return c, dir
}

// mdtest runs workers in parallel, each creating, then stating, then
// removing n empty files in its own directory under root; it returns the
// rate of each phase in operations per second, and the median latency of
// one create (open with O_CREAT|O_EXCL, then close).
func mdtest(b *testing.B, root string, workers, n int) (create, stat, remove float64, createP50 time.Duration) {
	b.Helper()
	dirs := make([]string, workers)
	for w := range workers {
		dirs[w] = filepath.Join(root, fmt.Sprintf("md-%d-%d", workers, w))
		if err := os.MkdirAll(dirs[w], 0o755); err != nil {
			b.Fatal(err)
		}
	}
	var latMu sync.Mutex
	var lats []time.Duration
	phase := func(op func(path string) error) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for i := range n {
					t := time.Now()
					if err := op(filepath.Join(dirs[w], fmt.Sprintf("f%06d", i))); err != nil {
						errs <- err
						return
					}
					latMu.Lock()
					lats = append(lats, time.Since(t))
					latMu.Unlock()
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
	create = phase(func(p string) error {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	})
	slices.Sort(lats)
	createP50 = lats[len(lats)/2]
	stat = phase(func(p string) error { _, err := os.Stat(p); return err })
	remove = phase(os.Remove)
	return create, stat, remove, createP50
}

// seqWriteRead writes size bytes to a new file in dir with 1 MiB writes
// (fsync before close), drops the page cache, reads it back, and returns
// both rates in bytes per second.
func seqWriteRead(b *testing.B, dir string, size int) (write, read float64) {
	b.Helper()
	p := filepath.Join(dir, "seq")
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	for off := 0; off < size; off += len(buf) {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	write = float64(size) / time.Since(start).Seconds()
	dropCaches()
	start = time.Now()
	f, err = os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	total := 0
	for {
		n, err := f.Read(buf)
		total += n
		if err != nil || n == 0 {
			break
		}
	}
	f.Close()
	if total != size {
		b.Fatalf("read %d bytes, wrote %d", total, size)
	}
	read = float64(size) / time.Since(start).Seconds()
	if err := os.Remove(p); err != nil {
		b.Fatal(err)
	}
	return write, read
}

// blobPutGet stores a local file of size bytes (the sequential pattern)
// with `arbor blob put`, drops the page cache, fetches it back with `arbor
// blob get` into a local file (unsynced: page cache), and returns both rates in bytes per second.
func blobPutGet(b *testing.B, c *devcluster.Cluster, dir string, size int) (put, get float64) {
	b.Helper()
	p := filepath.Join(dir, "blob-src")
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	for off := 0; off < size; off += len(buf) {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	defer os.Remove(p)
	bin := devclustertest.Binary(b)
	start := time.Now()
	out, err := exec.Command(bin, "blob", "put", p, "--dir", c.Dir(), "--progress", "never").Output()
	if err != nil {
		b.Fatalf("arbor blob put: %v", err)
	}
	put = float64(size) / time.Since(start).Seconds()
	id := strings.TrimSpace(string(out))
	dropCaches()
	start = time.Now()
	dst := filepath.Join(dir, "blob-dst")
	defer os.Remove(dst)
	if out, err := exec.Command(bin, "blob", "get", id, dst, "--dir", c.Dir(), "--progress", "never").CombinedOutput(); err != nil {
		b.Fatalf("arbor blob get: %v\n%s", err, out)
	}
	get = float64(size) / time.Since(start).Seconds()
	if out, err := exec.Command(bin, "blob", "rm", id, "--dir", c.Dir()).CombinedOutput(); err != nil {
		b.Fatalf("arbor blob rm: %v\n%s", err, out)
	}
	return put, get
}

func BenchmarkFS(b *testing.B) {
	cluster, mnt := startFSMount(b)
	local := b.TempDir()
	b.Run("mdtest", func(b *testing.B) {
		for _, workers := range []int{1, 16} {
			b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
				var c, s, r, lc, ls, lr float64
				var p50, lp50 time.Duration
				for i := 0; i < b.N; i++ {
					root := filepath.Join(mnt, fmt.Sprintf("run%d", i))
					c, s, r, p50 = mdtest(b, root, workers, fsFilesPerWorker)
					lroot := filepath.Join(local, fmt.Sprintf("run%d", i))
					lc, ls, lr, lp50 = mdtest(b, lroot, workers, fsFilesPerWorker)
				}
				b.ReportMetric(float64(p50.Microseconds())/1000, "create-p50-ms")
				b.ReportMetric(float64(lp50.Microseconds())/1000, "disk-create-p50-ms")
				b.ReportMetric(c, "creates/s")
				b.ReportMetric(s, "stats/s")
				b.ReportMetric(r, "removes/s")
				b.ReportMetric(lc, "disk-creates/s")
				b.ReportMetric(ls, "disk-stats/s")
				b.ReportMetric(lr, "disk-removes/s")
				b.ReportMetric(c/lc, "create-ratio")
				b.ReportMetric(s/ls, "stat-ratio")
				b.ReportMetric(r/lr, "remove-ratio")
			})
		}
	})
	b.Run("seq1GiB", func(b *testing.B) {
		var w, r, lw, lr, bw, br float64
		for i := 0; i < b.N; i++ {
			w, r = seqWriteRead(b, mnt, fsSeqBytes)
			lw, lr = seqWriteRead(b, local, fsSeqBytes)
			bw, br = blobPutGet(b, cluster, local, fsSeqBytes)
		}
		// Issue 11's reference for the FUSE data path: the same bytes
		// through the blob CLI (tract store, no FUSE) in the same run.
		b.ReportMetric(bw/(1<<20), "blob-put-MiB/s")
		b.ReportMetric(br/(1<<20), "blob-get-MiB/s")
		b.ReportMetric(w/bw, "write-vs-blob")
		b.ReportMetric(r/br, "read-vs-blob")
		b.ReportMetric(w/(1<<20), "write-MiB/s")
		b.ReportMetric(r/(1<<20), "read-MiB/s")
		b.ReportMetric(lw/(1<<20), "disk-write-MiB/s")
		b.ReportMetric(lr/(1<<20), "disk-read-MiB/s")
		b.ReportMetric(w/lw, "write-ratio")
		b.ReportMetric(r/lr, "read-ratio")
	})
	b.Run("gitclone", func(b *testing.B) { benchGitClone(b, mnt, b.TempDir()) })
	b.Run("untar", func(b *testing.B) {
		tarball := untarSource(b)
		entries := countEntries(b, tarball)
		var t, lt, ls, lls, cp, lcp time.Duration
		for i := 0; i < b.N; i++ {
			dir, ldir := filepath.Join(mnt, fmt.Sprintf("untar%d", i)), filepath.Join(local, fmt.Sprintf("untar%d", i))
			t = untar(b, tarball, dir)
			lt = untar(b, tarball, ldir)
			ls = listLong(b, dir)
			lls = listLong(b, ldir)
			// The tree copied back out to the local disk is the same.
			cp = copyTree(b, dir, filepath.Join(local, fmt.Sprintf("copy%d", i)))
			lcp = copyTree(b, ldir, filepath.Join(local, fmt.Sprintf("lcopy%d", i)))
			if out, err := exec.Command("diff", "-r", "--no-dereference", ldir, filepath.Join(local, fmt.Sprintf("copy%d", i))).CombinedOutput(); err != nil {
				b.Fatalf("the tree copied out of the mount differs from the local one: %v\n%.2000s", err, out)
			}
		}
		b.ReportMetric(cp.Seconds(), "cpa-s")
		b.ReportMetric(lcp.Seconds(), "disk-cpa-s")
		b.ReportMetric(lcp.Seconds()/cp.Seconds(), "cpa-ratio")
		b.ReportMetric(float64(entries), "entries")
		b.ReportMetric(t.Seconds(), "s")
		b.ReportMetric(lt.Seconds(), "disk-s")
		b.ReportMetric(float64(entries)/t.Seconds(), "entries/s")
		b.ReportMetric(float64(entries)/lt.Seconds(), "disk-entries/s")
		b.ReportMetric(lt.Seconds()/t.Seconds(), "ratio")
		b.ReportMetric(ls.Seconds(), "lsR-s")
		b.ReportMetric(lls.Seconds(), "disk-lsR-s")
		b.ReportMetric(lls.Seconds()/ls.Seconds(), "lsR-ratio")
	})
}

// copyTree runs `cp -a src dst` with cold caches and returns the time.
func copyTree(b *testing.B, src, dst string) time.Duration {
	b.Helper()
	dropCaches()
	start := time.Now()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		b.Fatalf("cp -a %s %s: %v\n%s", src, dst, err, out)
	}
	return time.Since(start)
}

// gitFiles is how many files the repository BenchmarkFS/gitclone clones
// holds.
const gitFiles = 3000

// BenchmarkFS's git clone: a local repository of gitFiles files (the
// first ones of the untar source, or generated) cloned into the mount and
// into the local disk, in the same run.
func benchGitClone(b *testing.B, mnt, local string) {
	repo := filepath.Join(local, "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range gitFiles {
		p := filepath.Join(repo, fmt.Sprintf("d%02d", i/100), fmt.Sprintf("f%04d.c", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		content := strings.Repeat(fmt.Sprintf("/* file %d */ int x%d;\n", i, i), 1+i%300)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	git := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@arbor", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@arbor")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git(repo, "init", "-q")
	git(repo, "add", ".")
	git(repo, "commit", "-q", "-m", "bench")
	clone := func(dst string) time.Duration {
		dropCaches()
		start := time.Now()
		// --no-local: a real clone (objects copied and checked out), not
		// hard links to the source's objects.
		git(local, "clone", "-q", "--no-local", repo, dst)
		return time.Since(start)
	}
	var t, lt time.Duration
	for i := 0; i < b.N; i++ {
		t = clone(filepath.Join(mnt, fmt.Sprintf("clone%d", i)))
		lt = clone(filepath.Join(local, fmt.Sprintf("clone%d", i)))
	}
	b.ReportMetric(float64(gitFiles), "files")
	b.ReportMetric(t.Seconds(), "s")
	b.ReportMetric(lt.Seconds(), "disk-s")
	b.ReportMetric(lt.Seconds()/t.Seconds(), "ratio")
}

// linuxSource is the tarball of Debian's linux-source-6.1 package
// (`make bench` installs it: scripts/install-deps.sh --bench).
const linuxSource = "/usr/src/linux-source-6.1.tar.xz"

// untarSource returns the uncompressed tarball the untar benchmark
// extracts: $ARBOR_UNTAR, else the Linux source, else (with a note) Go's
// own net package. Compressed tarballs are decompressed first, so both
// runs measure the file system, not xz.
func untarSource(b *testing.B) string {
	b.Helper()
	tarball := os.Getenv("ARBOR_UNTAR")
	if tarball == "" {
		if _, err := os.Stat(linuxSource); err == nil {
			tarball = linuxSource
		}
	}
	if tarball == "" {
		b.Logf("no %s: untarring Go's src/net instead (install it with scripts/install-deps.sh --bench)", linuxSource)
		tarball = filepath.Join(b.TempDir(), "src.tar")
		src := filepath.Join(runtimeGOROOT(b), "src", "net")
		if out, err := exec.Command("tar", "-cf", tarball, "-C", filepath.Dir(src), filepath.Base(src)).CombinedOutput(); err != nil {
			b.Fatalf("tar: %v\n%s", err, out)
		}
		return tarball
	}
	if !strings.HasSuffix(tarball, ".xz") {
		return tarball
	}
	plain := filepath.Join(b.TempDir(), strings.TrimSuffix(filepath.Base(tarball), ".xz"))
	out, err := os.Create(plain)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("xz", "-dc", tarball)
	cmd.Stdout = out
	if err := cmd.Run(); err != nil {
		b.Fatalf("xz -dc %s: %v", tarball, err)
	}
	return plain
}

// listLong runs `ls -lR` over dir with cold caches and returns the time.
func listLong(b *testing.B, dir string) time.Duration {
	b.Helper()
	dropCaches()
	start := time.Now()
	cmd := exec.Command("ls", "-lR", dir)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("ls -lR %s: %v\n%s", dir, err, stderr.String())
	}
	return time.Since(start)
}

func runtimeGOROOT(b *testing.B) string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func countEntries(b *testing.B, tarball string) int {
	out, err := exec.Command("tar", "-tf", tarball).Output()
	if err != nil {
		b.Fatal(err)
	}
	return strings.Count(string(out), "\n")
}

// untar extracts tarball into dir and syncs it, returning the time taken.
func untar(b *testing.B, tarball, dir string) time.Duration {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	start := time.Now()
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
		b.Fatalf("untar into %s: %v\n%s", dir, err, out)
	}
	syncDir(dir)
	return time.Since(start)
}

// syncDir makes what was written under dir durable: syncfs for the local
// disk, and fsync of the directory for the mount (Linux does not pass
// syncfs on to FUSE; the mount's fsyncdir waits for the data of every
// file it closed and its metadata changes).
func syncDir(dir string) {
	exec.Command("sync", "-f", dir).Run()
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// fsSnapshots is how many snapshots BenchmarkFSSnapshots takes.
const fsSnapshots = 1000

// BenchmarkFSSnapshots takes 1,000 snapshots of a populated file system
// on a 5-node cluster, through the library as `arbor snapshot create`
// does, and reports the time per snapshot, the metadata they add, and the
// rate of a small-file workload before (the reference) and after.
// Command: make bench BENCH=BenchmarkFSSnapshots
func BenchmarkFSSnapshots(b *testing.B) {
	bin := devclustertest.Binary(b)
	c := devclustertest.Start(b, devcluster.Options{Nodes: 5, Binary: bin, ServerArgs: []string{"--log-level=warn"}})
	ctx := context.Background()
	opts := c.DialOptions()
	dir, err := directory.Dial(c.DirectoryAddrs(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dir.Close() })
	ec, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: opts})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ec.Close() })
	tc, err := tract.NewClient(tract.ClientConfig{Directory: dir, DialOptions: opts})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tc.Close() })
	var tree *btree.Tree
	var data *fs.TractData
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tree, err = kv.Open(ctx, dir, extentstore.New(ec), kv.SystemSpace(), btree.Config{})
		if err == nil {
			data, err = fs.NewTractData(ctx, tc, 0)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	b.Cleanup(tree.Close)
	meta := fs.BTreeMeta{Tree: tree}
	rec, err := dir.CreateFileSystem(ctx, &dpb.CreateFileSystemRequest{Name: "snapbench"})
	if err != nil {
		b.Fatal(err)
	}
	if err := fs.Format(ctx, meta, rec.GetNumber(), fs.DefaultLayout, time.Now()); err != nil {
		b.Fatal(err)
	}
	engine, err := fs.Open(ctx, fs.Config{Meta: meta, Data: data, Number: rec.GetNumber()})
	if err != nil {
		b.Fatal(err)
	}
	fsys, err := fsclient.NewFS(fsclient.FSConfig{Meta: fsclient.Local{FS: engine, Session: 1}, Data: data})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fsys.Close(ctx) })
	payload := bytes.Repeat([]byte("s"), 8<<10)
	// workload creates n files of 8 KiB in a new directory, then
	// overwrites them, and returns files per second of each phase.
	workload := func(name string, n int) float64 {
		d, err := fsys.Mkdir(ctx, fs.RootHandle, name, 0o755, fs.Cred{})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for i := range n {
			a, err := fsys.Create(ctx, d.Handle, fmt.Sprintf("f%d", i), 0o644, fs.Cred{})
			if err != nil {
				b.Fatal(err)
			}
			writeClose(b, fsys, a.Handle, payload)
		}
		return float64(n) / time.Since(start).Seconds()
	}
	overwrite := func(hs []fs.Handle) float64 {
		start := time.Now()
		for _, h := range hs {
			writeClose(b, fsys, h, payload[:4<<10])
		}
		return float64(len(hs)) / time.Since(start).Seconds()
	}
	metaBytes := func() (keys, size int) {
		lo := tuple.AppendUint(nil, rec.GetNumber())
		if err := tree.Scan(ctx, lo, tuple.PrefixEnd(lo), func(k, v []byte) error {
			keys++
			size += len(k) + len(v)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		return keys, size
	}
	for b.Loop() {
		// A populated tree: 10 directories of 20 files.
		var all []fs.Handle
		for d := range 10 {
			dd, err := fsys.Mkdir(ctx, fs.RootHandle, fmt.Sprintf("d%d", d), 0o755, fs.Cred{})
			if err != nil {
				b.Fatal(err)
			}
			for i := range 20 {
				a, err := fsys.Create(ctx, dd.Handle, fmt.Sprintf("f%d", i), 0o644, fs.Cred{})
				if err != nil {
					b.Fatal(err)
				}
				writeClose(b, fsys, a.Handle, payload)
				all = append(all, a.Handle)
			}
		}
		createBefore := workload("before", 50)
		overBefore := overwrite(all[:50])
		keys0, bytes0 := metaBytes()
		start := time.Now()
		for i := range fsSnapshots {
			sn, err := dir.CreateSnapshot(ctx, &dpb.CreateSnapshotRequest{FileSystem: rec.GetNumber(), Name: fmt.Sprintf("s%04d", i)})
			if err != nil {
				b.Fatal(err)
			}
			if err := engine.CreateSnapshot(ctx, sn.GetNumber(), sn.GetName()); err != nil {
				b.Fatal(err)
			}
		}
		perSnap := time.Since(start) / fsSnapshots
		keys1, bytes1 := metaBytes()
		createAfter := workload("after", 50)
		overAfter := overwrite(all[50:100])
		b.ReportMetric(float64(perSnap.Microseconds())/1000, "ms/snapshot")
		b.ReportMetric(float64(keys1-keys0), "keys-added")
		b.ReportMetric(float64(bytes1-bytes0)/1024, "KiB-added")
		b.ReportMetric(float64(bytes0)/1024, "KiB-before")
		b.ReportMetric(createBefore, "creates/s-before")
		b.ReportMetric(createAfter, "creates/s-after")
		b.ReportMetric(createAfter/createBefore, "create-ratio")
		b.ReportMetric(overBefore, "overwrites/s-before")
		b.ReportMetric(overAfter, "overwrites/s-after")
		b.ReportMetric(overAfter/overBefore, "overwrite-ratio")
	}
}

func writeClose(b *testing.B, fsys *fsclient.FS, h fs.Handle, p []byte) {
	ctx := context.Background()
	if _, err := fsys.Open(ctx, h); err != nil {
		b.Fatal(err)
	}
	if _, err := fsys.Write(ctx, h, 0, p); err != nil {
		b.Fatal(err)
	}
	if err := fsys.Release(ctx, h); err != nil {
		b.Fatal(err)
	}
}
