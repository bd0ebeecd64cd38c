package tract

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/retry"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Client defaults and bounds.
const (
	defaultMaxInFlightBytes = 256 << 20
	defaultAttemptTimeout   = 30 * time.Second
	// minTLTRefreshInterval bounds how often a client refetches the TLT.
	minTLTRefreshInterval = 20 * time.Millisecond
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Directory gives the TLT and the node table (*directory.Client).
	Directory Directory
	// DialOptions are used to connect to tractservers (with Dial unset).
	DialOptions []grpc.DialOption
	// Dial, if set, replaces the client's own connections (a node's dialer).
	Dial DialFunc
	// MaxInFlightBytes bounds the tract data a client has in flight; the
	// simultaneous limit is this over the tract size (default 256 MiB).
	MaxInFlightBytes int64
	// AttemptTimeout bounds one call to a tractserver (default 30 s). The
	// whole operation, retries included, is bounded by its context.
	AttemptTimeout time.Duration
	Logger         *slog.Logger
}

// Client is the tract store's client library: the FDS API (FDS §2.1,
// Figure 1). It caches the TLT, sends each request to the tractserver the
// TLT names, and retries what can be retried: after a stale-version
// refusal it refreshes the TLT, after a failed or unreachable replica it
// backs off and refreshes (the TLT changes when the directory declares a
// tractserver dead), and reads try another replica. Every operation is
// bounded by its context. It is safe for concurrent use; the Async methods
// start an operation and return at once, and SimultaneousLimit says how
// many to keep in flight.
type Client struct {
	cfg   ClientConfig
	log   *slog.Logger
	peers *peers

	mu          sync.Mutex
	table       *Table
	lastRefresh time.Time
	conns       map[string]*grpc.ClientConn
	closed      bool
	sem         chan struct{}
	rng         *rand.Rand

	coders coders
	// degradedReads counts erasure-coded reads that had to reconstruct.
	degradedReads atomic.Uint64
	// degradedWrites counts erasure-coded writes acknowledged with
	// shards missing (their servers unreachable).
	degradedWrites atomic.Uint64
	// repairsRequested counts the stripes of those writes a tractserver
	// queued for repair (requestRepair).
	repairsRequested atomic.Uint64
	// layoutsOK holds the checkedLayouts that passed CheckLayout.
	layoutsOK sync.Map
}

// NewClient returns a client; it contacts nothing until the first call.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Directory == nil {
		return nil, errors.New("tract: client needs the directory")
	}
	if cfg.MaxInFlightBytes == 0 {
		cfg.MaxInFlightBytes = defaultMaxInFlightBytes
	}
	if cfg.MaxInFlightBytes < minTractSizeBytes || cfg.MaxInFlightBytes > 64<<30 {
		return nil, fmt.Errorf("tract: max in-flight bytes %d out of [%d, 64 GiB]", cfg.MaxInFlightBytes, minTractSizeBytes)
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = defaultAttemptTimeout
	}
	if cfg.AttemptTimeout < time.Millisecond {
		return nil, fmt.Errorf("tract: attempt timeout %v is too short", cfg.AttemptTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger.With("component", "tract-client"), conns: map[string]*grpc.ClientConn{},
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	dial := cfg.Dial
	if dial == nil {
		dial = c.dial
	}
	c.peers = newPeers(cfg.Directory, dial)
	return c, nil
}

func (c *Client) dial(addr string) (grpc.ClientConnInterface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("tract: client closed")
	}
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.cfg.DialOptions...)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close closes the client's connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for a, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}

// TLT returns the client's TLT, fetching it if it has none. A cluster that
// has not installed its first TLT yet (it is starting), or a directory
// that does not answer (an election), is waited for with retry.Failover's
// backoff until ctx ends; only a refusal of another kind fails at once.
func (c *Client) TLT(ctx context.Context) (*Table, error) {
	c.mu.Lock()
	t := c.table
	c.mu.Unlock()
	if t != nil {
		return t, nil
	}
	err := retry.Do(ctx, retry.Policy{Backoff: retry.Failover, Retryable: firstTLTRetryable}, func(ctx context.Context, _ int) error {
		var err error
		t, err = c.refresh(ctx, true)
		if err != nil {
			c.log.Debug("no TLT yet; retrying", "err", err)
		}
		return err
	})
	return t, err
}

