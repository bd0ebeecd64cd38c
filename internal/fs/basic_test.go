package fs

import (
	"bytes"
	"context"
	"math/rand/v2"
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
	t.Logf("max values in a transaction: %d", e.meta.MaxValues())
}

func TestBasicData(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	f := e.open(0)
	a := must[Attr](t)(f.Create(ctx, RootHandle, "f", 0o644, Cred{}))
	h := a.Handle
	must[Attr](t)(f.Open(ctx, h))
	rng := rand.New(rand.NewPCG(1, 2))
	model := make([]byte, 0)
	for i := range 200 {
		off := rng.IntN(600 << 10)
		n := rng.IntN(40 << 10)
		buf := make([]byte, n)
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		if _, err := f.Write(ctx, h, int64(off), buf); err != nil {
			t.Fatal(err)
		}
		if off+n > len(model) {
			model = append(model, make([]byte, off+n-len(model))...)
		}
		copy(model[off:], buf)
		switch i % 7 {
		case 3:
			if err := f.Flush(ctx, h); err != nil {
				t.Fatal(err)
			}
		case 5:
			sz := rng.IntN(len(model) + 1)
			if _, err := f.SetAttr(ctx, h, SetAttrIn{Valid: SetSize, Size: uint64(sz)}); err != nil {
				t.Fatal(err)
			}
			model = model[:sz]
		}
		got := make([]byte, len(model)+100)
		n2, err := f.Read(ctx, h, 0, got)
		if err != nil {
			t.Fatal(err)
		}
		if n2 != len(model) || !bytes.Equal(got[:n2], model) {
			t.Fatalf("step %d: read %d bytes, want %d; equal=%v", i, n2, len(model), bytes.Equal(got[:min(n2, len(model))], model[:min(n2, len(model))]))
		}
	}
	if err := f.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if at := must[Attr](t)(f.GetAttr(ctx, h)); at.Size != uint64(len(model)) {
		t.Fatalf("size %d, want %d", at.Size, len(model))
	}
	rep, err := f.Check(ctx, CheckOptions{Data: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %+v", rep.Problems)
	}
	if err := f.Unlink(ctx, RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	blobs, tracts, _ := e.data.Usage()
	if blobs != 0 || tracts != 0 {
		t.Fatalf("after unlink: %d blobs, %d tracts", blobs, tracts)
	}
}
