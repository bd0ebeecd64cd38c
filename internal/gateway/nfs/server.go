package nfs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
)

// Server is a gateway serving NFS v3 and MOUNT v3 on one TCP port (with
// the portmapper's GETPORT there too), and optionally a portmapper on
// port 111 of the same host.
type Server struct {
	g    *Gateway
	rpc  *sunrpc.Server
	lis  net.Listener
	pm   net.Listener
	done chan error
}

// Start listens on addr (host:port; port 0 picks one) and serves. With
// portmap, it also answers the portmapper on port 111 of addr's host.
func Start(cfg Config, addr string, portmap bool) (*Server, error) {
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		_ = g.Close(context.Background())
		return nil, fmt.Errorf("nfs gateway: listen on %s: %w", addr, err)
	}
	port := uint32(lis.Addr().(*net.TCPAddr).Port)
	progs := append(g.Programs(), PortmapProgram(port))
	s := &Server{g: g, rpc: sunrpc.NewServer(cfg.Logger, progs...), lis: lis, done: make(chan error, 2)}
	if portmap {
		host, _, _ := net.SplitHostPort(addr)
		pm, err := net.Listen("tcp", net.JoinHostPort(host, "111"))
		if err != nil {
			lis.Close()
			_ = g.Close(context.Background())
			return nil, fmt.Errorf("nfs gateway: portmapper: %w", err)
		}
		s.pm = pm
		go func() { s.done <- s.rpc.Serve(pm) }()
	}
	go func() { s.done <- s.rpc.Serve(lis) }()
	return s, nil
}

// Addr returns the address NFS and MOUNT are served on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Port returns the port NFS and MOUNT are served on.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr())
	n, _ := strconv.Atoi(p)
	return n
}

// Gateway returns the gateway served.
func (s *Server) Gateway() *Gateway { return s.g }

// Done reports a listener that failed.
func (s *Server) Done() <-chan error { return s.done }

// Close stops serving, then flushes and closes the gateway.
func (s *Server) Close(ctx context.Context) error {
	err := s.rpc.Close()
	return errors.Join(err, s.g.Close(ctx))
}
