package faults

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/faults/faultspb"
)

// testService counts what reaches the server.
type testService struct {
	testpb.UnimplementedTestServiceServer
	unary, empty, streamMsgs atomic.Int64
}

func (s *testService) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.unary.Add(1)
	return &testpb.SimpleResponse{Username: "served"}, nil
}

func (s *testService) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	s.empty.Add(1)
	return &testpb.Empty{}, nil
}

func (s *testService) StreamingInputCall(stream grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) error {
	var n int32
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: n})
		}
		if err != nil {
			return err
		}
		n++
		s.streamMsgs.Add(1)
	}
}

func (s *testService) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	for range req.GetResponseParameters() {
		if err := stream.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	return nil
}

func (s *testService) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// startServer serves the test service and the Admin service of in on a
// 127.0.0.1 port, with in's server interceptors.
func startServer(t *testing.T, in *Injector) (*testService, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(in.StreamServerInterceptor()),
	)
	svc := &testService{}
	testpb.RegisterTestServiceServer(srv, svc)
	faultspb.RegisterAdminServer(srv, NewAdminServer(in, nil))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return svc, lis.Addr().String()
}

// dial connects to addr through in's client interceptors.
func dial(t *testing.T, addr string, in *Injector) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(in.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(in.StreamClientInterceptor()),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryFailuresAreAmbiguous(t *testing.T) {
	svc, addr := startServer(t, mustInjector(t, 1, "off"))
	client := mustInjector(t, 2, "fail=1,seed=11")
	c := testpb.NewTestServiceClient(dial(t, addr, client))
	ctx := testCtx(t)
	const calls = 200
	for range calls {
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != injectedFailureMessage {
			t.Fatalf("call error = %v, want Unavailable %q", err, injectedFailureMessage)
		}
	}
	n := client.Counts()
	if n.RequestsLost+n.RepliesLost != calls {
		t.Fatalf("lost %d requests + %d replies, want %d in all", n.RequestsLost, n.RepliesLost, calls)
	}
	if n.RequestsLost == 0 || n.RepliesLost == 0 {
		t.Fatalf("one kind of failure never happened: %+v", n)
	}
	// Exactly the calls whose reply was lost were executed.
	if got := svc.unary.Load(); uint64(got) != n.RepliesLost {
		t.Fatalf("server executed %d calls, want %d (the replies lost)", got, n.RepliesLost)
	}
}

func TestUnaryDuplicateAndDelay(t *testing.T) {
	svc, addr := startServer(t, mustInjector(t, 1, "off"))
	client := mustInjector(t, 2, "dup=1,delay=1:20ms-30ms")
	c := testpb.NewTestServiceClient(dial(t, addr, client))
	ctx := testCtx(t)
	for range 5 {
		start := time.Now()
		resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetUsername() != "served" {
			t.Fatalf("reply = %v", resp)
		}
		if d := time.Since(start); d < 20*time.Millisecond {
			t.Fatalf("delayed call took %v, want at least 20ms", d)
		}
	}
	if got := svc.unary.Load(); got != 10 {
		t.Fatalf("server executed %d calls, want 10 (5 duplicated)", got)
	}
	if n := client.Counts(); n.CallsDuplicated != 5 || n.CallsDelayed != 5 {
		t.Fatalf("counts = %+v, want 5 duplicated and 5 delayed", n)
	}
}

func TestDelayRespectsDeadline(t *testing.T) {
	_, addr := startServer(t, mustInjector(t, 1, "off"))
	c := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 2, "delay=1:10s")))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("error = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("delay ignored the deadline: %v", d)
	}
}

func TestMethodsPattern(t *testing.T) {
	svc, addr := startServer(t, mustInjector(t, 1, "off"))
	c := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 2, "fail=1,methods=/EmptyCall$")))
	ctx := testCtx(t)
	if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("unmatched method failed: %v", err)
	}
	if _, err := c.EmptyCall(ctx, &testpb.Empty{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("matched method: error %v, want Unavailable", err)
	}
	if svc.unary.Load() != 1 {
		t.Fatal("unmatched call not executed once")
	}
}

