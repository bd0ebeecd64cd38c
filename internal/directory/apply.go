package directory

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/invariants"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Apply applies one command of the directory's log (raftengine.StateMachine).
// It returns a *directorypb.CommandResult; contract failures (stale epoch,
// failed condition, malformed command) are results that change nothing. An
// error is returned only when the key space cannot be written.
func (sm *StateMachine) Apply(w raftengine.Writer, index uint64, data []byte) (any, error) {
	cmd, err := DecodeCommand(data)
	if err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err), nil
	}
	if err := checkStateless(cmd); err != nil {
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "%v", err), nil
	}
	if prev, err := repeatedRequest(w, cmd.RequestId); err != nil {
		return nil, fmt.Errorf("directory: apply index %d: %w", index, err)
	} else if prev != nil {
		return prev, nil
	}
	// Apply is the only writer of sm.st and runs on one goroutine, so it
	// reads the state without the lock; it takes the lock to publish.
	a := &applier{
		st:    &sm.st,
		index: index,
		// Time never goes backwards, even when a new leader's clock is
		// behind the previous one's: lease expiry stays monotone.
		now: max(cmd.NowUnixMs, sm.st.clockUnixMs),
	}
	res := a.dispatch(cmd)
	if res.Code != pb.ErrorCode_OK {
		return res, nil
	}
	clock := make([]byte, 8)
	binary.BigEndian.PutUint64(clock, uint64(a.now))
	a.eff.setRaw(keyClock, clock)
	if err := a.eff.write(w); err != nil {
		return nil, fmt.Errorf("directory: apply index %d: %w", index, err)
	}
	if err := rememberRequest(w, index, cmd.RequestId, res, &sm.requestsPruned); err != nil {
		return nil, fmt.Errorf("directory: apply index %d: %w", index, err)
	}
	sm.mu.Lock()
	for _, commit := range a.eff.commits {
		commit(&sm.st)
	}
	sm.st.clockUnixMs = a.now
	sm.mu.Unlock()
	if invariants.Enabled {
		// Apply runs on one goroutine: the state is read without the lock.
		if err := sm.st.checkInvariants(); err != nil {
			panic(fmt.Sprintf("directory: after applying index %d (%T): %v", index, cmd.Op, err))
		}
	}
	return res, nil
}

// applier carries one command's context: the state before it, its index and
// time, and the writes and mirror changes it accumulates. Handlers validate
// everything before recording any effect, and effects are only carried out
// when the result is OK.
type applier struct {
	st    *state
	index uint64
	now   int64
	eff   effect
}

type writeOp struct {
	key, value []byte
	// rangeEnd is set for a DeleteRange; value is nil for a Delete.
	rangeEnd []byte
	del      bool
}

type effect struct {
	ops     []writeOp
	err     error
	commits []func(*state)
}

func (e *effect) set(key []byte, m proto.Message) {
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil && e.err == nil {
		e.err = fmt.Errorf("encode %q: %w", key, err)
	}
	e.ops = append(e.ops, writeOp{key: key, value: v})
}

func (e *effect) setRaw(key, value []byte) {
	e.ops = append(e.ops, writeOp{key: key, value: value})
}

func (e *effect) del(key []byte) { e.ops = append(e.ops, writeOp{key: key, del: true}) }

func (e *effect) delRange(start, end []byte) {
	e.ops = append(e.ops, writeOp{key: start, rangeEnd: end, del: true})
}

func (e *effect) then(f func(*state)) { e.commits = append(e.commits, f) }

func (e *effect) write(w raftengine.Writer) error {
	if e.err != nil {
		return e.err
	}
	for _, op := range e.ops {
		var err error
		switch {
		case op.rangeEnd != nil:
			err = w.DeleteRange(op.key, op.rangeEnd)
		case op.del:
			err = w.Delete(op.key)
		default:
			err = w.Set(op.key, op.value)
		}
		if err != nil {
			return fmt.Errorf("write %q: %w", op.key, err)
		}
	}
	return nil
}

