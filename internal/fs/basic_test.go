package fs

import (
	"bytes"
	"context"
	"syscall"
	"testing"
)

func TestBasicNamespace(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	f := e.open(0)
	root := RootHandle
	d := must[Attr](t)(f.Mkdir(ctx, root, "d", 0o755, Cred{Uid: 1, Gid: 2}))
	if !d.IsDir() || d.Nlink != 2 || d.Uid != 1 {
		t.Fatalf("mkdir: %+v", d)
	}
	a := must[Attr](t)(f.Create(ctx, d.Handle, "a", 0o644, Cred{}))
	if _, err := f.Create(ctx, d.Handle, "a", 0o644, Cred{}); err == nil {
		t.Fatal("create twice")
	} else {
		wantErrno(t, err, syscall.EEXIST)
	}
	got := must[Attr](t)(f.Lookup(ctx, d.Handle, "a"))
	if got.Handle != a.Handle {
		t.Fatalf("lookup %v, want %v", got.Handle, a.Handle)
	}
	rootAttr := must[Attr](t)(f.GetAttr(ctx, root))
	if rootAttr.Nlink != 3 {
		t.Fatalf("root nlink %d", rootAttr.Nlink)
	}
	must[Attr](t)(f.Link(ctx, a.Handle, root, "b"))
	if at := must[Attr](t)(f.GetAttr(ctx, a.Handle)); at.Nlink != 2 {
		t.Fatalf("nlink after link %d", at.Nlink)
	}
	if err := f.Rename(ctx, root, "b", d.Handle, "c", 0); err != nil {
		t.Fatal(err)
	}
	ents := must[[]DirEntry](t)(f.ReadDir(ctx, d.Handle, 0, 0))
	if len(ents) != 2 || ents[0].Name != "a" || ents[1].Name != "c" {
		t.Fatalf("readdir %+v", ents)
	}
	if err := f.Rename(ctx, root, "d", d.Handle, "x", 0); err == nil {
		t.Fatal("moved a directory into itself")
	} else {
		wantErrno(t, err, syscall.EINVAL)
	}
	if err := f.Rmdir(ctx, root, "d"); err == nil {
		t.Fatal("rmdir of a full directory")
	} else {
		wantErrno(t, err, syscall.ENOTEMPTY)
	}
	for _, n := range []string{"a", "c"} {
		if err := f.Unlink(ctx, d.Handle, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.GetAttr(ctx, a.Handle); err == nil {
		t.Fatal("object lives on")
	}
	if err := f.Rmdir(ctx, root, "d"); err != nil {
		t.Fatal(err)
	}
	s := must[Attr](t)(f.Symlink(ctx, root, "l", string(bytes.Repeat([]byte("x"), 3000)), Cred{}))
	if tg := must[string](t)(f.Readlink(ctx, s.Handle)); len(tg) != 3000 {
		t.Fatalf("readlink %d bytes", len(tg))
	}
	long := string(bytes.Repeat([]byte("n"), 256))
	_, err := f.Create(ctx, root, long, 0o644, Cred{})
	wantErrno(t, err, syscall.ENAMETOOLONG)
	_, err = f.Create(ctx, root, "a\x00b", 0o644, Cred{})
	wantErrno(t, err, syscall.EINVAL)
	rep, err := f.Check(ctx, CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %+v", rep.Problems)
	}
	if m, ok := e.meta.(*MemMeta); ok {
		t.Logf("max values in a transaction: %d", m.MaxValues())
	}
}
