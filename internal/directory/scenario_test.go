package directory

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine/raftenginetest"
)

// replica is one state machine over its own key space, applying commands at
// increasing indexes, and checking after every command that a failed one
// changed nothing and that a replica rebuilt from the key space by Load is
// identical to the one that applied.
type replica struct {
	t     testing.TB
	sm    *StateMachine
	kv    *raftenginetest.MemKV
	index uint64
}

func newReplica(t testing.TB) *replica {
	return &replica{t: t, sm: NewStateMachine(), kv: raftenginetest.NewMemKV()}
}

func (r *replica) applyRaw(data []byte) *pb.CommandResult {
	r.t.Helper()
	before, beforeDump := r.kv.Clone(), dump(r.sm)
	r.index++
	res, err := r.sm.Apply(r.kv, r.index, data)
	if err != nil {
		r.t.Fatalf("apply %d: %v", r.index, err)
	}
	result := res.(*pb.CommandResult)
	if result.Code != pb.ErrorCode_OK {
		if !r.kv.Equal(before) {
			r.t.Fatalf("apply %d failed with %v but changed the key space", r.index, result.Code)
		}
		if d := dump(r.sm); d != beforeDump {
			r.t.Fatalf("apply %d failed with %v but changed the mirror:\n%s\nbefore:\n%s", r.index, result.Code, d, beforeDump)
		}
	}
	r.checkReload()
	return result
}

func (r *replica) checkReload() {
	r.t.Helper()
	fresh := NewStateMachine()
	if err := fresh.Load(r.kv); err != nil {
		r.t.Fatalf("reload after index %d: %v", r.index, err)
	}
	if got, want := dump(fresh), dump(r.sm); got != want {
		r.t.Fatalf("reloaded state differs after index %d:\n%s\nwant:\n%s", r.index, got, want)
	}
	r.sm.mu.RLock()
	err := r.sm.st.checkInvariants()
	r.sm.mu.RUnlock()
	if err != nil {
		r.t.Fatalf("after index %d: %v", r.index, err)
	}
}

func (r *replica) apply(cmd *pb.Command) *pb.CommandResult {
	r.t.Helper()
	data, err := proto.Marshal(cmd)
	if err != nil {
		r.t.Fatalf("marshal: %v", err)
	}
	return r.applyRaw(data)
}

// args reads a directive's arguments.
type args struct {
	t testing.TB
	d *datadriven.TestData
}

func (a args) str(key, def string) string {
	arg, ok := a.d.Arg(key)
	if !ok {
		return def
	}
	if len(arg.Vals) == 0 {
		return ""
	}
	return strings.Join(arg.Vals, ",")
}

func (a args) u64(key string, def uint64) uint64 {
	s := a.str(key, "")
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		a.t.Fatalf("%s: %s=%q: %v", a.d.Pos, key, s, err)
	}
	return v
}

func (a args) i64(key string, def int64) int64 {
	s := a.str(key, "")
	if s == "" {
		return def
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		a.t.Fatalf("%s: %s=%q: %v", a.d.Pos, key, s, err)
	}
	return v
}

