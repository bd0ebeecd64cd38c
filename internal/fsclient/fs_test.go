package fsclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/fsclient/fsclienttest"
)

// local is a file system run in this process over the in-memory stores,
// with clients of it (each its own session).
type local struct {
	t       testing.TB
	meta    *fs.MemMeta
	data    *fs.MemData
	num     uint64
	engine  *fs.FS
	clock   func() time.Time
	session atomic.Uint64
	nextSn  uint64
	main    *fsclient.FS
	late    bool // clients flush after close
}

func newLocal(t testing.TB, tractSize int) *local { return newLocalLate(t, tractSize, false) }

// newLocalLate is newLocal with clients that flush after close (late).
func newLocalLate(t testing.TB, tractSize int, late bool) *local {
	t.Helper()
	var ns atomic.Int64
	ns.Store(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	l := &local{t: t, meta: fs.NewMemMeta(1), data: fs.NewMemData(tractSize), num: 7,
		clock: func() time.Time { return time.Unix(0, ns.Add(1000)) }, late: late}
	ctx := context.Background()
	if err := fs.Format(ctx, l.meta, l.num, fs.DefaultLayout, l.clock()); err != nil {
		t.Fatal(err)
	}
	l.engine = l.open(0)
	l.main = l.client(l.engine, 0)
	return l
}

func (l *local) open(snapshot uint64) *fs.FS {
	l.t.Helper()
	f, err := fs.Open(context.Background(), fs.Config{Meta: l.meta, Data: l.data, Number: l.num, Snapshot: snapshot, Clock: l.clock})
	if err != nil {
		l.t.Fatal(err)
	}
	return f
}

// client returns a new client (a new session) of engine.
func (l *local) client(engine *fs.FS, snapshot uint64) *fsclient.FS {
	l.t.Helper()
	c, err := fsclient.NewFS(fsclient.FSConfig{Meta: fsclient.Local{FS: engine, Session: l.session.Add(1)}, Data: l.data,
		Snapshot: snapshot, Clock: l.clock, FlushAfterClose: l.late && snapshot == 0})
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (l *local) FS() *fsclient.FS { return l.main }

func (l *local) CreateSnapshot(ctx context.Context, name string) (uint64, error) {
	// As a metadata server's drain does: data closed before is in.
	if err := l.engine.WaitHolds(ctx); err != nil {
		return 0, err
	}
	l.nextSn++
	return l.nextSn, l.engine.CreateSnapshot(ctx, l.nextSn, name)
}

func (l *local) DeleteSnapshot(ctx context.Context, n uint64) error {
	_, err := l.engine.DeleteSnapshot(ctx, n)
	return err
}

func (l *local) OpenSnapshot(t testing.TB, n uint64) *fsclient.FS { return l.client(l.open(n), n) }

func (l *local) Check(ctx context.Context) (*fs.CheckReport, error) {
	return l.engine.Check(ctx, fs.CheckOptions{Data: true})
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func wantErrno(t testing.TB, err error, want syscall.Errno) {
	t.Helper()
	var got syscall.Errno
	if !errors.As(err, &got) || got != want {
		t.Fatalf("error %v, want %v", err, want)
	}
}

// TestModel runs the model over a file system run in process, with
// transactions that conflict now and then.
func TestModel(t *testing.T) {
	seed := fsclienttest.Seed(t)
	steps := 3000
	if testing.Short() {
		steps = 800
	}
	for _, c := range []struct {
		tractSize int
		late      bool
	}{{64 << 10, false}, {1 << 20, false}, {64 << 10, true}} {
		tractSize := c.tractSize
		t.Run(fmt.Sprintf("tract=%d/late=%v", tractSize, c.late), func(t *testing.T) {
			l := newLocalLate(t, tractSize, c.late)
			l.meta.SetConflictRate(0.05)
			rep := fsclienttest.Run(t, l, fsclienttest.Options{Seed: seed + uint64(tractSize), Steps: steps,
				DataTracts: func() int { _, tracts, _ := l.data.Usage(); return tracts }})
			t.Logf("ops %v; %d objects, %d tracts; max values per transaction %d", rep.Ops, rep.Objects, rep.Tracts, l.meta.MaxValues())
		})
	}
}

func TestBasicData(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t, 64<<10)
	f := l.main
	a := must[fs.Attr](t)(f.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{}))
	h := a.Handle
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
			if _, err := f.SetAttr(ctx, h, fs.SetAttrIn{Valid: fs.SetSize, Size: uint64(sz)}); err != nil {
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
	if at := must[fs.Attr](t)(f.GetAttr(ctx, h)); at.Size != uint64(len(model)) {
		t.Fatalf("size %d, want %d", at.Size, len(model))
	}
	rep, err := l.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %+v", rep.Problems)
	}
	if err := f.Unlink(ctx, fs.RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	blobs, tracts, _ := l.data.Usage()
	if blobs != 0 || tracts != 0 {
		t.Fatalf("after unlink: %d blobs, %d tracts", blobs, tracts)
	}
}

// TestRemovedByOtherClient: a file open in client A whose last name client
// B removes is reclaimed by B (the orphan names B, which does not hold
// it); A's buffered writes then fail with ESTALE and leave nothing behind,
// and A closes cleanly.
func TestRemovedByOtherClient(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t, 64<<10)
	a := l.main
	// B runs its own copy of the file system, as another metadata server
	// would after a failover: it does not know A's opens.
	b := l.client(l.open(0), 0)
	at := must[fs.Attr](t)(a.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{}))
	if _, err := a.Write(ctx, at.Handle, 0, make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, at.Handle, 100<<10, make([]byte, 300<<10)); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlink(ctx, fs.RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, a.Flush(ctx, at.Handle), syscall.ESTALE)
	if err := a.Release(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	rep, err := l.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %+v", rep.Problems)
	}
}

