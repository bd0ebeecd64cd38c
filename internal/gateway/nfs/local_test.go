package nfs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// localBackend is one file system, "default", run in the test process
// over the in-memory stores, with its snapshots.
type localBackend struct {
	t       testing.TB
	meta    *fs.MemMeta
	data    *fs.MemData
	engine  *fs.FS
	session atomic.Uint64

	mu    sync.Mutex
	snaps []SnapInfo
}

const localNumber = 7

func newLocalBackend(t testing.TB) *localBackend {
	t.Helper()
	b := &localBackend{t: t, meta: fs.NewMemMeta(1), data: fs.NewMemData(64 << 10)}
	ctx := context.Background()
	if err := fs.Format(ctx, b.meta, localNumber, fs.DefaultLayout, time.Now()); err != nil {
		t.Fatal(err)
	}
	b.engine = b.open(0)
	return b
}

func (b *localBackend) open(snap uint64) *fs.FS {
	f, err := fs.Open(context.Background(), fs.Config{Meta: b.meta, Data: b.data, Number: localNumber, Snapshot: snap})
	if err != nil {
		b.t.Fatal(err)
	}
	return f
}

func (b *localBackend) info() FSInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	return FSInfo{Number: localNumber, Name: "default", Gen: 42, Snapshots: append([]SnapInfo(nil), b.snaps...)}
}

func (b *localBackend) snapshot(name string) {
	b.mu.Lock()
	n := uint64(len(b.snaps) + 1)
	b.snaps = append(b.snaps, SnapInfo{Name: name, Number: n})
	b.mu.Unlock()
	if err := b.engine.CreateSnapshot(context.Background(), n, name); err != nil {
		b.t.Fatal(err)
	}
}

func (b *localBackend) FileSystems(context.Context) ([]FSInfo, error) { return []FSInfo{b.info()}, nil }

func (b *localBackend) FileSystemByName(_ context.Context, name string) (FSInfo, error) {
	if name != "default" {
		return FSInfo{}, fmt.Errorf("%w: %q", ErrNoFileSystem, name)
	}
	return b.info(), nil
}

func (b *localBackend) FileSystemByNumber(_ context.Context, n uint64) (FSInfo, error) {
	if n != localNumber {
		return FSInfo{}, fmt.Errorf("%w: %d", ErrNoFileSystem, n)
	}
	return b.info(), nil
}

func (b *localBackend) Open(_ context.Context, _ FSInfo, snap uint64) (FS, error) {
	engine := b.engine
	if snap != 0 {
		engine = b.open(snap)
	}
	return fsclient.NewFS(fsclient.FSConfig{Meta: fsclient.Local{FS: engine, Session: b.session.Add(1)}, Data: b.data, Snapshot: snap})
}

// startLocal runs a gateway over a local backend on a free port.
func startLocal(t testing.TB) (*localBackend, *Server) {
	t.Helper()
	return startLocalWith(t, Config{})
}

// startLocalWith is startLocal with cfg (its Backend is set here).
func startLocalWith(t testing.TB, cfg Config) (*localBackend, *Server) {
	t.Helper()
	b := newLocalBackend(t)
	cfg.Backend = b
	srv, err := Start(cfg, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(context.Background()); err != nil {
			t.Errorf("closing the gateway: %v", err)
		}
	})
	return b, srv
}

// rpcClient is the tests' view of a Client: failures of the transport
// fail the test, and accept statuses and NFS statuses are returned.
type rpcClient struct {
	t  testing.TB
	cl *Client
	// xid, if set, is the transaction id of the next call.
	xid uint32
}

