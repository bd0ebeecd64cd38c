package raftengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// Transport limits.
const (
	// maxQueuedPerPeer bounds the messages waiting for one peer; beyond it
	// new messages are dropped (raft retransmits). Messages queued while a
	// peer is away (the sender blocked on a broken stream or backing off)
	// are delivered when it returns, so a restarted follower may catch up
	// from a leader's MsgApps of the outage even though the leader has
	// truncated those entries since: harmless, as raft never depends on
	// when a message arrives (TestLateMessagesCatchUpPastTruncation).
	maxQueuedPerPeer = 8192
	// maxBatchBytes bounds one MessageBatch on the wire.
	maxBatchBytes = 16 << 20
	// MaxGRPCMessageBytes is the gRPC message size limit both ends of the
	// transport need; servers hosting the transport must allow it
	// (grpc.MaxRecvMsgSize).
	MaxGRPCMessageBytes = 64 << 20
	reconnectBackoffMin = 50 * time.Millisecond
	reconnectBackoffMax = time.Second
)

// Resolver maps a node id to its gRPC address.
type Resolver func(ctx context.Context, nodeID uint64) (string, error)

// GRPCTransport is the Transport between real processes: one client stream
// (RaftTransport.Send) per ordered node pair, each stream message carrying
// every queued message for that peer, across all groups.
type GRPCTransport struct {
	nodeID   uint64
	resolve  Resolver
	dialOpts []grpc.DialOption
	log      *slog.Logger

	handler atomic.Pointer[Handler]

	mu    sync.Mutex
	peers map[uint64]*peerQueue
	conns map[string]*grpc.ClientConn

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	dropped atomic.Uint64
}

var _ Transport = (*GRPCTransport)(nil)

// NewGRPCTransport returns a transport for node nodeID. dialOpts are used
// for every connection to peers (credentials, interceptors).
func NewGRPCTransport(nodeID uint64, resolve Resolver, logger *slog.Logger, dialOpts ...grpc.DialOption) *GRPCTransport {
	if logger == nil {
		logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxGRPCMessageBytes), grpc.MaxCallSendMsgSize(MaxGRPCMessageBytes),
	)}, dialOpts...)
	return &GRPCTransport{
		nodeID:   nodeID,
		resolve:  resolve,
		dialOpts: opts,
		log:      logger.With("component", "raft-transport", "node", nodeID),
		peers:    map[uint64]*peerQueue{},
		conns:    map[string]*grpc.ClientConn{},
		ctx:      ctx,
		cancel:   cancel,
	}
}

// Register adds the transport's service to a gRPC server.
func (t *GRPCTransport) Register(s grpc.ServiceRegistrar) {
	enginepb.RegisterRaftTransportServer(s, transportServer{t: t})
}

// Listen implements Transport.
func (t *GRPCTransport) Listen(h Handler) { t.handler.Store(&h) }

// Dropped counts messages dropped because a peer's queue was full.
func (t *GRPCTransport) Dropped() uint64 { return t.dropped.Load() }

// Close stops every stream and closes the connections.
func (t *GRPCTransport) Close() error {
	t.cancel()
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	var err error
	for addr, c := range t.conns {
		err = errors.Join(err, c.Close())
		delete(t.conns, addr)
	}
	return err
}

// Send implements Transport.
func (t *GRPCTransport) Send(to uint64, envs []Envelope) {
	if to == t.nodeID || t.ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	p := t.peers[to]
	if p == nil {
		p = &peerQueue{t: t, id: to, signal: make(chan struct{}, 1)}
		t.peers[to] = p
		t.wg.Add(1)
		go p.run()
	}
	t.mu.Unlock()
	p.push(envs)
}