func (a *applier) dispatch(cmd *pb.Command) *pb.CommandResult {
	switch op := cmd.Op.(type) {
	case *pb.Command_InitCluster:
		return a.initCluster(op.InitCluster)
	case *pb.Command_RegisterNode:
		return a.registerNode(op.RegisterNode)
	case *pb.Command_SetNodeState:
		return a.setNodeState(op.SetNodeState)
	case *pb.Command_DecommissionNode:
		return a.decommissionNode(op.DecommissionNode)
	case *pb.Command_UpdateMemberStats:
		return a.updateMemberStats(op.UpdateMemberStats)
	case *pb.Command_InstallTlt:
		return a.installTLT(op.InstallTlt)
	case *pb.Command_UpdateTltRows:
		return a.updateTLTRows(op.UpdateTltRows)
	case *pb.Command_CreateExtent:
		return a.createExtent(op.CreateExtent)
	case *pb.Command_ChangeExtentReplicas:
		return a.changeExtentReplicas(op.ChangeExtentReplicas)
	case *pb.Command_SetDelegation:
		return a.setDelegation(op.SetDelegation)
	case *pb.Command_RenewDelegation:
		return a.renewDelegation(op.RenewDelegation)
	case *pb.Command_RenewDelegations:
		return a.renewDelegations(op.RenewDelegations)
	case *pb.Command_SplitDelegation:
		return a.splitDelegation(op.SplitDelegation)
	case *pb.Command_DeleteDelegation:
		return a.deleteDelegation(op.DeleteDelegation)
	case *pb.Command_CreateFileSystem:
		return a.createFileSystem(op.CreateFileSystem)
	case *pb.Command_DeleteFileSystem:
		return a.deleteFileSystem(op.DeleteFileSystem)
	case *pb.Command_CreateSnapshot:
		return a.createSnapshot(op.CreateSnapshot)
	case *pb.Command_DeleteSnapshot:
		return a.deleteSnapshot(op.DeleteSnapshot)
	case *pb.Command_GrantLease:
		return a.grantLease(op.GrantLease)
	case *pb.Command_RenewLease:
		return a.renewLease(op.RenewLease)
	case *pb.Command_ReleaseLease:
		return a.releaseLease(op.ReleaseLease)
	case *pb.Command_PutConfig:
		return a.putConfig(op.PutConfig)
	case *pb.Command_DeleteConfig:
		return a.deleteConfig(op.DeleteConfig)
	default:
		return failf(pb.ErrorCode_INVALID_ARGUMENT, "unknown operation %T", op)
	}
}

// setCounters records a change of the id allocators.
func (a *applier) setCounters(c *pb.Counters) {
	a.eff.set(keyCounters, c)
	a.eff.then(func(s *state) { s.counters = c })
}

func (a *applier) counters() *pb.Counters { return proto.Clone(a.st.counters).(*pb.Counters) }

func failf(code pb.ErrorCode, format string, args ...any) *pb.CommandResult {
	return &pb.CommandResult{Code: code, Message: fmt.Sprintf(format, args...)}
}

func withPayload(r *pb.CommandResult, payload any) *pb.CommandResult {
	switch p := payload.(type) {
	case *pb.ClusterInfo:
		r.Payload = &pb.CommandResult_Cluster{Cluster: p}
	case *pb.Node:
		r.Payload = &pb.CommandResult_Node{Node: p}
	case *pb.TLTVersion:
		r.Payload = &pb.CommandResult_Tlt{Tlt: p}
	case *pb.Extent:
		r.Payload = &pb.CommandResult_Extent{Extent: p}
	case *pb.Delegation:
		r.Payload = &pb.CommandResult_Delegation{Delegation: p}
	case *pb.DelegationPair:
		r.Payload = &pb.CommandResult_DelegationPair{DelegationPair: p}
	case *pb.RenewDelegationsResponse:
		r.Payload = &pb.CommandResult_Renewals{Renewals: p}
	case *pb.FileSystem:
		r.Payload = &pb.CommandResult_FileSystem{FileSystem: p}
	case *pb.Snapshot:
		r.Payload = &pb.CommandResult_Snapshot{Snapshot: p}
	case *pb.Lease:
		r.Payload = &pb.CommandResult_Lease{Lease: p}
	case *pb.ConfigEntry:
		r.Payload = &pb.CommandResult_ConfigEntry{ConfigEntry: p}
	case uint64:
		r.Payload = &pb.CommandResult_Version{Version: p}
	case nil:
	default:
		panic(fmt.Sprintf("directory: no payload for %T", payload))
	}
	return r
}

func ok(payload any) *pb.CommandResult { return withPayload(&pb.CommandResult{}, payload) }
