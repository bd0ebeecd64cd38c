package meta

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
)

// TestReleasesRideAlong: a session's last close of a file reaches the
// table's owner with the session's next request there (releases.go), not
// as a request of its own. Until it arrives, a file another client
// unlinked stays, as it is open; an open sent after the release was queued
// takes it back, so no release arrives after it; once a request carried
// the release, the file is reclaimed.
func TestReleasesRideAlong(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("releases")
	x.mainMD.releaseDelay = time.Hour // only other requests carry them
	other := x.mount(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := x.main.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	h := a.Handle
	data := []byte("held open")
	if _, err := x.main.Write(ctx, h, 0, data); err != nil {
		t.Fatal(err)
	}
	if err := x.main.Flush(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := other.Unlink(ctx, fs.RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	readBack := func(what string) {
		t.Helper()
		got := make([]byte, 64)
		n, err := x.main.Read(ctx, h, 0, got)
		if err != nil || !bytes.Equal(got[:n], data) {
			t.Fatalf("%s: read %q, %v; want %q", what, got[:n], err, data)
		}
	}
	readBack("open and unlinked")

	// The last close: queued, not sent.
	if err := x.main.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if !x.mainMD.rel.isQueued(h) {
		t.Fatal("the release was not queued")
	}
	// Past the servers' reclaim interval (1 s here) the file is still
	// there: the owner has not heard of the release.
	time.Sleep(1500 * time.Millisecond)
	if _, err := other.GetAttr(ctx, h); err != nil {
		t.Fatalf("the unlinked file was reclaimed before its release was sent: %v", err)
	}
	// An open takes the queued release back: it is never sent.
	if _, err := x.main.Open(ctx, h); err != nil {
		t.Fatal(err)
	}
	if x.mainMD.rel.isQueued(h) {
		t.Fatal("the open left the release queued")
	}
	if _, err := x.main.Lookup(ctx, fs.RootHandle, "nothing"); fs.Errno(err) != syscall.ENOENT {
		t.Fatalf("lookup of a missing name: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	readBack("opened again after a queued release")

	// Closed again; the next request to the table (a lookup) carries the
	// release, and the file goes.
	if err := x.main.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := x.main.Lookup(ctx, fs.RootHandle, "nothing"); fs.Errno(err) != syscall.ENOENT {
		t.Fatalf("lookup of a missing name: %v", err)
	}
	if x.mainMD.rel.isQueued(h) {
		t.Fatal("the lookup did not carry the release")
	}
	for {
		_, err := other.GetAttr(ctx, h)
		if e := fs.Errno(err); e == syscall.ENOENT || e == syscall.ESTALE {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the file was not reclaimed after its release was carried: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep, err := x.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("fsck: %+v", rep)
	}
}

// TestReleasesSentAlone: a release no request carries goes within the
// session's release delay, in a request of its own; one queued at
// unmount goes before the session ends.
func TestReleasesSentAlone(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("alone")
	other := x.mount(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gone := func(h fs.Handle) bool {
		_, err := other.GetAttr(ctx, h)
		e := fs.Errno(err)
		return e == syscall.ENOENT || e == syscall.ESTALE
	}
	var hs []fs.Handle
	for _, name := range []string{"a", "b"} {
		a, err := x.main.Create(ctx, fs.RootHandle, name, 0o644, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Unlink(ctx, fs.RootHandle, name); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, a.Handle)
	}
	if err := x.main.Release(ctx, hs[0]); err != nil {
		t.Fatal(err)
	}
	for !gone(hs[0]) {
		if ctx.Err() != nil {
			t.Fatal("a release no request carried was never sent")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Another session holds the second file open when it is unlinked,
	// and queues its release only for a request that never comes.
	late, lateMD := x.mountMD(0)
	lateMD.releaseDelay = time.Hour
	if _, err := late.Open(ctx, hs[1]); err != nil {
		t.Fatal(err)
	}
	if err := x.main.Release(ctx, hs[1]); err != nil {
		t.Fatal(err)
	}
	if err := late.Release(ctx, hs[1]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if gone(hs[1]) {
		t.Fatal("a file was reclaimed while a session's release of it was queued")
	}
	if err := late.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lateMD.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for !gone(hs[1]) {
		if ctx.Err() != nil {
			t.Fatal("a release queued at unmount was never sent")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
