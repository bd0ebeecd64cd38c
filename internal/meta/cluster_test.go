package meta

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/arbor-storage/arbor/internal/btree"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/directory/directorytest"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/fsclient/fsclienttest"
)

var _ fsclient.Metadata = (*FSClient)(nil)

// testCluster is metadata servers in the test's process: a real directory
// group (directorytest), one B-tree in memory shared by every server (each
// with its own tree client and caches, as on separate nodes), one data
// store, and real gRPC between clients and servers.
type testCluster struct {
	t       testing.TB
	dir     *directorytest.Cluster
	pages   *btree.MemStore
	root    btree.PageRef
	data    *fs.MemData
	log     *slog.Logger
	mu      sync.Mutex
	servers map[uint64]*testServer
	client  *Client
	lease   time.Duration
	split   SplitPolicy // zero: the default
	// slow, if set, is the page store the servers' trees use (it delays
	// commits while armed).
	slow *slowPages
	// serverOpts are the servers' gRPC options (tenancy_test.go's
	// identity interceptor).
	serverOpts []grpc.ServerOption
}

type testServer struct {
	id   uint64
	addr string
	srv  *Server
	grpc *grpc.Server
	node *directorytest.Node
}

func dialTest(addr string) (grpc.ClientConnInterface, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func newTestCluster(t testing.TB, servers int, opts ...func(*testCluster)) *testCluster {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	pages, root := newMemPages(t)
	c := &testCluster{t: t, dir: directorytest.Start(t, 1), pages: pages, root: root, data: fs.NewMemData(64 << 10),
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), servers: map[uint64]*testServer{},
		lease: time.Second}
	for _, o := range opts {
		o(c)
	}
	for i := range servers {
		c.start(uint64(i + 1))
	}
	cl, err := NewClient(ClientConfig{Directory: c.dir.Client(), Dial: dialTest, Logger: c.log, Durable: os.Getenv("DURABLE") != ""})
	if err != nil {
		t.Fatal(err)
	}
	c.client = cl
	return c
}

// start starts metadata server id (again, after kill: a new incarnation).
func (c *testCluster) start(id uint64) {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	ts := &testServer{id: id, addr: lis.Addr().String()}
	ts.node = c.dir.Register(id, ts.addr, RoleMeta)
	srv, err := NewServer(Config{Node: id, NodeEpoch: ts.node.Epoch, Directory: c.dir.Client(),
		Tree: newTree(c.t, c.pageStore(), c.root, 64<<20), Data: c.data, Dial: dialTest, Logger: c.log.With("node", id),
		LeaseDuration: c.lease, Split: c.split, PollInterval: 50 * time.Millisecond, ReclaimInterval: time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	ts.srv = srv
	ts.grpc = grpc.NewServer(c.serverOpts...)
	srv.Register(ts.grpc)
	go func() { _ = ts.grpc.Serve(lis) }()
	srv.Start()
	c.mu.Lock()
	c.servers[id] = ts
	c.mu.Unlock()
	c.t.Cleanup(func() { c.kill(id) })
}

func (c *testCluster) pageStore() btree.PageStore {
	if c.slow != nil {
		return c.slow
	}
	return c.pages
}

// kill stops server id at once: no more answers, no more heartbeats or
// lease renewals (its tables move when their leases run out).
func (c *testCluster) kill(id uint64) {
	c.mu.Lock()
	ts := c.servers[id]
	delete(c.servers, id)
	c.mu.Unlock()
	if ts == nil {
		return
	}
	ts.grpc.Stop()
	ts.node.Stop()
	ts.srv.crash()
}

// owner returns the owner of file system f's table of directory id d.
func (c *testCluster) owner(ctx context.Context, f, d uint64) uint64 {
	dm, err := c.dir.Client().GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, del := range dm.GetDelegations() {
		r, err := rangeFromKeys(del.GetStartKey(), del.GetEndKey())
		if err != nil {
			c.t.Fatal(err)
		}
		if r.Contains(d) {
			return del.GetOwnerNode()
		}
	}
	return 0
}

// clusterFS is a file system of a testCluster as fsclienttest sees it.
type clusterFS struct {
	c       *testCluster
	f       uint64
	session uint64
	main    *fsclient.FS
	mainMD  *FSClient
}

func (c *testCluster) newFS(name string) *clusterFS {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, _, err := c.client.CreateFileSystem(ctx, name)
	if err != nil {
		c.t.Fatal(err)
	}
	x := &clusterFS{c: c, f: f}
	x.main, x.mainMD = x.mountMD(0)
	return x
}

func (x *clusterFS) mount(snap uint64) *fsclient.FS {
	fsys, _ := x.mountMD(snap)
	return fsys
}

func (x *clusterFS) mountMD(snap uint64) (*fsclient.FS, *FSClient) {
	x.c.t.Helper()
	x.session++
	m := x.c.client.FileSystem(x.f, snap, rand.Uint64()|1)
	fsys, err := fsclient.NewFS(fsclient.FSConfig{Meta: m, Data: x.c.data, Snapshot: snap, FlushAfterClose: snap == 0})
	if err != nil {
		x.c.t.Fatal(err)
	}
	x.c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fsys.Close(ctx)
		_ = m.Close(ctx)
	})
	return fsys, m
}

