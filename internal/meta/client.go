package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/retry"
)

// Client reaches the metadata servers of a cluster (doc.go, Clients): it
// finds each request's table in the delegation map, which it caches and
// reads again when a server says NOT_OWNER or does not answer, and
// retries until the request's context ends. A recorded request keeps its
// request id across retries, so it is applied once.
type Client struct {
	dir   Directory
	peers peers
	log   *slog.Logger
	// durable: sessions ask for durable answers only (no early replies).
	durable bool

	mu   sync.Mutex
	maps map[uint64]*fsMap
}

// ClientConfig configures a Client.
type ClientConfig struct {
	Directory Directory
	// Dial connects to a metadata server's address.
	Dial   func(addr string) (grpc.ClientConnInterface, error)
	Logger *slog.Logger
	// Durable makes every mutation answered once durable: no early
	// replies, nothing to replay (doc.go, Early replies).
	Durable bool
}

// fsMap is the cached delegation map of one file system.
type fsMap struct {
	mu      sync.Mutex
	fetched time.Time
	stale   bool
	routes  []route // by range
}

type route struct {
	table uint64
	r     fs.DRange
	owner uint64
	epoch uint64 // the delegation's: every new owner (or incarnation) bumps it
}

// mapRefresh bounds how often one file system's map is read again.
const mapRefresh = 50 * time.Millisecond

// NewClient returns a client of the metadata servers.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Directory == nil || cfg.Dial == nil {
		return nil, errors.New("meta: ClientConfig needs Directory and Dial")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Client{dir: cfg.Directory, peers: peers{dir: cfg.Directory, dial: cfg.Dial}, log: cfg.Logger, maps: map[uint64]*fsMap{}, durable: cfg.Durable}, nil
}

// owner returns the route to directory id d of file system f: its table
// and the node serving it (0 while the table has none).
func (c *Client) owner(ctx context.Context, f, d uint64) (route, error) {
	routes, err := c.routes(ctx, f)
	if err != nil {
		return route{}, err
	}
	i := sort.Search(len(routes), func(i int) bool { r := routes[i].r; return r.Hi == 0 || d < r.Hi })
	if i < len(routes) && routes[i].r.Contains(d) {
		return routes[i], nil
	}
	c.invalidate(f)
	return route{}, nil
}

// routes returns file system f's delegation map, sorted by range: as
// cached, or read again when stale (at most every mapRefresh). The
// slice is never changed afterwards.
func (c *Client) routes(ctx context.Context, f uint64) ([]route, error) {
	c.mu.Lock()
	m := c.maps[f]
	if m == nil {
		m = &fsMap{stale: true}
		c.maps[f] = m
	}
	c.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stale && time.Since(m.fetched) >= mapRefresh {
		dm, err := c.dir.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
		if err != nil {
			return nil, fmt.Errorf("meta: read the delegation map: %w", err)
		}
		var rs []route
		for _, del := range dm.GetDelegations() {
			r, err := rangeFromKeys(del.GetStartKey(), del.GetEndKey())
			if err != nil {
				return nil, err
			}
			rs = append(rs, route{table: del.GetTableId(), r: r, owner: del.GetOwnerNode(), epoch: del.GetEpoch()})
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].r.Lo < rs[j].r.Lo })
		m.routes, m.fetched, m.stale = rs, time.Now(), false
	}
	return m.routes, nil
}

// invalidate marks f's map stale: it is read again at the next request.
func (c *Client) invalidate(f uint64) {
	c.mu.Lock()
	m := c.maps[f]
	c.mu.Unlock()
	if m != nil {
		m.mu.Lock()
		m.stale = true
		m.mu.Unlock()
	}
}

// call sends a request to the server of directory id d of file system f
// until it gets an answer that is not "ask again"; the answer's error (or
// the context's, when it ends first) is returned.
func (c *Client) call(ctx context.Context, f, d uint64, fn func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error)) error {
	return c.callRouted(ctx, f, d, nil, fn)
}

