package nfs

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// nlmOwner is who locks: a client's caller name, process (svid) and owner
// handle, as Linux's lockd sends them.
type nlmOwner struct {
	host string
	svid int32
}

func (o nlmOwner) oh() []byte { return []byte(fmt.Sprintf("%d@%s", o.svid, o.host)) }

// nlmHolder is a TEST's answer for a lock in the way.
type nlmHolder struct {
	excl     bool
	svid     int32
	oh       []byte
	off, len uint64
}

func writeNLMLock(w *xdr.Writer, o nlmOwner, fh []byte, off, n uint64) {
	w.String(o.host)
	w.Opaque(fh)
	w.Opaque(o.oh())
	w.Int32(o.svid)
	w.Uint64(off)
	w.Uint64(n)
}

// nlm makes one NLM4 call (TEST, LOCK, CANCEL or UNLOCK) and returns its
// status and, for a TEST denied, the holder.
func (c *rpcClient) nlm(proc uint32, o nlmOwner, fh []byte, excl, block bool, off, n uint64) (uint32, nlmHolder) {
	c.t.Helper()
	cookie := []byte{byte(proc), 7}
	st, r := c.call(ProgNLM, nlmV4, proc, func(w *xdr.Writer) {
		w.Opaque(cookie)
		switch proc {
		case nlmProcTest:
			w.Bool(excl)
		case nlmProcLock, nlmProcCancel:
			w.Bool(block)
			w.Bool(excl)
		}
		writeNLMLock(w, o, fh, off, n)
		if proc == nlmProcLock {
			w.Bool(false)
			w.Int32(3)
		}
	})
	if st != sunrpc.Success {
		c.t.Fatalf("NLM proc %d: accept status %d", proc, st)
	}
	if got := r.Opaque(64); !bytes.Equal(got, cookie) {
		c.t.Fatalf("NLM proc %d: cookie %x, sent %x", proc, got, cookie)
	}
	stat := r.Uint32()
	var h nlmHolder
	if proc == nlmProcTest && stat == nlm4Denied {
		h = nlmHolder{excl: r.Bool(), svid: r.Int32(), oh: r.Opaque(maxOwnerBytes), off: r.Uint64(), len: r.Uint64()}
	}
	if r.Err() != nil || r.Remaining() != 0 {
		c.t.Fatalf("NLM proc %d: reply does not decode (%v, %d bytes left)", proc, r.Err(), r.Remaining())
	}
	return stat, h
}

// lockModel is what the locks of one file should be: for each owner, the
// kind of lock it holds on each byte of [0, modelBytes) (0 none, 1
// shared, 2 exclusive). Ranges start below modelOffsets and are at most
// modelOffsets/2 long, so every lock ends within the model; a lock to the
// end of the file covers it all.
const (
	modelOffsets = 48
	modelBytes   = modelOffsets * 3 / 2
)

type lockModel map[nlmOwner]*[modelBytes]byte

func (m lockModel) conflict(o nlmOwner, excl bool, off, end uint64) bool {
	for other, b := range m {
		if other == o {
			continue
		}
		for i := off; i < end && i < modelBytes; i++ {
			if b[i] == 2 || b[i] == 1 && excl {
				return true
			}
		}
	}
	return false
}

func (m lockModel) set(o nlmOwner, kind byte, off, end uint64) {
	if m[o] == nil {
		m[o] = new([modelBytes]byte)
	}
	for i := off; i < end && i < modelBytes; i++ {
		m[o][i] = kind
	}
}

