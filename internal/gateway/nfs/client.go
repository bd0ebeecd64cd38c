package nfs

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// Client is a small NFSv3 client over one TCP connection, one call at a
// time, with AUTH_SYS: what the tests and benchmarks drive a gateway
// with beside libnfs's tools. It does no caching and no retries.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	xid  uint32
	cred sunrpc.Auth
	// Timeout bounds one call (default 60 s, NFS's own retry time).
	Timeout time.Duration
}

// StatusError is an NFS status other than OK.
type StatusError Status

func (e StatusError) Error() string { return fmt.Sprintf("nfs: status %d", uint32(e)) }

// Dial connects to a gateway; calls carry AUTH_SYS uid and gid.
func Dial(ctx context.Context, addr string, uid, gid uint32) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, Timeout: time.Minute, xid: uint32(time.Now().UnixNano())}
	c.As(uid, gid)
	return c, nil
}

// As makes the client's next calls as AUTH_SYS uid and gid.
func (c *Client) As(uid, gid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cred = sunrpc.Auth{Flavor: sunrpc.AuthSys, Body: sunrpc.EncodeSysCred(sunrpc.SysCred{MachineName: "arbor-client", Uid: uid, Gid: gid})}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call makes one call with transaction id xid (0: the next one) and
// returns its reply.
func (c *Client) Call(xid, prog, vers, proc uint32, args []byte) (sunrpc.Reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if xid == 0 {
		c.xid++
		xid = c.xid
	}
	_ = c.conn.SetDeadline(time.Now().Add(c.Timeout))
	if err := sunrpc.WriteRecord(c.conn, sunrpc.EncodeCall(sunrpc.Call{Xid: xid, Prog: prog, Vers: vers, Proc: proc, Cred: c.cred, Args: args})); err != nil {
		return sunrpc.Reply{}, err
	}
	rec, err := sunrpc.ReadRecord(c.conn, sunrpc.MaxRecordBytes)
	if err != nil {
		return sunrpc.Reply{}, err
	}
	rep, err := sunrpc.ParseReply(rec)
	if err != nil {
		return rep, err
	}
	if rep.Xid != xid {
		return rep, fmt.Errorf("nfs: reply to call %d, not %d", rep.Xid, xid)
	}
	if rep.Denied || rep.Stat != sunrpc.Success {
		return rep, fmt.Errorf("nfs: call %d.%d.%d refused (denied %v, status %d)", prog, vers, proc, rep.Denied, rep.Stat)
	}
	return rep, nil
}

// nfs makes an NFSv3 call and returns the results after an OK status.
func (c *Client) nfs(proc uint32, args func(w *xdr.Writer)) (*xdr.Reader, error) {
	w := xdr.NewWriter(nil)
	args(w)
	rep, err := c.Call(0, ProgNFS, Version3, proc, w.Bytes())
	if err != nil {
		return nil, err
	}
	r := xdr.NewReader(rep.Results)
	if st := Status(r.Uint32()); r.Err() != nil || st != OK {
		return nil, StatusError(st)
	}
	return r, nil
}

// Mount mounts path and returns its handle.
func (c *Client) Mount(path string) ([]byte, error) {
	w := xdr.NewWriter(nil)
	w.String(path)
	rep, err := c.Call(0, ProgMount, Version3, MountMnt, w.Bytes())
	if err != nil {
		return nil, err
	}
	r := xdr.NewReader(rep.Results)
	if st := Status(r.Uint32()); st != OK {
		return nil, StatusError(st)
	}
	fh := r.Opaque(maxHandleBytes)
	return fh, r.Err()
}

func skipPostAttr(r *xdr.Reader) {
	if r.Bool() {
		r.Fixed(84)
	}
}

func skipWccData(r *xdr.Reader) {
	if r.Bool() {
		r.Fixed(24)
	}
	skipPostAttr(r)
}

func putEmptySattr(w *xdr.Writer, mode uint32) {
	w.Bool(true)
	w.Uint32(mode)
	w.Bool(false)
	w.Bool(false)
	w.Bool(false)
	w.Uint32(timeDontChange)
	w.Uint32(timeDontChange)
}

// made reads the handle a create answered.
func made(r *xdr.Reader) ([]byte, error) {
	if !r.Bool() {
		return nil, fmt.Errorf("nfs: create answered no handle")
	}
	fh := r.Opaque(maxHandleBytes)
	return fh, r.Err()
}

// Create creates file name in dir (GUARDED) and returns its handle.
func (c *Client) Create(dir []byte, name string, mode uint32) ([]byte, error) {
	r, err := c.nfs(ProcCreate, func(w *xdr.Writer) {
		w.Opaque(dir)
		w.String(name)
		w.Uint32(createGuarded)
		putEmptySattr(w, mode)
	})
	if err != nil {
		return nil, err
	}
	return made(r)
}

// Mkdir creates directory name in dir and returns its handle.
func (c *Client) Mkdir(dir []byte, name string, mode uint32) ([]byte, error) {
	r, err := c.nfs(ProcMkdir, func(w *xdr.Writer) {
		w.Opaque(dir)
		w.String(name)
		putEmptySattr(w, mode)
	})
	if err != nil {
		return nil, err
	}
	return made(r)
}

// Lookup returns the handle of name in dir.
func (c *Client) Lookup(dir []byte, name string) ([]byte, error) {
	r, err := c.nfs(ProcLookup, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	if err != nil {
		return nil, err
	}
	fh := r.Opaque(maxHandleBytes)
	return fh, r.Err()
}

// Size returns the size GETATTR gives fh.
func (c *Client) Size(fh []byte) (uint64, error) {
	r, err := c.nfs(ProcGetAttr, func(w *xdr.Writer) { w.Opaque(fh) })
	if err != nil {
		return 0, err
	}
	r.Fixed(20)
	size := r.Uint64()
	return size, r.Err()
}

// Remove removes name from dir.
func (c *Client) Remove(dir []byte, name string) error {
	_, err := c.nfs(ProcRemove, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	return err
}

// Write writes data at off (stable: Unstable, DataSync or FileSync) and
// returns the write verifier.
func (c *Client) Write(fh []byte, off uint64, data []byte, stable uint32) ([]byte, error) {
	r, err := c.nfs(ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(off)
		w.Uint32(uint32(len(data)))
		w.Uint32(stable)
		w.Opaque(data)
	})
	if err != nil {
		return nil, err
	}
	skipWccData(r)
	if n := r.Uint32(); int(n) != len(data) {
		return nil, fmt.Errorf("nfs: wrote %d bytes of %d", n, len(data))
	}
	r.Uint32()
	verf := r.Fixed(8)
	return verf, r.Err()
}

// Commit commits fh's unstable writes and returns the write verifier.
func (c *Client) Commit(fh []byte) ([]byte, error) {
	r, err := c.nfs(ProcCommit, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(0) })
	if err != nil {
		return nil, err
	}
	skipWccData(r)
	verf := r.Fixed(8)
	return verf, r.Err()
}

// Read reads up to n bytes at off and reports whether the file ends
// there.
func (c *Client) Read(fh []byte, off uint64, n uint32) ([]byte, bool, error) {
	r, err := c.nfs(ProcRead, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(off); w.Uint32(n) })
	if err != nil {
		return nil, false, err
	}
	skipPostAttr(r)
	r.Uint32()
	eof := r.Bool()
	data := r.Opaque(maxIO)
	return data, eof, r.Err()
}
