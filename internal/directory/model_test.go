package directory

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// model is a deliberately naive reference of the nodes, leases and the
// configuration table: what the package doc promises, written without the
// state machine's structure.
type model struct {
	now    int64
	nodes  map[uint64]*modelNode
	leases map[string]*pb.Lease
	config map[string]*pb.ConfigEntry
}

type modelNode struct {
	epoch uint64
	dead  bool
}

func (m *model) heldAt(l *pb.Lease) bool { return l.HolderNode != 0 && m.now < l.ExpiryUnixMs }

// expect returns the outcome the model predicts for cmd at index, applying
// it to the model when it succeeds, and the lease or entry it yields.
func (m *model) expect(cmd *pb.Command, index uint64) (pb.ErrorCode, proto.Message) {
	saved := m.now
	m.now = max(m.now, cmd.NowUnixMs)
	code, out := m.step(cmd, index)
	if code != pb.ErrorCode_OK {
		m.now = saved // a refused command does not move time either
	}
	return code, out
}

func (m *model) step(cmd *pb.Command, index uint64) (pb.ErrorCode, proto.Message) {
	switch op := cmd.Op.(type) {
	case *pb.Command_RegisterNode:
		n := m.nodes[op.RegisterNode.NodeId]
		if n == nil {
			n = &modelNode{}
			m.nodes[op.RegisterNode.NodeId] = n
		}
		n.epoch++
		n.dead = false
		return pb.ErrorCode_OK, nil
	case *pb.Command_SetNodeState:
		r := op.SetNodeState
		n := m.nodes[r.NodeId]
		switch {
		case n == nil:
			return pb.ErrorCode_UNKNOWN_NODE, nil
		case n.epoch != r.Epoch:
			return pb.ErrorCode_STALE_EPOCH, nil
		}
		n.dead = true
		return pb.ErrorCode_OK, nil
	case *pb.Command_GrantLease:
		r := op.GrantLease
		n := m.nodes[r.HolderNode]
		switch {
		case n == nil:
			return pb.ErrorCode_UNKNOWN_NODE, nil
		case n.dead:
			return pb.ErrorCode_NODE_DEAD, nil
		case n.epoch != r.HolderEpoch:
			return pb.ErrorCode_STALE_EPOCH, nil
		}
		l := m.leases[r.Name]
		if l != nil && m.heldAt(l) {
			if l.HolderNode != r.HolderNode || l.HolderEpoch != r.HolderEpoch {
				return pb.ErrorCode_LEASE_HELD, l
			}
			l.ExpiryUnixMs = max(l.ExpiryUnixMs, m.now+r.DurationMs)
			return pb.ErrorCode_OK, l
		}
		epoch := uint64(1)
		if l != nil {
			epoch = l.Epoch + 1
		}
		l = &pb.Lease{Name: r.Name, HolderNode: r.HolderNode, HolderEpoch: r.HolderEpoch, Epoch: epoch,
			GrantedUnixMs: m.now, ExpiryUnixMs: m.now + r.DurationMs}
		m.leases[r.Name] = l
		return pb.ErrorCode_OK, l
	case *pb.Command_RenewLease:
		r := op.RenewLease
		l := m.leases[r.Name]
		switch {
		case l == nil:
			return pb.ErrorCode_NOT_FOUND, nil
		case l.HolderNode != r.HolderNode || l.Epoch != r.LeaseEpoch:
			return pb.ErrorCode_STALE_EPOCH, l
		case !m.heldAt(l):
			return pb.ErrorCode_EXPIRED, l
		case m.nodes[r.HolderNode].dead:
			return pb.ErrorCode_NODE_DEAD, nil
		case m.nodes[r.HolderNode].epoch != l.HolderEpoch:
			return pb.ErrorCode_STALE_EPOCH, l
		}
		l.ExpiryUnixMs = max(l.ExpiryUnixMs, m.now+r.DurationMs)
		return pb.ErrorCode_OK, l
	case *pb.Command_ReleaseLease:
		r := op.ReleaseLease
		l := m.leases[r.Name]
		switch {
		case l == nil:
			return pb.ErrorCode_NOT_FOUND, nil
		case l.HolderNode == 0 && l.Epoch == r.LeaseEpoch:
			return pb.ErrorCode_OK, l
		case l.HolderNode != r.HolderNode || l.Epoch != r.LeaseEpoch:
			return pb.ErrorCode_STALE_EPOCH, l
		}
		l.HolderNode, l.HolderEpoch = 0, 0
		l.ExpiryUnixMs = min(l.ExpiryUnixMs, m.now)
		return pb.ErrorCode_OK, l
	case *pb.Command_PutConfig:
		r := op.PutConfig
		cur := uint64(0)
		if e := m.config[r.Key]; e != nil {
			cur = e.Version
		}
		if r.ExpectedVersion != nil && *r.ExpectedVersion != cur {
			return pb.ErrorCode_CONFLICT, nil
		}
		e := &pb.ConfigEntry{Key: r.Key, Value: r.Value, Version: index, ModifiedUnixMs: m.now}
		m.config[r.Key] = e
		return pb.ErrorCode_OK, e
	case *pb.Command_DeleteConfig:
		r := op.DeleteConfig
		cur := uint64(0)
		if e := m.config[r.Key]; e != nil {
			cur = e.Version
		}
		if r.ExpectedVersion != nil && *r.ExpectedVersion != cur {
			return pb.ErrorCode_CONFLICT, nil
		}
		delete(m.config, r.Key)
		return pb.ErrorCode_OK, nil
	}
	panic(fmt.Sprintf("model: no %T", cmd.Op))
}