func (a args) list(key string) []string {
	arg, ok := a.d.Arg(key)
	if !ok {
		return nil
	}
	var out []string
	for _, v := range arg.Vals {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

func (a args) u64s(key string) []uint64 {
	var out []uint64
	for _, s := range a.list(key) {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			a.t.Fatalf("%s: %s: %v", a.d.Pos, key, err)
		}
		out = append(out, v)
	}
	return out
}

func (a args) optU64(key string) *uint64 {
	if !a.d.HasArg(key) {
		return nil
	}
	v := a.u64(key, 0)
	return &v
}

// parseTS parses "node/disk".
func parseTS(t testing.TB, s string) *pb.TractServer {
	n, d, ok := strings.Cut(s, "/")
	if !ok {
		t.Fatalf("tractserver %q: want node/disk", s)
	}
	node, err1 := strconv.ParseUint(n, 10, 64)
	disk, err2 := strconv.ParseUint(d, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("tractserver %q: bad number", s)
	}
	return &pb.TractServer{NodeId: node, DiskIndex: uint32(disk)}
}

// parseRow parses "1/0 2/0 pending=1:3/0".
func parseRow(t testing.TB, line string) ([]*pb.TractServer, []*pb.PendingEntry) {
	var slots []*pb.TractServer
	var pending []*pb.PendingEntry
	for _, f := range strings.Fields(line) {
		if p, ok := strings.CutPrefix(f, "pending="); ok {
			slot, ts, _ := strings.Cut(p, ":")
			n, err := strconv.ParseUint(slot, 10, 32)
			if err != nil {
				t.Fatalf("pending %q: %v", p, err)
			}
			pending = append(pending, &pb.PendingEntry{Slot: uint32(n), Server: parseTS(t, ts)})
			continue
		}
		slots = append(slots, parseTS(t, f))
	}
	return slots, pending
}

// commandFromDirective builds the command a state machine directive names.
func commandFromDirective(t testing.TB, d *datadriven.TestData) *pb.Command {
	a := args{t, d}
	cmd := &pb.Command{NowUnixMs: a.i64("now", 1)}
	switch d.Cmd {
	case "init":
		cmd.Op = &pb.Command_InitCluster{InitCluster: &pb.InitClusterRequest{
			ClusterId: a.str("id", ""), TractSizeBytes: a.u64("tract", DefaultTractSizeBytes)}}
	case "register":
		req := &pb.RegisterRequest{
			NodeId: a.u64("id", 0), Address: a.str("addr", ""), HttpAddress: a.str("http", ""),
			FailureDomain: a.str("domain", ""), Roles: a.list("roles"),
		}
		for _, spec := range a.list("disks") {
			path, capacity, _ := strings.Cut(spec, ":")
			c, _ := strconv.ParseUint(capacity, 10, 64)
			req.Disks = append(req.Disks, &pb.Disk{Path: path, CapacityBytes: c})
		}
		cmd.Op = &pb.Command_RegisterNode{RegisterNode: req}
	case "set-state":
		st := map[string]pb.NodeState{
			"alive": pb.NodeState_NODE_STATE_ALIVE, "suspect": pb.NodeState_NODE_STATE_SUSPECT,
			"dead": pb.NodeState_NODE_STATE_DEAD, "decommissioned": pb.NodeState_NODE_STATE_DECOMMISSIONED,
		}[a.str("state", "")]
		cmd.Op = &pb.Command_SetNodeState{SetNodeState: &pb.SetNodeState{
			NodeId: a.u64("id", 0), Epoch: a.u64("epoch", 0), State: st, LastHeartbeatUnixMs: a.i64("hb", 0)}}
	case "decommission":
		cmd.Op = &pb.Command_DecommissionNode{DecommissionNode: &pb.DecommissionRequest{NodeId: a.u64("id", 0)}}
	case "stats":
		req := &pb.UpdateMemberStats{}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			var s pb.MemberStats
			if _, err := fmt.Sscanf(line, "%d %d %d %g", &s.NodeId, &s.FreeBytes, &s.CapacityBytes, &s.Load); err != nil {
				t.Fatalf("%s: stats line %q: %v", d.Pos, line, err)
			}
			req.Stats = append(req.Stats, &s)
		}
		cmd.Op = &pb.Command_UpdateMemberStats{UpdateMemberStats: req}
	case "install-tlt":
		req := &pb.InstallTLTRequest{ExpectedVersion: a.u64("expected", 0), Replication: uint32(a.u64("k", 0))}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			slots, pending := parseRow(t, line)
			req.Rows = append(req.Rows, &pb.TLTRow{Slots: slots, Pending: pending})
		}
		cmd.Op = &pb.Command_InstallTlt{InstallTlt: req}
	case "update-tlt":
		req := &pb.UpdateTLTRowsRequest{}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			// row expected: slots...
			head, rest, _ := strings.Cut(line, ":")
			var row uint32
			var expected uint64
			if _, err := fmt.Sscanf(head, "%d %d", &row, &expected); err != nil {
				t.Fatalf("%s: update line %q: %v", d.Pos, line, err)
			}
			slots, pending := parseRow(t, rest)
			req.Updates = append(req.Updates, &pb.RowUpdate{Row: row, ExpectedVersion: expected, Slots: slots, Pending: pending})
		}
		cmd.Op = &pb.Command_UpdateTltRows{UpdateTltRows: req}
	case "create-extent":
		cmd.Op = &pb.Command_CreateExtent{CreateExtent: &pb.CreateExtentRequest{
			Geometry: &pb.ExtentGeometry{
				PageSizeBytes: uint32(a.u64("page", 4096)), BlockSizeBytes: uint32(a.u64("block", 65536)),
				ExtentSizeBytes: a.u64("size", 1<<30), Replication: uint32(a.u64("repl", 3)),
			},
			Replicas: a.u64s("replicas"),
		}}
	case "change-extent":
		cmd.Op = &pb.Command_ChangeExtentReplicas{ChangeExtentReplicas: &pb.ChangeExtentReplicasRequest{
			ExtentId: a.u64("id", 0), ExpectedEpoch: a.u64("epoch", 0), Replicas: a.u64s("replicas")}}
	case "set-delegation":
		cmd.Op = &pb.Command_SetDelegation{SetDelegation: &pb.SetDelegationRequest{
			TableId: a.u64("table", 0), FileSystem: a.u64("fs", 0),
			StartKey: []byte(a.str("start", "")), EndKey: []byte(a.str("end", "")),
			OwnerNode: a.u64("owner", 0), LeaseDurationMs: a.i64("lease", 0), ExpectedEpoch: a.u64("epoch", 0)}}
	case "renew-delegation":
		cmd.Op = &pb.Command_RenewDelegation{RenewDelegation: &pb.RenewDelegationRequest{
			TableId: a.u64("table", 0), Epoch: a.u64("epoch", 0), OwnerNode: a.u64("owner", 0), LeaseDurationMs: a.i64("lease", 0)}}
	case "renew-delegations":
		// One renewal a line: table epoch owner lease.
		req := &pb.RenewDelegationsRequest{}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			if line == "" {
				continue
			}
			r := &pb.RenewDelegationRequest{}
			if _, err := fmt.Sscanf(line, "%d %d %d %d", &r.TableId, &r.Epoch, &r.OwnerNode, &r.LeaseDurationMs); err != nil {
				t.Fatalf("%s: renewal line %q: %v", d.Pos, line, err)
			}
			req.Renewals = append(req.Renewals, r)
		}
		cmd.Op = &pb.Command_RenewDelegations{RenewDelegations: req}
	case "delete-delegation":
		cmd.Op = &pb.Command_DeleteDelegation{DeleteDelegation: &pb.DeleteDelegationRequest{
			TableId: a.u64("table", 0), ExpectedEpoch: a.u64("epoch", 0)}}
	case "create-fs":
		cmd.Op = &pb.Command_CreateFileSystem{CreateFileSystem: &pb.CreateFileSystemRequest{
			Name: a.str("name", ""), TenantId: a.u64("tenant", 0)}}
	case "delete-fs":
		cmd.Op = &pb.Command_DeleteFileSystem{DeleteFileSystem: &pb.DeleteFileSystemRequest{Number: a.u64("fs", 0)}}
	case "create-snapshot":
		cmd.Op = &pb.Command_CreateSnapshot{CreateSnapshot: &pb.CreateSnapshotRequest{
			FileSystem: a.u64("fs", 0), Name: a.str("name", "")}}
	case "delete-snapshot":
		cmd.Op = &pb.Command_DeleteSnapshot{DeleteSnapshot: &pb.DeleteSnapshotRequest{
			FileSystem: a.u64("fs", 0), Snapshot: a.u64("snapshot", 0)}}
	case "grant":
		cmd.Op = &pb.Command_GrantLease{GrantLease: &pb.GrantLeaseRequest{
			Name: a.str("name", ""), HolderNode: a.u64("node", 0), HolderEpoch: a.u64("epoch", 0), DurationMs: a.i64("dur", 0)}}
	case "renew":
		cmd.Op = &pb.Command_RenewLease{RenewLease: &pb.RenewLeaseRequest{
			Name: a.str("name", ""), HolderNode: a.u64("node", 0), LeaseEpoch: a.u64("epoch", 0), DurationMs: a.i64("dur", 0)}}
	case "release":
		cmd.Op = &pb.Command_ReleaseLease{ReleaseLease: &pb.ReleaseLeaseRequest{
			Name: a.str("name", ""), HolderNode: a.u64("node", 0), LeaseEpoch: a.u64("epoch", 0), Force: d.HasArg("force")}}
	case "put":
		cmd.Op = &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{
			Key: a.str("key", ""), Value: []byte(a.str("value", "")), ExpectedVersion: a.optU64("expected")}}
	case "delete":
		cmd.Op = &pb.Command_DeleteConfig{DeleteConfig: &pb.DeleteConfigRequest{
			Key: a.str("key", ""), ExpectedVersion: a.optU64("expected")}}
	default:
		t.Fatalf("%s: unknown directive %q", d.Pos, d.Cmd)
	}
	return cmd
}