func (t *GRPCTransport) conn(ctx context.Context, node uint64) (*grpc.ClientConn, error) {
	addr, err := t.resolve(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("resolve node %d: %w", node, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, t.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial node %d at %s: %w", node, addr, err)
	}
	t.conns[addr] = c
	return c, nil
}

type peerQueue struct {
	t      *GRPCTransport
	id     uint64
	signal chan struct{}

	mu        sync.Mutex
	queue     []Envelope
	keepalive bool
}

func (p *peerQueue) push(envs []Envelope) {
	p.mu.Lock()
	if len(envs) == 0 {
		p.keepalive = true
	} else if len(p.queue)+len(envs) > maxQueuedPerPeer {
		p.t.dropped.Add(uint64(len(envs)))
	} else {
		p.queue = append(p.queue, envs...)
	}
	p.mu.Unlock()
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

func (p *peerQueue) take() ([]Envelope, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q, k := p.queue, p.keepalive
	p.queue, p.keepalive = nil, false
	return q, k
}

func (p *peerQueue) run() {
	defer p.t.wg.Done()
	var stream enginepb.RaftTransport_SendClient
	var cancel context.CancelFunc
	closeStream := func() {
		if cancel != nil {
			cancel()
		}
		stream, cancel = nil, nil
	}
	defer closeStream()
	backoff := reconnectBackoffMin
	for {
		select {
		case <-p.t.ctx.Done():
			return
		case <-p.signal:
		}
		envs, keepalive := p.take()
		if len(envs) == 0 && !keepalive {
			continue
		}
		if stream == nil {
			var err error
			stream, cancel, err = p.open()
			if err != nil {
				p.t.log.Debug("raft stream to peer unavailable", "peer", p.id, "err", err)
				p.t.dropped.Add(uint64(len(envs)))
				closeStream()
				if !sleepCtx(p.t.ctx, backoff) {
					return
				}
				backoff = min(2*backoff, reconnectBackoffMax)
				continue
			}
		}
		if err := p.sendAll(stream, envs); err != nil {
			p.t.log.Debug("raft stream to peer broke", "peer", p.id, "err", err)
			closeStream()
			if !sleepCtx(p.t.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, reconnectBackoffMax)
			continue
		}
		backoff = reconnectBackoffMin
	}
}

func (p *peerQueue) open() (enginepb.RaftTransport_SendClient, context.CancelFunc, error) {
	c, err := p.t.conn(p.t.ctx, p.id)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(p.t.ctx)
	s, err := enginepb.NewRaftTransportClient(c).Send(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return s, cancel, nil
}

// sendAll sends envs in batches of at most maxBatchBytes; an empty envs
// sends one empty batch (a keepalive).
func (p *peerQueue) sendAll(stream enginepb.RaftTransport_SendClient, envs []Envelope) error {
	batch := &enginepb.MessageBatch{FromNode: p.t.nodeID, ToNode: p.id}
	size := 0
	for _, env := range envs {
		b, err := proto.Marshal(env.Message)
		if err != nil {
			return fmt.Errorf("encode raft message: %w", err)
		}
		if size+len(b) > maxBatchBytes && len(batch.Envelopes) > 0 {
			if err := stream.Send(batch); err != nil {
				return err
			}
			batch = &enginepb.MessageBatch{FromNode: p.t.nodeID, ToNode: p.id}
			size = 0
		}
		batch.Envelopes = append(batch.Envelopes, &enginepb.Envelope{GroupId: env.GroupID, Message: b, Quiesce: env.Quiesce})
		size += len(b)
	}
	return stream.Send(batch)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (t *GRPCTransport) currentHandler() (Handler, error) {
	h := t.handler.Load()
	if h == nil {
		return nil, status.Error(codes.Unavailable, "raft engine not started")
	}
	return *h, nil
}

// errTransportClosed ends a peer's stream into a transport that closed:
// the node is stopping.
var errTransportClosed = status.Error(codes.Unavailable, "raft transport closed: the node is stopping")

// transportServer is the receiving end of the transport.
type transportServer struct {
	enginepb.UnimplementedRaftTransportServer
	t *GRPCTransport
}

// Send implements enginepb.RaftTransportServer: the receiving end of a
// peer's stream. The stream lives as long as the peer's transport, so it
// ends here when this transport closes (errTransportClosed): otherwise a
// node's graceful gRPC stop would wait for every peer's transport to
// close, and peers stopping together each wait for the others.
func (s transportServer) Send(stream enginepb.RaftTransport_SendServer) error {
	t := s.t
	h, err := t.currentHandler()
	if err != nil {
		return err
	}
	// Recv cannot be interrupted but by the handler's return: receive on
	// a goroutine of the stream's own (it ends when the stream does).
	type received struct {
		batch *enginepb.MessageBatch
		err   error
	}
	in := make(chan received)
	go func() {
		for {
			batch, err := stream.Recv()
			select {
			case in <- received{batch, err}:
			case <-stream.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r received
		select {
		case <-t.ctx.Done():
			return errTransportClosed
		case r = <-in:
		}
		batch, err := r.batch, r.err
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&enginepb.SendResponse{})
		}
		if err != nil {
			return err
		}
		if batch.GetToNode() != t.nodeID {
			return status.Errorf(codes.FailedPrecondition, "raft batch for node %d reached node %d", batch.GetToNode(), t.nodeID)
		}
		envs := make([]Envelope, 0, len(batch.GetEnvelopes()))
		for _, pe := range batch.GetEnvelopes() {
			m := &raftpb.Message{}
			if err := proto.Unmarshal(pe.GetMessage(), m); err != nil {
				return status.Errorf(codes.InvalidArgument, "malformed raft message for group %d: %v", pe.GetGroupId(), err)
			}
			if m.GetTo() != t.nodeID {
				return status.Errorf(codes.InvalidArgument, "raft message for node %d in a batch to node %d", m.GetTo(), t.nodeID)
			}
			envs = append(envs, Envelope{GroupID: pe.GetGroupId(), Message: m, Quiesce: pe.GetQuiesce()})
		}
		h.HandleMessages(batch.GetFromNode(), envs)
	}
}

// SendSnapshot implements Transport.
func (t *GRPCTransport) SendSnapshot(ctx context.Context, to uint64, snap OutgoingSnapshot) (bool, error) {
	c, err := t.conn(ctx, to)
	if err != nil {
		return false, err
	}
	stream, err := enginepb.NewRaftTransportClient(c).Snapshot(ctx)
	if err != nil {
		return false, err
	}
	h := snap.Header()
	cs, err := proto.Marshal(h.ConfState)
	if err != nil {
		return false, err
	}
	header := &enginepb.SnapshotHeader{
		GroupId: h.GroupID, FromNode: h.From, ToNode: h.To, Index: h.Index, Term: h.Term,
		MessageTerm: h.MessageTerm, ConfState: cs,
		Descriptor_: &enginepb.GroupDescriptor{GroupId: h.Descriptor.GroupID, Kind: h.Descriptor.Kind, Params: h.Descriptor.Params},
	}
	sendErr := stream.Send(&enginepb.SnapshotChunk{Header: header})
	for sendErr == nil {
		kvs, err := snap.Next()
		if errors.Is(err, io.EOF) {
			sendErr = stream.Send(&enginepb.SnapshotChunk{Done: true})
			break
		}
		if err != nil {
			_ = stream.CloseSend()
			return false, fmt.Errorf("read snapshot: %w", err)
		}
		chunk := &enginepb.SnapshotChunk{Pairs: make([]*enginepb.KeyValue, len(kvs))}
		for i, kv := range kvs {
			chunk.Pairs[i] = &enginepb.KeyValue{Key: kv.Key, Value: kv.Value}
		}
		sendErr = stream.Send(chunk)
	}
	// io.EOF from Send means the receiver answered early (it declined);
	// CloseAndRecv returns its answer.
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return false, sendErr
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return false, err
	}
	return resp.GetApplied(), nil
}

// Snapshot implements enginepb.RaftTransportServer.
func (s transportServer) Snapshot(stream enginepb.RaftTransport_SnapshotServer) error {
	t := s.t
	h, err := t.currentHandler()
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ph := first.GetHeader()
	if ph == nil {
		return status.Error(codes.InvalidArgument, "snapshot stream must start with a header")
	}
	if ph.GetToNode() != t.nodeID {
		return status.Errorf(codes.FailedPrecondition, "snapshot for node %d reached node %d", ph.GetToNode(), t.nodeID)
	}
	cs := &raftpb.ConfState{}
	if err := proto.Unmarshal(ph.GetConfState(), cs); err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed snapshot conf state: %v", err)
	}
	header := SnapshotHeader{
		GroupID: ph.GetGroupId(), From: ph.GetFromNode(), To: ph.GetToNode(),
		Index: ph.GetIndex(), Term: ph.GetTerm(), MessageTerm: ph.GetMessageTerm(), ConfState: cs,
		Descriptor: GroupDescriptor{GroupID: ph.GetDescriptor_().GetGroupId(), Kind: ph.GetDescriptor_().GetKind(), Params: ph.GetDescriptor_().GetParams()},
	}
	done := false
	next := func() ([]KV, error) {
		for !done {
			chunk, err := stream.Recv()
			if err != nil {
				return nil, fmt.Errorf("snapshot stream ended early: %w", err)
			}
			done = chunk.GetDone()
			if len(chunk.GetPairs()) == 0 {
				continue
			}
			kvs := make([]KV, len(chunk.GetPairs()))
			for i, p := range chunk.GetPairs() {
				kvs[i] = KV{Key: p.GetKey(), Value: p.GetValue()}
			}
			return kvs, nil
		}
		return nil, io.EOF
	}
	// A snapshot being received is abandoned when the transport closes
	// (the sender retries it later), so that it never holds up a stop.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	applied, err := h.HandleSnapshot(ctx, header, next)
	if err != nil {
		return status.Errorf(codes.Aborted, "install snapshot of group %d: %v", header.GroupID, err)
	}
	return stream.SendAndClose(&enginepb.SnapshotResponse{Applied: applied})
}
