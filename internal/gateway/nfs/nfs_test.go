package nfs

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

func create(c *rpcClient, dir []byte, name string, how uint32, mode int, verf []byte) (Status, *xdr.Reader) {
	return c.nfs(ProcCreate, func(w *xdr.Writer) {
		dirop(w, dir, name)
		w.Uint32(how)
		if how == createExclusive {
			w.Fixed(verf)
		} else {
			sattrMode(w, mode)
		}
	})
}

func write(c *rpcClient, h []byte, off uint64, data []byte, stable uint32) (Status, uint32, []byte) {
	st, r := c.nfs(ProcWrite, func(w *xdr.Writer) {
		w.Opaque(h)
		w.Uint64(off)
		w.Uint32(uint32(len(data)))
		w.Uint32(stable)
		w.Opaque(data)
	})
	if st != OK {
		return st, 0, nil
	}
	skipWcc(r)
	r.Uint32()
	committed := r.Uint32()
	return st, committed, r.Fixed(8)
}

func read(c *rpcClient, h []byte, off uint64, n uint32) (Status, []byte, bool) {
	st, r := c.nfs(ProcRead, func(w *xdr.Writer) {
		w.Opaque(h)
		w.Uint64(off)
		w.Uint32(n)
	})
	if st != OK {
		return st, nil, false
	}
	readPostAttr(r)
	r.Uint32()
	eof := r.Bool()
	return st, r.Opaque(maxIO), eof
}

func getattr(c *rpcClient, h []byte) (Status, attrs) {
	st, r := c.nfs(ProcGetAttr, func(w *xdr.Writer) { w.Opaque(h) })
	if st != OK {
		return st, attrs{}
	}
	return st, readFattr(r)
}

func lookup(c *rpcClient, dir []byte, name string) (Status, []byte) {
	st, r := c.nfs(ProcLookup, func(w *xdr.Writer) { dirop(w, dir, name) })
	if st != OK {
		return st, nil
	}
	return st, r.Opaque(maxHandleBytes)
}

// readdir lists dir with READDIRPLUS in pages of count bytes.
func readdir(t *testing.T, c *rpcClient, dir []byte, count uint32) []string {
	t.Helper()
	var names []string
	var cookie uint64
	verf := make([]byte, 8)
	for range 1000 {
		st, r := c.nfs(ProcReadDirPlus, func(w *xdr.Writer) {
			w.Opaque(dir)
			w.Uint64(cookie)
			w.Fixed(verf)
			w.Uint32(count)
			w.Uint32(count)
		})
		if st != OK {
			t.Fatalf("READDIRPLUS: status %d", st)
		}
		readPostAttr(r)
		verf = r.Fixed(8)
		for r.Bool() {
			r.Uint64()
			names = append(names, r.String(1024))
			cookie = r.Uint64()
			readPostAttr(r)
			if r.Bool() {
				r.Opaque(maxHandleBytes)
			}
		}
		if r.Bool() {
			return names
		}
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
	}
	t.Fatal("READDIRPLUS never reached eof")
	return nil
}

