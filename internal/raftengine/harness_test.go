package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// kvSM is the test state machine: a map of string keys to values, stored in
// the engine's key space, with an in-memory mirror rebuilt by Load (as real
// state machines do).
//
// Commands: 's' key\x00value sets; 'i' key increments a counter stored
// under key and returns its new value. Apply returns the entry index for
// sets.
type kvSM struct {
	mu   sync.Mutex
	data map[string]string
}

func (s *kvSM) Apply(w Writer, index uint64, cmd []byte) (any, error) {
	if len(cmd) == 0 {
		return nil, errors.New("empty command")
	}
	switch cmd[0] {
	case 's':
		k, v, ok := cutByte(cmd[1:], 0)
		if !ok {
			return nil, fmt.Errorf("malformed set")
		}
		if err := w.Set(k, v); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.data[string(k)] = string(v)
		s.mu.Unlock()
		return index, nil
	case 'i':
		k := cmd[1:]
		var n uint64
		if v, err := w.Get(k); err == nil {
			n = binary.BigEndian.Uint64(v)
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		n++
		v := binary.BigEndian.AppendUint64(nil, n)
		if err := w.Set(k, v); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.data[string(k)] = string(v)
		s.mu.Unlock()
		return n, nil
	}
	return nil, fmt.Errorf("unknown command %q", cmd[0])
}

func (s *kvSM) Load(r Reader) error {
	data := map[string]string{}
	err := r.Scan(nil, nil, func(k, v []byte) error {
		data[string(k)] = string(v)
		return nil
	})
	s.mu.Lock()
	s.data = data
	s.mu.Unlock()
	return err
}

func (s *kvSM) get(k string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[k]
	return v, ok
}

func (s *kvSM) snapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.data))
	for k, v := range s.data {
		out[k] = v
	}
	return out
}

func cutByte(b []byte, sep byte) (before, after []byte, ok bool) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:], true
		}
	}
	return nil, nil, false
}

func setCmd(k, v string) []byte { return append(append(append([]byte{'s'}, k...), 0), v...) }

// testCluster is a set of engines on one LocalNetwork, each with its own
// in-memory file system. A node can be stopped, crashed (losing unsynced
// writes) and restarted from its disk.
type testCluster struct {
	t       *testing.T
	net     *LocalNetwork
	ids     []uint64
	fs      map[uint64]*vfs.MemFS
	stores  map[uint64]*Store
	engines map[uint64]*Engine
	tune    func(*Config)
	// wrapFS, if set, wraps a node's file system when the node starts (to
	// inject faults or delays); crashes still clone the MemFS underneath.
	wrapFS func(id uint64, fs vfs.FS) vfs.FS
	logger *slog.Logger
	// leaseHook, if set, is installed in every engine started (see
	// Engine.leaseHook).
	leaseHook *func()
	// disks, if set for a node, gives its store a ballast and the free
	// space its disk guard sees (diskfull.go).
	disks map[uint64]testDisk
}

// testDisk is a node's ballast and the free space its store sees.
type testDisk struct {
	ballast int64
	avail   func() (uint64, error)
}

func newTestCluster(t *testing.T, n int, tune func(*Config)) *testCluster {
	t.Helper()
	return newTestClusterFS(t, n, tune, nil)
}

// newTestClusterHooked is newTestCluster with a lease hook in every engine.
func newTestClusterHooked(t *testing.T, n int, tune func(*Config), leaseHook *func()) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, tune, nil, leaseHook)
}

func newTestClusterFS(t *testing.T, n int, tune func(*Config), wrapFS func(id uint64, fs vfs.FS) vfs.FS) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, tune, wrapFS, nil)
}

func newTestClusterWith(t *testing.T, n int, tune func(*Config), wrapFS func(id uint64, fs vfs.FS) vfs.FS, leaseHook *func()) *testCluster {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	c := &testCluster{
		t:         t,
		net:       NewLocalNetwork(uint64(time.Now().UnixNano())),
		fs:        map[uint64]*vfs.MemFS{},
		stores:    map[uint64]*Store{},
		engines:   map[uint64]*Engine{},
		tune:      tune,
		wrapFS:    wrapFS,
		leaseHook: leaseHook,
		logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	for i := 1; i <= n; i++ {
		c.addNode(uint64(i))
	}
	t.Cleanup(c.close)
	return c
}

func (c *testCluster) addNode(id uint64) {
	c.ids = append(c.ids, id)
	c.fs[id] = vfs.NewCrashableMem()
	c.start(id)
}

func (c *testCluster) start(id uint64) {
	c.t.Helper()
	var fs vfs.FS = c.fs[id]
	if c.wrapFS != nil {
		fs = c.wrapFS(id, fs)
	}
	disk := c.disks[id]
	st, err := OpenStoreWith("/db", StoreOptions{FS: fs, Logger: c.logger, BallastBytes: disk.ballast})
	if err != nil {
		c.t.Fatalf("open store %d: %v", id, err)
	}
	if disk.avail != nil {
		st.disk.avail = disk.avail
	}
	cfg := Config{
		NodeID:       id,
		Store:        st,
		Transport:    c.net.Transport(id),
		Factory:      func(GroupDescriptor) (StateMachine, error) { return &kvSM{data: map[string]string{}}, nil },
		Logger:       c.logger,
		TickInterval: 10 * time.Millisecond,
	}
	if c.tune != nil {
		c.tune(&cfg)
	}
	e, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("open engine %d: %v", id, err)
	}
	if c.leaseHook != nil {
		e.leaseHook.Store(c.leaseHook)
	}
	if err := e.Start(); err != nil {
		c.t.Fatalf("start engine %d: %v", id, err)
	}
	c.stores[id], c.engines[id] = st, e
}

