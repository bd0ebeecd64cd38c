package extent

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	policy "github.com/arbor-storage/arbor/internal/retry"
)

// Directory is what the client needs of the directory: the extent map and
// the node table (*directory.Client implements it).
type Directory interface {
	GetExtent(ctx context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error)
	ListExtents(ctx context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error)
	GetNode(ctx context.Context, req *dpb.GetNodeRequest) (*dpb.Node, error)
}

// Client defaults and bounds.
const (
	// DefaultCallTimeout is the deadline of a call whose context has none,
	// retries included (retry.DefaultStoreCall; FSS §8: 1 s per MPSC).
	DefaultCallTimeout = policy.DefaultStoreCall
	// nodeDownFor is how long a node that failed to answer is passed over
	// when another replica can take the call.
	nodeDownFor = time.Second
	// ambiguousRetryWindow bounds how long after its first attempt a write
	// whose outcome is unknown is resent under its request id: well within
	// the extent's memory of request ids (replyMemory).
	ambiguousRetryWindow = replyMemory * time.Millisecond / 2
	// maxCallTimeout bounds ClientConfig.CallTimeout.
	maxCallTimeout = 10 * time.Minute
	// defaultTxnLifetime is how long after its start a cross-extent
	// transaction expires when its context allows longer: the most a
	// crashed coordinator's locks last before background recovery.
	defaultTxnLifetime = 10 * time.Second
	// cleanupTimeout bounds the background clean-up of a transaction whose
	// coordinator could not finish it within the caller's deadline.
	cleanupTimeout = 5 * time.Second
	// maxListPages bounds the pages of extent map the client reads.
	maxListPages = 1000
)

// ClientConfig configures a Client.
type ClientConfig struct {
	Directory Directory
	// DialOptions are used for every node (credentials, interceptors: the
	// node's fault injector).
	DialOptions []grpc.DialOption
	// CallTimeout is the deadline of a call whose context has none
	// (default DefaultCallTimeout).
	CallTimeout time.Duration
	Logger      *slog.Logger
	// Now is the clock of transaction expiries (default time.Now).
	Now func() time.Time
}

// Client is the extent store's client library: linearizable page reads,
// MPSC commits (one raft entry within an extent, the FSS §6 linked-list
// two-phase commit across extents), block allocation, and recovery of
// transactions left prepared. Every call has a deadline (the context's,
// else CallTimeout). Within it a call is retried only where that is safe
// whatever happened (see invoke: nothing ran, or a write the extent will
// recognise); every other failure is returned, typed (errors.go), for the
// caller to decide (FSS §8). It is safe for concurrent use.
//
// It caches the extent map (from the directory), node addresses, and each
// extent's leader (learnt from replies and NotLeader hints). A call goes
// to the cached leader, or to a replica that forwards it once.
type Client struct {
	cfg ClientConfig
	log *slog.Logger

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	extents map[uint64]*dpb.Extent
	leaders map[uint64]uint64
	addrs   map[uint64]string
	rotate  map[uint64]int
	down    map[uint64]time.Time // node: passed over until then
	closed  bool
	retries atomic.Uint64

	cleanups sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc

	steps stepCounters
	hooks clientHooks
}

// clientHooks let tests crash the coordinator between steps.
type clientHooks struct {
	// beforeStep is called before step number n (from 1) of a cross-extent
	// commit; returning true makes the coordinator stop there as if it had
	// crashed: no further message, no clean-up.
	beforeStep func(n int, kind pb.StepKind) bool
}

type stepCounters struct {
	byKind [pb.StepKind_STEP_KIND_FENCE + 1]atomic.Uint64
}

// StepCounts is how many transaction steps of each kind a client sent.
type StepCounts struct {
	Prepare, PrepareDecide, DecideRelease, Release, Abort, Fence uint64
}

// errCoordinatorCrashed is what a test-crashed coordinator returns.
var errCoordinatorCrashed = errors.New("extent: coordinator crashed (test hook)")

// NewClient returns a client; see ClientConfig.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Directory == nil {
		return nil, errors.New("extent: client needs a directory")
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.CallTimeout < 0 || cfg.CallTimeout > maxCallTimeout {
		return nil, fmt.Errorf("extent: call timeout %v outside (0, %v]", cfg.CallTimeout, maxCallTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cfg: cfg, log: cfg.Logger.With("component", "extent-client"),
		conns: map[string]*grpc.ClientConn{}, extents: map[uint64]*dpb.Extent{},
		leaders: map[uint64]uint64{}, addrs: map[uint64]string{}, rotate: map[uint64]int{}, down: map[uint64]time.Time{},
		bgCtx: ctx, bgCancel: cancel,
	}, nil
}

