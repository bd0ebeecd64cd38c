package fs

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// TestDataHold: a session's hold makes other sessions' reads of the file
// wait until its final block commit; bad holds are refused and change
// nothing; an inode written before holds existed still decodes.
func TestDataHold(t *testing.T) {
	e := newEnv(t, 64<<10)
	f := e.open(0)
	bg := context.Background()
	s1, s2 := WithSession(bg, 1), WithSession(bg, 2)
	d := must[Attr](t)(f.Mkdir(s1, RootHandle, "d", 0o755, Cred{}))
	a := must[Attr](t)(f.Create(s1, RootHandle, "f", 0o644, Cred{}))
	for _, tc := range []struct {
		what string
		ctx  context.Context
		h    Handle
		in   SetAttrIn
	}{
		{"no session", bg, a.Handle, SetAttrIn{Valid: SetHold}},
		{"a directory", s1, d.Handle, SetAttrIn{Valid: SetHold}},
		{"hold and unhold", s1, a.Handle, SetAttrIn{Valid: SetHold | SetUnhold}},
		{"hold with a mode", s1, a.Handle, SetAttrIn{Valid: SetHold | SetMode, Mode: 0o600}},
	} {
		_, err := f.SetAttr(tc.ctx, tc.h, tc.in)
		wantErrno(t, err, syscall.EINVAL)
		if n, _ := f.headInode(bg, a.Handle); n.HoldSession != 0 || n.Mode&permBits != 0o644 {
			t.Fatalf("%s: refused, yet the inode changed: %+v", tc.what, n)
		}
	}
	before := must[Attr](t)(f.GetAttr(s1, a.Handle))
	must[Attr](t)(f.SetAttr(s1, a.Handle, SetAttrIn{Valid: SetHold}))
	if got := must[Attr](t)(f.GetAttr(s1, a.Handle)); got.Ctime != before.Ctime || got.Mtime != before.Mtime {
		t.Fatalf("a hold changed the times: %+v, was %+v", got, before)
	}
	// Another session's unhold does not clear it; its reads wait.
	must[Attr](t)(f.SetAttr(s2, a.Handle, SetAttrIn{Valid: SetUnhold}))
	short, cancel := context.WithTimeout(s2, 50*time.Millisecond)
	_, err := f.GetAttr(short, a.Handle)
	cancel()
	if err == nil {
		t.Fatal("another session read a held file at once")
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.Lookup(s2, RootHandle, "f")
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("lookup of a held file returned %v before the commit", err)
	default:
	}
	// A commit without a modification time is not a flush's last: the
	// hold stays. The last one clears it.
	payload := []byte("held data, now committed")
	if err := e.data.CreateBlob(bg, a.Blob); err != nil {
		t.Fatal(err)
	}
	first := must[uint64](t)(e.data.Extend(bg, a.Blob, 2))
	for i := range uint64(2) {
		if err := e.data.WriteTract(bg, a.Blob, first+i, payload); err != nil {
			t.Fatal(err)
		}
	}
	c1 := must[BlocksCommitted](t)(f.CommitBlocks(s1, a.Handle, a.Blob, []NewBlock{{Start: 0, Tract: first, Length: uint64(len(payload))}}, Commit{}))
	if n, _ := f.headInode(bg, a.Handle); n.HoldSession != 1 {
		t.Fatalf("a commit that is not a flush's last cleared the hold: %+v", n)
	}
	must[BlocksCommitted](t)(f.CommitBlocks(s1, a.Handle, a.Blob, []NewBlock{{Start: 0, Tract: first + 1, Length: uint64(len(payload)), Base: c1.Blocks[0]}},
		Commit{Size: uint64(len(payload)), Mtime: time.Now().UnixNano()}))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := f.WaitHolds(bg); err != nil {
		t.Fatal(err)
	}
	// An inode record without the hold fields (as written before them).
	n := &inode{Mode: sIFREG | 0o644, Nlink: 1}
	old := n.encode()
	n.HoldSession, n.HoldUntil = 7, 99
	if got, err := decodeInode(old); err != nil || got.HoldSession != 0 {
		t.Fatalf("decode of an inode without a hold: %+v, %v", got, err)
	}
	if got, err := decodeInode(n.encode()); err != nil || got.HoldSession != 7 || got.HoldUntil != 99 {
		t.Fatalf("hold round trip: %+v, %v", got, err)
	}
}