// refresh fetches the TLT (at most once per minTLTRefreshInterval unless
// the cached one is missing) and returns the newest known.
func (c *Client) refresh(ctx context.Context, force bool) (*Table, error) {
	c.mu.Lock()
	if c.table != nil && !force && time.Since(c.lastRefresh) < minTLTRefreshInterval {
		t := c.table
		c.mu.Unlock()
		return t, nil
	}
	c.lastRefresh = time.Now()
	c.mu.Unlock()
	fctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	p, err := c.cfg.Directory.GetTLT(fctx, &dpb.GetTLTRequest{})
	cancel()
	if err != nil {
		c.mu.Lock()
		t := c.table
		c.mu.Unlock()
		if t != nil {
			return t, nil
		}
		return nil, fmt.Errorf("tract: fetch the TLT: %w", err)
	}
	t, err := TableFromProto(p)
	if err != nil {
		return nil, fmt.Errorf("tract: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.table == nil || t.Version > c.table.Version {
		c.table = t
	}
	if c.sem == nil {
		c.sem = make(chan struct{}, limitFor(c.cfg.MaxInFlightBytes, c.table.TractSize))
	}
	return c.table, nil
}

func limitFor(inflight int64, tractSize int) int {
	return int(min(max(inflight/int64(tractSize), 1), maxSimultaneous))
}

// SimultaneousLimit is how many tract reads and writes an application
// should keep in flight (FDS GetSimultaneousLimit): the client's in-flight
// byte budget over the tract size. The client never runs more at once.
func (c *Client) SimultaneousLimit() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.table == nil {
		return limitFor(c.cfg.MaxInFlightBytes, DefaultTractSizeBytes)
	}
	return cap(c.sem)
}

// TractSize returns the cluster's tract size.
func (c *Client) TractSize(ctx context.Context) (int, error) {
	t, err := c.TLT(ctx)
	if err != nil {
		return 0, err
	}
	return t.TractSize, nil
}

