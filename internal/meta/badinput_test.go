package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// Bad input (DESIGN.md §2.6; the issue's "bad input gets a clear error and
// changes nothing"): administration of unknown tables, moves to nodes that
// do not exist, are dead or run no metadata server, and malformed
// file-system requests sent raw over gRPC. Each is answered with an error
// that says what was wrong, and the delegation map (owners, epochs,
// ranges), the file system's keys in the tree and what its server shows
// are the same before and after.

// rawClient connects to metadata server id directly (no routing, no
// retries).
func (c *testCluster) rawClient(id uint64) pb.MetaClient {
	c.t.Helper()
	c.mu.Lock()
	ts := c.servers[id]
	c.mu.Unlock()
	if ts == nil {
		c.t.Fatalf("no server %d", id)
	}
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = conn.Close() })
	return pb.NewMetaClient(conn)
}

// tableRow is what must not change of a table.
type tableRow struct {
	table, fs, owner, epoch uint64
	r                       fs.DRange
}

func (c *testCluster) tableRows(ctx context.Context) []tableRow {
	c.t.Helper()
	tabs, err := c.client.Tables(ctx, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	rows := make([]tableRow, len(tabs))
	for i, t := range tabs {
		rows[i] = tableRow{table: t.Table, fs: t.FileSystem, owner: t.Owner, epoch: t.Epoch, r: t.Range}
	}
	return rows
}

// fsView is what bad input must leave alone: the delegation map, the
// file system's record in the directory, every key of the file system in
// the tree, and what the owner of its root answers about the root.
type fsView struct {
	tables []tableRow
	record *dpb.FileSystem
	keys   map[string]string
	root   []proto.Message
}

func (v *fsView) diff(w *fsView) string {
	var out []string
	if !slices.Equal(v.tables, w.tables) {
		out = append(out, fmt.Sprintf("tables %+v, now %+v", v.tables, w.tables))
	}
	if !proto.Equal(v.record, w.record) {
		out = append(out, fmt.Sprintf("file system record %v, now %v", v.record, w.record))
	}
	for k, x := range v.keys {
		if y, ok := w.keys[k]; !ok {
			out = append(out, fmt.Sprintf("key %x removed", k))
		} else if x != y {
			out = append(out, fmt.Sprintf("key %x changed", k))
		}
	}
	for k := range w.keys {
		if _, ok := v.keys[k]; !ok {
			out = append(out, fmt.Sprintf("key %x added", k))
		}
	}
	for i := range min(len(v.root), len(w.root)) {
		if !proto.Equal(v.root[i], w.root[i]) {
			out = append(out, fmt.Sprintf("root view %d: %v, now %v", i, v.root[i], w.root[i]))
		}
	}
	return strings.Join(out, "\n")
}

// view reads file system f's view, once the owners' writes and moves have
// settled (three reads in a row agree: owners commit in the background,
// and a remote directory's table moves after its mkdir is answered).
func (c *testCluster) view(ctx context.Context, f uint64, clientOf func(id uint64) pb.MetaClient) *fsView {
	c.t.Helper()
	tree := newTree(c.t, c.pages, c.root, 0)
	read := func() *fsView {
		v := &fsView{tables: c.tableRows(ctx), keys: map[string]string{}}
		rec, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f})
		if err != nil {
			c.t.Fatal(err)
		}
		v.record = rec
		from := tuple.AppendUint(nil, f)
		if err := tree.Scan(ctx, from, tuple.PrefixEnd(from), func(k, val []byte) error {
			v.keys[string(k)] = string(val)
			return nil
		}); err != nil {
			c.t.Fatal(err)
		}
		cl := clientOf(c.owner(ctx, f, fs.RootHandle.D))
		hdr := &pb.Header{Fs: f}
		attr, err := cl.GetAttr(ctx, &pb.GetAttrRequest{Header: hdr, Handle: handleToPB(fs.RootHandle)})
		if err != nil {
			c.t.Fatal(err)
		}
		dir, err := cl.ReadDir(ctx, &pb.ReadDirRequest{Header: hdr, Dir: handleToPB(fs.RootHandle), Plus: true, Max: 1000})
		if err != nil {
			c.t.Fatal(err)
		}
		sf, err := cl.StatFS(ctx, &pb.StatFSRequest{Header: hdr})
		if err != nil {
			c.t.Fatal(err)
		}
		v.root = []proto.Message{attr, dir, sf}
		return v
	}
	last, same := read(), 0
	for deadline := time.Now().Add(15 * time.Second); ; {
		time.Sleep(100 * time.Millisecond)
		v := read()
		d := v.diff(last)
		if d == "" {
			if same++; same == 2 {
				return v
			}
			continue
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the file system does not settle: %s", d)
		}
		last, same = v, 0
	}
}

