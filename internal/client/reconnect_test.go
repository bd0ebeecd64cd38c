package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestReconnectSoonAfterAbsence: a node gone for several seconds (a
// restart) is called again within about a second of its return, not after
// gRPC's default backoff, which by then waits several seconds between
// attempts (and up to 120 s): the slow rejoins of the nemesis (issue 13).
func TestReconnectSoonAfterAbsence(t *testing.T) {
	serve := func(addr string) (*grpc.Server, string) {
		t.Helper()
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() { _ = srv.Serve(lis) }()
		return srv, lis.Addr().String()
	}
	srv, addr := serve("127.0.0.1:0")
	cc, err := grpc.NewClient(addr, DialOptions("", nil)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	check := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(5 * time.Second); err != nil {
		t.Fatal(err)
	}

	// Gone for 10.5 s while callers keep trying: with gRPC's defaults the
	// attempts come about 1, 2.6, 5.2, 9.3 and 15.8 s after the loss
	// (each +-20%), so the return waits about 5 s for the next one.
	srv.Stop()
	for end := time.Now().Add(10500 * time.Millisecond); time.Now().Before(end); {
		if check(200*time.Millisecond) == nil {
			t.Fatal("a call succeeded with the server stopped")
		}
		time.Sleep(100 * time.Millisecond)
	}
	srv, _ = serve(addr)
	defer srv.Stop()
	back := time.Now()
	for check(200*time.Millisecond) != nil {
		if time.Since(back) > 20*time.Second {
			t.Fatal("no call succeeded within 20 s of the server's return")
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(back)
	t.Logf("first call served %v after the server returned", took.Round(time.Millisecond))
	if max := ReconnectParams().Backoff.MaxDelay + 2500*time.Millisecond; took > max {
		t.Fatalf("first call served %v after the server returned, want within %v (the reconnect backoff's bound and a margin)", took, max)
	}
}