// TestProtocol walks the NFSv3 procedures against a gateway over a file
// system in the process, checking each answer against what was done.
func TestProtocol(t *testing.T) {
	made := createdBy(t)
	_, srv := startLocal(t)
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")

	// CREATE GUARDED, WRITE unstable then COMMIT, READ back.
	f := made(create(c, root, "a.txt", createGuarded, 0o644, nil))
	if st, _ := create(c, root, "a.txt", createGuarded, 0o644, nil); st != ErrExist {
		t.Fatalf("second GUARDED create: %d, want EXIST", st)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes: tracts of 64 KiB
	st, committed, verf := write(c, f, 0, data, Unstable)
	if st != OK || committed != Unstable {
		t.Fatalf("WRITE: %d committed %d", st, committed)
	}
	if st, _, v2 := write(c, f, uint64(len(data)), []byte("tail"), FileSync); st != OK || !bytes.Equal(v2, verf) {
		t.Fatalf("FILE_SYNC WRITE: %d, verifier %x then %x", st, verf, v2)
	}
	st, r := c.nfs(ProcCommit, func(w *xdr.Writer) { w.Opaque(f); w.Uint64(0); w.Uint32(0) })
	if st != OK {
		t.Fatalf("COMMIT: %d", st)
	}
	skipWcc(r)
	if v := r.Fixed(8); !bytes.Equal(v, verf) {
		t.Fatalf("COMMIT verifier %x, WRITE's %x: no data was lost, it must not change", v, verf)
	}
	want := append(append([]byte(nil), data...), "tail"...)
	var got []byte
	for off := uint64(0); ; {
		st, b, eof := read(c, f, off, 100000)
		if st != OK {
			t.Fatalf("READ at %d: %d", off, st)
		}
		got = append(got, b...)
		off += uint64(len(b))
		if eof {
			break
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, wrote %d (or they differ)", len(got), len(want))
	}
	if st, a := getattr(c, f); st != OK || a.size != uint64(len(want)) || a.typ != typeReg || a.mode != 0o644 {
		t.Fatalf("GETATTR: %d %+v", st, a)
	}

	// SETATTR with a guard that is out of date: NOT_SYNC, nothing changed.
	st, _ = c.nfs(ProcSetAttr, func(w *xdr.Writer) {
		w.Opaque(f)
		sattrMode(w, 0o600)
		w.Bool(true)
		w.Uint32(1)
		w.Uint32(0)
	})
	if st != ErrNotSync {
		t.Fatalf("guarded SETATTR with a wrong ctime: %d", st)
	}
	_, a := getattr(c, f)
	st, _ = c.nfs(ProcSetAttr, func(w *xdr.Writer) {
		w.Opaque(f)
		sattrMode(w, 0o600)
		w.Bool(true)
		w.Uint32(a.ctime[0])
		w.Uint32(a.ctime[1])
	})
	if _, a2 := getattr(c, f); st != OK || a2.mode != 0o600 {
		t.Fatalf("guarded SETATTR: %d, mode %o", st, a2.mode)
	}

	// EXCLUSIVE create: a retransmission (same verifier) succeeds, another
	// verifier is EXIST.
	v1 := []byte("verifie1")
	h1 := made(create(c, root, "x", createExclusive, 0, v1))
	h2 := made(create(c, root, "x", createExclusive, 0, v1))
	if !bytes.Equal(h1, h2) {
		t.Fatal("retransmitted EXCLUSIVE create gave another handle")
	}
	if st, _ := create(c, root, "x", createExclusive, 0, []byte("verifie2")); st != ErrExist {
		t.Fatalf("EXCLUSIVE create with another verifier: %d", st)
	}

	// MKDIR, SYMLINK, READLINK, LINK, RENAME, READDIRPLUS in small pages.
	d := made(c.nfs(ProcMkdir, func(w *xdr.Writer) { dirop(w, root, "d"); sattrMode(w, 0o755) }))
	for i := range 40 {
		made(create(c, d, string(rune('A'+i%26))+string(rune('a'+i/26)), createUnchecked, 0o644, nil))
	}
	if names := readdir(t, c, d, 1024); len(names) != 42 || names[0] != "." || names[1] != ".." {
		t.Fatalf("READDIRPLUS of 40 files: %d names %v", len(names), names)
	}
	l := made(c.nfs(ProcSymlink, func(w *xdr.Writer) { dirop(w, d, "ln"); sattrMode(w, -1); w.String("../a.txt") }))
	st, r = c.nfs(ProcReadlink, func(w *xdr.Writer) { w.Opaque(l) })
	readPostAttr(r)
	if target := r.String(4096); st != OK || target != "../a.txt" {
		t.Fatalf("READLINK: %d %q", st, target)
	}
	if st, _ := c.nfs(ProcLink, func(w *xdr.Writer) { w.Opaque(f); dirop(w, d, "hard") }); st != OK {
		t.Fatalf("LINK: %d", st)
	}
	if st, _ := c.nfs(ProcRename, func(w *xdr.Writer) { dirop(w, root, "a.txt"); dirop(w, d, "moved") }); st != OK {
		t.Fatalf("RENAME: %d", st)
	}
	if st, h := lookup(c, d, "moved"); st != OK || !bytes.Equal(h, f) {
		t.Fatalf("LOOKUP of the renamed file: %d, same handle %v", st, bytes.Equal(h, f))
	}
	if st, _ := lookup(c, root, "a.txt"); st != ErrNoEnt {
		t.Fatalf("LOOKUP of the old name: %d", st)
	}

	// REMOVE both names: the handle goes stale. RMDIR of a non-empty
	// directory: NOTEMPTY.
	for _, n := range []string{"moved", "hard"} {
		if st, _ := c.nfs(ProcRemove, func(w *xdr.Writer) { dirop(w, d, n) }); st != OK {
			t.Fatalf("REMOVE %s: %d", n, st)
		}
	}
	srv.Gateway().sessionsRelease(t)
	if st, _ := getattr(c, f); st != ErrStale {
		t.Fatalf("GETATTR of a removed file: %d, want STALE", st)
	}
	if st, _ := c.nfs(ProcRmdir, func(w *xdr.Writer) { dirop(w, root, "d") }); st != ErrNotEmpty {
		t.Fatalf("RMDIR of a full directory: %d", st)
	}

	// A handle that is no handle, and one of another file system.
	if st, _ := getattr(c, []byte("nonsense")); st != ErrBadHandle {
		t.Fatalf("GETATTR of garbage bytes: %d", st)
	}
	other := FileHandle{F: 99, Gen: 1}
	if st, _ := getattr(c, other.Encode()); st != ErrStale {
		t.Fatalf("GETATTR of a handle of no file system: %d", st)
	}
	fh, _ := DecodeHandle(root)
	fh.Gen++
	if st, _ := getattr(c, fh.Encode()); st != ErrStale {
		t.Fatalf("GETATTR of a handle of an older file system: %d", st)
	}

	// FSSTAT, FSINFO, PATHCONF answer.
	for _, p := range []uint32{ProcFSStat, ProcFSInfo, ProcPathConf} {
		if st, _ := c.nfs(p, func(w *xdr.Writer) { w.Opaque(root) }); st != OK {
			t.Fatalf("proc %d: %d", p, st)
		}
	}
}

// sessionsRelease releases every file the gateway holds open (as its
// idle timer would), so removed files are reclaimed.
func (g *Gateway) sessionsRelease(t *testing.T) {
	g.mu.Lock()
	ss := make([]*session, 0)
	for _, s := range g.sessions {
		ss = append(ss, s)
	}
	g.mu.Unlock()
	for _, s := range ss {
		s.releaseIdle(t.Context(), g, time.Time{})
	}
}

// TestPermissions checks AUTH_SYS credentials against the modes.
func TestPermissions(t *testing.T) {
	made := createdBy(t)
	_, srv := startLocal(t)
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")
	priv := made(c.nfs(ProcMkdir, func(w *xdr.Writer) { dirop(w, root, "priv"); sattrMode(w, 0o700) }))
	made(create(c, priv, "secret", createGuarded, 0o600, nil))
	pub := made(c.nfs(ProcMkdir, func(w *xdr.Writer) { dirop(w, root, "pub"); sattrMode(w, 0o1777) }))
	rootFile := made(create(c, pub, "roots", createGuarded, 0o644, nil))

	u := dialRPC(t, srv.Addr()).as(1000, 1000)
	if st, _ := lookup(u, priv, "secret"); st != ErrAccess {
		t.Fatalf("LOOKUP in a 0700 directory of another user: %d", st)
	}
	if st, _ := create(u, priv, "mine", createGuarded, 0o644, nil); st != ErrAccess {
		t.Fatalf("CREATE in a 0700 directory of another user: %d", st)
	}
	if st, _, _ := write(u, rootFile, 0, []byte("x"), FileSync); st != ErrAccess {
		t.Fatalf("WRITE to root's 0644 file: %d", st)
	}
	if st, _ := u.nfs(ProcSetAttr, func(w *xdr.Writer) { w.Opaque(rootFile); sattrMode(w, 0o666); w.Bool(false) }); st != ErrPerm {
		t.Fatalf("chmod of root's file: %d", st)
	}
	// Sticky directory: the user may create but not remove root's file.
	mine := made(create(u, pub, "mine", createGuarded, 0o644, nil))
	if _, a := getattr(u, mine); a.uid != 1000 || a.gid != 1000 {
		t.Fatalf("a created file's owner: %+v", a)
	}
	if st, _ := u.nfs(ProcRemove, func(w *xdr.Writer) { dirop(w, pub, "roots") }); st != ErrPerm {
		t.Fatalf("REMOVE of root's file in a sticky directory: %d", st)
	}
	if st, _ := u.nfs(ProcRemove, func(w *xdr.Writer) { dirop(w, pub, "mine") }); st != OK {
		t.Fatalf("REMOVE of one's own file: %d", st)
	}
	// ACCESS tells what is allowed.
	st, r := u.nfs(ProcAccess, func(w *xdr.Writer) { w.Opaque(rootFile); w.Uint32(0x3f) })
	readPostAttr(r)
	if got := r.Uint32(); st != OK || got != accessRead {
		t.Fatalf("ACCESS of root's 0644 file: %d %#x", st, got)
	}
}

// TestSnapshotExport mounts a snapshot: it shows the file as it was and
// refuses changes.
func TestSnapshotExport(t *testing.T) {
	made := createdBy(t)
	b, srv := startLocal(t)
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")
	f := made(create(c, root, "f", createGuarded, 0o644, nil))
	if st, _, _ := write(c, f, 0, []byte("before"), FileSync); st != OK {
		t.Fatal(st)
	}
	b.snapshot("s1")
	if st, _, _ := write(c, f, 0, []byte("AFTER!"), FileSync); st != OK {
		t.Fatal(st)
	}
	snap := c.mount("/default/.snapshot/s1")
	st, sf := lookup(c, snap, "f")
	if st != OK {
		t.Fatalf("LOOKUP in the snapshot: %d", st)
	}
	if st, b, _ := read(c, sf, 0, 100); st != OK || string(b) != "before" {
		t.Fatalf("READ in the snapshot: %d %q", st, b)
	}
	if st, _, _ := write(c, sf, 0, []byte("x"), FileSync); st != ErrROFS {
		t.Fatalf("WRITE in the snapshot: %d", st)
	}
	if st, _ := create(c, snap, "new", createGuarded, 0o644, nil); st != ErrROFS {
		t.Fatalf("CREATE in the snapshot: %d", st)
	}
	// EXPORT lists both.
	ast, r := c.call(ProgMount, Version3, MountExport, nil)
	var exports []string
	for ast == sunrpc.Success && r.Bool() {
		exports = append(exports, r.String(1024))
		for r.Bool() {
			r.String(1024)
		}
	}
	if len(exports) != 2 || exports[0] != "/default" || exports[1] != "/default/.snapshot/s1" {
		t.Fatalf("EXPORT: %v", exports)
	}
	if st, r := c.call(ProgMount, Version3, MountMnt, func(w *xdr.Writer) { w.String("/nosuch") }); st != sunrpc.Success || Status(r.Uint32()) != ErrNoEnt {
		t.Fatal("MNT of a missing file system must answer NOENT")
	}
}

// TestMalformedCalls sends calls the gateway cannot run: each gets the
// RPC answer its fault calls for, and the connection keeps working.
func TestMalformedCalls(t *testing.T) {
	_, srv := startLocal(t)
	c := dialRPC(t, srv.Addr())
	root := c.mount("/default")
	for proc := uint32(1); proc <= ProcCommit; proc++ {
		// Arguments cut short: a handle and nothing else.
		if st, _ := c.call(ProgNFS, Version3, proc, func(w *xdr.Writer) { w.Uint32(200) }); st != sunrpc.GarbageArgs {
			t.Fatalf("proc %d with a handle length past its bound: accept status %d", proc, st)
		}
	}
	if st, _ := c.call(ProgNFS, Version3, 22, nil); st != sunrpc.ProcUnavail {
		t.Fatalf("proc 22: %d", st)
	}
	if st, r := c.call(ProgNFS, 4, 0, nil); st != sunrpc.ProgMismatch || r.Uint32() != 3 || r.Uint32() != 3 {
		t.Fatalf("NFS v4: %d", st)
	}
	if st, _ := c.call(100099, 1, 0, nil); st != sunrpc.ProgUnavail {
		t.Fatalf("a program not served: %d", st)
	}
	if st, r := c.call(ProgNLM, 3, 0, nil); st != sunrpc.ProgMismatch || r.Uint32() != nlmV4 || r.Uint32() != nlmV4 {
		t.Fatalf("NLM v3: %d", st)
	}
	msg := sunrpc.EncodeCall(sunrpc.Call{Xid: 77, Prog: ProgNFS, Vers: 3})
	binary.BigEndian.PutUint32(msg[8:], 3) // RPC version 3
	if rep := c.raw(msg); !rep.Denied || rep.Xid != 77 {
		t.Fatalf("RPC version 3: %+v", rep)
	}
	msg = sunrpc.EncodeCall(sunrpc.Call{Xid: 78, Prog: ProgNFS, Vers: 3, Cred: sunrpc.Auth{Flavor: sunrpc.AuthSys, Body: []byte{1, 2}}})
	if rep := c.raw(msg); !rep.Denied || rep.Xid != 78 {
		t.Fatalf("a bad AUTH_SYS credential: %+v", rep)
	}
	if rep := c.raw([]byte{0, 0, 0, 79, 0, 0, 0, 0, 0}); rep.Xid != 79 || rep.Stat != sunrpc.GarbageArgs {
		t.Fatalf("a call header cut short: %+v", rep)
	}
	if st, _ := getattr(c, root); st != OK {
		t.Fatalf("GETATTR after the malformed calls: %d", st)
	}
}