// callRouted is call with onRoute, which runs before each attempt with the
// route taken (a session re-registers its opens with a new owner).
func (c *Client) callRouted(ctx context.Context, f, d uint64, onRoute func(ctx context.Context, rt route, cl pb.MetaClient), fn func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error)) error {
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := retry.Sleep(ctx, retryBackoff(attempt)); err != nil {
				return fmt.Errorf("%w: %w (last: %v)", syscall.EIO, err, last)
			}
		}
		rt, err := c.owner(ctx, f, d)
		if err != nil {
			last = err
			continue
		}
		if rt.owner == 0 {
			last = fmt.Errorf("meta: directory %#x of file system %d has no metadata server now", d, f)
			c.invalidate(f)
			continue
		}
		cl, err := c.peers.client(ctx, rt.owner)
		if err != nil {
			last = err
			c.invalidate(f)
			continue
		}
		if onRoute != nil {
			onRoute(ctx, rt, cl)
		}
		e, err := fn(ctx, cl)
		if err != nil {
			if rerr := requestError(err); rerr != nil {
				return rerr
			}
			// No answer: the server may be down; its tables move.
			last = err
			c.invalidate(f)
			continue
		}
		if e == nil {
			return nil
		}
		switch e.GetKind() {
		case pb.Error_NOT_OWNER:
			c.invalidate(f)
			last = errorFromPB(e)
			if attempt == 0 {
				attempt++ // a fresh map usually names the owner: no wait
			}
			continue
		case pb.Error_RETRY, pb.Error_AMBIGUOUS:
			last = errorFromPB(e)
			continue
		}
		return errorFromPB(e)
	}
}

// retryBackoff is the jittered wait before attempt (1 ms doubling to
// 500 ms).
func retryBackoff(attempt int) time.Duration {
	d := min(time.Millisecond<<min(attempt-1, 9), 500*time.Millisecond)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// anyServer runs fn on a live metadata server, trying another when one
// does not answer, until ctx ends.
func (c *Client) anyServer(ctx context.Context, fn func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error)) error {
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := retry.Sleep(ctx, retryBackoff(attempt)); err != nil {
				return fmt.Errorf("%w (last: %v)", err, last)
			}
		}
		nodes, err := c.peers.list(ctx, attempt > 0)
		if err != nil {
			last = err
			continue
		}
		live := metaNodes(nodes)
		if len(live) == 0 {
			last = errors.New("meta: no live metadata server")
			continue
		}
		n := live[rand.IntN(len(live))]
		cl, err := c.peers.clientAt(n.GetAddress())
		if err != nil {
			last = err
			continue
		}
		e, err := fn(ctx, cl)
		if err != nil {
			if rerr := requestError(err); rerr != nil {
				return rerr
			}
			last = err
			continue
		}
		if e != nil && (e.GetKind() == pb.Error_RETRY || e.GetKind() == pb.Error_NOT_OWNER) {
			last = errorFromPB(e)
			continue
		}
		return errorFromPB(e)
	}
}

// CreateFileSystem creates file system name (created false: it existed)
// and returns its number.
func (c *Client) CreateFileSystem(ctx context.Context, name string) (number uint64, created bool, err error) {
	return c.CreateFileSystemLayout(ctx, name, "")
}

// CreateFileSystemLayout is CreateFileSystem with the layout of the file
// system's file data (replicas:K or ec:D+P; "" the tract store's
// default): a layout the cluster cannot hold is refused and nothing is
// created. A file system that exists keeps its layout.
func (c *Client) CreateFileSystemLayout(ctx context.Context, name, layout string) (number uint64, created bool, err error) {
	return c.CreateTenantFileSystem(ctx, name, layout, "")
}

// CreateTenantFileSystem is CreateFileSystemLayout for tenant: the file
// system belongs to it (issue 15). A tenant's credential may name only
// itself ("" stands for itself); an administrator's any tenant ("": the
// cluster's own file system, which no tenant reaches). An existing file
// system of another tenant is refused (EEXIST, or EACCES to a tenant).
func (c *Client) CreateTenantFileSystem(ctx context.Context, name, layout, tenant string) (number uint64, created bool, err error) {
	if err := CheckFileSystemName(name); err != nil {
		return 0, false, err
	}
	err = c.anyServer(ctx, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.CreateFileSystem(ctx, &pb.CreateFileSystemRequest{Name: name, DataLayout: layout, Tenant: tenant})
		number, created = resp.GetNumber(), resp.GetCreated()
		return resp.GetError(), err
	})
	return number, created, err
}