// TestOpenFileOutlivesItsName: a file open in one session keeps its data
// after another session (same metadata server) removes its last name,
// until its last close.
func TestOpenFileOutlivesItsName(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t, 64<<10)
	a := l.main
	b := l.client(l.engine, 0)
	at := must[fs.Attr](t)(a.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{}))
	if _, err := a.Write(ctx, at.Handle, 0, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlink(ctx, fs.RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, at.Handle, 10, []byte(", and more")); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, at.Handle); err != nil {
		t.Fatalf("flush of an open file another session unlinked: %v", err)
	}
	got := make([]byte, 40)
	n := must[int](t)(a.Read(ctx, at.Handle, 0, got))
	if string(got[:n]) != "still here, and more" {
		t.Fatalf("read %q", got[:n])
	}
	if err := a.Release(ctx, at.Handle); err != nil {
		t.Fatal(err)
	}
	_, err := a.GetAttr(ctx, at.Handle)
	wantErrno(t, err, syscall.ENOENT)
	if blobs, tracts, _ := l.data.Usage(); blobs != 0 || tracts != 0 {
		t.Fatalf("after the last close: %d blobs, %d tracts", blobs, tracts)
	}
}

// TestReadAhead: a file read front to back in small pieces has its next
// tracts loaded ahead, each once; a read far from the stream's end does
// not extend it; and every byte reads back right.
func TestReadAhead(t *testing.T) {
	ctx := context.Background()
	const tractSize = 64 << 10
	l := newLocal(t, tractSize)
	w := l.main
	a := must[fs.Attr](t)(w.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{}))
	want := make([]byte, 40*tractSize)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	if _, err := w.Write(ctx, a.Handle, 0, want); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}

	_, tracts, _ := l.data.Usage()
	r := l.client(l.engine, 0)
	h := must[fs.Attr](t)(r.Lookup(ctx, fs.RootHandle, "f")).Handle
	if _, err := r.Open(ctx, h); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 16 << 10 {
		if _, err := r.Read(ctx, h, int64(off), got[off:off+16<<10]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("a sequential read returned other bytes than written")
	}
	c := r.Counters()
	if c.ReadAheads.Load() == 0 {
		t.Fatal("no read-ahead on a sequential read")
	}
	// Read-ahead goroutines may still be finishing their loads.
	deadline := time.Now().Add(5 * time.Second)
	for c.TractReads.Load() < int64(tracts) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := c.TractReads.Load(); n != int64(tracts) {
		t.Fatalf("%d tract reads for a file of %d tracts", n, tracts)
	}
	before := c.ReadAheads.Load()
	for _, off := range []int{3 * tractSize, 30 * tractSize, 7 * tractSize} {
		if _, err := r.Read(ctx, h, int64(off), got[:100]); err != nil {
			t.Fatal(err)
		}
	}
	if c.ReadAheads.Load() != before {
		t.Fatal("random reads started a read-ahead")
	}
}