// acquire takes an in-flight slot.
func (c *Client) acquire(ctx context.Context) (func(), error) {
	if _, err := c.TLT(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	sem := c.sem
	c.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// firstTLTRetryable reports whether fetching the first TLT may succeed if
// asked again: the directory has none yet (NotFound) or gave no answer.
// A request the directory judged bad, or a node of another cluster,
// fails at once.
func firstTLTRetryable(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return false
	}
	return true
}

// retryable classifies an error: final errors are returned to the caller;
// others are retried after a TLT refresh (any of them may mean the TLT
// moved on).
func retryable(err error) bool {
	if te, ok := ErrorOf(err); ok {
		switch te.Code {
		case tpb.ErrorCode_STALE_TLT, tpb.ErrorCode_WRONG_SERVER,
			tpb.ErrorCode_TLT_BEHIND, tpb.ErrorCode_NOT_READABLE, tpb.ErrorCode_CORRUPT,
			tpb.ErrorCode_REPLICA_FAILED, tpb.ErrorCode_OVERLOADED, tpb.ErrorCode_IO_ERROR:
			return true
		}
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.ResourceExhausted, codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// do runs attempt until it succeeds, fails for good, or ctx ends.
func (c *Client) do(ctx context.Context, what string, attempt func(ctx context.Context, t *Table) error) error {
	failures := 0 // retries after a real failure (not a stale TLT)
	var last error
	for {
		t, err := c.TLT(ctx)
		if err == nil {
			err = attempt(ctx, t)
			if err == nil {
				return nil
			}
		}
		last = err
		if ctx.Err() != nil {
			return fmt.Errorf("tract: %s: %w (last error: %v)", what, ctx.Err(), last)
		}
		if !retryable(err) {
			return fromWire(err)
		}
		te, _ := ErrorOf(err)
		quick := te != nil && te.Code == tpb.ErrorCode_STALE_TLT
		if !quick {
			backoff := retry.Failover.Delay(failures)
			failures++
			c.log.Debug("tract operation failed; retrying", "op", what, "err", err, "backoff", backoff)
			if retry.Sleep(ctx, backoff) != nil {
				return fmt.Errorf("tract: %s: %w (last error: %v)", what, ctx.Err(), last)
			}
		}
		if _, err := c.refresh(ctx, false); err != nil && ctx.Err() != nil {
			return fmt.Errorf("tract: %s: %w (last error: %v)", what, ctx.Err(), last)
		}
	}
}

// call runs one RPC against a server with the attempt timeout.
func (c *Client) server(ctx context.Context, s ServerID) (tpb.TractServerClient, error) {
	return c.peers.client(ctx, s.Node)
}

func newRequestID() []byte {
	b := make([]byte, 16)
	_, _ = crand.Read(b)
	return b
}

// blobOp sends a metadata operation to the primary of the blob's metadata
// row.
func (c *Client) blobOp(ctx context.Context, g GUID, req *tpb.BlobOpRequest) (*tpb.BlobMeta, error) {
	req.Guid = g[:]
	var out *tpb.BlobMeta
	err := c.do(ctx, fmt.Sprintf("%v %s", req.Op, g), func(ctx context.Context, t *Table) error {
		row := t.Rows[t.Locate(g, MetadataTract)]
		primary := row.Slots[0]
		s, err := c.server(ctx, primary)
		if err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		req.Disk, req.RowVersion = primary.Disk, row.Version
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		defer cancel()
		resp, err := s.BlobOp(actx, req)
		if err != nil {
			return err
		}
		out = resp.Meta
		return nil
	})
	return out, err
}

// BlobInfo is what a client knows of a blob.
type BlobInfo struct {
	GUID        GUID
	Tracts      uint64
	Replication int
	// Layout is the blob's layout (for an erasure-coded blob Replication
	// is D+P, the slots its stripes use).
	Layout      Layout
	Incarnation uint64
	Created     time.Time
	Modified    time.Time
}

func infoOf(g GUID, m *tpb.BlobMeta) BlobInfo {
	l := Layout{Replicas: int(m.GetReplication())}
	if m.GetEc() != nil {
		l = Layout{EC: layoutOf(m.GetEc())}
	}
	return BlobInfo{GUID: g, Tracts: m.GetLengthTracts(), Replication: int(m.GetReplication()), Layout: l, Incarnation: m.GetIncarnation(),
		Created: time.UnixMilli(m.GetCreatedUnixMs()), Modified: time.UnixMilli(m.GetModifiedUnixMs())}
}

// Blob is an open blob.
type Blob struct {
	c    *Client
	guid GUID

	mu     sync.Mutex
	info   BlobInfo
	closed bool
}

// CreateBlob creates a blob of length 0 (FDS CreateBlob) with the given
// replication level (0: DefaultReplication, or the TLT's row width if it
// is narrower; a TLT widened for erasure-coded stripes does not make every
// blob that wide). It fails with BLOB_EXISTS if the
// blob exists.
func (c *Client) CreateBlob(ctx context.Context, g GUID, replication int) (*Blob, error) {
	return c.CreateBlobSized(ctx, g, replication, 0)
}

// CreateBlobSized is CreateBlob of a blob that starts n tracts long (an
// ExtendBlobSize in the same round): the caller owns tracts [0, n).
func (c *Client) CreateBlobSized(ctx context.Context, g GUID, replication int, n uint64) (*Blob, error) {
	return c.createSized(ctx, g, replication, n, "")
}

// createSized is CreateBlobSized of a blob for tenant (BlobOpRequest.tenant).
func (c *Client) createSized(ctx context.Context, g GUID, replication int, n uint64, tenant string) (*Blob, error) {
	if n > maxExtendTracts {
		return nil, invalidf("create with %d tracts: must be at most %d (maxExtendTracts)", n, maxExtendTracts)
	}
	t, err := c.TLT(ctx)
	if err != nil {
		return nil, err
	}
	if replication == 0 {
		replication = min(DefaultReplication, t.Replication)
	}
	if replication < 1 || replication > t.Replication {
		return nil, invalidf("replication %d: must be in [1, %d] (the TLT's)", replication, t.Replication)
	}
	m, err := c.blobOp(ctx, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_CREATE, Replication: uint32(replication), ExtendTracts: n, RequestId: newRequestID(),
		Tenant: tenant})
	if err != nil {
		return nil, err
	}
	return &Blob{c: c, guid: g, info: infoOf(g, m)}, nil
}

// OpenBlob opens an existing blob (FDS OpenBlob): it reads the blob's
// metadata (length, replication level).
func (c *Client) OpenBlob(ctx context.Context, g GUID) (*Blob, error) {
	m, err := c.blobOp(ctx, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_GET})
	if err != nil {
		return nil, err
	}
	return &Blob{c: c, guid: g, info: infoOf(g, m)}, nil
}

// DeleteBlob deletes a blob (FDS DeleteBlob). Its tracts are reclaimed by
// the scrubbers.
func (c *Client) DeleteBlob(ctx context.Context, g GUID) error {
	_, err := c.blobOp(ctx, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_DELETE, RequestId: newRequestID()})
	return err
}

