package fs

import (
	"context"
	"syscall"
	"testing"
)

// TestReplayedCreateTakesOnlyItsOwnBlob: a replayed create names the
// blob its first run gave (Want.Blob), and the file system takes only one
// of its own (its number in the GUID's first 8 bytes): a client cannot
// make a new file's data another file system's blob (issue 15 review).
func TestReplayedCreateTakesOnlyItsOwnBlob(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	f := e.open(0)
	first := must[Attr](t)(f.Create(ctx, RootHandle, "first", 0o644, Cred{}))
	next := Handle{D: first.Handle.D, C: first.Handle.C + 1}

	foreign := newGUID(e.num + 1)
	rctx := WithWant(ctx, Want{Handle: next, Blob: foreign})
	_, err := f.Create(rctx, RootHandle, "stolen", 0o644, Cred{})
	wantErrno(t, err, syscall.EINVAL)
	if _, err := f.Lookup(ctx, RootHandle, "stolen"); err == nil {
		t.Fatal("the refused create made a file")
	}

	own := newGUID(e.num)
	a := must[Attr](t)(f.Create(WithWant(ctx, Want{Handle: next, Blob: own}), RootHandle, "replayed", 0o644, Cred{}))
	if a.Handle != next || a.Blob != own {
		t.Fatalf("replayed create gave %v blob %v, want %v blob %v", a.Handle, a.Blob, next, own)
	}
}