// waitNodeState waits until the directory says node id is in state.
func (c *testCluster) waitNodeState(ctx context.Context, id uint64, state dpb.NodeState) {
	c.t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		nodes, err := c.dir.Client().ListNodes(ctx, &dpb.ListNodesRequest{})
		if err != nil {
			c.t.Fatal(err)
		}
		for _, n := range nodes.GetNodes() {
			if n.GetId() == id && n.GetState() == state {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d never reached state %v", id, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answer is a request's outcome: the gRPC error, else the answer's.
func answer(e *pb.Error, err error) *pb.Error {
	if err != nil {
		return &pb.Error{Kind: -1, Message: "gRPC: " + err.Error()}
	}
	return e
}

// wantErr checks a bad request's answer: an error of the kind and errno
// expected (errno 0: any), with a message.
type wantErr struct {
	kind  pb.Error_Kind
	errno syscall.Errno
}

var (
	wantInvalid  = wantErr{kind: pb.Error_INVALID, errno: syscall.EINVAL}
	wantNotOwner = wantErr{kind: pb.Error_NOT_OWNER, errno: syscall.EAGAIN}
)

func posix(errno syscall.Errno) wantErr { return wantErr{kind: pb.Error_POSIX, errno: errno} }

func (w wantErr) check(t *testing.T, what string, e *pb.Error) {
	t.Helper()
	switch {
	case e == nil:
		t.Errorf("%s: succeeded", what)
	case e.GetKind() != w.kind || (w.errno != 0 && syscall.Errno(e.GetErrno()) != w.errno):
		t.Errorf("%s: answered %v errno %d (%v) %q, want %v errno %d (%v)", what, e.GetKind(), e.GetErrno(),
			syscall.Errno(e.GetErrno()), e.GetMessage(), w.kind, w.errno, w.errno)
	case e.GetMessage() == "":
		t.Errorf("%s: answered %v with no message", what, e.GetKind())
	default:
		t.Logf("%s: %v %v: %s", what, e.GetKind(), syscall.Errno(e.GetErrno()), e.GetMessage())
	}
}

// TestBadInput sends bad administration and malformed file-system
// requests to a cluster of metadata servers 1 and 2 (3 stopped and dead,
// 50 alive but no metadata server) and checks each is refused with a
// clear error and changes nothing.
func TestBadInput(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	clients := map[uint64]pb.MetaClient{}
	clientOf := func(id uint64) pb.MetaClient {
		if clients[id] == nil {
			clients[id] = c.rawClient(id)
		}
		return clients[id]
	}
	s1, s2 := clientOf(1), clientOf(2)
	// The file system is created by server 1: its first table is served
	// there. Node 3 stops (and is declared dead); node 50 runs no metadata
	// server.
	created, err := s1.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: "bad"})
	if err := answer(created.GetError(), err); err != nil {
		t.Fatal(err)
	}
	f := created.GetNumber()
	c.kill(3)
	c.dir.Register(50, "127.0.0.1:1", "tract")
	c.waitNodeState(ctx, 3, dpb.NodeState_NODE_STATE_DEAD)
	time.Sleep(peerRefresh + 100*time.Millisecond) // every server's node cache knows

	// Some content: a file with an attribute, a symlink, a directory (which
	// placement may give a table of its own on server 2), and two tables
	// on server 1 (split).
	hdr := func(seq uint64) *pb.Header { return &pb.Header{Fs: f, Session: 77, Slot: 1, Seq: seq} }
	seq := uint64(0)
	next := func() *pb.Header { seq++; return hdr(seq) }
	root := handleToPB(fs.RootHandle)
	file, err := s1.Create(ctx, &pb.CreateRequest{Header: next(), Kind: pb.CreateRequest_FILE, Dir: root, Name: "file", Mode: 0o644})
	if err := answer(file.GetError(), err); err != nil {
		t.Fatal(err)
	}
	fh := file.GetAttr().GetHandle()
	if x, err := s1.Xattr(ctx, &pb.XattrRequest{Header: next(), Op: pb.XattrRequest_SET, Handle: fh, Name: "user.a", Value: []byte("v")}); answer(x.GetError(), err) != nil {
		t.Fatal(answer(x.GetError(), err))
	}
	if l, err := s1.Create(ctx, &pb.CreateRequest{Header: next(), Kind: pb.CreateRequest_SYMLINK, Dir: root, Name: "link", Target: "file"}); answer(l.GetError(), err) != nil {
		t.Fatal(answer(l.GetError(), err))
	}
	if d, err := s1.Create(ctx, &pb.CreateRequest{Header: next(), Kind: pb.CreateRequest_DIRECTORY, Dir: root, Name: "dir", Mode: 0o755}); answer(d.GetError(), err) != nil {
		t.Fatal(answer(d.GetError(), err))
	}
	rootTable := func() tableRow {
		for _, r := range c.tableRows(ctx) {
			if r.fs == f && r.r.Contains(0) {
				return r
			}
		}
		t.Fatal("no table holds the root")
		return tableRow{}
	}
	const cut = 1 << 40
	if rt := rootTable(); rt.r.Hi == 0 || rt.r.Hi > cut {
		if sp, err := s1.SplitTable(ctx, &pb.SplitTableRequest{Table: rt.table, At: cut}); answer(sp.GetError(), err) != nil {
			t.Fatal(answer(sp.GetError(), err))
		}
	}
	if sn, err := s1.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Fs: f, Name: "snap"}); answer(sn.GetError(), err) != nil {
		t.Fatal(answer(sn.GetError(), err))
	}
	before := c.view(ctx, f, clientOf)
	rt := rootTable()
	if rt.owner != 1 {
		t.Fatalf("the root's table %+v is not on server 1", rt)
	}
	t.Logf("tables: %+v", before.tables)
	if !slices.ContainsFunc(before.tables, func(r tableRow) bool { return r.owner == 2 }) {
		// Placement kept "dir" on server 1: the bad mkdirs below do not
		// exercise remote placement.
		t.Log("no table on server 2: remote placement was not used")
	}
	if len(before.keys) == 0 || len(before.root[1].(*pb.ReadDirResponse).GetEntries()) < 3 {
		t.Fatalf("the file system's view is empty: %d keys, root %v", len(before.keys), before.root[1])
	}

	t.Run("tables", func(t *testing.T) {
		const unknown = 987654321
		// Through the client, as `arbor table move/split` does.
		if _, err := c.client.MoveTable(ctx, unknown, 2); !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "no table") {
			t.Errorf("move of unknown table: %v", err)
		}
		if _, _, err := c.client.SplitTable(ctx, unknown, 0); !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "no table") {
			t.Errorf("split of unknown table: %v", err)
		}
		for _, to := range []uint64{99, 3, 50, 0} {
			if _, err := c.client.MoveTable(ctx, rt.table, to); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("move of table %d to node %d: %v, want EINVAL", rt.table, to, err)
			} else {
				t.Logf("move to node %d: %v", to, err)
			}
		}
		// Raw, to the owner and to another server.
		for _, x := range []struct {
			what string
			cl   pb.MetaClient
			req  *pb.MoveTableRequest
			want wantErr
		}{
			{"move of unknown table", s1, &pb.MoveTableRequest{Table: unknown, Node: 2}, wantInvalid},
			{"move of table 0", s1, &pb.MoveTableRequest{Table: 0, Node: 2}, wantInvalid},
			{"move to no node", s1, &pb.MoveTableRequest{Table: rt.table, Node: 0}, wantInvalid},
			{"move to a node not in the cluster", s1, &pb.MoveTableRequest{Table: rt.table, Node: 99}, wantInvalid},
			{"move to a dead node", s1, &pb.MoveTableRequest{Table: rt.table, Node: 3}, wantInvalid},
			{"move to a node with no metadata server", s1, &pb.MoveTableRequest{Table: rt.table, Node: 50}, wantInvalid},
			{"move asked of a server that does not own the table", s2, &pb.MoveTableRequest{Table: rt.table, Node: 2}, wantNotOwner},
		} {
			resp, err := x.cl.MoveTable(ctx, x.req)
			x.want.check(t, x.what, answer(resp.GetError(), err))
		}
		for _, x := range []struct {
			what string
			cl   pb.MetaClient
			req  *pb.SplitTableRequest
			want wantErr
		}{
			{"split of unknown table", s1, &pb.SplitTableRequest{Table: unknown}, wantInvalid},
			{"split of unknown table at a point", s1, &pb.SplitTableRequest{Table: unknown, At: 5}, wantInvalid},
			{"split outside the table", s1, &pb.SplitTableRequest{Table: rt.table, At: rt.r.Hi + 1}, wantInvalid},
			{"split at the table's end", s1, &pb.SplitTableRequest{Table: rt.table, At: rt.r.Hi}, wantInvalid},
			{"split asked of a server that does not own the table", s2, &pb.SplitTableRequest{Table: rt.table, At: 5}, wantNotOwner},
		} {
			resp, err := x.cl.SplitTable(ctx, x.req)
			x.want.check(t, x.what, answer(resp.GetError(), err))
		}
		tabs, err := s1.Tables(ctx, &pb.TablesRequest{Fs: f, Op: 42})
		wantInvalid.check(t, "tables operation 42", answer(tabs.GetError(), err))
		for _, x := range []struct {
			what string
			cl   pb.MetaClient
			at   *pb.TableAt
		}{
			{"sweep asked of a server that does not own the table", s2, &pb.TableAt{Table: rt.table, Epoch: rt.epoch}},
			{"sweep of the table at an older epoch", s1, &pb.TableAt{Table: rt.table, Epoch: rt.epoch - 1}},
			{"sweep of an unknown table", s1, &pb.TableAt{Table: unknown, Epoch: 1}},
		} {
			sweep, err := x.cl.Tables(ctx, &pb.TablesRequest{Fs: f, Op: pb.TablesRequest_SWEEP, Tables: []*pb.TableAt{x.at}})
			wantNotOwner.check(t, x.what, answer(sweep.GetError(), err))
		}
		for _, x := range []struct {
			what, name string
		}{
			{"file system with no name", ""}, {"file system with a long name", strings.Repeat("n", 300)}, {"file system named a/b", "a/b"},
			{"file system named .", "."}, {"file system named ..", ".."}, {"file system named with a space", "a b"},
			{"file system named with a tab", "a\tb"}, {"file system named with a newline", "a\n"},
		} {
			fsr, err := s1.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: x.name})
			wantInvalid.check(t, x.what, answer(fsr.GetError(), err))
			// The client library refuses it before sending.
			_, _, err = c.client.CreateFileSystem(ctx, x.name)
			wantInvalid.check(t, x.what+", by the client", errorToPB(err))
		}
		// A data layout the data store cannot give (a memory store has
		// one) is refused, and no file system is made.
		for _, layout := range []string{"ec:5+2", "replicas:3", "bogus"} {
			fsr, err := s1.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: "layered", DataLayout: layout})
			wantInvalid.check(t, "file system with data layout "+layout, answer(fsr.GetError(), err))
			if _, err := c.dir.Client().GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: "layered"}); !directory.IsNotFound(err) {
				t.Fatalf("a file system refused for its data layout %q was made: %v", layout, err)
			}
		}
		// A name that is not UTF-8 cannot be marshaled: the client says so
		// instead of gRPC's "error while marshaling".
		_, _, err = c.client.CreateFileSystem(ctx, "bad\xff")
		wantInvalid.check(t, "file system name that is not UTF-8", errorToPB(err))
		for _, x := range []struct {
			what string
			req  *pb.CreateSnapshotRequest
			want wantErr
		}{
			{"snapshot with no name", &pb.CreateSnapshotRequest{Fs: f}, wantInvalid},
			{"snapshot with a long name", &pb.CreateSnapshotRequest{Fs: f, Name: strings.Repeat("n", 300)}, wantInvalid},
			{"snapshot named a/b", &pb.CreateSnapshotRequest{Fs: f, Name: "a/b"}, wantInvalid},
			{"snapshot named .", &pb.CreateSnapshotRequest{Fs: f, Name: "."}, wantInvalid},
			{"snapshot named ..", &pb.CreateSnapshotRequest{Fs: f, Name: ".."}, wantInvalid},
			{"snapshot named with a space", &pb.CreateSnapshotRequest{Fs: f, Name: "a b"}, wantInvalid},
			{"snapshot named with a newline", &pb.CreateSnapshotRequest{Fs: f, Name: "a\n"}, wantInvalid},
			{"snapshot with the name of another", &pb.CreateSnapshotRequest{Fs: f, Name: "snap"}, posix(syscall.EEXIST)},
			{"snapshot of file system 0", &pb.CreateSnapshotRequest{Name: "s"}, wantInvalid},
			{"snapshot of an unknown file system", &pb.CreateSnapshotRequest{Fs: f + 1000, Name: "s"}, posix(syscall.ENOENT)},
		} {
			resp, err := s1.CreateSnapshot(ctx, x.req)
			x.want.check(t, x.what, answer(resp.GetError(), err))
			if x.want == wantInvalid && x.req.GetFs() == f {
				// The client library refuses it before sending.
				_, err = c.client.CreateSnapshot(ctx, f, x.req.GetName())
				wantInvalid.check(t, x.what+", by the client", errorToPB(err))
			}
		}
		_, err = c.client.CreateSnapshot(ctx, f, "bad\xff")
		wantInvalid.check(t, "snapshot name that is not UTF-8", errorToPB(err))
		for _, x := range []struct {
			n    uint64
			want wantErr
		}{{0, wantInvalid}, {77, posix(syscall.ENOENT)}} {
			ds, err := s1.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Fs: f, Number: x.n})
			x.want.check(t, fmt.Sprintf("delete of snapshot %d, never taken", x.n), answer(ds.GetError(), err))
		}
		df, err := s1.DeleteFileSystem(ctx, &pb.DeleteFileSystemRequest{Name: "no such file system"})
		posix(syscall.ENOENT).check(t, "delete of an unknown file system", answer(df.GetError(), err))
		ck, err := s1.Check(ctx, &pb.CheckRequest{})
		wantInvalid.check(t, "check of file system 0", answer(ck.GetError(), err))

		if d := before.diff(c.view(ctx, f, clientOf)); d != "" {
			t.Errorf("bad table requests changed things:\n%s", d)
		}
	})

	t.Run("requests", func(t *testing.T) {
		long := strings.Repeat("x", fs.MaxNameBytes+1)
		gone := &pb.Handle{D: 0, C: 0xdead} // in the root's table, no such object
		far := &pb.Handle{D: cut - 1, C: 0} // in the root's table, no such directory
		type req struct {
			what string
			run  func(h *pb.Header) (*pb.Error, error)
			want wantErr
		}
		var reqs []req
		create := func(what string, kind pb.CreateRequest_Kind, dir *pb.Handle, name, target string, want wantErr) {
			reqs = append(reqs, req{what, func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Create(ctx, &pb.CreateRequest{Header: h, Kind: kind, Dir: dir, Name: name, Mode: 0o755, Target: target})
				return r.GetError(), err
			}, want})
		}
		names := []struct {
			name string
			want wantErr
		}{
			{"", posix(syscall.ENOENT)},
			{long, posix(syscall.ENAMETOOLONG)},
			{"a/b", posix(syscall.EINVAL)},
			{"/", posix(syscall.EINVAL)},
			{"a\x00b", posix(syscall.EINVAL)},
			{".", posix(syscall.EEXIST)},
			{"..", posix(syscall.EEXIST)},
			{"file", posix(syscall.EEXIST)},
		}
		for _, kind := range []pb.CreateRequest_Kind{pb.CreateRequest_FILE, pb.CreateRequest_DIRECTORY, pb.CreateRequest_SYMLINK, pb.CreateRequest_NODE} {
			for _, n := range names {
				create(fmt.Sprintf("create %v %q", kind, trim(n.name)), kind, root, n.name, "t", n.want)
			}
			create(fmt.Sprintf("create %v in a missing object", kind), kind, gone, "new", "t", posix(syscall.ENOENT))
			create(fmt.Sprintf("create %v in a missing directory", kind), kind, far, "new", "t", posix(syscall.ENOENT))
			create(fmt.Sprintf("create %v in a file", kind), kind, fh, "new", "t", posix(syscall.ENOTDIR))
		}
		create("create of kind 42", 42, root, "new", "", wantInvalid)
		create("symlink to nothing", pb.CreateRequest_SYMLINK, root, "new", "", posix(syscall.ENOENT))
		create("symlink to a long target", pb.CreateRequest_SYMLINK, root, "new", strings.Repeat("t", 4096), posix(syscall.ENAMETOOLONG))
		create("symlink to a target with NUL", pb.CreateRequest_SYMLINK, root, "new", "a\x00b", posix(syscall.EINVAL))
		for _, n := range names[:5] {
			reqs = append(reqs, req{fmt.Sprintf("lookup %q", trim(n.name)), func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: root, Name: n.name})
				return r.GetError(), err
			}, n.want})
			reqs = append(reqs, req{fmt.Sprintf("link as %q", trim(n.name)), func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Link(ctx, &pb.LinkRequest{Header: h, Handle: fh, Dir: root, Name: n.name})
				return r.GetError(), err
			}, n.want})
			reqs = append(reqs, req{fmt.Sprintf("unlink %q", trim(n.name)), func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Remove(ctx, &pb.RemoveRequest{Header: h, Dir: root, Name: n.name})
				return r.GetError(), err
			}, n.want})
			reqs = append(reqs, req{fmt.Sprintf("rename to %q", trim(n.name)), func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: root, SrcName: "file", DstDir: root, DstName: n.name})
				return r.GetError(), err
			}, n.want})
			reqs = append(reqs, req{fmt.Sprintf("rename from %q", trim(n.name)), func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: root, SrcName: n.name, DstDir: root, DstName: "new"})
				return r.GetError(), err
			}, n.want})
		}
		more := []req{
			{"link of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Link(ctx, &pb.LinkRequest{Header: h, Handle: gone, Dir: root, Name: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"link into a file", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Link(ctx, &pb.LinkRequest{Header: h, Handle: fh, Dir: fh, Name: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOTDIR)},
			{"unlink of a missing name", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Remove(ctx, &pb.RemoveRequest{Header: h, Dir: root, Name: "missing"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"rmdir of a file", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Remove(ctx, &pb.RemoveRequest{Header: h, Dir: root, Name: "file", Directory: true})
				return r.GetError(), err
			}, posix(syscall.ENOTDIR)},
			{"rename with flags 0xff", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: root, SrcName: "file", DstDir: root, DstName: "new", Flags: 0xff})
				return r.GetError(), err
			}, posix(syscall.EINVAL)},
			{"rename of a missing name", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: root, SrcName: "missing", DstDir: root, DstName: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"rename into a missing directory", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: root, SrcName: "file", DstDir: far, DstName: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"getattr of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.GetAttr(ctx, &pb.GetAttrRequest{Header: h, Handle: gone})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"setattr of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.SetAttr(ctx, &pb.SetAttrRequest{Header: h, Handle: gone, Valid: ^uint32(0), Mode: 0o777, Size: 5})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"readlink of a file", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Readlink(ctx, &pb.ReadlinkRequest{Header: h, Handle: fh})
				return r.GetError(), err
			}, posix(syscall.EINVAL)},
			{"readdir of a file", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.ReadDir(ctx, &pb.ReadDirRequest{Header: h, Dir: fh})
				return r.GetError(), err
			}, posix(syscall.ENOTDIR)},
			{"xattr operation 42", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: 42, Handle: fh, Name: "user.a"})
				return r.GetError(), err
			}, wantInvalid},
			{"xattr with no name", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: pb.XattrRequest_SET, Handle: fh, Value: []byte("v")})
				return r.GetError(), err
			}, wantErr{kind: pb.Error_POSIX}},
			{"xattr with a long name", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: pb.XattrRequest_SET, Handle: fh, Name: "user." + long, Value: []byte("v")})
				return r.GetError(), err
			}, posix(syscall.ERANGE)},
			{"xattr with a large value", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: pb.XattrRequest_SET, Handle: fh, Name: "user.b", Value: make([]byte, 64<<10)})
				return r.GetError(), err
			}, posix(syscall.E2BIG)},
			{"xattr of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: pb.XattrRequest_SET, Handle: gone, Name: "user.b", Value: []byte("v")})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"removexattr of a missing attribute", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Xattr(ctx, &pb.XattrRequest{Header: h, Op: pb.XattrRequest_REMOVE, Handle: fh, Name: "user.none"})
				return r.GetError(), err
			}, posix(syscall.ENODATA)},
			{"open of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.Open(ctx, &pb.OpenRequest{Header: h, Handle: gone})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"file blocks of a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.FileBlocks(ctx, &pb.FileBlocksRequest{Header: h, Handle: gone, Starts: []uint64{0}})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"too many file blocks", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.FileBlocks(ctx, &pb.FileBlocksRequest{Header: h, Handle: fh, Starts: make([]uint64, maxBlocksPerRequest+1)})
				return r.GetError(), err
			}, wantInvalid},
			{"commit to a blob id of 3 bytes", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.CommitBlocks(ctx, &pb.CommitBlocksRequest{Header: h, Handle: fh, Blob: []byte{1, 2, 3},
					Blocks: []*pb.NewBlock{{Start: 0, Tract: 0, Length: 10}}, Size: 10})
				return r.GetError(), err
			}, wantInvalid},
			{"commit of too many blocks", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.CommitBlocks(ctx, &pb.CommitBlocksRequest{Header: h, Handle: fh, Blob: make([]byte, 16),
					Blocks: make([]*pb.NewBlock, fs.MaxBlocksPerCommit+1), Size: 10})
				return r.GetError(), err
			}, wantInvalid},
			{"commit to a directory", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.CommitBlocks(ctx, &pb.CommitBlocksRequest{Header: h, Handle: root, Blob: bytesOf(16, 1),
					Blocks: []*pb.NewBlock{{Start: 0, Tract: 0, Length: 10}}, Size: 10})
				return r.GetError(), err
			}, posix(syscall.EINVAL)},
			{"commit to a missing object", func(h *pb.Header) (*pb.Error, error) {
				r, err := s1.CommitBlocks(ctx, &pb.CommitBlocksRequest{Header: h, Handle: gone, Blob: bytesOf(16, 1),
					Blocks: []*pb.NewBlock{{Start: 0, Tract: 0, Length: 10}}, Size: 10})
				return r.GetError(), err
			}, posix(syscall.ESTALE)},
			{"sync of too many opens", func(h *pb.Header) (*pb.Error, error) {
				hs := make([]*pb.Handle, maxSyncedOpens+1)
				for i := range hs {
					hs[i] = fh
				}
				r, err := s1.SyncOpens(ctx, &pb.SyncOpensRequest{Header: h, Table: rt.table, Epoch: rt.epoch, Handles: hs})
				return r.GetError(), err
			}, wantInvalid},
			{"sync of opens with no session", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Session = 0
				r, err := s1.SyncOpens(ctx, &pb.SyncOpensRequest{Header: h, Table: rt.table, Epoch: rt.epoch, Handles: []*pb.Handle{fh}})
				return r.GetError(), err
			}, wantInvalid},
			{"session 0", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Session = 0
				r, err := s1.Session(ctx, &pb.SessionRequest{Header: h})
				return r.GetError(), err
			}, wantInvalid},
			{"a release of a file in another table", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Releases = []*pb.Handle{fh, {D: cut, C: 5}} // the second table on server 1
				r, err := s1.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: root, Name: "file"})
				return r.GetError(), err
			}, wantNotOwner},
			{"a release of a directory", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Releases = []*pb.Handle{root}
				r, err := s1.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: root, Name: "file"})
				return r.GetError(), err
			}, wantInvalid},
			{"too many releases", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				for range maxReleasesPerRequest + 1 {
					h.Releases = append(h.Releases, fh)
				}
				r, err := s1.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: root, Name: "file"})
				return r.GetError(), err
			}, wantInvalid},
			{"releases with no session", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Session, h.Releases = 0, []*pb.Handle{fh}
				r, err := s1.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: root, Name: "file"})
				return r.GetError(), err
			}, wantInvalid},
			{"no header", func(*pb.Header) (*pb.Error, error) {
				r, err := s1.Create(ctx, &pb.CreateRequest{Dir: root, Name: "new"})
				return r.GetError(), err
			}, wantInvalid},
			{"file system 0", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Fs = 0
				r, err := s1.Create(ctx, &pb.CreateRequest{Header: h, Dir: root, Name: "new"})
				return r.GetError(), err
			}, wantInvalid},
			{"unknown file system", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Fs = f + 1000
				r, err := s1.Create(ctx, &pb.CreateRequest{Header: h, Dir: root, Name: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
			{"create in a snapshot", func(h *pb.Header) (*pb.Error, error) {
				h = proto.Clone(h).(*pb.Header)
				h.Snapshot = 5
				r, err := s1.Create(ctx, &pb.CreateRequest{Header: h, Dir: root, Name: "new"})
				return r.GetError(), err
			}, posix(syscall.ENOENT)},
		}
		reqs = append(reqs, more...)
		for _, row := range before.tables {
			if row.fs == f && row.owner != 1 {
				// A directory of a table server 1 does not serve.
				other := &pb.Handle{D: row.r.Lo, C: 0}
				reqs = append(reqs, req{"mkdir in another server's table", func(h *pb.Header) (*pb.Error, error) {
					r, err := s1.Create(ctx, &pb.CreateRequest{Header: h, Kind: pb.CreateRequest_DIRECTORY, Dir: other, Name: "new"})
					return r.GetError(), err
				}, wantNotOwner})
				break
			}
		}
		for _, r := range reqs {
			r.want.check(t, r.what, answer(r.run(next())))
		}

		// Bytes that are not the request: refused by gRPC's decoding
		// before the server sees them; an unknown method likewise.
		conn, err := grpc.NewClient(c.servers[1].addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		valid, err := proto.Marshal(&pb.CreateRequest{Header: next(), Kind: pb.CreateRequest_FILE, Dir: root, Name: "new"})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct {
			what, method string
			b            []byte
			code         codes.Code
		}{
			{"garbage", "Create", []byte{0xff, 0xff, 0xff, 0xff}, codes.Internal},
			{"a truncated request", "Create", valid[:len(valid)-2], codes.Internal},
			// Field 3 (dir) holds a handle whose d is a truncated varint.
			{"a handle that does not decode", "Create", append(slices.Clone(valid), 0x1a, 0x02, 0x08, 0x80), codes.Internal},
			// Field 4 (handles) holds a handle whose d has no value.
			{"a handle that does not decode", "SyncOpens", []byte{0x22, 0x01, 0x08}, codes.Internal},
			// Field 4 (name) is not UTF-8.
			{"a name that is not UTF-8", "Create", append(slices.Clone(valid), 0x22, 0x02, 0xc3, 0x28), codes.Internal},
			{"an unknown method", "Format", valid, codes.Unimplemented},
		} {
			var out pb.AttrResponse
			err := conn.Invoke(ctx, "/arbor.meta.v1.Meta/"+x.method, x.b, &out, grpc.ForceCodec(rawCodec{}))
			if st, _ := status.FromError(err); err == nil || st.Code() != x.code {
				t.Errorf("%s to %s: %v (%v), want code %v", x.what, x.method, err, &out, x.code)
			} else {
				t.Logf("%s to %s: %v", x.what, x.method, err)
			}
		}
		if d := before.diff(c.view(ctx, f, clientOf)); d != "" {
			t.Errorf("malformed requests changed things:\n%s", d)
		}
	})
}

// rawCodec sends a request's bytes as they are (and decodes replies as
// protobuf).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }

func (rawCodec) Name() string { return "proto" }

func trim(s string) string {
	if len(s) > 12 {
		return fmt.Sprintf("%s... (%d bytes)", s[:8], len(s))
	}
	return s
}

func bytesOf(n int, b byte) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}