// GUID returns the blob's id.
func (b *Blob) GUID() GUID { return b.guid }

// Info returns what the client last learned of the blob.
func (b *Blob) Info() BlobInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info
}

// Close closes the blob (FDS CloseBlob); later calls on it fail.
func (b *Blob) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

func (b *Blob) check() (BlobInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return BlobInfo{}, invalidf("blob %s is closed", b.guid)
	}
	return b.info, nil
}

func (b *Blob) learn(m *tpb.BlobMeta) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.GetIncarnation() == b.info.Incarnation && m.GetLengthTracts() > b.info.Tracts {
		b.info.Tracts = m.GetLengthTracts()
		b.info.Modified = time.UnixMilli(m.GetModifiedUnixMs())
	}
}

// Size returns the blob's length in tracts (FDS GetBlobSize), asking its
// metadata primary.
func (b *Blob) Size(ctx context.Context) (uint64, error) {
	info, err := b.check()
	if err != nil {
		return 0, err
	}
	m, err := b.c.blobOp(ctx, b.guid, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_GET})
	if err != nil {
		return 0, err
	}
	if m.GetIncarnation() != info.Incarnation {
		return 0, errorf(tpb.ErrorCode_BLOB_NOT_FOUND, "blob %s was deleted and created again", b.guid)
	}
	b.learn(m)
	return m.GetLengthTracts(), nil
}

// Extend adds n tracts to the blob atomically and returns its new size
// (FDS ExtendBlobSize): the caller owns tracts [size-n, size). Concurrent
// extends never return overlapping ranges; a retried extend is applied
// once.
func (b *Blob) Extend(ctx context.Context, n uint64) (uint64, error) {
	info, err := b.check()
	if err != nil {
		return 0, err
	}
	if n < 1 || n > maxExtendTracts {
		return 0, invalidf("extend by %d tracts: must be in [1, %d] (maxExtendTracts)", n, maxExtendTracts)
	}
	m, err := b.c.blobOp(ctx, b.guid, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_EXTEND, ExtendTracts: n, RequestId: newRequestID()})
	if err != nil {
		return 0, err
	}
	if m.GetIncarnation() != info.Incarnation {
		return 0, errorf(tpb.ErrorCode_BLOB_NOT_FOUND, "blob %s was deleted and created again", b.guid)
	}
	b.learn(m)
	return m.GetLengthTracts(), nil
}

// checkIndex makes sure tract i is inside the blob, refreshing the length
// once if the cached one says it is not.
func (b *Blob) checkIndex(ctx context.Context, i uint64) (BlobInfo, error) {
	info, err := b.check()
	if err != nil {
		return info, err
	}
	if i < info.Tracts {
		return info, nil
	}
	size, err := b.Size(ctx)
	if err != nil {
		return info, err
	}
	if i >= size {
		return info, errorf(tpb.ErrorCode_PAST_END, "tract %d is past the end of blob %s (%d tracts): extend it first", i, b.guid, size)
	}
	return b.check()
}

