package fs

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
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
	meta  *MemMeta
	data  *MemData
	clock *testClock
	num   uint64
}

func newEnv(t testing.TB, tractSize int) *env {
	e := &env{t: t, meta: NewMemMeta(1), data: NewMemData(tractSize), clock: newTestClock(), num: 7}
	if err := Format(context.Background(), e.meta, e.num, DefaultLayout, e.clock.now()); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) open(snapshot uint64) *FS {
	e.t.Helper()
	f, err := Open(context.Background(), Config{Meta: e.meta, Data: e.data, Number: e.num, Snapshot: snapshot,
		Clock: e.clock.now, SessionInterval: -1})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = f.Close(context.Background()) })
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
