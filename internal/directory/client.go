package directory

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"google.golang.org/grpc/metadata"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// Client defaults and bounds.
const (
	defaultAttemptTimeout = 3 * time.Second
	minRetryBackoff       = 20 * time.Millisecond
	maxRetryBackoff       = time.Second
	// maxClientAddresses bounds the replicas a client knows (the seeds plus
	// the leaders it was pointed to).
	maxClientAddresses = 64
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Addresses are the gRPC addresses of (some of) the directory replicas.
	Addresses []string
	// DialOptions are passed to grpc.NewClient for every replica (for
	// example transport credentials).
	DialOptions []grpc.DialOption
	// AttemptTimeout bounds one attempt at one replica (default 3 s); the
	// whole call is bounded by its context.
	AttemptTimeout time.Duration
	Logger         *slog.Logger
}

// Client calls the directory. It finds the leader, caches it, follows
// NotLeader hints and retries Unavailable errors (and attempts that time
// out) on other replicas with backoff until the call's context ends. Other
// errors are returned at once, mapped to the package's sentinel errors
// (client_errors.go): errors.Is(err, ErrNotFound) and the like.
//
// A retried write may have been applied by an attempt whose reply was lost:
// Register then returns a later epoch, GrantLease by the same holder
// extends, ReleaseLease succeeds again; a retried create may report
// ALREADY_EXISTS, and a retried conditional write a CONFLICT or STALE_EPOCH
// that its own first attempt caused.
type Client struct {
	cfg ClientConfig
	log *slog.Logger

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	addrs  []string
	leader string
	next   int
	closed bool
}

// Dial returns a client of the directory replicas at addrs. Connections are
// made lazily.
func Dial(addrs []string, opts ...grpc.DialOption) (*Client, error) {
	return NewClient(ClientConfig{Addresses: addrs, DialOptions: opts})
}

// NewClient returns a client; see ClientConfig.
func NewClient(cfg ClientConfig) (*Client, error) {
	if len(cfg.Addresses) == 0 || len(cfg.Addresses) > maxClientAddresses {
		return nil, fmt.Errorf("directory: client needs 1 to %d addresses, got %d", maxClientAddresses, len(cfg.Addresses))
	}
	for _, a := range cfg.Addresses {
		if err := checkAddress("address", a, true); err != nil {
			return nil, fmt.Errorf("directory: %w", err)
		}
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = defaultAttemptTimeout
	}
	if cfg.AttemptTimeout < 0 {
		return nil, fmt.Errorf("directory: negative attempt timeout %v", cfg.AttemptTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger.With("component", "directory-client"), conns: map[string]*grpc.ClientConn{}}
	for _, a := range cfg.Addresses {
		c.addAddress(a)
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
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

// Leader returns the address of the cached leader, or "" if none is known.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *Client) addAddress(a string) {
	for _, known := range c.addrs {
		if known == a {
			return
		}
	}
	if len(c.addrs) < maxClientAddresses {
		c.addrs = append(c.addrs, a)
	}
}

// target returns the replica to try: the cached leader, or the next one.
func (c *Client) target() (string, *grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, errors.New("directory: client closed")
	}
	addr := c.leader
	if addr == "" {
		addr = c.addrs[c.next%len(c.addrs)]
		c.next++
	}
	conn := c.conns[addr]
	if conn == nil {
		var err error
		conn, err = grpc.NewClient(addr, c.cfg.DialOptions...)
		if err != nil {
			return "", nil, fmt.Errorf("directory: dial %s: %w", addr, err)
		}
		c.conns[addr] = conn
	}
	return addr, conn, nil
}

func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if addr != "" {
		c.addAddress(addr)
	}
	c.leader = addr
}

// forget drops addr as the cached leader.
func (c *Client) forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == addr {
		c.leader = ""
	}
}

// retryable reports whether another replica might succeed where this one
// failed.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// call runs one RPC against the leader, redirecting and retrying.
// newRequestID returns a random request id (hex, 16 bytes of entropy).
func newRequestID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func call[T any](ctx context.Context, c *Client, method string, rpc func(context.Context, pb.DirectoryClient) (T, error)) (T, error) {
	var zero T
	backoff := minRetryBackoff
	redirected := false
	// One id for every attempt of this call: the directory applies a
	// successful write once however often it arrives (requests.go).
	ctx = metadata.AppendToOutgoingContext(ctx, requestIDMetadataKey, newRequestID())
	for {
		addr, conn, err := c.target()
		if err != nil {
			return zero, err
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		out, err := rpc(actx, pb.NewDirectoryClient(conn))
		cancel()
		if err == nil {
			c.setLeader(addr)
			return out, nil
		}
		if ctx.Err() != nil {
			return zero, fmt.Errorf("directory: %s: %w (last error from %s: %v)", method, ctx.Err(), addr, err)
		}
		if !retryable(err) {
			return zero, clientError(method, err)
		}
		c.forget(addr)
		if nl, ok := NotLeaderOf(err); ok && nl.LeaderAddress != "" && nl.LeaderAddress != addr {
			c.setLeader(nl.LeaderAddress)
			if !redirected {
				// Follow a fresh hint at once; a chain of stale hints
				// backs off like any other failure.
				redirected = true
				continue
			}
		}
		c.log.Debug("directory call failed; retrying", "method", method, "replica", addr, "err", err, "backoff", backoff)
		sleep := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return zero, fmt.Errorf("directory: %s: %w (last error from %s: %v)", method, ctx.Err(), addr, err)
		}
		backoff = min(2*backoff, maxRetryBackoff)
		redirected = false
	}
}