// WriteTract writes tract i (FDS WriteTract): at most the tract size bytes
// (a shorter tract costs only its size). It returns once every replica has
// the data.
func (b *Blob) WriteTract(ctx context.Context, i uint64, data []byte) error {
	info, err := b.checkIndex(ctx, i)
	if err != nil {
		return err
	}
	t, err := b.c.TLT(ctx)
	if err != nil {
		return err
	}
	if len(data) > t.TractSize {
		return invalidf("tract data is %d bytes; the tract size is %d", len(data), t.TractSize)
	}
	release, err := b.c.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	if info.Layout.IsEC() {
		return b.writeStripe(ctx, info, i, data)
	}
	crc := Checksum(data)
	return b.c.do(ctx, fmt.Sprintf("write %s/%d", b.guid, i), func(ctx context.Context, t *Table) error {
		row := t.Rows[t.Locate(b.guid, int64(i))]
		primary := row.Slots[0]
		s, err := b.c.server(ctx, primary)
		if err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		actx, cancel := context.WithTimeout(ctx, b.c.cfg.AttemptTimeout)
		defer cancel()
		_, err = s.WriteTract(actx, &tpb.WriteTractRequest{
			Disk: primary.Disk, Guid: b.guid[:], Tract: int64(i), RowVersion: row.Version,
			Replication: uint32(info.Replication), Incarnation: info.Incarnation, Data: data, Crc32C: crc,
		})
		return err
	})
}

// ReadTract reads tract i (FDS ReadTract) from one of its replicas,
// trying others if one cannot serve it. A tract inside the blob that was
// never written reads as empty.
func (b *Blob) ReadTract(ctx context.Context, i uint64) ([]byte, error) {
	data, _, err := b.readTract(ctx, i, false)
	return data, err
}

// TractLength returns the stored length of tract i (0 if unwritten).
func (b *Blob) TractLength(ctx context.Context, i uint64) (int, error) {
	_, m, err := b.readTract(ctx, i, true)
	if err != nil {
		return 0, err
	}
	return int(m.GetLength()), nil
}

func (b *Blob) readTract(ctx context.Context, i uint64, metaOnly bool) ([]byte, *tpb.TractMeta, error) {
	info, err := b.checkIndex(ctx, i)
	if err != nil {
		return nil, nil, err
	}
	release, err := b.c.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	if info.Layout.IsEC() {
		return b.readStripe(ctx, info, i, metaOnly)
	}
	var data []byte
	var meta *tpb.TractMeta
	err = b.c.do(ctx, fmt.Sprintf("read %s/%d", b.guid, i), func(ctx context.Context, t *Table) error {
		row := t.Rows[t.Locate(b.guid, int64(i))]
		n := min(info.Replication, len(row.Slots))
		b.c.mu.Lock()
		first := b.c.rng.IntN(n)
		b.c.mu.Unlock()
		var errs []error
		for j := range n {
			srv := row.Slots[(first+j)%n]
			s, err := b.c.server(ctx, srv)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			actx, cancel := context.WithTimeout(ctx, b.c.cfg.AttemptTimeout)
			resp, err := s.ReadTract(actx, &tpb.ReadTractRequest{Disk: srv.Disk, Guid: b.guid[:], Tract: int64(i),
				RowVersion: row.Version, Incarnation: info.Incarnation, MetaOnly: metaOnly})
			cancel()
			if err == nil {
				data, meta = resp.Data, resp.Meta
				if !resp.Found {
					data, meta = nil, nil
				}
				return nil
			}
			if !retryable(err) {
				return err
			}
			if CodeOf(err) == tpb.ErrorCode_STALE_TLT {
				return err // every replica will say so: refresh first
			}
			errs = append(errs, fmt.Errorf("%s: %w", srv, err))
		}
		return errorf(tpb.ErrorCode_NOT_READABLE, "no replica of tract %d of %s could serve it: %v", i, b.guid, errors.Join(errs...))
	})
	return data, meta, err
}