// slowData delays (and, while fail is set, fails) tract writes.
type slowData struct {
	fs.DataStore
	delay time.Duration
	fail  atomic.Bool
}

func (d *slowData) WriteTract(ctx context.Context, g fs.GUID, i uint64, data []byte) error {
	time.Sleep(d.delay)
	if d.fail.Load() && data != nil {
		return fmt.Errorf("injected: %w", syscall.EIO)
	}
	return d.DataStore.WriteTract(ctx, g, i, data)
}

// TestFlushAfterClose: a writer's close returns before its data reaches
// the tracts; another client's open of the file waits for the data (the
// hold) and sees all of it (close-to-open); a flush that fails is
// reported by the writer's next fsync, and its hold is cleared.
func TestFlushAfterClose(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t, 64<<10)
	data := &slowData{DataStore: l.data, delay: 300 * time.Millisecond}
	newClient := func(late bool) *fsclient.FS {
		c, err := fsclient.NewFS(fsclient.FSConfig{Meta: fsclient.Local{FS: l.engine, Session: l.session.Add(1)}, Data: data,
			Clock: l.clock, FlushAfterClose: late})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	writer, reader := newClient(true), newClient(false)
	want := bytes.Repeat([]byte("late flush "), 20000) // 220 KB: tracts, not inline
	a := must[fs.Attr](t)(writer.Create(ctx, fs.RootHandle, "f", 0o644, fs.Cred{}))
	if _, err := writer.Write(ctx, a.Handle, 0, want); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := writer.Flush(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= data.delay {
		t.Fatalf("close took %v: it waited for the tract writes (%v each)", d, data.delay)
	}
	// The writer sees its data at once; the reader once it is there.
	got := make([]byte, len(want)+10)
	if n, err := writer.Read(ctx, a.Handle, 0, got); err != nil || !bytes.Equal(got[:n], want) {
		t.Fatalf("the writer reads %d bytes (%v) after its close", n, err)
	}
	ra := must[fs.Attr](t)(reader.Lookup(ctx, fs.RootHandle, "f"))
	if ra.Size != uint64(len(want)) {
		t.Fatalf("another client sees size %d after the close, want %d", ra.Size, len(want))
	}
	must[fs.Attr](t)(reader.Open(ctx, ra.Handle))
	if n, err := reader.Read(ctx, ra.Handle, 0, got); err != nil || !bytes.Equal(got[:n], want) {
		t.Fatalf("another client reads %d bytes (%v) after the close, want %d", n, err, len(want))
	}
	if err := reader.Release(ctx, ra.Handle); err != nil {
		t.Fatal(err)
	}
	if err := writer.Release(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}

	// A flush after close that fails: fsync says so (once); the hold is
	// gone, so other clients read the file as it was.
	data.fail.Store(true)
	b := must[fs.Attr](t)(writer.Create(ctx, fs.RootHandle, "g", 0o644, fs.Cred{}))
	if _, err := writer.Write(ctx, b.Handle, 0, want); err != nil {
		t.Fatal(err)
	}
	if err := writer.Flush(ctx, b.Handle); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, writer.SyncClosed(ctx), syscall.EIO)
	if err := writer.SyncClosed(ctx); err != nil {
		t.Fatalf("a failed flush reported twice: %v", err)
	}
	data.fail.Store(false)
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if rb, err := reader.Lookup(ctx2, fs.RootHandle, "g"); err != nil || rb.Size != 0 {
		t.Fatalf("after a failed flush another client sees %+v, %v: want the empty file, at once", rb, err)
	}
	_ = writer.Release(ctx, b.Handle)
	if rep, err := l.Check(ctx); err != nil || !rep.OK() {
		t.Fatalf("check: %v %+v", err, rep)
	}
}