func (x *clusterFS) FS() *fsclient.FS { return x.main }

func (x *clusterFS) CreateSnapshot(ctx context.Context, name string) (uint64, error) {
	return x.c.client.CreateSnapshot(ctx, x.f, name)
}

func (x *clusterFS) DeleteSnapshot(ctx context.Context, n uint64) error {
	_, err := x.c.client.DeleteSnapshot(ctx, x.f, n)
	return err
}

func (x *clusterFS) OpenSnapshot(_ testing.TB, n uint64) *fsclient.FS { return x.mount(n) }

func (x *clusterFS) Check(ctx context.Context) (*fs.CheckReport, error) {
	return x.c.client.Check(ctx, x.f, true)
}

// TestServersModel runs the file-system model through metadata servers
// over gRPC, with no failure: the protocol, the client's routing and the
// servers' tables.
func TestServersModel(t *testing.T) {
	seed := fsclienttest.Seed(t)
	c := newTestCluster(t, 3)
	x := c.newFS("model")
	steps := 1500
	if testing.Short() {
		steps = 400
	}
	rep := fsclienttest.Run(t, x, fsclienttest.Options{Seed: seed, Steps: steps, ReclaimWithin: 15 * time.Second,
		DataTracts: func() int { _, tracts, _ := c.data.Usage(); return tracts }})
	t.Logf("ops %v; %d objects, %d tracts", rep.Ops, rep.Objects, rep.Tracts)
}

// TestServersModelOwnerKills runs the model while the owner of the file
// system's table is killed every so often (and started again): the table
// moves to a live server when its lease runs out, the client follows, and
// every operation is applied exactly once.
func TestServersModelOwnerKills(t *testing.T) {
	seed := fsclienttest.Seed(t)
	c := newTestCluster(t, 3)
	x := c.newFS("kills")
	steps := 1200
	if testing.Short() {
		steps = 300
	}
	rng := rand.New(rand.NewPCG(seed, 5))
	kills := 0
	rep := fsclienttest.Run(t, x, fsclienttest.Options{Seed: seed, Steps: steps, ReclaimWithin: 15 * time.Second,
		DataTracts: func() int { _, tracts, _ := c.data.Usage(); return tracts },
		Between: func(step int) {
			if step%150 != 149 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			victim := c.owner(ctx, x.f, rng.Uint64N(1<<62))
			if victim == 0 {
				return
			}
			c.kill(victim)
			kills++
			// Back after a while, as a new incarnation with cold caches.
			go func() {
				time.Sleep(2 * c.lease)
				c.start(victim)
			}()
		}})
	t.Logf("ops %v; %d objects, %d tracts; %d owner kills; journal %+v", rep.Ops, rep.Objects, rep.Tracts, kills, x.mainMD.JournalStats())
	if kills == 0 {
		t.Fatal("no owner was killed")
	}
}

