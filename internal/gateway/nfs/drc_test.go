package nfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// TestDuplicateRequests checks the duplicate-request cache: a retransmitted
// REMOVE (same xid and arguments, on a new connection, as after a
// reconnect or at another gateway) is answered from its record, not run
// again (which would say NOENT); a call whose record says it was started
// but not finished (its gateway died) runs in retry mode: a GUARDED
// CREATE of the name the first attempt made answers that file, a REMOVE
// of a name already gone answers OK, a guarded SETATTR whose guard the
// first attempt invalidated applies; a new xid is a new call.
func TestDuplicateRequests(t *testing.T) {
	replies := NewMemReplies()
	_, srv := startLocalWith(t, Config{Replies: replies})
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")
	made := createdBy(t)
	made(create(c, root, "f", createGuarded, 0o644, nil))
	remove := func(c *rpcClient, xid uint32, name string) Status {
		st, _ := c.nfsXid(xid, ProcRemove, func(w *xdr.Writer) { dirop(w, root, name) })
		return st
	}
	if st := remove(c, 1000, "f"); st != OK {
		t.Fatalf("REMOVE: %d", st)
	}
	// The reply is recorded after it is sent.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		done := true
		replies.mu.Lock()
		for _, v := range replies.m {
			if st, _, _, _ := decodeRecord(v); st != replyDone {
				done = false
			}
		}
		replies.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the REMOVE's reply was not recorded")
		}
	}
	c2 := dialRPC(t, srv.Addr())
	if st := remove(c2, 1000, "f"); st != OK {
		t.Fatalf("retransmitted REMOVE: %d, want the recorded OK", st)
	}
	if n := srv.Gateway().Counters().Replayed.Load(); n != 1 {
		t.Fatalf("%d replies replayed, want 1", n)
	}
	if st := remove(c2, 1001, "f"); st != ErrNoEnt {
		t.Fatalf("a new REMOVE of a removed name: %d", st)
	}

	// A started record: the call's first gateway died after (perhaps)
	// applying it.
	started := func(xid, proc uint32, args []byte) {
		call := &sunrpc.Call{Xid: xid, Prog: ProgNFS, Vers: Version3, Proc: proc, Args: args,
			Sys: &sunrpc.SysCred{MachineName: "arbor-client"}}
		key := replyKey(call, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1})
		if err := replies.Put(context.Background(), key, encodeRecord(replyStarted, time.Now(), nil)); err != nil {
			t.Fatal(err)
		}
	}
	argsOf := func(fn func(w *xdr.Writer)) []byte { w := xdr.NewWriter(nil); fn(w); return w.Bytes() }
	first := made(create(c, root, "g", createGuarded, 0o644, nil))
	started(2000, ProcCreate, argsOf(func(w *xdr.Writer) { dirop(w, root, "g"); w.Uint32(createGuarded); sattrMode(w, 0o644) }))
	st, r := c.nfsXid(2000, ProcCreate, func(w *xdr.Writer) { dirop(w, root, "g"); w.Uint32(createGuarded); sattrMode(w, 0o644) })
	if h := created(t, st, r); !bytes.Equal(h, first) {
		t.Fatal("a retried GUARDED CREATE answered another file")
	}
	started(2001, ProcRemove, argsOf(func(w *xdr.Writer) { dirop(w, root, "gone") }))
	if st := remove(c, 2001, "gone"); st != OK {
		t.Fatalf("a retried REMOVE of a missing name: %d, want OK", st)
	}
	_, a := getattr(c, first)
	guarded := func(w *xdr.Writer) {
		w.Opaque(first)
		sattrMode(w, 0o600)
		w.Bool(true)
		w.Uint32(a.ctime[0] - 1)
		w.Uint32(0)
	}
	started(2002, ProcSetAttr, argsOf(guarded))
	if st, _ := c.nfsXid(2002, ProcSetAttr, guarded); st != OK {
		t.Fatalf("a retried guarded SETATTR: %d", st)
	}
	if n := srv.Gateway().Counters().Retried.Load(); n != 3 {
		t.Fatalf("%d calls retried, want 3", n)
	}
	// Unprotected by a record, the same REMOVE of a missing name fails.
	if st := remove(c, 2003, "gone"); st != ErrNoEnt {
		t.Fatalf("REMOVE of a missing name: %d", st)
	}

	// Records past their time are swept. The last calls' replies are
	// recorded after they are sent: sweep until they have been.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := replies.Sweep(context.Background(), time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		replies.mu.Lock()
		left := len(replies.m)
		replies.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records left after sweeps of all for 30 s", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNeedsRecord checks which calls go through the cache: those that are
