package fs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// afterUpdate is a MetaStore that calls hook after each update commits.
type afterUpdate struct {
	MetaStore
	hook func()
}

func (a *afterUpdate) Update(ctx context.Context, fn func(MetaTxn) error) error {
	err := a.MetaStore.Update(ctx, fn)
	if err == nil && a.hook != nil {
		a.hook()
	}
	return err
}

// TestReclaimTrimsDataCommittedAfterItsTrim: the blocks of an orphan's
// late flush that commit between the reclaim's trim and the deletion of
// its inode are trimmed too, not stranded under a missing inode (seen in
// TestModel with late flushes, seed 18172661867720578958).
func TestReclaimTrimsDataCommittedAfterItsTrim(t *testing.T) {
	e := newEnv(t, 64<<10)
	meta := &afterUpdate{MetaStore: e.meta}
	f, err := Open(context.Background(), Config{Meta: meta, Data: e.data, Number: e.num, Clock: e.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	s1 := WithSession(context.Background(), 1)
	a := must[Attr](t)(f.Create(s1, RootHandle, "f", 0o644, Cred{}))
	f.OpenNew(s1, a.Handle)
	writeTract(t, f, e.data, a, 0, []byte("first data"))
	if err := f.Unlink(s1, RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	// The late flush lands once the trim has emptied the orphan.
	var fired, firing atomic.Bool
	meta.hook = func() {
		n, err := f.headInode(context.Background(), a.Handle)
		if err != nil || n.Nlink != 0 || n.TrimFrom != 0 || n.Size != 0 || fired.Load() || !firing.CompareAndSwap(false, true) {
			return
		}
		defer firing.Store(false)
		fired.Store(true)
		first := must[uint64](t)(e.data.Extend(context.Background(), a.Blob, 1))
		if err := e.data.WriteTract(context.Background(), a.Blob, first, []byte("late data")); err != nil {
			t.Error(err)
			return
		}
		if _, err := f.CommitBlocks(s1, a.Handle, a.Blob, []NewBlock{{Start: 0, Tract: first, Length: 9}},
			Commit{Size: 9, Mtime: time.Now().UnixNano()}); err != nil {
			t.Errorf("the late flush: %v", err)
		}
	}
	if err := f.Release(s1, a.Handle); err != nil {
		t.Fatal(err)
	}
	if !fired.Load() {
		t.Fatal("the late flush never ran between the trim and the inode's deletion")
	}
	rep, err := f.Check(context.Background(), CheckOptions{Data: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %v", rep.Problems)
	}
	if _, err := f.headInode(context.Background(), a.Handle); errnoOf(err) == 0 {
		t.Fatal("the orphan's inode is still there")
	}
}
