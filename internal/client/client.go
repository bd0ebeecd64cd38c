// Package client is the one library Arbor's clients use (DESIGN.md §2.7):
// Dial connects to a cluster through its directory, and the Cluster gives
// its file systems (a POSIX client per mount, internal/fsclient, over the
// metadata servers, internal/meta, and the tract store), its blob store
// (internal/tract) and its key-value store (the B-tree, internal/kv). The
// CLI, the FUSE mount, the benchmarks and the NFS gateway dial through
// it; none of them wires the layers below by hand.
//
// Every connection carries the cluster's id when it is known
// (DialOptions), so a client pointed at another cluster is refused, and
// is mutual TLS with the caller's credentials (internal/security), so the
// nodes know who calls.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/meta"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
)

// ClusterMetadataKey is the gRPC metadata key that carries the caller's
// cluster id; nodes refuse a call for another cluster.
const ClusterMetadataKey = "arbor-cluster"

// MaxMessageBytes bounds one gRPC message, for clients and servers alike:
// a tract of the default size with its header and the raft transport's
// batches fit.
const MaxMessageBytes = raftengine.MaxGRPCMessageBytes

// ReconnectParams are how a connection to a node that went away tries
// again: gRPC's default backoff grows to 120 s between attempts, so a
// peer back after a restart of ten or twenty seconds stayed unreachable
// (every call failing fast on the connection's transient failure) for up
// to as long again; the nemesis saw writes fail for 33.6 s after a graceful
// restart. Attempts here are at most a second apart (a refused connection
// costs little), and each may take MinConnectTimeout (a TLS handshake on a
// loaded node).
func ReconnectParams() grpc.ConnectParams {
	return grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	}
}

// DialOptions are the dial options of a client of the cluster clusterID
// (empty: unchecked): mutual TLS with creds (internal/security; nil:
// plain text, for servers run with --insecure), the message size bound,
// reconnection within a second of a node's return (ReconnectParams), and
// the cluster id on every call. Nodes dial each other with them too.
func DialOptions(clusterID string, creds *security.Credentials) []grpc.DialOption {
	transport := insecure.NewCredentials()
	if creds != nil {
		transport = security.ClientCredentials(creds)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithConnectParams(ReconnectParams()),
	}
	if clusterID != "" {
		opts = append(opts,
			grpc.WithChainUnaryInterceptor(ClusterUnaryInterceptor(clusterID)),
			grpc.WithChainStreamInterceptor(ClusterStreamInterceptor(clusterID)))
	}
	return opts
}

// ClusterUnaryInterceptor puts the cluster id on every unary call.
func ClusterUnaryInterceptor(clusterID string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(withCluster(ctx, clusterID), method, req, reply, cc, opts...)
	}
}

// ClusterStreamInterceptor puts the cluster id on every stream.
func ClusterStreamInterceptor(clusterID string) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(withCluster(ctx, clusterID), desc, cc, method, opts...)
	}
}

func withCluster(ctx context.Context, clusterID string) context.Context {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(ClusterMetadataKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, ClusterMetadataKey, clusterID)
}

// Options say how to reach a cluster.
type Options struct {
	// Addrs are directory members' gRPC addresses; any of them may answer.
	Addrs []string
	// ClusterID, if set, is sent on every call (DialOptions).
	ClusterID string
	// Credentials are presented to the nodes (mutual TLS); nil dials in
	// plain text, which only servers run with --insecure accept.
	Credentials *security.Credentials
	// DialOptions, if set, replace DialOptions(ClusterID, Credentials).
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
	// DurableMetadata makes every metadata change answered only once it is
	// durable (no early answers to replay: internal/meta doc.go, Early
	// replies), and close return only once the file's data is written
	// (no flushes after close: fsclient FSConfig.FlushAfterClose).
	DurableMetadata bool
}

// Cluster is a connection to a cluster. It is safe for concurrent use.
type Cluster struct {
	opts Options
	log  *slog.Logger
	dir  *directory.Client
	meta *meta.Client

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	tc    *tract.Client
	data  *fs.TractData
	ec    *extent.Client
	kv    *btree.Tree
}

// Dial connects to the cluster. It does not wait for the network: the
// first call that needs a server reaches it.
func Dial(opts Options) (*Cluster, error) {
	if len(opts.Addrs) == 0 {
		return nil, errors.New("client: no directory address")
	}
	if opts.DialOptions == nil {
		opts.DialOptions = DialOptions(opts.ClusterID, opts.Credentials)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := directory.Dial(opts.Addrs, opts.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("client: connect to the directory: %w", err)
	}
	c := &Cluster{opts: opts, log: opts.Logger, dir: dir, conns: map[string]*grpc.ClientConn{}}
	c.meta, err = meta.NewClient(meta.ClientConfig{Directory: dir, Dial: c.conn, Logger: opts.Logger, Durable: opts.DurableMetadata})
	if err != nil {
		dir.Close()
		return nil, err
	}
	return c, nil
}

// conn returns the shared connection to addr.
func (c *Cluster) conn(addr string) (grpc.ClientConnInterface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.opts.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close closes every connection. What was opened from the Cluster must be
// closed first.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	if c.kv != nil {
		c.kv.Close()
	}
	if c.ec != nil {
		errs = append(errs, c.ec.Close())
	}
	if c.tc != nil {
		errs = append(errs, c.tc.Close())
	}
	for addr, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to %s: %w", addr, err))
		}
	}
	c.conns = map[string]*grpc.ClientConn{}
	errs = append(errs, c.dir.Close())
	return errors.Join(errs...)
}

