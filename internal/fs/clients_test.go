package fs

import (
	"context"
	"syscall"
	"testing"
)

// TestRemovedByOtherClient: a file open in client A whose last name client
// B removes is reclaimed by B (B does not know A holds it); A's buffered
// writes then fail with ESTALE and leave nothing behind, and A closes
// cleanly.
func TestRemovedByOtherClient(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	a, b := e.open(0), e.open(0)
	at := must[Attr](t)(a.Create(ctx, RootHandle, "f", 0o644, Cred{}))
	must[Attr](t)(a.Open(ctx, at.Handle))
	if _, err := a.Write(ctx, at.Handle, 0, make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, at.Handle, 100<<10, make([]byte, 300<<10)); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlink(ctx, RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	if err := b.ReclaimOrphans(ctx, true); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, a.Flush(ctx, at.Handle), syscall.ESTALE)
	if err := a.Release(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	rep, err := b.Check(ctx, CheckOptions{Data: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %+v", rep.Problems)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
