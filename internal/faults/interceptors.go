package faults

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// NodeMetadataKey is the gRPC metadata key that carries the calling node's
// id (decimal) on every call a node makes.
const NodeMetadataKey = "arbor-node"

// injectedFailureMessage is the one message of both kinds of injected
// failure (invariant 2).
const injectedFailureMessage = "faults: injected failure: request or reply lost"

func injectedFailure() error { return status.Error(codes.Unavailable, injectedFailureMessage) }

func (in *Injector) partitioned(peer uint64) error {
	in.counts.rejected.Add(1)
	return status.Errorf(codes.Unavailable, "faults: node %d is partitioned from node %d", in.nodeID, peer)
}

// PeerNode returns the node id an incoming call carries in its metadata, or
// 0 when the caller is not a node (or sent a malformed id).
func PeerNode(ctx context.Context) uint64 {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(NodeMetadataKey)
	if len(vals) != 1 {
		return 0
	}
	id, err := strconv.ParseUint(vals[0], 10, 64)
	if err != nil {
		return 0
	}
	return id
}

// withNodeID adds this node's id to the outgoing metadata, once.
func (in *Injector) withNodeID(ctx context.Context) context.Context {
	if in.nodeID == 0 {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(NodeMetadataKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, NodeMetadataKey, strconv.FormatUint(in.nodeID, 10))
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// UnaryClientInterceptor tags calls with the node id and injects failures,
// delays and duplicates.
func (in *Injector) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = in.withNodeID(ctx)
		d, ok := in.decide(method)
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if d.delay > 0 {
			in.counts.callsDelayed.Add(1)
			if err := sleep(ctx, d.delay); err != nil {
				return err
			}
		}
		if d.fail && !d.replyLost {
			in.counts.requestsLost.Add(1)
			return injectedFailure()
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if d.dup {
			// The duplicate arrives after the original; its reply is lost,
			// as a retransmission's would be.
			if dupReply, ok := newReplyLike(reply); ok {
				in.counts.callsDuplicated.Add(1)
				_ = invoker(ctx, method, req, dupReply, cc, opts...)
			}
		}
		if d.fail {
			in.counts.repliesLost.Add(1)
			return injectedFailure()
		}
		return err
	}
}

// newReplyLike returns an empty message of reply's type.
func newReplyLike(reply any) (any, bool) {
	m, ok := reply.(proto.Message)
	if !ok {
		return nil, false
	}
	return m.ProtoReflect().New().Interface(), true
}

// StreamClientInterceptor tags streams with the node id, injects failures
// and delays at open, and drops, delays and duplicates the messages the
// client sends.
func (in *Injector) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx = in.withNodeID(ctx)
		if exempt(method) {
			return streamer(ctx, desc, cc, method, opts...)
		}
		if d, ok := in.decide(method); ok {
			if d.delay > 0 {
				in.counts.callsDelayed.Add(1)
				if err := sleep(ctx, d.delay); err != nil {
					return nil, err
				}
			}
			if d.fail {
				// A stream that never opened: only the request can be lost.
				in.counts.requestsLost.Add(1)
				return nil, injectedFailure()
			}
		}
		// The stream is wrapped even when its method is not faulted now:
		// faults may be switched on while it is open.
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &faultyClientStream{ClientStream: cs, in: in, method: method}, nil
	}
}

type faultyClientStream struct {
	grpc.ClientStream
	in     *Injector
	method string
}

func (s *faultyClientStream) SendMsg(m any) error {
	return s.in.sendMessage(s.Context(), s.method, m, s.ClientStream.SendMsg)
}

// sendMessage sends one stream message through send, dropping, delaying or
// duplicating it as decided.
func (in *Injector) sendMessage(ctx context.Context, method string, m any, send func(any) error) error {
	d, ok := in.decide(method)
	if !ok {
		return send(m)
	}
	if d.delay > 0 {
		in.counts.messagesDelayed.Add(1)
		if err := sleep(ctx, d.delay); err != nil {
			return err
		}
	}
	if d.fail {
		in.counts.messagesDropped.Add(1)
		return nil
	}
	if err := send(m); err != nil {
		return err
	}
	if d.dup {
		in.counts.messagesDuplicated.Add(1)
		return send(m)
	}
	return nil
}

// UnaryServerInterceptor rejects calls from blocked peers.
func (in *Injector) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !exempt(info.FullMethod) {
			if peer := PeerNode(ctx); in.IsBlocked(peer) {
				return nil, in.partitioned(peer)
			}
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor rejects streams from blocked peers, fails open
// streams as soon as their peer is blocked, and drops, delays and
// duplicates the messages the server sends.
func (in *Injector) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		peer := PeerNode(ss.Context())
		if in.IsBlocked(peer) {
			return in.partitioned(peer)
		}
		return handler(srv, &faultyServerStream{ServerStream: ss, in: in, method: info.FullMethod, peer: peer})
	}
}

type faultyServerStream struct {
	grpc.ServerStream
	in     *Injector
	method string
	peer   uint64
}

func (s *faultyServerStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.in.IsBlocked(s.peer) {
		return s.in.partitioned(s.peer)
	}
	return nil
}

func (s *faultyServerStream) SendMsg(m any) error {
	if s.in.IsBlocked(s.peer) {
		return s.in.partitioned(s.peer)
	}
	return s.in.sendMessage(s.Context(), s.method, m, s.ServerStream.SendMsg)
}
