package fsclient_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
)

// countingMeta counts the SetAttr requests a client sends.
type countingMeta struct {
	fsclient.Local
	setAttrs atomic.Int64
	last     atomic.Uint32 // the Valid bits of the last one
}

func (c *countingMeta) SetAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error) {
	c.setAttrs.Add(1)
	c.last.Store(in.Valid)
	return c.Local.SetAttr(ctx, h, in)
}

// TestCreateHoldMergesClose: a client that flushes after close creates
// its files under its data hold, so a close of a written file is no
// request at all, and tar's chmod, chown and utimens of the open file go
// with the flush's block commit: other clients see data and attributes
// once the close returned (close-to-open), without one SetAttr. A file
// closed with nothing to flush clears the hold with its held attributes
// in one SetAttr; one kept open longer than a moment has its hold cleared
// meanwhile, so other clients do not wait for it.
func TestCreateHoldMergesClose(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t, 64<<10)
	data := &slowData{DataStore: l.data, delay: 100 * time.Millisecond}
	md := &countingMeta{Local: fsclient.Local{FS: l.engine, Session: l.session.Add(1)}}
	writer, err := fsclient.NewFS(fsclient.FSConfig{Meta: md, Data: data, Clock: l.clock, FlushAfterClose: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writer.Close(context.Background()) })
	reader := l.client(l.engine, 0)
	quick := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 50*time.Millisecond) }

	// A file of tracts, as tar writes it.
	want := bytes.Repeat([]byte("held from its create "), 10000) // 210 KB
	a := must[fs.Attr](t)(writer.Create(ctx, fs.RootHandle, "f", 0o600, fs.Cred{}))
	qctx, cancel := quick()
	if _, err := reader.Lookup(qctx, fs.RootHandle, "f"); err == nil {
		t.Fatal("another client saw the new file at once, before its writer closed it")
	}
	cancel()
	if _, err := writer.Write(ctx, a.Handle, 0, want); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2020, 2, 2, 2, 2, 2, 0, time.UTC)
	for _, in := range []fs.SetAttrIn{
		{Valid: fs.SetUid | fs.SetGid, Uid: 1000, Gid: 1000},
		{Valid: fs.SetMode, Mode: 0o644},
		{Valid: fs.SetAtime | fs.SetMtime, Atime: mtime, Mtime: mtime},
	} {
		must[fs.Attr](t)(writer.SetAttr(ctx, a.Handle, in))
	}
	if err := writer.Flush(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	if n := md.setAttrs.Load(); n != 0 {
		t.Fatalf("the close of a written file sent %d SetAttr requests (last %#x), want none", n, md.last.Load())
	}
	ra := must[fs.Attr](t)(reader.Lookup(ctx, fs.RootHandle, "f"))
	if ra.Size != uint64(len(want)) || ra.Mode&0o7777 != 0o644 || ra.Uid != 1000 || ra.Gid != 1000 || !ra.Mtime.Equal(mtime) {
		t.Fatalf("another client after the close sees %+v", ra)
	}
	must[fs.Attr](t)(reader.Open(ctx, ra.Handle))
	got := make([]byte, len(want)+10)
	if n, err := reader.Read(ctx, ra.Handle, 0, got); err != nil || !bytes.Equal(got[:n], want) {
		t.Fatalf("another client reads %d bytes (%v) after the close, want %d", n, err, len(want))
	}
	_ = reader.Release(ctx, ra.Handle)
	if err := writer.Release(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	if n := md.setAttrs.Load(); n != 0 {
		t.Fatalf("the file cost %d SetAttr requests, want none", n)
	}

	// A file closed with nothing to flush: one SetAttr, the unhold with
	// the held mode.
	b := must[fs.Attr](t)(writer.Create(ctx, fs.RootHandle, "empty", 0o600, fs.Cred{}))
	must[fs.Attr](t)(writer.SetAttr(ctx, b.Handle, fs.SetAttrIn{Valid: fs.SetMode, Mode: 0o640}))
	if err := writer.Flush(ctx, b.Handle); err != nil {
		t.Fatal(err)
	}
	if n, v := md.setAttrs.Load(), md.last.Load(); n != 1 || v != fs.SetUnhold|fs.SetMode {
		t.Fatalf("the close of an empty file sent %d SetAttr requests (last %#x), want one, the unhold with the mode", n, v)
	}
	qctx, cancel = quick()
	if rb, err := reader.Lookup(qctx, fs.RootHandle, "empty"); err != nil || rb.Mode&0o7777 != 0o640 || rb.Size != 0 {
		t.Fatalf("another client after the close of an empty file: %+v, %v; want it at once, mode 640", rb, err)
	}
	cancel()
	_ = writer.Release(ctx, b.Handle)

	// A file kept open: its create's hold is cleared while it is open;
	// its close then places a hold of its own, and the data is seen.
	c := must[fs.Attr](t)(writer.Create(ctx, fs.RootHandle, "slow", 0o644, fs.Cred{}))
	time.Sleep(800 * time.Millisecond) // past createHoldIdle
	qctx, cancel = quick()
	if _, err := reader.Lookup(qctx, fs.RootHandle, "slow"); err != nil {
		t.Fatalf("a file kept open still holds other clients: %v", err)
	}
	cancel()
	if _, err := writer.Write(ctx, c.Handle, 0, want); err != nil {
		t.Fatal(err)
	}
	before := md.setAttrs.Load()
	if err := writer.Flush(ctx, c.Handle); err != nil {
		t.Fatal(err)
	}
	if n, v := md.setAttrs.Load()-before, md.last.Load(); n != 1 || v != fs.SetHold {
		t.Fatalf("the close of a file kept open sent %d SetAttr requests (last %#x), want its hold", n, v)
	}
	if rc := must[fs.Attr](t)(reader.Lookup(ctx, fs.RootHandle, "slow")); rc.Size != uint64(len(want)) {
		t.Fatalf("another client after the close sees size %d, want %d", rc.Size, len(want))
	}
	_ = writer.Release(ctx, c.Handle)
	if rep, err := l.Check(ctx); err != nil || !rep.OK() {
		t.Fatalf("check: %v %+v", err, rep)
	}
}