// stop stops node id cleanly.
func (c *testCluster) stop(id uint64) {
	if e := c.engines[id]; e != nil {
		c.net.Detach(id)
		e.Stop()
		_ = c.stores[id].Close()
		delete(c.engines, id)
		delete(c.stores, id)
	}
}

// crash stops node id as a power loss would: whatever it had not synced is
// gone when it restarts.
func (c *testCluster) crash(id uint64) {
	e := c.engines[id]
	if e == nil {
		return
	}
	c.net.Detach(id)
	crashed := c.fs[id].CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	e.Stop()
	_ = c.stores[id].Close()
	delete(c.engines, id)
	delete(c.stores, id)
	c.fs[id] = crashed
}

// powerLoss stops every node as a power cut would, each node's disk
// becoming the image given for it (taken with CrashClone at the moment of
// the cut).
func (c *testCluster) powerLoss(images map[uint64]*vfs.MemFS) {
	for _, id := range c.ids {
		c.net.Detach(id)
	}
	for _, id := range c.ids {
		if e := c.engines[id]; e != nil {
			e.Stop()
			_ = c.stores[id].Close()
			delete(c.engines, id)
			delete(c.stores, id)
		}
		c.fs[id] = images[id]
	}
}

func (c *testCluster) close() {
	for _, id := range c.ids {
		c.stop(id)
	}
	c.net.Close()
}

func (c *testCluster) createGroup(gid uint64, voters ...uint64) {
	c.t.Helper()
	for _, id := range voters {
		if err := c.engines[id].CreateGroup(context.Background(), GroupDescriptor{GroupID: gid, Kind: "kv"}, voters); err != nil {
			c.t.Fatalf("create group %d on %d: %v", gid, id, err)
		}
	}
}

// leader waits for a leader of gid that every running member agrees on.
func (c *testCluster) leader(gid uint64) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var lead uint64
		agree := true
		for _, e := range c.engines {
			st, err := e.Status(gid)
			if err != nil {
				continue
			}
			if st.IsLeader() {
				lead = st.NodeID
			}
		}
		if lead != 0 {
			for _, e := range c.engines {
				st, err := e.Status(gid)
				if err == nil && slices.Contains(st.Voters, st.NodeID) && st.Leader != lead && !st.Quiesced {
					agree = false
				}
			}
			if agree {
				return lead
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("no leader for group %d", gid)
	return 0
}

// propose sends cmd to whichever node leads gid, following hints, until it
// is applied or the deadline passes.
func (c *testCluster) propose(gid uint64, cmd []byte) any {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.tryPropose(ctx, gid, cmd)
	if err != nil {
		c.t.Fatalf("propose to group %d: %v", gid, err)
	}
	return res
}

func (c *testCluster) tryPropose(ctx context.Context, gid uint64, cmd []byte) (any, error) {
	target := c.ids[0]
	for {
		e := c.engines[target]
		var err error
		if e != nil {
			var res any
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			res, err = e.Propose(pctx, gid, cmd)
			cancel()
			if err == nil {
				return res, nil
			}
		}
		if nl, ok := IsNotLeader(err); ok && nl.Leader != 0 {
			target = nl.Leader
			continue
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		time.Sleep(10 * time.Millisecond)
		target = c.ids[(slices.Index(c.ids, target)+1)%len(c.ids)]
	}
}

func (c *testCluster) sm(id, gid uint64) *kvSM {
	c.t.Helper()
	sm, err := c.engines[id].StateMachine(gid)
	if err != nil {
		c.t.Fatalf("state machine of group %d on node %d: %v", gid, id, err)
	}
	return sm.(*kvSM)
}

// waitConverged waits until every running replica of gid holds want.
func (c *testCluster) waitConverged(gid uint64, members []uint64, want map[string]string) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var diff string
		for _, id := range members {
			got := c.sm(id, gid).snapshot()
			if d := mapDiff(want, got); d != "" {
				diff = fmt.Sprintf("node %d: %s", id, d)
				break
			}
		}
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("group %d did not converge: %s", gid, diff)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mapDiff(want, got map[string]string) string {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return fmt.Sprintf("key %q: want %q, got %q (present %v)", k, v, g, ok)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			return fmt.Sprintf("unexpected key %q", k)
		}
	}
	return ""
}

var _ = io.EOF