func TestClientStreamMessages(t *testing.T) {
	svc, addr := startServer(t, mustInjector(t, 1, "off"))
	client := mustInjector(t, 2, "off")
	c := testpb.NewTestServiceClient(dial(t, addr, client))
	ctx := testCtx(t)

	send := func(n int) int32 {
		t.Helper()
		stream, err := c.StreamingInputCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := stream.Send(&testpb.StreamingInputCallRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAggregatedPayloadSize()
	}
	if got := send(10); got != 10 {
		t.Fatalf("no faults: server got %d messages, want 10", got)
	}
	if err := client.SetConfig(Config{DupRate: 1}); err != nil {
		t.Fatal(err)
	}
	if got := send(10); got != 20 {
		t.Fatalf("dup=1: server got %d messages, want 20", got)
	}

	// Open a stream, then switch to dropping everything: the open stream is
	// affected too.
	if err := client.SetConfig(Config{}); err != nil {
		t.Fatal(err)
	}
	stream, err := c.StreamingInputCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.SetConfig(Config{FailRate: 1}); err != nil {
		t.Fatal(err)
	}
	for range 7 {
		if err := stream.Send(&testpb.StreamingInputCallRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAggregatedPayloadSize() != 0 {
		t.Fatalf("fail=1: server got %d messages, want 0", resp.GetAggregatedPayloadSize())
	}
	n := client.Counts()
	if n.MessagesDropped != 7 || n.MessagesDuplicated != 10 {
		t.Fatalf("counts = %+v, want 7 dropped and 10 duplicated", n)
	}
	if svc.streamMsgs.Load() != 30 {
		t.Fatalf("server received %d messages in all, want 30", svc.streamMsgs.Load())
	}
	// With fail=1 a new stream does not open.
	if _, err := c.StreamingInputCall(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("opening a stream with fail=1: %v, want Unavailable", err)
	}
}

func TestServerStreamMessages(t *testing.T) {
	server := mustInjector(t, 1, "dup=1,methods=StreamingOutputCall")
	_, addr := startServer(t, server)
	c := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 2, "off")))
	stream, err := c.StreamingOutputCall(testCtx(t), &testpb.StreamingOutputCallRequest{
		ResponseParameters: make([]*testpb.ResponseParameters, 4),
	})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != 8 {
		t.Fatalf("client received %d messages, want 8 (4 duplicated)", got)
	}
	if n := server.Counts(); n.MessagesDuplicated != 4 {
		t.Fatalf("server counts = %+v, want 4 duplicated messages", n)
	}
}

func TestPartitionUnary(t *testing.T) {
	server := mustInjector(t, 1, "off")
	svc, addr := startServer(t, server)
	if err := server.Block(7); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	from7 := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 7, "off")))
	from8 := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 8, "off")))
	tool := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 0, "off")))

	_, err := from7.UnaryCall(ctx, &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "partitioned") {
		t.Fatalf("call from blocked node 7: %v, want Unavailable partitioned", err)
	}
	if svc.unary.Load() != 0 {
		t.Fatal("a call from a blocked peer was executed")
	}
	if _, err := from8.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("call from node 8: %v", err)
	}
	if _, err := tool.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("call from a non-node: %v", err)
	}
	if err := server.Unblock(7); err != nil {
		t.Fatal(err)
	}
	if _, err := from7.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("call from node 7 after heal: %v", err)
	}
	if n := server.Counts(); n.PartitionRejections != 1 {
		t.Fatalf("partition rejections = %d, want 1", n.PartitionRejections)
	}
}

func TestPartitionCutsOpenStream(t *testing.T) {
	server := mustInjector(t, 1, "off")
	_, addr := startServer(t, server)
	c := testpb.NewTestServiceClient(dial(t, addr, mustInjector(t, 7, "off")))
	stream, err := c.FullDuplexCall(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	echo := func() error {
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("x")}}); err != nil {
			return err
		}
		_, err := stream.Recv()
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("echo before partition: %v", err)
	}
	if err := server.Block(7); err != nil {
		t.Fatal(err)
	}
	err = echo()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "partitioned") {
		t.Fatalf("echo after partition: %v, want Unavailable partitioned", err)
	}
	// A new stream from the blocked peer is refused.
	stream, err = c.FullDuplexCall(testCtx(t))
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("new stream from blocked peer: %v, want Unavailable", err)
	}
}

