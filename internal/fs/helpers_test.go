package fs

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
)

// testClock is a clock that moves 1 µs per reading, so every timestamp
// differs.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *testClock) now() time.Time { return time.Unix(0, c.ns.Add(1000)) }

type env struct {
	t     testing.TB
	meta  MetaStore
	data  *MemData
	clock *testClock
	num   uint64
}

func newEnv(t testing.TB, tractSize int) *env {
	e := &env{t: t, meta: newMeta(t), data: NewMemData(tractSize), clock: newTestClock(), num: 7}
	if err := Format(context.Background(), e.meta, e.num, DefaultLayout, e.clock.now()); err != nil {
		t.Fatal(err)
	}
	return e
}

// metaEnv chooses the metadata store of the fs tests (issue 13 item 7):
// MemMeta by default, the real B-tree on its in-memory page store with
// ARBOR_FS_META=btree (make test runs both).
const metaEnv = "ARBOR_FS_META"

func newMeta(t testing.TB) MetaStore {
	t.Helper()
	switch m := os.Getenv(metaEnv); m {
	case "", "mem":
		return NewMemMeta(1)
	case "btree":
		ctx := context.Background()
		const ext = 1000
		st := btree.NewMemStore(1)
		// 8 KiB pages (the extent store's default), 32 pages a block, 4096
		// blocks: room for every test's tree in one extent.
		if err := st.AddExtent(ext, btree.Geometry{PageBytes: 8 << 10, PagesPerBlock: 32, Blocks: 4096}); err != nil {
			t.Fatal(err)
		}
		root, err := btree.Create(ctx, st, ext, 1)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := btree.Open(ctx, btree.Config{Store: st, Root: root, Extents: []uint64{ext}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		return BTreeMeta{Tree: tr}
	default:
		t.Fatalf("%s=%q: want mem or btree", metaEnv, m)
		return nil
	}
}

func (e *env) open(snapshot uint64) *FS {
	e.t.Helper()
	f, err := Open(context.Background(), Config{Meta: e.meta, Data: e.data, Number: e.num, Snapshot: snapshot,
		Clock: e.clock.now})
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

func wantErrno(t testing.TB, err error, want syscall.Errno) {
	t.Helper()
	var got syscall.Errno
	if !errors.As(err, &got) || got != want {
		t.Fatalf("error %v, want %v", err, want)
	}
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

// writeTract writes data as the first block of file a, as a client does:
// a new tract of its blob, then the block map pointed at it.
func writeTract(t testing.TB, f *FS, data DataStore, a Attr, start uint64, b []byte) {
	t.Helper()
	ctx := context.Background()
	if !a.BlobExists {
		if err := data.CreateBlob(ctx, a.Blob); err != nil {
			t.Fatal(err)
		}
	}
	first, err := data.Extend(ctx, a.Blob, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := data.WriteTract(ctx, a.Blob, first, b); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CommitBlocks(ctx, a.Handle, a.Blob, []NewBlock{{Start: start, Tract: first, Length: uint64(len(b))}}, Commit{}); err != nil {
		t.Fatal(err)
	}
}
