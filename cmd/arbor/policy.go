package main

// The client commands' one timeout and retry policy (issue 17).
//
// --timeout bounds how long a command waits for the cluster to answer
// one step, retries included: one call of a short command (kv get, fs
// list, status), one tract of a blob transfer, one key of kv put --stdin.
// A command that keeps getting answers never times out, so one default
// fits a kv get and a 10 GiB blob put; a command that waits longer than
// --timeout for any answer fails with context.DeadlineExceeded. A step
// that is the cluster doing a long job for the command (fsck, deleting
// a file system or a snapshot, moving a table) is not cut short: only
// reaching the cluster before it is; Ctrl-C ends it. --timeout 0 waits
// forever.
//
// Retries are the clients' (internal/directory, tract, extent, meta):
// each retries a failed attempt on other replicas until the step's
// context ends. What they cannot tell from a slow cluster is a cluster
// that is not there, so before the first step a command probes the
// addresses it was given (probeCluster): connection refused at every
// one, after a short retry, is final, and an HTTP server where a gRPC
// one should be is named as such.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// defaultTimeout is --timeout's default on every command that talks to
// the cluster. It outlasts a directory leader election and a node being
// declared dead with its work moved (a few seconds each), so a healthy
// cluster never hits it, while a user with a wrong address or a stuck
// cluster hears so within half a minute.
const defaultTimeout = 30 * time.Second

// timeoutUsage is the --timeout flag's help, the same on every command.
const timeoutUsage = "give up when the cluster has not answered a step (a call, retries included; a tract of a transfer) for this long; 0: never"

// stallKey finds a command's stallContext among its context's values.
type stallKey struct{}

// stallContext is a context that ends with context.DeadlineExceeded once
// its timeout has passed without progress (or when its parent ends). To
// gRPC and every client below it looks like a deadline that moves forward
// with each answer; its Deadline is the parent's, since a fixed one would
// cut a long transfer short.
type stallContext struct {
	context.Context
	timeout time.Duration
	done    chan struct{}

	mu         sync.Mutex
	err        error
	held       int
	timer      *time.Timer
	stopParent func() bool
}

// withStallTimeout returns a context bounded by the --timeout policy:
// it ends once timeout passes without a call to stepDone(ctx) (timeout
// 0: never). The cancel function releases it.
func withStallTimeout(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return context.WithCancel(parent)
	}
	c := &stallContext{Context: parent, timeout: timeout, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = time.AfterFunc(timeout, func() { c.end(context.DeadlineExceeded) })
	c.stopParent = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c, func() { c.end(context.Canceled) }
}

func (c *stallContext) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	c.timer.Stop()
	c.stopParent()
}

func (c *stallContext) Done() <-chan struct{} { return c.done }