// not safe to run twice.
func TestNeedsRecord(t *testing.T) {
	fh := FileHandle{F: 1, Gen: 1}.Encode()
	args := func(fn func(w *xdr.Writer)) []byte { w := xdr.NewWriter(nil); fn(w); return w.Bytes() }
	createHow := func(how uint32) []byte {
		return args(func(w *xdr.Writer) {
			dirop(w, fh, "x")
			w.Uint32(how)
			if how == createExclusive {
				w.Fixed(make([]byte, 8))
			} else {
				sattrMode(w, 0o644)
			}
		})
	}
	setattr := func(guard bool) []byte {
		return args(func(w *xdr.Writer) {
			w.Opaque(fh)
			sattrMode(w, 0o600)
			w.Bool(guard)
			if guard {
				w.Uint32(1)
				w.Uint32(2)
			}
		})
	}
	for _, tc := range []struct {
		proc uint32
		args []byte
		want bool
	}{
		{ProcCreate, createHow(createUnchecked), false},
		{ProcCreate, createHow(createGuarded), true},
		{ProcCreate, createHow(createExclusive), false},
		{ProcCreate, []byte{1, 2}, true}, // undecodable: the handler says GARBAGE_ARGS
		{ProcSetAttr, setattr(false), false},
		{ProcSetAttr, setattr(true), true},
		{ProcRemove, args(func(w *xdr.Writer) { dirop(w, fh, "x") }), true},
		{ProcRename, nil, true},
		{ProcGetAttr, args(func(w *xdr.Writer) { w.Opaque(fh) }), false},
		{ProcWrite, nil, false},
		{99, nil, false},
	} {
		if got := needsRecord(&sunrpc.Call{Proc: tc.proc, Args: tc.args}); got != tc.want {
			t.Errorf("proc %d args %x: needsRecord %v, want %v", tc.proc, tc.args, got, tc.want)
		}
	}
}

// memTree is a B-tree on an in-memory page store, as the cluster's KV
// store is one on the extent store.
func memTree(t *testing.T) *btree.Tree {
	t.Helper()
	ctx := context.Background()
	const ext = 1000
	st := btree.NewMemStore(1)
	if err := st.AddExtent(ext, btree.Geometry{PageBytes: 8 << 10, PagesPerBlock: 32, Blocks: 1024}); err != nil {
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
	return tr
}

// TestKVRepliesGroups runs many concurrent Begins and Puts through
// KVReplies, which commits them in groups: each Begin of a new key finds
// nothing and writes its started record, exactly one of two racing
// Begins of one key finds the other's, a Put replaces a record, and a
// caller whose context ends gets its error without failing the others.
func TestKVRepliesGroups(t *testing.T) {
	tr := memTree(t)
	// The tree opens only once every Begin waits, so the groups are
	// full whatever the machine's speed.
	release := make(chan struct{})
	s := &KVReplies{Open: func(context.Context) (*btree.Tree, error) { <-release; return tr, nil }}
	ctx := context.Background()
	const keys = 64
	key := func(i int) []byte { return []byte(fmt.Sprintf("%skey-%03d", ReplyKeyPrefix, i)) }
	var found atomic.Int64
	var wg sync.WaitGroup
	for i := range keys {
		for range 2 { // two racing Begins of each key
			wg.Go(func() {
				_, ok, err := s.Begin(ctx, key(i), encodeRecord(replyStarted, time.Now(), nil))
				if err != nil {
					t.Error(err)
				}
				if ok {
					found.Add(1)
				}
			})
		}
	}
	for {
		s.mu.Lock()
		queued := len(s.begins)
		s.mu.Unlock()
		if queued >= 2*keys-maxReplyLeaders*maxReplyBatch {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if found.Load() != keys {
		t.Fatalf("%d of %d second Begins found the first's record", found.Load(), keys)
	}
	if g := s.groups.Load(); g > 2*keys/maxReplyBatch+maxReplyLeaders+1 {
		t.Fatalf("%d Begins took %d commits: they were not grouped", 2*keys, g)
	} else {
		t.Logf("%d Begins in %d commits", 2*keys, g)
	}
	for i := range keys {
		wg.Go(func() {
			if err := s.Put(ctx, key(i), encodeRecord(replyDone, time.Now(), []byte{byte(i)})); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i := range keys {
		v, ok, err := s.Begin(ctx, key(i), nil)
		if err != nil || !ok {
			t.Fatalf("key %d after its Put: found %v, %v", i, ok, err)
		}
		if st, _, reply, err := decodeRecord(v); err != nil || st != replyDone || len(reply) != 1 || reply[0] != byte(i) {
			t.Fatalf("key %d: state %d reply %x (%v)", i, st, reply, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := s.Begin(done, key(keys), encodeRecord(replyStarted, time.Now(), nil)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Begin with its context done: %v", err)
	}
}