// TestNLMModel drives one file's locks with random TEST, LOCK and UNLOCK
// calls of three owners, half through each of two gateways sharing one
// lock store, and checks every answer against a byte-by-byte model of
// POSIX locks: a LOCK is granted exactly when no other owner's lock in
// its range is in the way, a TEST names a lock that really is in the way,
// and an UNLOCK cuts its range out of the owner's locks (splitting them).
func TestNLMModel(t *testing.T) {
	locks := NewMemLocks()
	b, srv1 := startLocalWith(t, Config{Locks: locks})
	srv2, err := Start(Config{Backend: b, Locks: locks}, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv2.Close(context.Background()) })
	cs := []*rpcClient{dialRPC(t, srv1.Addr()), dialRPC(t, srv2.Addr())}
	root := cs[0].mount("/default")
	fh := createdBy(t)(create(cs[0], root, "locked", createUnchecked, 0o644, nil))

	owners := []nlmOwner{{"alpha", 1}, {"alpha", 2}, {"beta", 1}}
	model := lockModel{}
	var granted, denied int
	rng := rand.New(rand.NewPCG(testseed.Seed(t), 14))
	for step := range 600 {
		o := owners[rng.IntN(len(owners))]
		c := cs[rng.IntN(2)]
		off := uint64(rng.IntN(modelOffsets))
		n := uint64(rng.IntN(modelOffsets/2) + 1)
		if rng.IntN(8) == 0 {
			n = 0 // to the end of the file
		}
		end := rangeEnd(off, n)
		excl := rng.IntN(2) == 0
		switch op := rng.IntN(10); {
		case op < 5:
			st, _ := c.nlm(nlmProcLock, o, fh, excl, false, off, n)
			want := uint32(nlm4Granted)
			if model.conflict(o, excl, off, end) {
				want = nlm4Denied
			} else {
				model.set(o, map[bool]byte{false: 1, true: 2}[excl], off, end)
			}
			if st != want {
				t.Fatalf("step %d: LOCK %v excl=%v [%d,%d): %d, want %d", step, o, excl, off, end, st, want)
			}
			if st == nlm4Granted {
				granted++
			} else {
				denied++
			}
		case op < 8:
			if st, _ := c.nlm(nlmProcUnlock, o, fh, false, false, off, n); st != nlm4Granted {
				t.Fatalf("step %d: UNLOCK: %d", step, st)
			}
			model.set(o, 0, off, end)
		default:
			st, h := c.nlm(nlmProcTest, o, fh, excl, false, off, n)
			conflict := model.conflict(o, excl, off, end)
			if conflict != (st == nlm4Denied) || st != nlm4Granted && st != nlm4Denied {
				t.Fatalf("step %d: TEST %v excl=%v [%d,%d): %d, model conflict %v", step, o, excl, off, end, st, conflict)
			}
			if !conflict {
				continue
			}
			// The holder is another owner's lock in the way, held over
			// its whole range.
			var ho *nlmOwner
			for i := range owners {
				if owners[i].svid == h.svid && bytes.Equal(owners[i].oh(), h.oh) {
					ho = &owners[i]
				}
			}
			hend := rangeEnd(h.off, h.len)
			if ho == nil || *ho == o || !h.excl && !excl || h.off >= end || off >= hend {
				t.Fatalf("step %d: TEST %v [%d,%d) excl=%v names %+v, which is not in its way", step, o, off, end, excl, h)
			}
			kind := map[bool]byte{false: 1, true: 2}[h.excl]
			for i := h.off; i < hend && i < modelBytes; i++ {
				if model[*ho][i] != kind {
					t.Fatalf("step %d: TEST names %+v, but the model has byte %d as %d", step, h, i, model[*ho][i])
				}
			}
		}
	}
	if granted < 20 || denied < 20 {
		t.Fatalf("%d LOCKs granted and %d denied: the model test tested little", granted, denied)
	}
}

