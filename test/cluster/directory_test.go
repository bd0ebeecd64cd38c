// Package cluster holds whole-cluster tests: they start real arbor server
// processes (internal/devcluster), kill them with SIGKILL, restart and
// partition them, inject faults, and check what users are promised (DESIGN
// §4). This file covers the foundation: the directory group.
package cluster

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
	"github.com/arbor-storage/arbor/internal/testseed"
)

func seedOf(t *testing.T) uint64 { return testseed.Seed(t) }

func dial(t *testing.T, c *devcluster.Cluster) *directory.Client {
	t.Helper()
	cl, err := directory.Dial(c.DirectoryAddrs(), c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// leaderOf polls the directory until it reports a leader other than
// exclude, and returns it with the time it took.
func leaderOf(t *testing.T, cl *directory.Client, exclude uint64, within time.Duration) (uint64, time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		st, err := cl.Status(ctx, &pb.StatusRequest{})
		cancel()
		if err == nil && st.GetLeaderId() != 0 && st.GetLeaderId() != exclude {
			return st.GetLeaderId(), time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no directory leader other than %d within %v", exclude, within)
	return 0, 0
}

func nodeState(t *testing.T, cl *directory.Client, id uint64) pb.NodeState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := cl.GetNode(ctx, &pb.GetNodeRequest{NodeId: id})
	if err != nil {
		t.Fatalf("get node %d: %v", id, err)
	}
	return n.GetState()
}

func waitNodeState(t *testing.T, cl *directory.Client, id uint64, want pb.NodeState, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for nodeState(t, cl, id) != want {
		if time.Since(start) > within {
			t.Fatalf("node %d is %v after %v, want %v", id, nodeState(t, cl, id), within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// TestDirectoryLeaderKilled: kill -9 of the directory leader; a new leader
// within 5 s with the default timeouts; the killed node restarts, rejoins
// and catches up with what was written while it was away.
func TestDirectoryLeaderKilled(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5})
	cl := dial(t, c)
	old, _ := leaderOf(t, cl, 0, 10*time.Second)
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	lead, took := leaderOf(t, cl, old, 5*time.Second)
	t.Logf("node %d killed; node %d leads after %v", old, lead, took.Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: fmt.Sprintf("while-away/%d", i), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.StartNode(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted replica catches up: its own local view has the writes.
	n, _ := c.Node(old)
	local, err := directory.Dial([]string{n.Addr}, c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	for {
		st, err := local.Status(ctx, &pb.StatusRequest{Local: true})
		if err == nil && st.GetNodeId() == old {
			lst, err := cl.Status(ctx, &pb.StatusRequest{})
			if err == nil && st.GetAppliedIndex() >= lst.GetAppliedIndex() {
				t.Logf("node %d caught up to applied index %d", old, st.GetAppliedIndex())
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted node %d did not catch up", old)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNodeKilledIsMarkedDeadAndComesBack: kill -9 of a non-directory node;
// the directory marks it dead after the timeout (10 s by default), and
// alive again once it restarts.
func TestNodeKilledIsMarkedDeadAndComesBack(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5})
	cl := dial(t, c)
	const victim = 5
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	took := waitNodeState(t, cl, victim, pb.NodeState_NODE_STATE_DEAD, 20*time.Second)
	t.Logf("node %d declared dead %v after kill -9", victim, took.Round(100*time.Millisecond))
	if took < 5*time.Second {
		t.Fatalf("node declared dead after %v, well before the 10 s timeout", took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.StartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	took = waitNodeState(t, cl, victim, pb.NodeState_NODE_STATE_ALIVE, 20*time.Second)
	t.Logf("node %d alive again %v after restart", victim, took.Round(100*time.Millisecond))
}

// TestWholeClusterRestartLosesNoAcknowledgedWrite kills every process at
// once (SIGKILL, no clean shutdown) after a burst of acknowledged writes and
// checks every one of them after the restart.
func TestWholeClusterRestartLosesNoAcknowledgedWrite(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	cl := dial(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acked := map[string]uint64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				k := fmt.Sprintf("w%d/%d", w, i)
				e, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: k, Value: []byte(k)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[k] = e.GetVersion()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, n := range c.Nodes() {
		if err := c.Kill(n.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cl2 := dial(t, c)
	for k, version := range acked {
		e, err := cl2.GetConfig(ctx, &pb.GetConfigRequest{Key: k})
		if err != nil {
			t.Fatalf("acknowledged write %q lost: %v", k, err)
		}
		if string(e.GetValue()) != k || e.GetVersion() != version {
			t.Fatalf("acknowledged write %q came back as %q version %d, want version %d", k, e.GetValue(), e.GetVersion(), version)
		}
	}
	t.Logf("%d acknowledged writes survived a whole-cluster kill -9", len(acked))
}

// TestDirectoryRefusesBadInput: malformed requests, unknown node ids, stale
// epochs, oversize values, another cluster's calls and garbage raft traffic
// get clear errors and change nothing.
func TestDirectoryRefusesBadInput(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	cl := dial(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	// A node that registered twice (restarted): epoch 1 is stale.
	reg := &pb.RegisterRequest{NodeId: 9, Address: "127.0.0.1:9", FailureDomain: "test"}
	for range 2 {
		if _, err := cl.Register(ctx, reg); err != nil {
			t.Fatal(err)
		}
	}
	before, err := cl.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	beforeEntry, err := cl.GetConfig(ctx, &pb.GetConfigRequest{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"empty config key", func() error {
			_, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "", Value: []byte("x")})
			return err
		}, codes.InvalidArgument},
		{"oversize config value", func() error {
			_, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "k", Value: make([]byte, 1<<20)})
			return err
		}, codes.InvalidArgument},
		{"stale config version", func() error {
			_, err := cl.PutConfig(ctx, &pb.PutConfigRequest{Key: "k", Value: []byte("y"), ExpectedVersion: proto.Uint64(beforeEntry.GetVersion() - 1)})
			return err
		}, codes.Aborted},
		{"heartbeat from an unknown node", func() error {
			_, err := cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 404, Epoch: 1})
			return err
		}, codes.NotFound},
		{"register with a malformed address", func() error {
			_, err := cl.Register(ctx, &pb.RegisterRequest{NodeId: 9, Address: "no port", FailureDomain: "x"})
			return err
		}, codes.InvalidArgument},
		{"decommission an unknown node", func() error {
			_, err := cl.Decommission(ctx, &pb.DecommissionRequest{NodeId: 404})
			return err
		}, codes.NotFound},
	} {
		err := tc.call()
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: got %v (%v), want %v", tc.name, got, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}

	// A heartbeat under a stale epoch is not an error: the node is told to
	// register again and drop what it held under the old epoch.
	hb, err := cl.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: 9, Epoch: 1})
	if err != nil || hb.GetAction() != pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER || hb.GetEpoch() != 2 {
		t.Errorf("heartbeat under stale epoch 1: %v, %v; want REREGISTER at epoch 2", hb, err)
	}

	// A caller from another cluster is refused before anything runs.
	stranger, err := directory.Dial(c.DirectoryAddrs(), client.DialOptions("another-cluster", c.Credentials())...)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = stranger.PutConfig(sctx, &pb.PutConfigRequest{Key: "k", Value: []byte("stranger")})
	scancel()
	if err == nil {
		t.Error("a call from another cluster succeeded")
	}

	// Garbage on the raft transport (which answers nodes only: we present
	// node 2's certificate) is refused and the node carries on.
	n1, _ := c.Node(1)
	node2, err := c.NodeCredentials(2)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n1.Addr, client.DialOptions(c.ClusterID(), node2)...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := enginepb.NewRaftTransportClient(conn).Send(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&enginepb.MessageBatch{FromNode: 2, ToNode: 1, Envelopes: []*enginepb.Envelope{{GroupId: 1, Message: []byte{0xff, 0xff, 0xff}}}})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("garbage raft message: got %v, want InvalidArgument", err)
	}

	after, err := cl.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	afterEntry, err := cl.GetConfig(ctx, &pb.GetConfigRequest{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(beforeEntry, afterEntry) {
		t.Errorf("config entry changed by refused requests: %v -> %v", beforeEntry, afterEntry)
	}
	if len(after.GetNodes()) != len(before.GetNodes()) {
		t.Errorf("node table changed: %d -> %d nodes", len(before.GetNodes()), len(after.GetNodes()))
	}
	for i, n := range after.GetNodes() {
		b := before.GetNodes()[i]
		if n.GetId() != b.GetId() || n.GetEpoch() != b.GetEpoch() {
			t.Errorf("node %d changed: %v -> %v", n.GetId(), b, n)
		}
	}
}

// registerState is the model of one configuration key: absent, or a value
// with the version (raft index) that wrote it. A write whose outcome is
// unknown may leave the version unknown until a read observes it.
type registerState struct {
	present      bool
	value        string
	version      uint64
	versionKnown bool
}

type registerInput struct {
	key      string
	write    bool
	value    string
	expected uint64 // 0: unconditional
}

type registerOutput struct {
	unknown  bool // the write's fate is unknown
	conflict bool // the conditional write was refused
	present  bool
	value    string
	version  uint64
}

var registerModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(registerInput).key
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{registerState{versionKnown: true}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(registerState), input.(registerInput), output.(registerOutput)
		versionOK := func(v uint64) bool { return !s.versionKnown || s.version == v }
		switch {
		case !in.write:
			if out.present != s.present || (s.present && (out.value != s.value || !versionOK(out.version))) {
				return nil
			}
			return []any{registerState{present: out.present, value: out.value, version: out.version, versionKnown: true}}
		case out.unknown:
			return []any{s, registerState{present: true, value: in.value}}
		case out.conflict:
			if in.expected == 0 || (s.versionKnown && s.present && s.version == in.expected) {
				return nil
			}
			return []any{s}
		default:
			if in.expected != 0 && (!s.present || !versionOK(in.expected)) {
				return nil
			}
			if s.versionKnown && s.present && out.version <= s.version {
				return nil
			}
			return []any{registerState{present: true, value: in.value, version: out.version, versionKnown: true}}
		}
	},
}

// TestDirectoryLinearizableUnderChaos runs concurrent reads, writes and
// compare-and-set writes on the directory's configuration table while a
// nemesis kills the directory leader (kill -9, then restart), isolates
// voters and turns on fault injection (failed, delayed and duplicated
// RPCs). The history must be linearizable.
func TestDirectoryLinearizableUnderChaos(t *testing.T) {
	seed := seedOf(t)
	const (
		clients   = 4
		keys      = 3
		minOps    = 1200
		minRounds = 6
	)
	c := devclustertest.Start(t, devcluster.Options{Nodes: 5})
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		count   atomic.Int64
		done    atomic.Bool
		wg      sync.WaitGroup
	)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := dial(t, c)
			rng := rand.New(rand.NewPCG(seed, uint64(cl)))
			lastVersion := map[string]uint64{}
			for i := 0; !done.Load(); i++ {
				key := fmt.Sprintf("reg/%d", rng.IntN(keys))
				in := registerInput{key: key}
				switch rng.IntN(3) {
				case 1:
					in.write, in.value = true, fmt.Sprintf("c%d-%d", cl, i)
				case 2:
					in.write, in.value, in.expected = true, fmt.Sprintf("c%d-%d", cl, i), lastVersion[key]
				}
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				call := now()
				var out registerOutput
				var err error
				if in.write {
					req := &pb.PutConfigRequest{Key: key, Value: []byte(in.value)}
					if in.expected != 0 {
						req.ExpectedVersion = proto.Uint64(in.expected)
					}
					var e *pb.ConfigEntry
					e, err = client.PutConfig(ctx, req)
					switch {
					case err == nil:
						out = registerOutput{present: true, value: in.value, version: e.GetVersion()}
						lastVersion[key] = e.GetVersion()
					case status.Code(err) == codes.Aborted:
						out, err = registerOutput{conflict: true}, nil
					default:
						out, err = registerOutput{unknown: true}, nil
					}
				} else {
					var e *pb.ConfigEntry
					e, err = client.GetConfig(ctx, &pb.GetConfigRequest{Key: key})
					switch {
					case err == nil:
						out = registerOutput{present: true, value: string(e.GetValue()), version: e.GetVersion()}
						lastVersion[key] = e.GetVersion()
					case status.Code(err) == codes.NotFound:
						out, err = registerOutput{}, nil
					}
				}
				cancel()
				if err != nil {
					continue // a failed read has no effect
				}
				ret := now()
				if out.unknown {
					ret = math.MaxInt64
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
				count.Add(1)
			}
		}()
	}

	nemesis := rand.New(rand.NewPCG(seed, 1000))
	admin := dial(t, c)
	ctx := context.Background()
	rounds := 0
	for count.Load() < minOps || rounds < minRounds {
		rounds++
		switch rounds % 3 {
		case 0: // kill -9 the leader, bring it back
			lead, _ := leaderOf(t, admin, 0, 20*time.Second)
			t.Logf("nemesis: kill -9 leader %d", lead)
			if err := c.Kill(lead); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(500+nemesis.IntN(1500)) * time.Millisecond)
			if err := c.StartNode(ctx, lead); err != nil {
				t.Fatal(err)
			}
		case 1: // isolate a voter
			victim := uint64(1 + nemesis.IntN(3))
			t.Logf("nemesis: isolate node %d", victim)
			if err := c.Isolate(ctx, victim); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(1000+nemesis.IntN(2000)) * time.Millisecond)
			if err := c.Heal(ctx); err != nil {
				t.Fatal(err)
			}
		case 2: // failed, delayed and duplicated RPCs everywhere
			t.Log("nemesis: fault injection on every node")
			for _, n := range c.Nodes() {
				if n.Running {
					if err := c.SetFaults(ctx, n.ID, "fail=0.05,delay=0.1:1ms-30ms,dup=0.05"); err != nil {
						t.Fatal(err)
					}
				}
			}
			time.Sleep(time.Duration(1500+nemesis.IntN(1500)) * time.Millisecond)
			for _, n := range c.Nodes() {
				if n.Running {
					if err := c.SetFaults(ctx, n.ID, ""); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
		if time.Since(start) > 4*time.Minute {
			t.Fatalf("only %d operations in %v", count.Load(), time.Since(start))
		}
	}
	done.Store(true)
	wg.Wait()

	res, info := porcupine.CheckOperationsVerbose(registerModel.ToModel(), history, 2*time.Minute)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		if f, err := os.Create(path); err == nil {
			_ = porcupine.Visualize(registerModel.ToModel(), info, f)
			_ = f.Close()
		}
		t.Fatalf("%d operations: not linearizable (%v); visualization in %s", len(history), res, path)
	}
	unknown := 0
	for _, op := range history {
		if op.Output.(registerOutput).unknown {
			unknown++
		}
	}
	t.Logf("%d directory operations linearizable (%d with unknown outcome) across %d nemesis rounds", len(history), unknown, rounds)
}