// Close stops background clean-ups and closes every connection.
func (c *Client) Close() error {
	c.bgCancel()
	c.cleanups.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for a, conn := range c.conns {
		errs = append(errs, conn.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}

// Retries returns how many attempts the client made beyond the first
// of each call (after no leader, a moved leader, a node down, or an
// unknown outcome under a request id).
func (c *Client) Retries() uint64 { return c.retries.Load() }

// Steps returns how many transaction steps of each kind the client sent.
func (c *Client) Steps() StepCounts {
	k := &c.steps.byKind
	return StepCounts{
		Prepare: k[pb.StepKind_STEP_KIND_PREPARE].Load(), PrepareDecide: k[pb.StepKind_STEP_KIND_PREPARE_DECIDE].Load(),
		DecideRelease: k[pb.StepKind_STEP_KIND_DECIDE_RELEASE].Load(), Release: k[pb.StepKind_STEP_KIND_RELEASE].Load(),
		Abort: k[pb.StepKind_STEP_KIND_ABORT].Load(), Fence: k[pb.StepKind_STEP_KIND_FENCE].Load(),
	}
}

// withDeadline gives ctx the client's default deadline if it has none.
func (c *Client) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.CallTimeout)
}

func randomID() uint64 {
	var b [8]byte
	for {
		_, _ = crand.Read(b[:])
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// extent returns the extent map entry of id, from the cache or the
// directory.
func (c *Client) extent(ctx context.Context, id uint64) (*dpb.Extent, error) {
	c.mu.Lock()
	e := c.extents[id]
	c.mu.Unlock()
	if e != nil {
		return e, nil
	}
	if err := checkExtentID(id); err != nil {
		return nil, newError(ErrInvalid, "locate", id, "%v", err)
	}
	e, err := c.cfg.Directory.GetExtent(ctx, &dpb.GetExtentRequest{ExtentId: id})
	if errors.Is(err, directory.ErrNotFound) {
		return nil, newError(ErrNotFound, "locate", id, "the directory knows no extent %d", id)
	}
	if err != nil {
		return nil, newError(ErrUnavailable, "locate", id, "directory: %v", err)
	}
	c.mu.Lock()
	c.extents[id] = e
	c.mu.Unlock()
	return e, nil
}

// nodeConn returns a connection to node.
func (c *Client) nodeConn(ctx context.Context, node uint64) (*grpc.ClientConn, error) {
	c.mu.Lock()
	addr := c.addrs[node]
	c.mu.Unlock()
	if addr == "" {
		n, err := c.cfg.Directory.GetNode(ctx, &dpb.GetNodeRequest{NodeId: node})
		if err != nil {
			return nil, fmt.Errorf("address of node %d: %w", node, err)
		}
		addr = n.GetAddress()
		c.mu.Lock()
		c.addrs[node] = addr
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("extent: client closed")
	}
	conn := c.conns[addr]
	if conn == nil {
		var err error
		if conn, err = grpc.NewClient(addr, c.cfg.DialOptions...); err != nil {
			return nil, fmt.Errorf("dial node %d at %s: %w", node, addr, err)
		}
		c.conns[addr] = conn
	}
	return conn, nil
}

// NodeClient returns the Extent service of node (for the extent manager
// and tools).
func (c *Client) NodeClient(ctx context.Context, node uint64) (pb.ExtentClient, error) {
	conn, err := c.nodeConn(ctx, node)
	if err != nil {
		return nil, err
	}
	return pb.NewExtentClient(conn), nil
}

// route picks the node to send a call on extent id to: its cached leader,
// else the next of its replicas (which forwards to the leader it knows),
// skipping nodes that failed to answer within the last nodeDownFor while
// another replica remains.
func (c *Client) route(ctx context.Context, id uint64) (uint64, pb.ExtentClient, error) {
	e, err := c.extent(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	c.mu.Lock()
	now := time.Now()
	node := c.leaders[id]
	if node != 0 && now.Before(c.down[node]) {
		node = 0 // a hint at a node that just failed: ask a replica
	}
	if node == 0 {
		if len(e.Replicas) == 0 {
			c.mu.Unlock()
			return 0, nil, newError(ErrUnavailable, "route", id, "extent %d has no replicas", id)
		}
		for range e.Replicas {
			node = e.Replicas[c.rotate[id]%len(e.Replicas)]
			c.rotate[id]++
			if !now.Before(c.down[node]) {
				break
			}
		}
	}
	c.mu.Unlock()
	cl, err := c.NodeClient(ctx, node)
	if err != nil {
		return 0, nil, newError(ErrUnavailable, "route", id, "%v", err)
	}
	return node, cl, nil
}

// learn updates the caches from the outcome of a call to node.
func (c *Client) learn(id, node, leader uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.down, node)
		if leader != 0 {
			c.leaders[id] = leader
		}
		return
	}
	d, ok := detailOf(err)
	switch {
	case refused(err):
		// The node answered: it refused the caller, and is not down.
	case !ok:
		// The node may be down, have moved, or no longer hold the extent
		// (it was re-replicated): look all three up again, and route
		// around it for a moment.
		if c.leaders[id] == node {
			delete(c.leaders, id)
		}
		delete(c.addrs, node)
		delete(c.extents, id)
		c.down[node] = time.Now().Add(nodeDownFor)
	case d.Code == pb.Code_CODE_NO_REPLICA:
		delete(c.extents, id)
		delete(c.leaders, id)
	case d.LeaderId != 0 && d.LeaderId != node:
		c.leaders[id] = d.LeaderId
	case d.Code == pb.Code_CODE_NOT_LEADER || d.Code == pb.Code_CODE_UNAVAILABLE:
		delete(c.leaders, id)
	}
}

// invoke runs one call on extent id at its leader, under the project's
// retry policy (internal/retry): within ctx's deadline it tries again,
// with the Failover backoff and at another replica if the node failed,
// every failure that ran nothing (ErrUnavailable: no leader, a leader that
// moved, a node down or without the replica), and, for a write that
// carries a request id (idempotent: the extent remembers the id and
// answers a repeat with the first reply, replies.go), a failure whose
// outcome is unknown (ErrAmbiguous), for as long as the extent surely
// remembers the id (ambiguousRetryWindow). One attempt takes at most
// retry.ExtentAttempt, so a dead or unreachable node costs at most that
// before the call moves on. Every other error is returned at once: the
// store does not retry what the caller must decide (FSS §8).
func invoke[Resp interface{ GetLeaderId() uint64 }](ctx context.Context, c *Client, op string, id uint64, write, idempotent bool,
	call func(context.Context, pb.ExtentClient) (Resp, error)) (Resp, error) {
	var zero Resp
	start := time.Now()
	// unknown is the first attempt whose outcome is unknown. Only a
	// later answer of the state machine itself (a refusal it decided,
	// or its memory of the first run under the request id) says what
	// became of it; any other failure (no leader, a refused connection,
	// a credential refused) leaves the call's outcome unknown: answering
	// "unavailable" there told a coordinator that a prepare-and-decide
	// which had committed had not.
	var unknown error
	fail := func(err error) (Resp, error) {
		if unknown != nil && !decidedByStateMachine(err) {
			return zero, newError(ErrAmbiguous, op, id, "%v, after an attempt with an unknown outcome (%v)", err, unknown)
		}
		return zero, err
	}
	for attempt := 0; ; attempt++ {
		node, cl, err := c.route(ctx, id)
		if err == nil {
			actx, cancel := policy.Attempt(ctx, policy.ExtentAttempt)
			var resp Resp
			resp, err = call(actx, cl)
			cancel()
			if err == nil {
				c.learn(id, node, resp.GetLeaderId(), nil)
				return resp, nil
			}
			c.learn(id, node, 0, err)
			err = rpcError(op, id, err, write)
		}
		if unknown == nil && errors.Is(err, ErrAmbiguous) {
			unknown = err
		}
		retry := errors.Is(err, ErrUnavailable) ||
			(idempotent && errors.Is(err, ErrAmbiguous) && time.Since(start) < ambiguousRetryWindow)
		if !retry || ctx.Err() != nil {
			return fail(err)
		}
		c.retries.Add(1)
		if policy.Sleep(ctx, policy.Failover.Delay(attempt)) != nil {
			return fail(err)
		}
	}
}

// decidedByStateMachine reports whether err is a refusal an extent's state
// machine (or its request validation) decided: the request did nothing.
func decidedByStateMachine(err error) bool {
	for _, kind := range []error{ErrConflict, ErrStale, ErrPrepared, ErrAborted, ErrNoSpace, ErrInvalid, ErrAmbiguous} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// ReadPage reads the page p points to: its data and slot, linearizably,
// after checking p's ownership tag against its block (ErrStale) and that no
// prepared transaction holds it (ErrPrepared).
func (c *Client) ReadPage(ctx context.Context, p Pointer) (Page, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	resp, err := invoke(ctx, c, "read", p.Extent, false, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.ReadResponse, error) {
		return cl.Read(ctx, &pb.ReadRequest{Page: p.toProto()})
	})
	if err != nil {
		return Page{}, err
	}
	return Page{Data: resp.Data, Slot: resp.Slot}, nil
}

// Commit runs a multi-page store-conditional (FSS §3): up to MaxElements
// elements (conditional writes, slot checks, block allocations and frees),
// all applied atomically or none. Elements apply in order, so a write may
// follow the allocation of its block (with slot 0). Within one extent it is
// one raft entry; across extents, the linked-list two-phase commit of FSS
// §6 in 2n steps, extents in increasing id order. It returns one Result
// per element. Errors: see errors.go; only ErrAmbiguous leaves the outcome
// unknown.
func (c *Client) Commit(ctx context.Context, elems []Element) ([]Result, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	parts, err := splitParts(elems)
	if err != nil {
		return nil, err
	}
	if len(parts) == 1 {
		p := parts[0]
		req := &pb.CommitRequest{ExtentId: p.extent, Elements: p.elems, RequestId: randomID()}
		resp, err := invoke(ctx, c, "commit", p.extent, true, true, func(ctx context.Context, cl pb.ExtentClient) (*pb.CommitResponse, error) {
			return cl.Commit(ctx, req)
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Results) != len(elems) {
			return nil, newError(ErrAmbiguous, "commit", p.extent, "reply has %d results for %d elements", len(resp.Results), len(elems))
		}
		return resultsFromProto(resp.Results), nil
	}
	return c.commitAcross(ctx, parts, len(elems))
}

// Check validates a read-only transaction: nil if every page elems check
// (only Check elements) is still at its slot, owned as its pointer says
// and held by no prepared transaction, else the error a Commit of the
// same checks would return (ErrConflict, ErrStale, ErrPrepared...). It
// writes nothing and costs no raft entry: each extent's leader answers
// from a linearizable read, the extents at once. Checking extents at
// different moments is enough: every read of the transaction came before
// every check, and a page's slot only grows, so all the pages held their
// checked values together at the moment of the last read.
func (c *Client) Check(ctx context.Context, elems []Element) error {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	parts, err := splitParts(elems)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if e.Kind != KindCheck {
			return newError(ErrInvalid, "check", e.Ptr.Extent, "a check may hold only checks, not element kind %d", e.Kind)
		}
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = invoke(ctx, c, "check", p.extent, false, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.CheckResponse, error) {
				return cl.Check(ctx, &pb.CheckRequest{ExtentId: p.extent, Elements: p.elems})
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// part is the elements of one extent, with their positions in the
// caller's list.
type part struct {
	extent uint64
	elems  []*pb.Element
	pos    []int
}

// splitParts checks what the client can check alone and groups elements
// by extent, extents in increasing id order.
func splitParts(elems []Element) ([]part, error) {
	if len(elems) == 0 {
		return nil, newError(ErrInvalid, "commit", 0, "an MPSC needs at least one element")
	}
	if len(elems) > MaxElements {
		return nil, newError(ErrInvalid, "commit", 0, "%d elements: an MPSC has at most %d (MaxElements)", len(elems), MaxElements)
	}
	byExtent := map[uint64]*part{}
	for i, e := range elems {
		if e.Kind < KindWrite || e.Kind > KindFree {
			return nil, newError(ErrInvalid, "commit", 0, "element %d: unknown kind %v", i, e.Kind)
		}
		id := e.extentOf()
		if err := checkExtentID(id); err != nil {
			return nil, newError(ErrInvalid, "commit", id, "element %d: %v", i, err)
		}
		if e.Kind == KindWrite && len(e.Data) > maxPageSizeBytes {
			return nil, newError(ErrInvalid, "commit", id, "element %d: %d bytes exceed the largest page size %d", i, len(e.Data), maxPageSizeBytes)
		}
		if d := e.Delta; d != nil && (e.Kind != KindWrite || len(e.Data) != 0 || max(uint64(d.Length), uint64(len(d.Script))) > maxPageSizeBytes) {
			return nil, newError(ErrInvalid, "commit", id, "element %d: a page delta must be a write without data, of at most %d bytes", i, maxPageSizeBytes)
		}
		p := byExtent[id]
		if p == nil {
			p = &part{extent: id}
			byExtent[id] = p
		}
		p.elems = append(p.elems, e.toProto())
		p.pos = append(p.pos, i)
	}
	ids := make([]uint64, 0, len(byExtent))
	for id := range byExtent {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]part, len(ids))
	for i, id := range ids {
		parts[i] = *byExtent[id]
	}
	return parts, nil
}

// FreeBlocks lists up to n free blocks of extent, those nearest to page
// near first: a hint for AllocateBlock (the allocation decides).
func (c *Client) FreeBlocks(ctx context.Context, extent, near uint64, n int) ([]FreeBlock, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	if n < 1 || n > maxFreeBlocksListed {
		return nil, newError(ErrInvalid, "free blocks", extent, "n %d outside [1, %d]", n, maxFreeBlocksListed)
	}
	resp, err := invoke(ctx, c, "free blocks", extent, false, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.FreeBlocksResponse, error) {
		return cl.FreeBlocks(ctx, &pb.FreeBlocksRequest{ExtentId: extent, NearPage: near, Limit: uint32(n)})
	})
	if err != nil {
		return nil, err
	}
	out := make([]FreeBlock, len(resp.Blocks))
	for i, b := range resp.Blocks {
		out[i] = FreeBlock{Extent: extent, Page: b.Page, Generation: b.Generation}
	}
	return out, nil
}

// ExtentInfo is an extent as the directory's extent map records it.
type ExtentInfo struct {
	ID       uint64
	Geometry Geometry
	Replicas []uint64
	Epoch    uint64
}

func extentInfo(e *dpb.Extent) ExtentInfo {
	g := e.GetGeometry()
	return ExtentInfo{
		ID: e.ExtentId, Replicas: slices.Clone(e.Replicas), Epoch: e.Epoch,
		Geometry: Geometry{PageSizeBytes: g.GetPageSizeBytes(), BlockSizeBytes: g.GetBlockSizeBytes(),
			ExtentSizeBytes: g.GetExtentSizeBytes(), Replication: g.GetReplication()},
	}
}

// Geometry returns an extent's geometry (cached: it never changes).
func (c *Client) Geometry(ctx context.Context, extent uint64) (Geometry, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	e, err := c.extent(ctx, extent)
	if err != nil {
		return Geometry{}, err
	}
	return extentInfo(e).Geometry, nil
}

// Extents lists every extent of the extent map, by id. The entries it
// reads also fill the client's cache, so that the calls that follow do not
// ask the directory for each extent again.
func (c *Client) Extents(ctx context.Context) ([]ExtentInfo, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	var out []ExtentInfo
	var after uint64
	for range maxListPages {
		resp, err := c.cfg.Directory.ListExtents(ctx, &dpb.ListExtentsRequest{StartAfter: after})
		if err != nil {
			return nil, newError(ErrUnavailable, "list extents", 0, "directory: %v", err)
		}
		c.mu.Lock()
		for _, e := range resp.Extents {
			out = append(out, extentInfo(e))
			after = e.ExtentId
			c.extents[e.ExtentId] = e
		}
		c.mu.Unlock()
		if !resp.More || len(resp.Extents) == 0 {
			return out, nil
		}
	}
	return out, nil
}

// Info returns the leader's linearizable view of an extent: membership,
// counters and pending transactions.
func (c *Client) Info(ctx context.Context, extent uint64) (*pb.InfoResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	return invoke(ctx, c, "info", extent, false, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.InfoResponse, error) {
		return cl.Info(ctx, &pb.InfoRequest{ExtentId: extent})
	})
}

// ReplicaStatus asks node about its replica of extent (exists false if it
// has none).
func (c *Client) ReplicaStatus(ctx context.Context, node, extent uint64, progress bool) (*pb.ReplicaStatusResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	cl, err := c.NodeClient(ctx, node)
	if err != nil {
		return nil, newError(ErrUnavailable, "replica status", extent, "%v", err)
	}
	resp, err := cl.ReplicaStatus(ctx, &pb.ReplicaStatusRequest{ExtentId: extent, Progress: progress})
	if err != nil {
		c.learn(extent, node, 0, err)
		return nil, rpcError("replica status", extent, err, false)
	}
	return resp, nil
}

// Forget drops what the client caches about extent (its map entry and
// leader), so that the next call looks it up again.
func (c *Client) Forget(extent uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.extents, extent)
	delete(c.leaders, extent)
}

// background runs fn with its own deadline after the caller's call has
// returned (clean-up of a transaction the coordinator left).
func (c *Client) background(what string, fn func(ctx context.Context) error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed || c.bgCtx.Err() != nil {
		return
	}
	c.cleanups.Add(1)
	go func() {
		defer c.cleanups.Done()
		ctx, cancel := context.WithTimeout(c.bgCtx, cleanupTimeout)
		defer cancel()
		if err := fn(ctx); err != nil {
			c.log.Debug("transaction clean-up incomplete; recovery will finish it", "what", what, "err", err)
		}
	}()
}