// DeleteFileSystem deletes file system name with everything in it.
func (c *Client) DeleteFileSystem(ctx context.Context, name string) (*pb.DeleteFileSystemResponse, error) {
	var out *pb.DeleteFileSystemResponse
	err := c.anyServer(ctx, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.DeleteFileSystem(ctx, &pb.DeleteFileSystemRequest{Name: name})
		out = resp
		return resp.GetError(), err
	})
	return out, err
}

// CreateSnapshot takes a snapshot of file system f and returns its number.
func (c *Client) CreateSnapshot(ctx context.Context, f uint64, name string) (uint64, error) {
	if err := CheckSnapshotName(name); err != nil {
		return 0, err
	}
	var n uint64
	err := c.call(ctx, f, fs.RootHandle.D, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Fs: f, Name: name})
		n = resp.GetNumber()
		return resp.GetError(), err
	})
	return n, err
}

// DeleteSnapshot deletes snapshot n of file system f.
func (c *Client) DeleteSnapshot(ctx context.Context, f, n uint64) (*pb.DeleteSnapshotResponse, error) {
	var out *pb.DeleteSnapshotResponse
	err := c.call(ctx, f, fs.RootHandle.D, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Fs: f, Number: n})
		out = resp
		return resp.GetError(), err
	})
	return out, err
}

// Check checks file system f (fsck).
func (c *Client) Check(ctx context.Context, f uint64, data bool) (*fs.CheckReport, error) {
	var rep fs.CheckReport
	err := c.anyServer(ctx, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.Check(ctx, &pb.CheckRequest{Fs: f, Data: data})
		if err == nil && resp.GetError() == nil {
			if jerr := json.Unmarshal(resp.GetReportJson(), &rep); jerr != nil {
				return &pb.Error{Kind: pb.Error_POSIX, Errno: uint32(syscall.EIO), Message: "check report: " + jerr.Error()}, nil
			}
		}
		return resp.GetError(), err
	})
	return &rep, err
}

// TableInfo is a table as `arbor table list` shows it: the delegation
// map's record with what its owner reports.
type TableInfo struct {
	Table      uint64    `json:"table"`
	FileSystem uint64    `json:"file_system"`
	Range      fs.DRange `json:"-"`
	Lo         string    `json:"lo"`
	Hi         string    `json:"hi"`
	Owner      uint64    `json:"owner"`
	Epoch      uint64    `json:"epoch"`
	LeaseMs    int64     `json:"lease_expiry_unix_ms"`
	// From the owner (zero when it did not answer): inodes and keys in
	// its cache, operations and creates per second recently.
	Inodes        uint64  `json:"inodes"`
	CachedKeys    uint64  `json:"cached_keys"`
	OpsPerSec     float64 `json:"ops_per_second"`
	CreatesPerSec float64 `json:"creates_per_second"`
	Reported      bool    `json:"reported"`
}