func TestAdminService(t *testing.T) {
	server := mustInjector(t, 1, "off")
	_, addr := startServer(t, server)
	// The admin client itself is blocked and fails every call: Admin calls
	// must still get through (invariant 3).
	if err := server.Block(9); err != nil {
		t.Fatal(err)
	}
	admin := faultspb.NewAdminClient(dial(t, addr, mustInjector(t, 9, "fail=1")))
	ctx := testCtx(t)

	st, err := admin.SetFaults(ctx, &faultspb.SetFaultsRequest{
		Config: proto.String("fail=0.25,delay=0.5:1ms-2ms,seed=5"),
		Block:  []uint64{3, 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNodeId() != 1 || st.GetConfig() != "fail=0.25,delay=0.5:1ms-2ms,seed=5" || !equalIDs(st.GetBlocked(), 3, 4, 9) {
		t.Fatalf("state after set = %v", st)
	}

	// A bad config fails and changes nothing, not even the blocked set.
	_, err = admin.SetFaults(ctx, &faultspb.SetFaultsRequest{Config: proto.String("fail=7"), Unblock: []uint64{3}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad config: %v, want InvalidArgument", err)
	}
	if _, err = admin.SetFaults(ctx, &faultspb.SetFaultsRequest{Block: []uint64{0}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("blocking node 0: %v, want InvalidArgument", err)
	}
	st, err = admin.GetFaults(ctx, &faultspb.GetFaultsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetConfig() != "fail=0.25,delay=0.5:1ms-2ms,seed=5" || !equalIDs(st.GetBlocked(), 3, 4, 9) {
		t.Fatalf("state after rejected updates = %v", st)
	}

	st, err = admin.SetFaults(ctx, &faultspb.SetFaultsRequest{
		Config:  proto.String("off"),
		Blocked: &faultspb.NodeSet{Nodes: []uint64{5, 6}},
		Unblock: []uint64{6},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetConfig() != "off" || !equalIDs(st.GetBlocked(), 5) {
		t.Fatalf("state after replace = %v", st)
	}
	if server.Config().Enabled() {
		t.Fatal("faults still enabled after config off")
	}
}

func TestCollector(t *testing.T) {
	server := mustInjector(t, 1, "off")
	_, addr := startServer(t, server)
	client := mustInjector(t, 2, "fail=1,seed=3")
	c := testpb.NewTestServiceClient(dial(t, addr, client))
	ctx := testCtx(t)
	for range 20 {
		_, _ = c.EmptyCall(ctx, &testpb.Empty{})
	}
	if err := client.Block(5, 6); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(client.Collector()); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := client.Counts()
	want := map[string]float64{
		"request_lost": float64(n.RequestsLost), "reply_lost": float64(n.RepliesLost),
	}
	seen := map[string]bool{}
	for _, f := range families {
		switch f.GetName() {
		case "arbor_faults_injected_total":
			for _, m := range f.GetMetric() {
				kind := m.GetLabel()[0].GetValue()
				if w, ok := want[kind]; ok {
					seen[kind] = true
					if m.GetCounter().GetValue() != w {
						t.Errorf("%s = %v, want %v", kind, m.GetCounter().GetValue(), w)
					}
				}
			}
		case "arbor_faults_blocked_peers":
			seen["blocked"] = true
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != 2 {
				t.Errorf("blocked peers = %v, want 2", v)
			}
		case "arbor_faults_enabled":
			seen["enabled"] = true
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Errorf("enabled = %v, want 1", v)
			}
		}
	}
	if len(seen) != 4 {
		t.Fatalf("missing metrics: saw %v", seen)
	}
	if n.RequestsLost+n.RepliesLost != 20 {
		t.Fatalf("counts = %+v, want 20 failures", n)
	}
}

func equalIDs(got []uint64, want ...uint64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}