// TestServersModelMovesSplitsKills runs the model while tables are split
// and moved between servers (operations over two servers' tables borrow)
// and owners are killed: every acknowledged operation is there exactly
// once, and fsck is clean after.
func TestServersModelMovesSplitsKills(t *testing.T) {
	seed := fsclienttest.Seed(t)
	c := newTestCluster(t, 3)
	x := c.newFS("chaos")
	steps := 1500
	if testing.Short() {
		steps = 400
	}
	rng := rand.New(rand.NewPCG(seed, 9))
	var splits, moves, kills int
	splitErrs := map[string]int{}
	rep := fsclienttest.Run(t, x, fsclienttest.Options{Seed: seed, Steps: steps, ReclaimWithin: 15 * time.Second,
		DataTracts: func() int { _, tracts, _ := c.data.Usage(); return tracts },
		Between: func(step int) {
			if step%40 != 39 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			tabs, err := c.client.Tables(ctx, x.f)
			if err != nil || len(tabs) == 0 {
				return
			}
			tab := tabs[rng.IntN(len(tabs))]
			switch op := rng.IntN(10); {
			case op < 4 && len(tabs) < 12:
				// Most tables hold one directory (placed remotely): split
				// the first that holds more.
				for _, i := range rng.Perm(len(tabs)) {
					_, _, err := c.client.SplitTable(ctx, tabs[i].Table, 0)
					if err == nil {
						splits++
						break
					}
					splitErrs[err.Error()]++
				}
			case op < 9:
				c.mu.Lock()
				var live []uint64
				for id := range c.servers {
					live = append(live, id)
				}
				c.mu.Unlock()
				if len(live) > 0 {
					if _, err := c.client.MoveTable(ctx, tab.Table, live[rng.IntN(len(live))]); err == nil {
						moves++
					}
				}
			default:
				if tab.Owner != 0 {
					c.kill(tab.Owner)
					kills++
					victim := tab.Owner
					go func() {
						time.Sleep(2 * c.lease)
						c.start(victim)
					}()
				}
			}
		}})
	t.Logf("ops %v; %d objects, %d tracts; %d splits, %d moves, %d kills; journal %+v", rep.Ops, rep.Objects, rep.Tracts, splits, moves, kills, x.mainMD.JournalStats())
	if splits == 0 || moves == 0 {
		t.Fatalf("the run made %d splits and %d moves (split errors: %v)", splits, moves, splitErrs)
	}
}

// TestAutoSplit: a table past SplitPolicy.Inodes splits on its own, under
// load its new part moves to the quieter server, and the file system
// loses nothing.
func TestAutoSplit(t *testing.T) {
	c := newTestCluster(t, 2, func(c *testCluster) { c.split = SplitPolicy{Inodes: 60, Cooldown: time.Second} })
	x := c.newFS("auto")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys := x.FS()
	want := map[fs.Handle][]string{}
	create := func(dir fs.Handle, name string) {
		t.Helper()
		a, err := fsys.Create(ctx, dir, name, 0o644, fs.Cred{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if err := fsys.Release(ctx, a.Handle); err != nil {
			t.Fatal(err)
		}
		want[dir] = append(want[dir], name)
	}
	top, err := fsys.Mkdir(ctx, fs.RootHandle, "top", 0o755, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	var dirs []fs.Handle
	for i := range 8 {
		d, err := fsys.Mkdir(ctx, top.Handle, fmt.Sprintf("d%d", i), 0o755, fs.Cred{})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d.Handle)
		for j := range 10 {
			create(d.Handle, fmt.Sprintf("f%d", j))
		}
	}
	countTables := func() (int, map[uint64]int) {
		t.Helper()
		tables, err := c.client.Tables(ctx, x.f)
		if err != nil {
			t.Fatal(err)
		}
		inodes := map[uint64]int{}
		for _, tb := range tables {
			inodes[tb.Table] = int(tb.Inodes)
		}
		return len(tables), inodes
	}
	// "top" may be placed on the other server as a table of its own; no
	// table holds more than 60 inodes yet.
	before, inodes := countTables()
	t.Logf("%d tables before: inodes %v", before, inodes)
	// Keep creating until a table splits.
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			t.Fatalf("no split within a minute")
		}
		create(dirs[i%len(dirs)], fmt.Sprintf("g%d", i))
		if i%20 == 0 {
			if n, inodes := countTables(); n > before {
				t.Logf("%d tables after %d more creates: inodes %v", n, i+1, inodes)
				break
			}
		}
	}
	for _, d := range dirs {
		for _, name := range want[d] {
			if _, err := fsys.Lookup(ctx, d, name); err != nil {
				t.Fatalf("%s after the split: %v", name, err)
			}
		}
	}
	rep, err := x.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("fsck: %+v", rep)
	}
}

// TestLargeOverwrite writes a file of many blocks and overwrites it all:
// each CommitBlocks carries fs.MaxBlocksPerCommit blocks, replaces as many
// (their tracts queued to be freed) and is recorded, and still fits one
// transaction of an owner.
func TestLargeOverwrite(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("large")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fsys := x.FS()
	a, err := fsys.Create(ctx, fs.RootHandle, "big", 0o644, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4<<20) // 64 tracts of the test cluster's 64 KiB
	for round := range 3 {
		for i := range buf {
			buf[i] = byte(round + i)
		}
		if _, err := fsys.Write(ctx, a.Handle, 0, buf); err != nil {
			t.Fatalf("round %d: write: %v", round, err)
		}
		if err := fsys.Flush(ctx, a.Handle); err != nil {
			t.Fatalf("round %d: flush: %v", round, err)
		}
	}
	if err := fsys.Release(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := fsys.Read(ctx, a.Handle, 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf) {
		t.Fatal("the file does not hold the last round's bytes")
	}
}
