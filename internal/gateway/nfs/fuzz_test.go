package nfs

import (
	"context"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// FuzzCall runs arbitrary arguments through every NFS, MOUNT, NLM and
// NSM procedure of a gateway over a file system in the process (proc
// below 100: NFS; 100-149: MOUNT; 150-199: NLM; from 200: NSM): none may
// panic or hang (each call has a deadline), and each is answered SUCCESS
// with a status, GARBAGE_ARGS, or PROC_UNAVAIL.
func FuzzCall(f *testing.F) {
	root := FileHandle{F: localNumber, H: fs.RootHandle, Gen: 42}.Encode()
	args := func(fn func(w *xdr.Writer)) []byte { w := xdr.NewWriter(nil); fn(w); return w.Bytes() }
	f.Add(uint8(ProcGetAttr), args(func(w *xdr.Writer) { w.Opaque(root) }))
	f.Add(uint8(ProcLookup), args(func(w *xdr.Writer) { dirop(w, root, "x") }))
	f.Add(uint8(ProcCreate), args(func(w *xdr.Writer) { dirop(w, root, "x"); w.Uint32(0); sattrMode(w, 0o644) }))
	f.Add(uint8(ProcWrite), args(func(w *xdr.Writer) { w.Opaque(root); w.Uint64(0); w.Uint32(1); w.Uint32(2); w.Opaque([]byte{1}) }))
	f.Add(uint8(ProcReadDirPlus), args(func(w *xdr.Writer) {
		w.Opaque(root)
		w.Uint64(0)
		w.Fixed(make([]byte, 8))
		w.Uint32(100)
		w.Uint32(4096)
	}))
	f.Add(uint8(ProcMknod), args(func(w *xdr.Writer) {
		dirop(w, root, "n")
		w.Uint32(typeChr)
		sattrMode(w, 0o600)
		w.Uint32(1)
		w.Uint32(3)
	}))
	f.Add(uint8(ProcRename), args(func(w *xdr.Writer) { dirop(w, root, "x"); dirop(w, root, "y") }))
	f.Add(uint8(100+MountMnt), args(func(w *xdr.Writer) { w.String("/default") }))
	f.Add(uint8(100+MountExport), []byte{})
	f.Add(uint8(150+nlmProcLock), args(func(w *xdr.Writer) {
		w.Opaque([]byte("c"))
		w.Bool(false)
		w.Bool(true)
		writeNLMLock(w, nlmOwner{"h", 1}, root, 0, 10)
		w.Bool(false)
		w.Int32(1)
	}))
	f.Add(uint8(150+nlmProcTest), args(func(w *xdr.Writer) {
		w.Opaque(nil)
		w.Bool(true)
		writeNLMLock(w, nlmOwner{"h", 2}, root, 5, 0)
	}))
	f.Add(uint8(150+nlmProcUnlock), args(func(w *xdr.Writer) { w.Opaque(nil); writeNLMLock(w, nlmOwner{"h", 1}, root, 0, 0) }))
	f.Add(uint8(150+nlmProcFreeAll), args(func(w *xdr.Writer) { w.String("h"); w.Int32(3) }))
	f.Add(uint8(200+nsmProcNotify), args(func(w *xdr.Writer) { w.String("h"); w.Int32(3) }))
	f.Add(uint8(200+nsmProcStat), args(func(w *xdr.Writer) { w.String("h") }))
	b := newLocalBackend(f)
	g, err := New(Config{Backend: b, OpTimeout: 10 * time.Second, Locks: NewMemLocks()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = g.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, proc uint8, a []byte) {
		c := &sunrpc.Call{Xid: 1, Prog: ProgNFS, Vers: Version3, Proc: uint32(proc), Args: a,
			Sys: &sunrpc.SysCred{Uid: uint32(proc % 3), Gid: 0}}
		serve := g.serveNFS
		switch {
		case proc >= 200:
			c.Prog, c.Vers, c.Proc, serve = ProgNSM, nsmV1, uint32(proc-200), g.serveNSM
		case proc >= 150:
			c.Prog, c.Vers, c.Proc, serve = ProgNLM, nlmV4, uint32(proc-150), g.serveNLM
		case proc >= 100:
			c.Prog, c.Proc, serve = ProgMount, uint32(proc-100), g.serveMount
		}
		w := xdr.NewWriter(nil)
		switch st := serve(context.Background(), c, sunrpc.ConnInfo{}, w); st {
		case sunrpc.Success:
			if c.Prog == ProgNFS && c.Proc != ProcNull && w.Len() < 4 {
				t.Fatal("a successful NFS reply without a status")
			}
		case sunrpc.GarbageArgs, sunrpc.ProcUnavail:
		default:
			t.Fatalf("proc %d: accept status %d", proc, st)
		}
	})
}