func (c *stallContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *stallContext) Value(key any) any {
	if key == (stallKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// stepDone tells the --timeout policy of ctx's command that the cluster
// answered a step: the wait for the next starts afresh.
func stepDone(ctx context.Context) {
	c, ok := ctx.Value(stallKey{}).(*stallContext)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.held == 0 {
		c.timer.Reset(c.timeout)
	}
}

// longJob runs job, a step that is the cluster working for as long as it
// needs (fsck, a deletion), with ctx's --timeout suspended: the job ends
// when it is done, fails or the user interrupts it.
func longJob(ctx context.Context, job func() error) error {
	c, ok := ctx.Value(stallKey{}).(*stallContext)
	if !ok {
		return job()
	}
	c.mu.Lock()
	c.held++
	c.timer.Stop()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.held--
		if c.held == 0 && c.err == nil {
			c.timer.Reset(c.timeout)
		}
	}()
	return job()
}

// Bounds of probeCluster.
const (
	// probeDialTimeout bounds one TCP connection attempt: a silent
	// address (a firewall dropping packets) is left to --timeout.
	probeDialTimeout = 2 * time.Second
	// probeAnswerTimeout bounds the wait for a server's first bytes.
	probeAnswerTimeout = time.Second
	// probeAttempts is how often a refused connection is tried before
	// the address counts as refusing: a node restarting is back within
	// this short retry.
	probeAttempts = 3
	// probeRetryDelay is the pause before the second attempt; it doubles.
	probeRetryDelay = 200 * time.Millisecond
)

// http2Preface is what an HTTP/2 (gRPC) client sends first.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// probeResult is what probing one address found.
type probeResult int

const (
	probeUnknown probeResult = iota // no verdict: leave it to the real call
	probeGRPC                       // an HTTP/2 server answered: go ahead
	probeRefused                    // connection refused, every attempt
	probeHTTP1                      // an HTTP/1 server answered
)

// unreachableError says no address of the cluster accepts connections.
type unreachableError struct {
	addrs []string
	err   error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("connect to the cluster at %s: %v", strings.Join(e.addrs, ","), e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// hint names what the user can do.
func (e *unreachableError) hint() string {
	return "is the cluster running? arbor dev prints its addresses; give them with --cluster, --dir or $" + clusterEnv
}

// notGRPCError says the addresses given answer HTTP/1, not gRPC: most
// likely a node's --http address instead of its --listen one.
type notGRPCError struct{ addrs []string }

func (e *notGRPCError) Error() string {
	return fmt.Sprintf("%s answers HTTP/1.1, not gRPC", strings.Join(e.addrs, ","))
}

func (e *notGRPCError) hint() string {
	return "--cluster takes the nodes' gRPC addresses (their --listen), not their --http ones; arbor dev prints both"
}

// probeCluster checks, before a command's first step, that some address
// may serve gRPC. It fails only on certainty: every address refused the
// connection (after probeAttempts tries), or every one that accepted
// answered HTTP/1. Anything else (a slow or silent address) is left to
// the command's calls and its --timeout.
func probeCluster(ctx context.Context, addrs []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type verdict struct {
		addr   string
		result probeResult
	}
	results := make(chan verdict, len(addrs))
	for _, addr := range addrs {
		go func() { results <- verdict{addr, probeAddr(ctx, addr)} }()
	}
	var http1 []string
	for range addrs {
		v := <-results
		switch v.result {
		case probeGRPC, probeUnknown:
			return nil
		case probeHTTP1:
			http1 = append(http1, v.addr)
		}
	}
	if len(http1) > 0 {
		return &notGRPCError{addrs: http1}
	}
	return &unreachableError{addrs: addrs, err: syscall.ECONNREFUSED}
}

// probeAddr probes one address: connect (retrying a refusal briefly),
// send the HTTP/2 preface and look at the first bytes of the answer. A
// gRPC server sends its SETTINGS frame at once; an HTTP/1 server answers
// the preface with a status line ("HTTP/1.1 505 ..."), which is what a
// gRPC client reports as "http2: frame too large".
func probeAddr(ctx context.Context, addr string) probeResult {
	var conn net.Conn
	delay := probeRetryDelay
	for attempt := 1; ; attempt++ {
		var err error
		d := net.Dialer{Timeout: probeDialTimeout}
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return probeUnknown
		}
		if attempt == probeAttempts {
			return probeRefused
		}
		select {
		case <-ctx.Done():
			return probeUnknown
		case <-time.After(delay):
		}
		delay *= 2
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(probeAnswerTimeout)); err != nil {
		return probeUnknown
	}
	if _, err := conn.Write([]byte(http2Preface)); err != nil {
		return probeUnknown
	}
	buf := make([]byte, 5)
	n, _ := conn.Read(buf)
	switch {
	case n == 0:
		return probeUnknown
	case bytes.HasPrefix([]byte("HTTP/"), buf[:n]) || bytes.HasPrefix(buf[:n], []byte("HTTP/")):
		return probeHTTP1
	}
	return probeGRPC
}
