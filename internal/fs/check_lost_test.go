package fs

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCheckCountsLostData: fsck tells acknowledged data that is gone (a
// tract shorter than its block, a blob missing under referenced tracts)
// from other problems, so a checker can count it as loss without reading
// the text.
func TestCheckCountsLostData(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	f := e.open(0)
	a := must[Attr](t)(f.Create(ctx, RootHandle, "short", 0o644, Cred{}))
	writeTract(t, f, e.data, a, 0, bytes.Repeat([]byte("s"), 3000))
	b := must[Attr](t)(f.Create(ctx, RootHandle, "gone", 0o644, Cred{}))
	writeTract(t, f, e.data, b, 0, bytes.Repeat([]byte("g"), 3000))
	if rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{})); !rep.OK() || rep.Lost != 0 {
		t.Fatalf("check before any loss: lost %d, %v", rep.Lost, rep.Problems)
	}

	if err := e.data.WriteTract(ctx, a.Blob, 0, []byte("cut")); err != nil {
		t.Fatal(err)
	}
	if err := e.data.DeleteBlob(ctx, b.Blob); err != nil {
		t.Fatal(err)
	}
	rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{}))
	if rep.OK() || rep.Lost != 2 || rep.ProblemCount() != 2 || len(rep.LostData) != 2 {
		t.Fatalf("check after two losses: lost %d of %d problems, lost data %q", rep.Lost, rep.ProblemCount(), rep.LostData)
	}
	joined := strings.Join(rep.LostData, "\n")
	if !strings.Contains(joined, a.Blob.String()) || !strings.Contains(joined, b.Blob.String()) {
		t.Fatalf("lost data %q does not name both blobs", rep.LostData)
	}
}

// scanHook runs hook (once) before the first Scan of the keys under
// prefix: what another server does while a check is between two scans.
type scanHook struct {
	MetaStore
	prefix []byte
	hook   func()
}

func (s *scanHook) Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error {
	if s.hook != nil && bytes.Equal(from, s.prefix) {
		h := s.hook
		s.hook = nil
		h()
	}
	return s.MetaStore.Scan(ctx, from, to, fn)
}

// TestCheckIgnoresOrphansReclaimedDuringIt: an orphan reclaimed after the
// check loaded its inode and before it read the orphan records (inode and
// record go in one transaction) is not reported as leaked, as it was when
// fsck ran right after a metadata server's failover
// (TestOwnerKilledDuringCreateStorm, under load).
func TestCheckIgnoresOrphansReclaimedDuringIt(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	meta := &scanHook{MetaStore: e.meta}
	f, err := Open(ctx, Config{Meta: meta, Data: e.data, Number: e.num, Clock: e.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	s1 := WithSession(ctx, 1)
	a := must[Attr](t)(f.Create(s1, RootHandle, "f", 0o644, Cred{}))
	f.OpenNew(s1, a.Handle)
	if err := f.Unlink(s1, RootHandle, "f"); err != nil {
		t.Fatal(err)
	}
	meta.prefix = f.keys.orphanPrefix()
	meta.hook = func() {
		if err := f.Release(s1, a.Handle); err != nil {
			t.Error(err)
		}
	}
	rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{}))
	if meta.hook != nil {
		t.Fatal("the check never scanned the orphan records")
	}
	if _, err := f.headInode(ctx, a.Handle); errnoOf(err) == 0 {
		t.Fatal("the release did not reclaim the orphan")
	}
	if !rep.OK() {
		t.Fatalf("check with an orphan reclaimed during it: %v", rep.Problems)
	}

	// A real leak (no name, no orphan record) is still reported.
	b := must[Attr](t)(f.Create(ctx, RootHandle, "g", 0o644, Cred{}))
	f.OpenNew(s1, b.Handle)
	if err := f.Unlink(s1, RootHandle, "g"); err != nil {
		t.Fatal(err)
	}
	if err := e.meta.Update(ctx, func(tx MetaTxn) error { return tx.Delete(f.keys.orphan(b.Handle)) }); err != nil {
		t.Fatal(err)
	}
	if rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{})); rep.Leaked != 1 {
		t.Fatalf("check with an object that lost its orphan record: %d leaked, %v", rep.Leaked, rep.Problems)
	}
}