// TestStateMachineScenarios runs testdata/statemachine: each directive is a
// command (its output the result) or `dump` (the whole state), `raw hex=..`
// (undecodable bytes) or `big key=.. bytes=N` (an oversize value).
func TestStateMachineScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/statemachine", func(t *testing.T, path string) {
		r := newReplica(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "dump":
				return dump(r.sm)
			case "raw":
				data, err := hex.DecodeString(args{t, d}.str("hex", ""))
				if err != nil {
					t.Fatalf("%s: %v", d.Pos, err)
				}
				return fmtResult(r.applyRaw(data)) + "\n"
			case "big":
				a := args{t, d}
				cmd := &pb.Command{NowUnixMs: a.i64("now", 1), Op: &pb.Command_PutConfig{PutConfig: &pb.PutConfigRequest{
					Key: a.str("key", "k"), Value: make([]byte, a.u64("bytes", 0))}}}
				return fmtResult(r.apply(cmd)) + "\n"
			}
			return fmtResult(r.apply(commandFromDirective(t, d))) + "\n"
		})
	})
}

// TestDetectorScenarios runs testdata/detector: `new` creates a detector,
// `reset`/`sync` feed it the committed nodes (one per input line:
// "id epoch state"), `heartbeat` and `tick` drive it; times are in ms.
func TestDetectorScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/detector", func(t *testing.T, path string) {
		var det *Detector
		at := func(ms int64) time.Time { return time.UnixMilli(ms) }
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			a := args{t, d}
			switch d.Cmd {
			case "new":
				var err error
				det, err = NewDetector(DetectorConfig{
					HeartbeatInterval: time.Duration(a.i64("heartbeat", 0)) * time.Millisecond,
					SuspectTimeout:    time.Duration(a.i64("suspect", 0)) * time.Millisecond,
					DeadTimeout:       time.Duration(a.i64("dead", 0)) * time.Millisecond,
				})
				if err != nil {
					return fmt.Sprintf("error: %v\n", err)
				}
				cfg := det.Config()
				return fmt.Sprintf("heartbeat=%v suspect=%v dead=%v\n", cfg.HeartbeatInterval, cfg.SuspectTimeout, cfg.DeadTimeout)
			case "reset", "sync":
				var nodes []*pb.Node
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					if line == "" {
						continue
					}
					var id, epoch uint64
					var state string
					if _, err := fmt.Sscanf(line, "%d %d %s", &id, &epoch, &state); err != nil {
						t.Fatalf("%s: node line %q: %v", d.Pos, line, err)
					}
					nodes = append(nodes, &pb.Node{Id: id, Epoch: epoch, State: parseState(t, state)})
				}
				if d.Cmd == "reset" {
					det.Reset(at(a.i64("now", 0)), nodes)
				} else {
					det.Sync(at(a.i64("now", 0)), nodes)
				}
				return "ok\n"
			case "heartbeat":
				return fmt.Sprintf("watched=%v\n", det.Heartbeat(a.u64("id", 0), a.u64("epoch", 0), at(a.i64("now", 0))))
			case "tick":
				var b strings.Builder
				for _, tr := range det.Tick(at(a.i64("now", 0))) {
					b.WriteString(tr.String() + "\n")
				}
				if b.Len() == 0 {
					return "no transitions\n"
				}
				return b.String()
			case "verdict":
				n := &pb.Node{Id: a.u64("id", 0), Epoch: a.u64("node-epoch", 0), State: parseState(t, a.str("state", ""))}
				action, reason := heartbeatVerdict(n, a.u64("epoch", 0))
				return fmt.Sprintf("%v %s\n", action, reason)
			}
			t.Fatalf("%s: unknown directive %q", d.Pos, d.Cmd)
			return ""
		})
	})
}

func parseState(t testing.TB, s string) pb.NodeState {
	for _, st := range []pb.NodeState{pb.NodeState_NODE_STATE_ALIVE, pb.NodeState_NODE_STATE_SUSPECT,
		pb.NodeState_NODE_STATE_DEAD, pb.NodeState_NODE_STATE_DECOMMISSIONED} {
		if stateName(st) == s {
			return st
		}
	}
	t.Fatalf("unknown state %q", s)
	return 0
}
