package fs

import (
	"context"
	"syscall"
	"testing"
)

// TestDestroy: deleting a file system removes every key and blob of it and
// nothing of another file system sharing the store.
func TestDestroy(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	other := keys{f: 8}
	if err := Format(ctx, e.meta, 8, DefaultLayout, e.clock.now()); err != nil {
		t.Fatal(err)
	}
	f := e.open(0)
	d := must[Attr](t)(f.Mkdir(ctx, RootHandle, "d", 0o755, Cred{}))
	a := must[Attr](t)(f.Create(ctx, d.Handle, "a", 0o644, Cred{}))
	writeTract(t, f, e.data, a, 0, make([]byte, 16<<10))
	if err := f.CreateSnapshot(ctx, 1, "s"); err != nil {
		t.Fatal(err)
	}
	if blobs, _, _ := e.data.Usage(); blobs != 1 {
		t.Fatalf("%d blobs before, want 1", blobs)
	}
	st, err := Destroy(ctx, e.meta, e.data, e.num)
	if err != nil {
		t.Fatal(err)
	}
	if st.Blobs != 1 || st.Keys == 0 {
		t.Fatalf("stats %+v", st)
	}
	if blobs, _, _ := e.data.Usage(); blobs != 0 {
		t.Fatalf("%d blobs after, want 0", blobs)
	}
	lo, hi := keys{f: e.num}.fsRange()
	n := 0
	if err := e.meta.Scan(ctx, lo, hi, func(_, _ []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d keys left", n)
	}
	_, err = Open(ctx, Config{Meta: e.meta, Data: e.data, Number: e.num})
	wantErrno(t, err, syscall.ENOENT)
	// The other file system is intact and usable.
	g, err := Open(ctx, Config{Meta: e.meta, Data: e.data, Number: 8})
	if err != nil {
		t.Fatal(err)
	}
	must[Attr](t)(g.Mkdir(ctx, RootHandle, "x", 0o755, Cred{}))
	if err := e.meta.View(ctx, func(tx MetaTxn) error {
		_, ok, err := tx.Get(other.superblock())
		if err == nil && !ok {
			t.Error("the other file system's superblock is gone")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Destroying again (after a crash) is harmless.
	if _, err := Destroy(ctx, e.meta, e.data, e.num); err != nil {
		t.Fatal(err)
	}
}