// TestNLM checks the rest of the lock manager's contract: locks outlive
// the gateway that granted them and show at every gateway; a blocking
// LOCK in the way is answered BLOCKED; FREE_ALL and the status monitor's
// SM_NOTIFY drop a restarted client's locks and no one else's; a stale
// handle answers STALE_FH; arguments that do not decode answer
// GARBAGE_ARGS and change nothing; the portmapper knows NLM and NSM.
func TestNLM(t *testing.T) {
	locks := NewMemLocks()
	b, srv1 := startLocalWith(t, Config{Locks: locks})
	srv2, err := Start(Config{Backend: b, Locks: locks}, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv2.Close(context.Background()) })
	c1, c2 := dialRPC(t, srv1.Addr()), dialRPC(t, srv2.Addr())
	root := c1.mount("/default")
	fh := createdBy(t)(create(c1, root, "f", createUnchecked, 0o644, nil))
	a, a2, bb := nlmOwner{"alpha", 10}, nlmOwner{"alpha", 11}, nlmOwner{"beta", 20}

	if st, _ := c1.nlm(nlmProcLock, a, fh, true, false, 100, 10); st != nlm4Granted {
		t.Fatalf("LOCK: %d", st)
	}
	if st, _ := c1.nlm(nlmProcLock, a2, fh, false, false, 200, 0); st != nlm4Granted {
		t.Fatalf("LOCK to the end: %d", st)
	}
	// The first gateway goes away; the second sees its locks.
	if err := srv1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, h := c2.nlm(nlmProcTest, bb, fh, false, false, 105, 1)
	if st != nlm4Denied || !h.excl || h.svid != a.svid || !bytes.Equal(h.oh, a.oh()) || h.off != 100 || h.len != 10 {
		t.Fatalf("TEST at another gateway: %d %+v", st, h)
	}
	if st, h := c2.nlm(nlmProcTest, bb, fh, true, false, 1<<40, 1); st != nlm4Denied || h.len != 0 || h.off != 200 {
		t.Fatalf("TEST past the end of a lock to the end of the file: %d %+v", st, h)
	}
	if st, _ := c2.nlm(nlmProcTest, bb, fh, false, false, 1<<40, 1); st != nlm4Granted {
		t.Fatalf("a shared TEST over a shared lock: %d", st)
	}
	if st, _ := c2.nlm(nlmProcLock, bb, fh, true, true, 0, 0); st != nlm4Blocked {
		t.Fatalf("a blocking LOCK in the way: %d, want BLOCKED", st)
	}
	if st, _ := c2.nlm(nlmProcCancel, bb, fh, true, true, 0, 0); st != nlm4Granted {
		t.Fatalf("CANCEL: %d", st)
	}
	// beta locks what is free; alpha's client restarts and says so to
	// the status monitor: its locks go, beta's stay.
	if st, _ := c2.nlm(nlmProcLock, bb, fh, true, false, 0, 50); st != nlm4Granted {
		t.Fatalf("LOCK of a free range: %d", st)
	}
	if st, _ := c2.call(ProgNSM, nsmV1, nsmProcNotify, func(w *xdr.Writer) { w.String("alpha"); w.Int32(5) }); st != sunrpc.Success {
		t.Fatalf("SM_NOTIFY: %d", st)
	}
	if st, _ := c2.nlm(nlmProcTest, nlmOwner{"gamma", 1}, fh, true, false, 100, 0); st != nlm4Granted {
		t.Fatalf("alpha's locks after its SM_NOTIFY: TEST %d", st)
	}
	if st, h := c2.nlm(nlmProcTest, nlmOwner{"gamma", 1}, fh, true, false, 0, 0); st != nlm4Denied || h.svid != bb.svid {
		t.Fatalf("beta's lock after alpha's SM_NOTIFY: %d %+v", st, h)
	}
	if st, _ := c2.call(ProgNLM, nlmV4, nlmProcFreeAll, func(w *xdr.Writer) { w.String("beta"); w.Int32(7) }); st != sunrpc.Success {
		t.Fatalf("FREE_ALL: %d", st)
	}
	if st, _ := c2.nlm(nlmProcLock, nlmOwner{"gamma", 1}, fh, true, false, 0, 0); st != nlm4Granted {
		t.Fatalf("LOCK after FREE_ALL: %d", st)
	}
	if err := locks.Scan(context.Background(), func(k, v []byte) error {
		l, err := decodeLocks(v)
		if err != nil || len(l) != 1 || l[0].Host != "gamma" || l[0].Off != 0 || l[0].End != math.MaxUint64 {
			t.Fatalf("the store holds %+v (%v), want gamma's one lock", l, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A removed file's handle is stale; so is one that is no handle.
	if st, _ := c2.nfs(ProcRemove, func(w *xdr.Writer) { dirop(w, root, "f") }); st != OK {
		t.Fatalf("REMOVE: %d", st)
	}
	if st, _ := c2.nlm(nlmProcLock, bb, fh, true, false, 0, 1); st != nlm4StaleFH {
		t.Fatalf("LOCK of a removed file: %d, want STALE_FH", st)
	}
	// gamma unlocks after the remove (close after unlink): granted, and the
	// removed file's record is gone from the store.
	if st, _ := c2.nlm(nlmProcUnlock, nlmOwner{"gamma", 1}, fh, false, false, 0, 0); st != nlm4Granted {
		t.Fatalf("UNLOCK of a removed file: %d, want GRANTED", st)
	}
	if err := locks.Scan(context.Background(), func(k, v []byte) error {
		t.Fatalf("the store still holds a record after the removed file's UNLOCK: %x", k)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st, _ := c2.nlm(nlmProcTest, bb, []byte("nonsense"), true, false, 0, 1); st != nlm4StaleFH {
		t.Fatalf("TEST of bytes that are no handle: %d, want STALE_FH", st)
	}
	// Garbage: a LOCK cut short.
	if st, _ := c2.call(ProgNLM, nlmV4, nlmProcLock, func(w *xdr.Writer) { w.Opaque([]byte{1}); w.Bool(true) }); st != sunrpc.GarbageArgs {
		t.Fatalf("a truncated LOCK: accept status %d, want GARBAGE_ARGS", st)
	}
	if st, _ := c2.call(ProgNLM, nlmV4, 7, nil); st != sunrpc.ProcUnavail {
		t.Fatalf("LOCK_MSG: accept status %d, want PROC_UNAVAIL", st)
	}
	for _, p := range []struct{ prog, vers uint32 }{{ProgNLM, nlmV4}, {ProgNSM, nsmV1}} {
		st, r := c2.call(ProgPortmap, portmapV2, pmapGetPort, func(w *xdr.Writer) { w.Uint32(p.prog); w.Uint32(p.vers); w.Uint32(protoTCP); w.Uint32(0) })
		if port := r.Uint32(); st != sunrpc.Success || int(port) != srv2.Port() {
			t.Fatalf("GETPORT of %d v%d: %d, port %d, want %d", p.prog, p.vers, st, port, srv2.Port())
		}
	}
	if st, r := c2.call(ProgNSM, nsmV1, nsmProcMon, func(w *xdr.Writer) {
		w.String("alpha")
		w.String("client")
		w.Int32(ProgNLM)
		w.Int32(nlmV4)
		w.Int32(16)
		w.Fixed(make([]byte, 16))
	}); st != sunrpc.Success || r.Uint32() != 0 || r.Int32()%2 != 1 {
		t.Fatalf("SM_MON: accept status %d, or not success with an odd state", st)
	}
}

// TestLockRanges checks the range arithmetic the lock table is made of.
func TestLockRanges(t *testing.T) {
	o := nlmLock{Host: "h", Svid: 1}
	lk := func(excl bool, off, end uint64) nlmLock { l := o; l.Excl, l.Off, l.End = excl, off, end; return l }
	var ls []nlmLock
	ls = add(ls, lk(false, 0, 10))
	ls = add(ls, lk(false, 10, 20)) // touching, same kind: merged
	if len(ls) != 1 || ls[0].Off != 0 || ls[0].End != 20 {
		t.Fatalf("merge: %+v", ls)
	}
	ls = add(ls, lk(true, 5, 8)) // a different kind inside: split in three
	if len(ls) != 3 {
		t.Fatalf("split: %+v", ls)
	}
	ls = cut(ls, &nlmLock{Host: "h", Svid: 1, Off: 0, End: math.MaxUint64})
	if len(ls) != 0 {
		t.Fatalf("unlock all: %+v", ls)
	}
	if rangeEnd(math.MaxUint64-1, 5) != math.MaxUint64 || rangeEnd(7, 0) != math.MaxUint64 || rangeEnd(7, 3) != 10 {
		t.Fatal("rangeEnd")
	}
	rec := encodeLocks([]nlmLock{lk(true, 1, 2), {Host: "other", Owner: []byte("oh"), Svid: -3, Off: 9, End: math.MaxUint64}})
	back, err := decodeLocks(rec)
	if err != nil || len(back) != 2 || back[1].Svid != -3 || string(back[1].Owner) != "oh" || !back[0].Excl {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if _, err := decodeLocks(rec[:len(rec)-1]); err == nil {
		t.Fatal("a truncated record decoded")
	}
}

// FuzzLockRecord: any bytes decode to locks or an error, never a panic;
// what decodes encodes back to the same bytes.
func FuzzLockRecord(f *testing.F) {
	f.Add(encodeLocks([]nlmLock{{Host: "h", Owner: []byte("1@h"), Svid: 1, Excl: true, Off: 0, End: 10}}))
	f.Add([]byte{lockRecordVersion, 0, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ls, err := decodeLocks(b)
		if err != nil {
			return
		}
		if again := encodeLocks(ls); !bytes.Equal(again, b) && !(len(ls) == 0 && len(again) == 0) {
			t.Fatalf("%x decoded to %+v, which encodes to %x", b, ls, again)
		}
	})
}
