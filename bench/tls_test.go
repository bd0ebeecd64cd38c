package bench

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
)

// What mutual TLS costs (issue 15): the same calls on two 3-node dev
// clusters in one run, one as every cluster runs (mutual TLS) and one with
// --insecure (plain text, the reference).
const (
	tlsBenchCalls      = 2000     // small unary calls on a warm connection
	tlsBenchHandshakes = 200      // new connections, each with one call
	tlsBenchBlobBytes  = 64 << 20 // one blob written and read, 3 replicas
)

type tlsFigures struct {
	call, connect       time.Duration // per call, per new connection
	writeMBps, readMBps float64
}

func measureTLS(b *testing.B, insecure bool) tlsFigures {
	b.Helper()
	tb := startTractClusterWith(b, devcluster.Options{
		Nodes:      3,
		Insecure:   insecure,
		ServerArgs: []string{"--log-level=warn"},
	})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := tb.c.Stop(ctx); err != nil {
			b.Error(err)
		}
	}()
	ctx := context.Background()
	var f tlsFigures
	nodes := tb.c.Nodes()

	// Small unary calls on warm connections (a tractserver's status).
	if _, err := tb.client.NodeStatus(ctx, nodes[0].ID, false); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for i := range tlsBenchCalls {
		if _, err := tb.client.NodeStatus(ctx, nodes[i%len(nodes)].ID, false); err != nil {
			b.Fatal(err)
		}
	}
	f.call = time.Since(start) / tlsBenchCalls

	// A new connection per call: TCP, the TLS handshake, one call.
	start = time.Now()
	for i := range tlsBenchHandshakes {
		cc, err := grpc.NewClient(nodes[i%len(nodes)].Addr, tb.c.DialOptions()...)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := faultspb.NewAdminClient(cc).GetFaults(ctx, &faultspb.GetFaultsRequest{}); err != nil {
			b.Fatal(err)
		}
		cc.Close()
	}
	f.connect = time.Since(start) / tlsBenchHandshakes

	// One blob, every tract in flight: written with 3 replicas, read back.
	data := make([]byte, tlsBenchBlobBytes)
	rand.Read(data)
	start = time.Now()
	g := tb.writeBlob(b, data, 3)
	f.writeMBps = float64(len(data)) / time.Since(start).Seconds() / 1e6
	start = time.Now()
	if n := tb.readBlob(b, g); n != len(data) {
		b.Fatalf("read %d bytes of %d", n, len(data))
	}
	f.readMBps = float64(len(data)) / time.Since(start).Seconds() / 1e6
	return f
}

// BenchmarkTLSCost: a small call, a new connection, and a blob's write
// and read, with mutual TLS and with --insecure in the same run; it
// reports both and the ratios (TLS over plain text).
func BenchmarkTLSCost(b *testing.B) {
	for range b.N {
		plain := measureTLS(b, true)
		secure := measureTLS(b, false)
		b.Logf("call: plain %v, TLS %v; new connection + call: plain %v, TLS %v", plain.call, secure.call, plain.connect, secure.connect)
		b.Logf("blob %d MiB write: plain %.0f MB/s, TLS %.0f MB/s; read: plain %.0f MB/s, TLS %.0f MB/s",
			tlsBenchBlobBytes>>20, plain.writeMBps, secure.writeMBps, plain.readMBps, secure.readMBps)
		b.ReportMetric(float64(plain.call.Microseconds()), "plain-call-µs")
		b.ReportMetric(float64(secure.call.Microseconds()), "tls-call-µs")
		b.ReportMetric(float64(plain.connect.Microseconds()), "plain-connect-µs")
		b.ReportMetric(float64(secure.connect.Microseconds()), "tls-connect-µs")
		b.ReportMetric(plain.writeMBps, "plain-write-MB/s")
		b.ReportMetric(secure.writeMBps, "tls-write-MB/s")
		b.ReportMetric(plain.readMBps, "plain-read-MB/s")
		b.ReportMetric(secure.readMBps, "tls-read-MB/s")
	}
}
