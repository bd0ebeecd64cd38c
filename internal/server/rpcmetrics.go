package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// rpcMetrics counts the calls a node serves, by method and status code,
// and times them by method: how an operator sees which requests a node
// spends its time on (and how many a client's operation costs).
type rpcMetrics struct {
	handled *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newRPCMetrics() *rpcMetrics {
	return &rpcMetrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbor_rpc_server_handled_total",
			Help: "gRPC calls served, by full method and status code (streams count once, when they end).",
		}, []string{"method", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "arbor_rpc_server_seconds",
			Help:    "Time to serve a unary gRPC call, by full method.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}, []string{"method"}),
	}
}

func (m *rpcMetrics) unaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.seconds.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
		m.handled.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		return resp, err
	}
}

func (m *rpcMetrics) streamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		m.handled.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
		return err
	}
}