// Op is an operation started by an Async method.
type Op[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// Done is closed when the operation has finished.
func (o *Op[T]) Done() <-chan struct{} { return o.done }

// Wait waits for the operation and returns its result.
func (o *Op[T]) Wait() (T, error) {
	<-o.done
	return o.val, o.err
}

func start[T any](f func() (T, error)) *Op[T] {
	o := &Op[T]{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		o.val, o.err = f()
	}()
	return o
}

// WriteTractAsync starts WriteTract and returns at once. The client keeps
// at most SimultaneousLimit operations running; more wait their turn.
// Writes are not ordered among themselves (FDS §2.1).
func (b *Blob) WriteTractAsync(ctx context.Context, i uint64, data []byte) *Op[struct{}] {
	return start(func() (struct{}, error) { return struct{}{}, b.WriteTract(ctx, i, data) })
}

// ReadTractAsync starts ReadTract and returns at once.
func (b *Blob) ReadTractAsync(ctx context.Context, i uint64) *Op[[]byte] {
	return start(func() ([]byte, error) { return b.ReadTract(ctx, i) })
}

// ExtendAsync starts Extend and returns at once.
func (b *Blob) ExtendAsync(ctx context.Context, n uint64) *Op[uint64] {
	return start(func() (uint64, error) { return b.Extend(ctx, n) })
}

// RefreshTLT fetches the TLT from the directory now.
func (c *Client) RefreshTLT(ctx context.Context) (*Table, error) { return c.refresh(ctx, true) }

// NodeStatus asks a node's tract service for its status (every row it is
// a member of, with allRows; otherwise only rows catching up).
func (c *Client) NodeStatus(ctx context.Context, node uint64, allRows bool) (*tpb.StatusResponse, error) {
	s, err := c.peers.client(ctx, node)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	resp, err := s.Status(actx, &tpb.StatusRequest{AllRows: allRows})
	if err != nil {
		return nil, fmt.Errorf("tract: status of node %d: %w", node, fromWire(err))
	}
	return resp, nil
}

// DegradedReads counts the erasure-coded tract reads this client served by
// reconstructing from parity.
func (c *Client) DegradedReads() uint64 { return c.degradedReads.Load() }

// DegradedWrites returns how many erasure-coded tract writes were
// acknowledged with shards missing.
func (c *Client) DegradedWrites() uint64 { return c.degradedWrites.Load() }

// RepairsRequested is how many stripes written with shards missing a
// tractserver queued for repair at this client's request.
func (c *Client) RepairsRequested() uint64 { return c.repairsRequested.Load() }

// ScrubNode runs a scrubber pass on every disk of a node now.
func (c *Client) ScrubNode(ctx context.Context, node uint64, verify bool) (*tpb.ScrubResponse, error) {
	s, err := c.peers.client(ctx, node)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, 10*c.cfg.AttemptTimeout)
	defer cancel()
	resp, err := s.Scrub(actx, &tpb.ScrubRequest{Disk: ^uint32(0), VerifyChecksums: verify})
	if err != nil {
		return nil, fmt.Errorf("tract: scrub node %d: %w", node, fromWire(err))
	}
	return resp, nil
}

// TenantBlobs lists the live blobs of tenant (empty: the cluster's own),
// at most limit of them: it asks every tractserver of the current TLT for
// the blob records it holds as a row's primary (ListBlobs, page by page).
// An administrator's question (arbor tenant delete and create ask it of
// the tenant they change); a tenant's credential sees only its own blobs.
func (c *Client) TenantBlobs(ctx context.Context, tenant string, limit int) ([]GUID, error) {
	t, err := c.RefreshTLT(ctx)
	if err != nil {
		return nil, err
	}
	servers := map[ServerID]bool{}
	for _, r := range t.Rows {
		for _, s := range r.Slots {
			servers[s] = true
		}
	}
	seen := map[GUID]bool{}
	var out []GUID
	for s := range servers {
		cl, err := c.server(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("tract: list the blobs of tractserver %s: %w", s, err)
		}
		var after []byte
		for {
			resp, err := cl.ListBlobs(ctx, &tpb.ListBlobsRequest{Disk: s.Disk, AfterGuid: after})
			if err != nil {
				return nil, fmt.Errorf("tract: list the blobs of tractserver %s: %w", s, err)
			}
			for _, b := range resp.GetBlobs() {
				g, err := guidFromBytes(b.GetGuid())
				if err != nil {
					return nil, fmt.Errorf("tract: tractserver %s lists blob %x: %w", s, b.GetGuid(), err)
				}
				after = b.GetGuid()
				if b.GetMeta().GetTenant() != tenant || b.GetMeta().GetDeleted() || seen[g] {
					continue
				}
				seen[g] = true
				out = append(out, g)
				if len(out) >= limit {
					return out, nil
				}
			}
			if !resp.GetMore() || len(resp.GetBlobs()) == 0 {
				break
			}
		}
	}
	return out, nil
}