// Tables lists the tables of file system f (0: all) with their owners'
// statistics.
func (c *Client) Tables(ctx context.Context, f uint64) ([]TableInfo, error) {
	dm, err := c.dir.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{FileSystem: f})
	if err != nil {
		return nil, fmt.Errorf("meta: read the delegation map: %w", err)
	}
	owners := map[uint64]bool{}
	var out []TableInfo
	for _, d := range dm.GetDelegations() {
		r, err := rangeFromKeys(d.GetStartKey(), d.GetEndKey())
		if err != nil {
			return nil, err
		}
		hi := "end"
		if r.Hi != 0 {
			hi = fmt.Sprintf("%#x", r.Hi)
		}
		out = append(out, TableInfo{Table: d.GetTableId(), FileSystem: d.GetFileSystem(), Range: r, Lo: fmt.Sprintf("%#x", r.Lo), Hi: hi,
			Owner: d.GetOwnerNode(), Epoch: d.GetEpoch(), LeaseMs: d.GetLeaseExpiryUnixMs()})
		if d.GetOwnerNode() != 0 {
			owners[d.GetOwnerNode()] = true
		}
	}
	stats := map[uint64]*pb.TableStats{}
	for o := range owners {
		cl, err := c.peers.client(ctx, o)
		if err != nil {
			continue
		}
		resp, err := cl.TableStats(ctx, &pb.TableStatsRequest{Exact: true})
		if err != nil {
			continue
		}
		for _, ts := range resp.GetTables() {
			if ts.GetOwner() == o {
				stats[ts.GetTable()] = ts
			}
		}
	}
	for i := range out {
		if ts := stats[out[i].Table]; ts != nil && ts.GetEpoch() == out[i].Epoch {
			out[i].Inodes, out[i].CachedKeys = ts.GetInodes(), ts.GetKeys()
			out[i].OpsPerSec, out[i].CreatesPerSec, out[i].Reported = ts.GetOpsPerSecond(), ts.GetCreatesPerSecond(), true
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].FileSystem != out[j].FileSystem {
			return out[i].FileSystem < out[j].FileSystem
		}
		return out[i].Range.Lo < out[j].Range.Lo
	})
	return out, nil
}

// tableOwner returns the owner of table id.
func (c *Client) tableOwner(ctx context.Context, id uint64) (uint64, error) {
	dm, err := c.dir.GetDelegationMap(ctx, &dpb.GetDelegationMapRequest{})
	if err != nil {
		return 0, fmt.Errorf("meta: read the delegation map: %w", err)
	}
	for _, d := range dm.GetDelegations() {
		if d.GetTableId() == id {
			if d.GetOwnerNode() == 0 {
				return 0, fmt.Errorf("table %d has no metadata server right now (its owner's lease ran out); try again in a few seconds", id)
			}
			return d.GetOwnerNode(), nil
		}
	}
	return 0, fmt.Errorf("%w: no table %d (arbor table list shows them)", syscall.EINVAL, id)
}

// ownerCall runs fn on the owner of table id; an owner that does not
// answer is reported, not waited for.
func (c *Client) ownerCall(ctx context.Context, id uint64, fn func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error)) error {
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			if err := retry.Sleep(ctx, retryBackoff(attempt)); err != nil {
				return fmt.Errorf("%w (last: %v)", err, last)
			}
		}
		owner, err := c.tableOwner(ctx, id)
		if err != nil {
			return err
		}
		cl, err := c.peers.client(ctx, owner)
		if err != nil {
			return err
		}
		e, err := fn(ctx, cl)
		if err != nil {
			return fmt.Errorf("table %d's owner, node %d, does not answer (%v); its tables move to a live server when their leases run out", id, owner, err)
		}
		if e != nil && (e.GetKind() == pb.Error_NOT_OWNER || e.GetKind() == pb.Error_RETRY) {
			last = errorFromPB(e)
			continue
		}
		return errorFromPB(e)
	}
	return last
}

// MoveTable asks table id's owner to hand it to node.
func (c *Client) MoveTable(ctx context.Context, id, node uint64) (epoch uint64, err error) {
	err = c.ownerCall(ctx, id, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.MoveTable(ctx, &pb.MoveTableRequest{Table: id, Node: node})
		epoch = resp.GetEpoch()
		return resp.GetError(), err
	})
	return epoch, err
}

// SplitTable asks table id's owner to cut it at directory id at (0: the
// owner chooses); it returns the new table and where it starts.
func (c *Client) SplitTable(ctx context.Context, id, at uint64) (newTable, start uint64, err error) {
	err = c.ownerCall(ctx, id, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.SplitTable(ctx, &pb.SplitTableRequest{Table: id, At: at})
		newTable, start = resp.GetNewTable(), resp.GetAt()
		return resp.GetError(), err
	})
	return newTable, start, err
}

// Servers returns the node ids of the live metadata servers.
func (c *Client) Servers(ctx context.Context) ([]uint64, error) {
	nodes, err := c.peers.list(ctx, true)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, n := range metaNodes(nodes) {
		ids = append(ids, n.GetId())
	}
	slices.Sort(ids)
	return ids, nil
}
