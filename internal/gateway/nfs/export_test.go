package nfs

import (
	"testing"

	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// What the external tests (package nfs_test: the cluster tests, which
// import devcluster and so, through the server, this package) use of the
// internal tests' client.

var (
	NeedLibnfs = needLibnfs
	RunTool    = runTool
	LibnfsURL  = libnfsURL
)

// CreateExclusive is CREATE's exclusive mode.
const CreateExclusive = createExclusive

// TestClient is the tests' NFSv3 client (rpcClient).
type TestClient struct{ c *rpcClient }

// DialTest connects to a gateway as root.
func DialTest(t testing.TB, addr string) *TestClient { return &TestClient{c: dialRPC(t, addr)} }

// Mount mounts path and returns its handle.
func (c *TestClient) Mount(path string) []byte { return c.c.mount(path) }

// Create creates name in dir (mode UNCHECKED, GUARDED or EXCLUSIVE with
// verf) and returns the new file's handle.
func (c *TestClient) Create(dir []byte, name string, how uint32, mode int, verf []byte) (Status, []byte) {
	st, r := create(c.c, dir, name, how, mode, verf)
	if st != OK {
		return st, nil
	}
	return st, created(c.c.t, st, r)
}

// Write writes data at off and returns the status, how it was committed
// and the write verifier.
func (c *TestClient) Write(fh []byte, off uint64, data []byte, stable uint32) (Status, uint32, []byte) {
	return write(c.c, fh, off, data, stable)
}

// Commit commits fh and returns the status and the write verifier.
func (c *TestClient) Commit(fh []byte) (Status, []byte) {
	st, r := c.c.nfs(ProcCommit, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(0) })
	if st != OK {
		return st, nil
	}
	skipWcc(r)
	return st, r.Fixed(8)
}

// Remove removes name from dir.
func (c *TestClient) Remove(dir []byte, name string) Status {
	st, _ := c.c.nfs(ProcRemove, func(w *xdr.Writer) { dirop(w, dir, name) })
	return st
}

// RemoveXid is Remove sent with transaction id xid (a retransmission
// when xid was used before).
func (c *TestClient) RemoveXid(xid uint32, dir []byte, name string) Status {
	st, _ := c.c.nfsXid(xid, ProcRemove, func(w *xdr.Writer) { dirop(w, dir, name) })
	return st
}

// NLM procedures and statuses the cluster tests use.
const (
	NLMTest     = nlmProcTest
	NLMLock     = nlmProcLock
	NLMUnlock   = nlmProcUnlock
	NLM4Granted = nlm4Granted
	NLM4Denied  = nlm4Denied
)

// NLM makes an NLM v4 call (TEST, non-blocking LOCK, or UNLOCK) as owner
// (host, svid) over [off, off+n) of fh, and returns its status and, for a
// TEST denied, the svid of the lock in the way.
func (c *TestClient) NLM(proc uint32, host string, svid int32, fh []byte, excl bool, off, n uint64) (uint32, int32) {
	st, h := c.c.nlm(proc, nlmOwner{host, svid}, fh, excl, false, off, n)
	return st, h.svid
}