// randomCommand picks an operation over a small domain, so that conflicts,
// stale epochs and expiries are frequent.
func randomCommand(rng *rand.Rand, m *model, now int64) *pb.Command {
	node := uint64(1 + rng.IntN(3))
	epoch := uint64(rng.IntN(3))
	if n := m.nodes[node]; n != nil && rng.IntN(3) > 0 {
		epoch = n.epoch
	}
	name := []string{"a", "b"}[rng.IntN(2)]
	leaseEpoch := uint64(1 + rng.IntN(3))
	if l := m.leases[name]; l != nil && rng.IntN(3) > 0 {
		leaseEpoch = l.Epoch
	}
	key := []string{"x", "y"}[rng.IntN(2)]
	var expected *uint64
	if rng.IntN(2) == 0 {
		v := uint64(rng.IntN(3))
		if e := m.config[key]; e != nil && rng.IntN(2) == 0 {
			v = e.Version
		}
		expected = &v
	}
	dur := int64(100 + rng.IntN(900))
	cmd := &pb.Command{NowUnixMs: now}
	switch rng.IntN(8) {
	case 0:
		cmd.Op = &pb.Command_RegisterNode{RegisterNode: &pb.RegisterRequest{NodeId: node, Address: fmt.Sprintf("h:%d", node)}}
	case 1:
		cmd.Op = &pb.Command_SetNodeState{SetNodeState: &pb.SetNodeState{NodeId: node, Epoch: max(epoch, 1), State: pb.NodeState_NODE_STATE_DEAD}}
	case 2, 3:
		cmd.Op = &pb.Command_GrantLease{GrantLease: &pb.GrantLeaseRequest{Name: name, HolderNode: node, HolderEpoch: max(epoch, 1), DurationMs: dur}}
	case 4:
		cmd.Op = &pb.Command_RenewLease{RenewLease: &pb.RenewLeaseRequest{Name: name, HolderNode: node, LeaseEpoch: leaseEpoch, DurationMs: dur}}
	case 5:
		cmd.Op = &pb.Command_ReleaseLease{ReleaseLease: &pb.ReleaseLeaseRequest{Name: name, HolderNode: node, LeaseEpoch: leaseEpoch}}
	case 6:
		cmd.Op = &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{Key: key, Value: []byte(fmt.Sprint(now)), ExpectedVersion: expected}}
	default:
		cmd.Op = &pb.Command_DeleteConfig{DeleteConfig: &pb.DeleteConfigRequest{Key: key, ExpectedVersion: expected}}
	}
	return cmd
}

// TestStateMachineAgainstModel runs random command sequences, with a leader
// clock that sometimes steps back, and compares every outcome and the final
// state with the model.
func TestStateMachineAgainstModel(t *testing.T) {
	seed := testseed.Seed(t)
	for run := range 20 {
		rng := rand.New(rand.NewPCG(seed, uint64(run)))
		r := newReplica(t)
		m := &model{nodes: map[uint64]*modelNode{}, leases: map[string]*pb.Lease{}, config: map[string]*pb.ConfigEntry{}}
		now := int64(1000)
		for step := range 300 {
			now += int64(rng.IntN(400)) - 100 // a new leader's clock may be behind
			cmd := randomCommand(rng, m, max(now, 1))
			wantCode, wantOut := m.expect(cmd, r.index+1)
			res := r.apply(cmd)
			if res.Code != wantCode {
				t.Fatalf("seed %d run %d step %d: %v gave %s, model says %v", seed, run, step, cmd, fmtResult(res), wantCode)
			}
			var got proto.Message
			switch p := res.Payload.(type) {
			case *pb.CommandResult_Lease:
				got = p.Lease
			case *pb.CommandResult_ConfigEntry:
				got = p.ConfigEntry
			}
			if wantOut != nil && got != nil && !proto.Equal(got, wantOut) {
				t.Fatalf("seed %d run %d step %d: %v gave %s, model has %v", seed, run, step, cmd, fmtResult(res), wantOut)
			}
		}
		for name, want := range m.leases {
			if got, _ := r.sm.Lease(name); !proto.Equal(got, want) {
				t.Fatalf("seed %d run %d: lease %s is %v, model %v", seed, run, name, got, want)
			}
		}
		entries, _ := r.sm.ListConfig("", "", maxListEntries)
		if len(entries) != len(m.config) {
			t.Fatalf("seed %d run %d: %d config entries, model %d", seed, run, len(entries), len(m.config))
		}
		for _, e := range entries {
			if !proto.Equal(e, m.config[e.Key]) {
				t.Fatalf("seed %d run %d: config %v, model %v", seed, run, e, m.config[e.Key])
			}
		}
	}
}