// Directory returns the directory's client.
func (c *Cluster) Directory() *directory.Client { return c.dir }

// Meta returns the metadata servers' client (file systems, snapshots,
// tables, fsck).
func (c *Cluster) Meta() *meta.Client { return c.meta }

// Tracts returns the tract store's client (the blob store), opening it on
// first use.
func (c *Cluster) Tracts() (*tract.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tc == nil {
		tc, err := tract.NewClient(tract.ClientConfig{Directory: c.dir, DialOptions: c.opts.DialOptions, Logger: c.log})
		if err != nil {
			return nil, err
		}
		c.tc = tc
	}
	return c.tc, nil
}

// data returns the file systems' data store: the tract store.
func (c *Cluster) fileData(ctx context.Context) (*fs.TractData, error) {
	tc, err := c.Tracts()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	d := c.data
	c.mu.Unlock()
	if d != nil {
		return d, nil
	}
	d, err = fs.NewTractData(ctx, tc, 0)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data == nil {
		c.data = d
	}
	return c.data, nil
}

// KV returns the caller's key-value store: the tree of its key space
// (kv.SpaceOf its credential's identity: a tenant's own, or the
// administrators'), opening it on first use (and creating it if the
// cluster has none yet).
func (c *Cluster) KV(ctx context.Context) (*btree.Tree, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, nil
	}
	if c.ec == nil {
		ec, err := extent.NewClient(extent.ClientConfig{Directory: c.dir, DialOptions: c.opts.DialOptions, Logger: c.log})
		if err != nil {
			return nil, err
		}
		c.ec = ec
	}
	var id security.Identity
	if c.opts.Credentials != nil {
		id = c.opts.Credentials.Identity
	}
	tree, err := kv.OpenOnExtents(ctx, c.dir, c.ec, kv.SpaceOf(id), btree.Config{Logger: c.log})
	if err != nil {
		return nil, err
	}
	c.kv = tree
	return tree, nil
}

// FileSystem looks up file system name in the directory.
func (c *Cluster) FileSystem(ctx context.Context, name string) (*dpb.FileSystem, error) {
	if name == "" {
		return nil, errors.New("a file system name is required")
	}
	f, err := c.dir.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: name})
	if directory.IsNotFound(err) {
		return nil, fmt.Errorf("no file system named %q (arbor fs list shows them; arbor fs create makes one)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up file system %q: %w", name, err)
	}
	return f, nil
}

// Snapshot finds snapshot name of file system f.
func Snapshot(f *dpb.FileSystem, name string) (*dpb.Snapshot, error) {
	for _, s := range f.GetSnapshots() {
		if s.GetName() == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("file system %q has no snapshot named %q (arbor snapshot list %s shows them)", f.GetName(), name, f.GetName())
}

// FS is a mounted file system: the POSIX client and its session.
type FS struct {
	*fsclient.FS
	Record *dpb.FileSystem
	meta   *meta.FSClient
}

// Close flushes what the client buffered and ends its session.
func (f *FS) Close(ctx context.Context) error {
	return errors.Join(f.FS.Close(ctx), f.meta.Close(ctx))
}

// OpenFS opens file system rec (at snapshot snap, 0: the live one) for a
// new session: a client that asks the metadata servers for metadata and
// reads and writes tracts itself.
func (c *Cluster) OpenFS(ctx context.Context, rec *dpb.FileSystem, snap uint64) (*FS, error) {
	all, err := c.fileData(ctx)
	if err != nil {
		return nil, err
	}
	// New files' blobs get the file system's layout, and belong to its
	// tenant (whoever writes them: an administrator's mount too).
	data, err := all.WithLayout(rec.GetDataLayout())
	if err != nil {
		return nil, fmt.Errorf("file system %q: %w", rec.GetName(), err)
	}
	data = data.WithTenant(rec.GetTenant())
	if snap != 0 && !slices.ContainsFunc(rec.GetSnapshots(), func(s *dpb.Snapshot) bool { return s.GetNumber() == snap }) {
		return nil, fmt.Errorf("file system %q has no snapshot %d", rec.GetName(), snap)
	}
	m := c.meta.FileSystem(rec.GetNumber(), snap, rand.Uint64()|1)
	fsys, err := fsclient.NewFS(fsclient.FSConfig{Meta: m, Data: data, Snapshot: snap, Logger: c.log,
		FlushAfterClose: !c.opts.DurableMetadata && snap == 0})
	if err != nil {
		_ = m.Close(ctx)
		return nil, err
	}
	return &FS{FS: fsys, Record: rec, meta: m}, nil
}