func dialRPC(t testing.TB, addr string) *rpcClient {
	t.Helper()
	cl, err := Dial(context.Background(), addr, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl.Timeout = 30 * time.Second
	t.Cleanup(func() { cl.Close() })
	return &rpcClient{t: t, cl: cl}
}

// as makes the client's calls with AUTH_SYS uid and gid.
func (c *rpcClient) as(uid, gid uint32) *rpcClient {
	c.cl.As(uid, gid)
	return c
}

// raw sends a message as one record and returns the reply's record.
func (c *rpcClient) raw(msg []byte) sunrpc.Reply {
	c.t.Helper()
	conn := c.cl.conn
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if err := sunrpc.WriteRecord(conn, msg); err != nil {
		c.t.Fatal(err)
	}
	rec, err := sunrpc.ReadRecord(conn, sunrpc.MaxRecordBytes)
	if err != nil {
		c.t.Fatalf("reading the reply: %v", err)
	}
	rep, err := sunrpc.ParseReply(rec)
	if err != nil {
		c.t.Fatal(err)
	}
	return rep
}

// call makes a call and returns its accept status and results.
func (c *rpcClient) call(prog, vers, proc uint32, args func(w *xdr.Writer)) (sunrpc.AcceptStat, *xdr.Reader) {
	c.t.Helper()
	w := xdr.NewWriter(nil)
	if args != nil {
		args(w)
	}
	xid := c.xid
	c.xid = 0
	rep, err := c.cl.Call(xid, prog, vers, proc, w.Bytes())
	if rep.Denied {
		c.t.Fatalf("call %d/%d/%d denied", prog, vers, proc)
	}
	if err != nil && rep.Stat == sunrpc.Success {
		c.t.Fatalf("call %d/%d/%d: %v", prog, vers, proc, err)
	}
	return rep.Stat, xdr.NewReader(rep.Results)
}

// nfsXid is nfs with a given transaction id (a retransmission).
func (c *rpcClient) nfsXid(xid, proc uint32, args func(w *xdr.Writer)) (Status, *xdr.Reader) {
	c.t.Helper()
	c.xid = xid
	return c.nfs(proc, args)
}

// nfs makes an NFSv3 call that must be accepted and returns its status
// and the rest of its results.
func (c *rpcClient) nfs(proc uint32, args func(w *xdr.Writer)) (Status, *xdr.Reader) {
	c.t.Helper()
	st, r := c.call(ProgNFS, Version3, proc, args)
	if st != sunrpc.Success {
		c.t.Fatalf("NFS proc %d: accept status %d", proc, st)
	}
	return Status(r.Uint32()), r
}

// mount mounts path and returns its handle.
func (c *rpcClient) mount(path string) []byte {
	c.t.Helper()
	st, r := c.call(ProgMount, Version3, MountMnt, func(w *xdr.Writer) { w.String(path) })
	if st != sunrpc.Success {
		c.t.Fatalf("MNT %s: accept status %d", path, st)
	}
	if s := Status(r.Uint32()); s != OK {
		c.t.Fatalf("MNT %s: status %d", path, s)
	}
	return r.Opaque(maxHandleBytes)
}

// attrs is the part of a fattr3 the tests look at.
type attrs struct {
	typ, mode, uid, gid uint32
	size, fileid        uint64
	mtime, ctime        [2]uint32
}

func readFattr(r *xdr.Reader) attrs {
	var a attrs
	a.typ, a.mode = r.Uint32(), r.Uint32()
	r.Uint32() // nlink
	a.uid, a.gid = r.Uint32(), r.Uint32()
	a.size = r.Uint64()
	r.Uint64()            // used
	r.Uint32()            // rdev
	r.Uint32()            //
	r.Uint64()            // fsid
	a.fileid = r.Uint64() //
	r.Uint32()            // atime
	r.Uint32()            //
	a.mtime = [2]uint32{r.Uint32(), r.Uint32()}
	a.ctime = [2]uint32{r.Uint32(), r.Uint32()}
	return a
}

func readPostAttr(r *xdr.Reader) (attrs, bool) {
	if !r.Bool() {
		return attrs{}, false
	}
	return readFattr(r), true
}

func skipWcc(r *xdr.Reader) {
	if r.Bool() {
		r.Uint64()
		r.Uint64()
		r.Uint64()
	}
	readPostAttr(r)
}

func dirop(w *xdr.Writer, dir []byte, name string) {
	w.Opaque(dir)
	w.String(name)
}

// emptySattr writes a sattr3 that sets nothing but the mode (if mode >= 0).
func sattrMode(w *xdr.Writer, mode int) {
	if mode >= 0 {
		w.Bool(true)
		w.Uint32(uint32(mode))
	} else {
		w.Bool(false)
	}
	w.Bool(false)
	w.Bool(false)
	w.Bool(false)
	w.Uint32(0)
	w.Uint32(0)
}

// createdBy returns a reader of CREATE/MKDIR/SYMLINK/MKNOD results that
// must be OK: the new handle.
func createdBy(t testing.TB) func(st Status, r *xdr.Reader) []byte {
	return func(st Status, r *xdr.Reader) []byte { t.Helper(); return created(t, st, r) }
}

func created(t testing.TB, st Status, r *xdr.Reader) []byte {
	t.Helper()
	if st != OK {
		t.Fatalf("create: status %d", st)
	}
	if !r.Bool() {
		t.Fatal("create: no handle")
	}
	h := r.Opaque(maxHandleBytes)
	readPostAttr(r)
	skipWcc(r)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	return h
}
