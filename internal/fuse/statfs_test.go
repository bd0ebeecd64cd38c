package fuse_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// TestStatFSCluster checks statfs(2) on a mount of a dev cluster of real
// processes: its size is the storage nodes' disk space over the TLT's
// replication (every node of a dev cluster keeps its data on the same
// file system as this test's cluster directory, so that is n times that
// file system's usable size, over k), and its used space grows by at least
// a file's size once the file is written.
func TestStatFSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	e := startEnv(t)
	e.createFS("default")
	m := e.mount("default")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir, err := directory.NewClient(directory.ClientConfig{Addresses: e.c.DirectoryAddrs(), DialOptions: e.c.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	tlt, err := dir.GetTLT(ctx, &dpb.GetTLTRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := dir.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	storage := 0
	for _, n := range nodes.GetNodes() {
		if n.GetState() == dpb.NodeState_NODE_STATE_ALIVE && slices.Contains(n.GetRoles(), "storage") {
			storage++
		}
	}
	var host syscall.Statfs_t
	if err := syscall.Statfs(e.c.Dir(), &host); err != nil {
		t.Fatal(err)
	}
	usable := (host.Blocks - (host.Bfree - host.Bavail)) * uint64(host.Bsize)
	want := uint64(storage) * usable / uint64(tlt.GetReplication())

	statfs := func() (total, used uint64) {
		t.Helper()
		var st syscall.Statfs_t
		if err := syscall.Statfs(m.dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Bavail != st.Bfree {
			t.Errorf("statfs: %d blocks available, %d free: the cluster reserves none", st.Bavail, st.Bfree)
		}
		return st.Blocks * uint64(st.Frsize), (st.Blocks - st.Bfree) * uint64(st.Frsize)
	}
	// The nodes' first statistics reach statfs within a stats flush.
	var total, before uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		if total, before = statfs(); total > want-want/100 && total < want+want/100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statfs size %d bytes; want %d (%d storage nodes of %d usable bytes, replication %d)",
				total, want, storage, usable, tlt.GetReplication())
		}
	}
	t.Logf("statfs: %d bytes, %d used; %d storage nodes, replication %d", total, before, storage, tlt.GetReplication())

	const fileBytes = 64 << 20
	data := make([]byte, fileBytes)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(m.dir, "statfs-file"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Every node of a dev cluster shares the host's disk, which other
	// processes (a parallel build, other tests) fill and empty at the same
	// time: "used grew by the file" is not a sound check here (the
	// in-process meta test checks growth on disks of its own). What must
	// hold is that used follows the disk: the storage nodes' use of the
	// host disk over the replication, within 1 % of the size (the nodes'
	// statistics and the metadata server's cache lag by seconds).
	hostUsed := func() uint64 {
		var h syscall.Statfs_t
		if err := syscall.Statfs(e.c.Dir(), &h); err != nil {
			t.Fatal(err)
		}
		return uint64(storage) * (usable - h.Bavail*uint64(h.Bsize)) / uint64(tlt.GetReplication())
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		_, used := statfs()
		wantUsed := hostUsed()
		diff := max(used, wantUsed) - min(used, wantUsed)
		if diff <= want/100 {
			t.Logf("used %d bytes after writing %d (was %d); the host disk says %d", used, fileBytes, before, wantUsed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("used %d bytes after writing %d; the host disk's use over the replication is %d", used, fileBytes, wantUsed)
		}
	}
}
