package extent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
)

// Engine is what the extent service needs of the replication engine
// (*raftengine.Engine implements it).
type Engine interface {
	NodeID() uint64
	Groups() []uint64
	CreateGroup(ctx context.Context, desc raftengine.GroupDescriptor, voters []uint64) error
	Propose(ctx context.Context, gid uint64, cmd []byte) (any, error)
	ReadIndex(ctx context.Context, gid uint64) error
	Status(gid uint64) (raftengine.GroupStatus, error)
	StatusWithProgress(ctx context.Context, gid uint64) (raftengine.GroupStatus, error)
	StateMachine(gid uint64) (raftengine.StateMachine, error)
	AddLearner(ctx context.Context, gid, node uint64) error
	AddVoter(ctx context.Context, gid, node uint64) error
	RemoveReplica(ctx context.Context, gid, node uint64) error
	RecoverAlone(ctx context.Context, gid uint64) (raftengine.RecoveryReport, error)
	RemoveGroup(ctx context.Context, gid uint64) error
}

// PeerFunc returns the Extent service of another node, for forwarding.
type PeerFunc func(ctx context.Context, node uint64) (pb.ExtentClient, error)

// ServerConfig configures a Server.
type ServerConfig struct {
	Engine Engine
	// Peers reaches other nodes; nil disables forwarding.
	Peers  PeerFunc
	Logger *slog.Logger
	// Now is the clock that stamps commands (default time.Now).
	Now func() time.Time
}

// Server is the Extent gRPC service of one node: the data path of the
// extents whose leader is here (a follower forwards a call once to the
// leader it knows), and the replica life cycle the extent manager drives.
type Server struct {
	pb.UnimplementedExtentServer
	cfg  ServerConfig
	e    Engine
	log  *slog.Logger
	self uint64

	stats serverStats
}

type serverStats struct {
	reads, commits, checks, steps, forwards, refused, ambiguous atomic.Uint64
	deltaMismatches                                             atomic.Uint64
}

// NewServer returns the service.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("extent: server needs an engine")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{
		cfg: cfg, e: cfg.Engine, self: cfg.Engine.NodeID(),
		log: cfg.Logger.With("component", "extent-server"),
	}, nil
}

// localReplica returns the local state machine of extent id and its raft
// status, or the service error saying this node holds no replica.
func (s *Server) localReplica(id uint64) (*StateMachine, raftengine.GroupStatus, error) {
	st, err := s.e.Status(id)
	if err != nil {
		return nil, st, statusError(&pb.Error{Code: pb.Code_CODE_NO_REPLICA, ExtentId: id, Message: fmt.Sprintf("node %d holds no replica of extent %d", s.self, id)})
	}
	raw, err := s.e.StateMachine(id)
	if err != nil {
		return nil, st, statusError(&pb.Error{Code: pb.Code_CODE_NO_REPLICA, ExtentId: id, Message: err.Error()})
	}
	sm, ok := raw.(*StateMachine)
	if !ok {
		return nil, st, statusError(&pb.Error{Code: pb.Code_CODE_NO_REPLICA, ExtentId: id, Message: fmt.Sprintf("group %d is not an extent", id)})
	}
	return sm, st, nil
}

// engineError maps an engine failure of a call on extent id to the
// service's error. write says whether the call proposes.
func (s *Server) engineError(id uint64, err error, write bool) error {
	d := &pb.Error{ExtentId: id, Message: err.Error()}
	nl, isNL := raftengine.IsNotLeader(err)
	switch {
	case isNL:
		d.Code, d.LeaderId = pb.Code_CODE_NOT_LEADER, nl.Leader
	case errors.Is(err, raftengine.ErrProposalDropped) && !write:
		d.Code = pb.Code_CODE_UNAVAILABLE
	case errors.Is(err, raftengine.ErrGroupNotFound) && !write:
		d.Code = pb.Code_CODE_NO_REPLICA
	case errors.Is(err, raftengine.ErrTooLarge), errors.Is(err, ErrInvalid):
		d.Code = pb.Code_CODE_INVALID_ARGUMENT
	case errors.Is(err, raftengine.ErrDiskFull):
		// Refused before raft saw it; the engine hands the leadership
		// to a replica with room, where the client's retry goes.
		d.Code = pb.Code_CODE_UNAVAILABLE
	case !write:
		d.Code = pb.Code_CODE_UNAVAILABLE
	default:
		// The deadline passed or the replica stopped after the proposal
		// was handed to raft: it may still commit. So may a "dropped"
		// proposal: a replica that stepped down in the same step can have
		// forwarded it to the new leader (raft's proposal forwarding), which
		// raftengine reports as dropped.
		d.Code = pb.Code_CODE_AMBIGUOUS
	}
	if d.Code == pb.Code_CODE_AMBIGUOUS {
		s.stats.ambiguous.Add(1)
	}
	return statusError(d)
}

// route decides where a data-path call on extent id runs: here (the local
// state machine), at the leader it returns (forward the call), or nowhere
// (an error: no replica here, or no leader known, or already forwarded).
func (s *Server) route(id uint64, forwarded bool) (*StateMachine, uint64, error) {
	sm, st, err := s.localReplica(id)
	if err != nil {
		return nil, 0, err
	}
	if st.IsLeader() {
		return sm, 0, nil
	}
	if st.Leader == 0 || forwarded || s.cfg.Peers == nil {
		return nil, 0, statusError(&pb.Error{Code: pb.Code_CODE_NOT_LEADER, ExtentId: id, LeaderId: st.Leader,
			Message: fmt.Sprintf("node %d does not lead extent %d (leader %d)", s.self, id, st.Leader)})
	}
	return nil, st.Leader, nil
}

// forward runs call against node's service. A failure that carries no
// service detail happened on the way: a write's outcome is unknown.
func forward[Resp any](ctx context.Context, s *Server, id, node uint64, write bool, call func(context.Context, pb.ExtentClient) (Resp, error)) (Resp, error) {
	var zero Resp
	s.stats.forwards.Add(1)
	cl, err := s.cfg.Peers(ctx, node)
	if err != nil {
		return zero, statusError(&pb.Error{Code: pb.Code_CODE_NOT_LEADER, ExtentId: id, LeaderId: node, Message: fmt.Sprintf("reach leader %d: %v", node, err)})
	}
	resp, err := call(ctx, cl)
	if err == nil {
		return resp, nil
	}
	if _, ok := detailOf(err); ok {
		return zero, err
	}
	code := pb.Code_CODE_UNAVAILABLE
	if write {
		code = pb.Code_CODE_AMBIGUOUS
		s.stats.ambiguous.Add(1)
	}
	return zero, statusError(&pb.Error{Code: code, ExtentId: id, LeaderId: node, Message: fmt.Sprintf("forwarded to leader %d: %v", node, err)})
}

// propose commits cmd on extent id (this replica leads it) and returns
// Apply's result, or the service error of a refusal or failure.
func (s *Server) propose(ctx context.Context, id uint64, cmd *pb.Command) (*pb.CommandResult, error) {
	cmd.NowUnixMs = s.cfg.Now().UnixMilli()
	data, err := EncodeCommand(cmd)
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: id, Message: err.Error()})
	}
	out, err := s.e.Propose(ctx, id, data)
	if err != nil {
		return nil, s.engineError(id, err, true)
	}
	res, ok := out.(*pb.CommandResult)
	if !ok {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INTERNAL, ExtentId: id, Message: fmt.Sprintf("apply returned %T", out)})
	}
	if res.Code != pb.Code_CODE_OK {
		s.stats.refused.Add(1)
		if res.Code == pb.Code_CODE_DELTA_MISMATCH {
			s.stats.deltaMismatches.Add(1)
		}
		return res, statusError(&pb.Error{Code: res.Code, ExtentId: id, Message: res.Message, Holder: res.Holder})
	}
	return res, nil
}

// linearize makes the local replica reflect every write committed before
// the call (leader only), so that what is read next is linearizable.
func (s *Server) linearize(ctx context.Context, id uint64) error {
	if err := s.e.ReadIndex(ctx, id); err != nil {
		return s.engineError(id, err, false)
	}
	return nil
}

// Read implements pb.ExtentServer.
func (s *Server) Read(ctx context.Context, req *pb.ReadRequest) (*pb.ReadResponse, error) {
	id := req.GetPage().GetExtentId()
	if req.Page == nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, Message: "no page"})
	}
	sm, leader, err := s.route(id, req.Forwarded)
	if err != nil {
		return nil, err
	}
	if leader != 0 {
		return forward(ctx, s, id, leader, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.ReadResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.Read(ctx, fwd)
		})
	}
	s.stats.reads.Add(1)
	if err := s.linearize(ctx, id); err != nil {
		return nil, err
	}
	page, refused, err := sm.ReadPage(pointerFromProto(req.Page))
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: id, Message: err.Error()})
	}
	if refused != nil {
		return nil, statusError(&pb.Error{Code: refused.Code, ExtentId: id, Message: refused.Message, Holder: refused.Holder})
	}
	return &pb.ReadResponse{Data: page.Data, Slot: page.Slot, LeaderId: s.self}, nil
}

// Commit implements pb.ExtentServer: an MPSC within one extent, one raft
// entry.
func (s *Server) Commit(ctx context.Context, req *pb.CommitRequest) (*pb.CommitResponse, error) {
	_, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	if leader != 0 {
		return forward(ctx, s, req.ExtentId, leader, true, func(ctx context.Context, cl pb.ExtentClient) (*pb.CommitResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.Commit(ctx, fwd)
		})
	}
	s.stats.commits.Add(1)
	res, err := s.propose(ctx, req.ExtentId, &pb.Command{RequestId: req.RequestId,
		Op: &pb.Command_Commit{Commit: &pb.CommitCmd{Elements: req.Elements}}})
	if err != nil {
		return nil, err
	}
	return &pb.CommitResponse{Results: res.Results, Index: res.Index, LeaderId: s.self}, nil
}

// Check implements pb.ExtentServer: a read-only transaction's
// validation, answered by the leader after a linearizable read, with no
// raft entry.
func (s *Server) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	sm, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	if leader != 0 {
		return forward(ctx, s, req.ExtentId, leader, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.CheckResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.Check(ctx, fwd)
		})
	}
	s.stats.checks.Add(1)
	if err := s.linearize(ctx, req.ExtentId); err != nil {
		return nil, err
	}
	res, err := sm.Check(req.Elements)
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	if res.Code != pb.Code_CODE_OK {
		s.stats.refused.Add(1)
		return nil, statusError(&pb.Error{Code: res.Code, ExtentId: req.ExtentId, Message: res.Message, Holder: res.Holder})
	}
	return &pb.CheckResponse{LeaderId: s.self}, nil
}

// TxnStep implements pb.ExtentServer: one state transition of a
// cross-extent transaction (FSS §6), one raft entry. A tenant's step that
// names only the transaction's id is checked against its record here, at
// the leader, and never forwarded (tenancy.go, rule 2).
func (s *Server) TxnStep(ctx context.Context, req *pb.TxnStepRequest) (*pb.TxnStepResponse, error) {
	cmd := &pb.Command{RequestId: req.RequestId}
	txn := &pb.TxnCmd{TxnId: req.TxnId, ExpiryUnixMs: req.ExpiryUnixMs}
	switch req.Kind {
	case pb.StepKind_STEP_KIND_PREPARE, pb.StepKind_STEP_KIND_PREPARE_DECIDE:
		cmd.Op = &pb.Command_Prepare{Prepare: &pb.PrepareCmd{
			TxnId: req.TxnId, PrevExtent: req.PrevExtent, NextExtent: req.NextExtent, ExpiryUnixMs: req.ExpiryUnixMs,
			Elements: req.Elements, Decide: req.Kind == pb.StepKind_STEP_KIND_PREPARE_DECIDE,
		}}
	case pb.StepKind_STEP_KIND_DECIDE_RELEASE:
		cmd.Op = &pb.Command_DecideRelease{DecideRelease: txn}
	case pb.StepKind_STEP_KIND_RELEASE:
		cmd.Op = &pb.Command_Release{Release: txn}
	case pb.StepKind_STEP_KIND_ABORT:
		cmd.Op = &pb.Command_Abort{Abort: txn}
	case pb.StepKind_STEP_KIND_FENCE:
		cmd.Op = &pb.Command_Fence{Fence: txn}
	default:
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId, Message: fmt.Sprintf("step kind %v", req.Kind)})
	}
	sm, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	tenant, isTenant := security.CallerTenant(ctx)
	checkRecord := isTenant && stepNamesOnlyID(req.Kind)
	if leader != 0 {
		if checkRecord {
			return nil, s.tenantNotForwarded(req.ExtentId, leader, "transaction step")
		}
		return forward(ctx, s, req.ExtentId, leader, true, func(ctx context.Context, cl pb.ExtentClient) (*pb.TxnStepResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.TxnStep(ctx, fwd)
		})
	}
	if checkRecord {
		if err := s.checkTenantTxn(ctx, sm, req.ExtentId, req.TxnId, tenant); err != nil {
			return nil, err
		}
	}
	s.stats.steps.Add(1)
	res, err := s.propose(ctx, req.ExtentId, cmd)
	if err != nil {
		return nil, err
	}
	return &pb.TxnStepResponse{Record: res.Record, Results: res.Results, Index: res.Index, LeaderId: s.self}, nil
}

// QueryTxn implements pb.ExtentServer: a linearizable read of a
// transaction's record (its summary). A tenant's is checked against the
// whole record here, at the leader, and never forwarded (tenancy.go,
// rule 2).
func (s *Server) QueryTxn(ctx context.Context, req *pb.QueryTxnRequest) (*pb.QueryTxnResponse, error) {
	sm, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	tenant, isTenant := security.CallerTenant(ctx)
	if leader != 0 {
		if isTenant {
			return nil, s.tenantNotForwarded(req.ExtentId, leader, "transaction query")
		}
		return forward(ctx, s, req.ExtentId, leader, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.QueryTxnResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.QueryTxn(ctx, fwd)
		})
	}
	if isTenant {
		// Linearizes too.
		if err := s.checkTenantTxn(ctx, sm, req.ExtentId, req.TxnId, tenant); err != nil {
			return nil, err
		}
	} else if err := s.linearize(ctx, req.ExtentId); err != nil {
		return nil, err
	}
	rec, err := sm.QueryTxn(req.TxnId)
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	return &pb.QueryTxnResponse{Record: rec, LeaderId: s.self}, nil
}

// FreeBlocks implements pb.ExtentServer.
func (s *Server) FreeBlocks(ctx context.Context, req *pb.FreeBlocksRequest) (*pb.FreeBlocksResponse, error) {
	sm, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	if leader != 0 {
		return forward(ctx, s, req.ExtentId, leader, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.FreeBlocksResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.FreeBlocks(ctx, fwd)
		})
	}
	if req.NearPage >= sm.geo.Pages() {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId,
			Message: fmt.Sprintf("page %d does not exist: extent %d has %d pages", req.NearPage, req.ExtentId, sm.geo.Pages())})
	}
	if err := s.linearize(ctx, req.ExtentId); err != nil {
		return nil, err
	}
	blocks, err := sm.FreeBlocks(req.NearPage, int(req.Limit))
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	resp := &pb.FreeBlocksResponse{LeaderId: s.self}
	for _, b := range blocks {
		resp.Blocks = append(resp.Blocks, &pb.FreeBlock{Page: b.Page, Generation: b.Generation})
	}
	return resp, nil
}

// Info implements pb.ExtentServer.
func (s *Server) Info(ctx context.Context, req *pb.InfoRequest) (*pb.InfoResponse, error) {
	sm, leader, err := s.route(req.ExtentId, req.Forwarded)
	if err != nil {
		return nil, err
	}
	if leader != 0 {
		return forward(ctx, s, req.ExtentId, leader, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.InfoResponse, error) {
			fwd := proto.CloneOf(req)
			fwd.Forwarded = true
			return cl.Info(ctx, fwd)
		})
	}
	if err := s.linearize(ctx, req.ExtentId); err != nil {
		return nil, err
	}
	meta, pending, err := sm.Info()
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	st, _ := s.e.Status(req.ExtentId)
	return &pb.InfoResponse{
		ExtentId: req.ExtentId, Geometry: sm.geo.toProto(), LeaderId: s.self, Term: st.Term,
		Voters: slices.Clone(st.Voters), Learners: slices.Clone(st.Learners), Meta: meta, Pending: pending,
	}, nil
}

// CreateReplica implements pb.ExtentServer: it creates this node's
// replica of an extent, bootstrapping the group with voters, or empty to
// be added by a membership change. Creating an existing replica of the
// same geometry does nothing.
func (s *Server) CreateReplica(ctx context.Context, req *pb.CreateReplicaRequest) (*pb.CreateReplicaResponse, error) {
	g := geometryFromProto(req.GetGeometry())
	desc, err := GroupDescriptor(req.ExtentId, g)
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId, Message: err.Error()})
	}
	if len(req.Voters) > 0 && !slices.Contains(req.Voters, s.self) {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId,
			Message: fmt.Sprintf("node %d is not among the voters %v", s.self, req.Voters)})
	}
	if len(req.Voters) > MaxReplication {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId,
			Message: fmt.Sprintf("%d voters, limit %d", len(req.Voters), MaxReplication)})
	}
	err = s.e.CreateGroup(ctx, desc, req.Voters)
	if errors.Is(err, raftengine.ErrGroupExists) {
		raw, serr := s.e.StateMachine(req.ExtentId)
		if sm, ok := raw.(*StateMachine); serr == nil && ok && sm.geo == g {
			return &pb.CreateReplicaResponse{Existed: true}, nil
		}
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId,
			Message: fmt.Sprintf("node %d already holds group %d with another kind or geometry", s.self, req.ExtentId)})
	}
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	s.log.Info("extent replica created", "extent", req.ExtentId, "voters", req.Voters, "geometry", g.String())
	return &pb.CreateReplicaResponse{}, nil
}

// ChangeReplicas implements pb.ExtentServer: one membership change,
// proposed by this replica, which must lead.
func (s *Server) ChangeReplicas(ctx context.Context, req *pb.ChangeReplicasRequest) (*pb.ChangeReplicasResponse, error) {
	if req.NodeId == 0 {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId, Message: "no node"})
	}
	var err error
	switch req.Op {
	case pb.MembershipOp_MEMBERSHIP_OP_ADD_LEARNER:
		err = s.e.AddLearner(ctx, req.ExtentId, req.NodeId)
	case pb.MembershipOp_MEMBERSHIP_OP_ADD_VOTER:
		err = s.e.AddVoter(ctx, req.ExtentId, req.NodeId)
	case pb.MembershipOp_MEMBERSHIP_OP_REMOVE:
		err = s.e.RemoveReplica(ctx, req.ExtentId, req.NodeId)
	default:
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId, Message: fmt.Sprintf("op %v", req.Op)})
	}
	if err != nil {
		if errors.Is(err, raftengine.ErrConfChangeInProgress) {
			return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
		}
		return nil, s.engineError(req.ExtentId, err, true)
	}
	s.log.Info("extent membership changed", "extent", req.ExtentId, "op", req.Op.String(), "node", req.NodeId)
	return &pb.ChangeReplicasResponse{}, nil
}

// ReplicaStatus implements pb.ExtentServer: this node's replica as it
// sees itself; with progress, on the leader, every replica's progress.
func (s *Server) ReplicaStatus(ctx context.Context, req *pb.ReplicaStatusRequest) (*pb.ReplicaStatusResponse, error) {
	sm, st, err := s.localReplica(req.ExtentId)
	if err != nil {
		return &pb.ReplicaStatusResponse{NodeId: s.self}, nil
	}
	if req.Progress && st.IsLeader() {
		if full, err := s.e.StatusWithProgress(ctx, req.ExtentId); err == nil {
			st = full
		}
	}
	resp := &pb.ReplicaStatusResponse{
		Exists: true, NodeId: s.self, LeaderId: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied,
		LastIndex: st.LastIndex, LastTerm: st.LastTerm,
		Voters: slices.Clone(st.Voters), Learners: slices.Clone(st.Learners), Geometry: sm.geo.toProto(),
	}
	for node, p := range st.Progress {
		resp.Progress = append(resp.Progress, &pb.ReplicaProgress{NodeId: node, Match: p.Match, Snapshot: p.Snapshot, RecentActive: p.RecentActive})
	}
	slices.SortFunc(resp.Progress, func(a, b *pb.ReplicaProgress) int { return int(a.NodeId) - int(b.NodeId) })
	return resp, nil
}

// Recover implements pb.ExtentServer: the operator's repair of an extent
// that lost its quorum (arbor extent recover). This node's replica becomes
// the only voter of the extent's group, keeping every entry it holds
// (raftengine.RecoverAlone); the extent manager then re-replicates it.
// Whatever only the lost replicas held is lost, so the request must say it
// accepts that.
func (s *Server) Recover(ctx context.Context, req *pb.RecoverRequest) (*pb.RecoverResponse, error) {
	if !req.AcceptLoss {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_INVALID_ARGUMENT, ExtentId: req.ExtentId,
			Message: "recovering an extent from one replica loses the writes only the lost replicas held: the request must accept that"})
	}
	if _, _, err := s.localReplica(req.ExtentId); err != nil {
		return nil, err
	}
	rep, err := s.e.RecoverAlone(ctx, req.ExtentId)
	if err != nil {
		return nil, statusError(&pb.Error{Code: pb.Code_CODE_UNAVAILABLE, ExtentId: req.ExtentId, Message: err.Error()})
	}
	s.log.Warn("extent recovered from this replica alone", "extent", req.ExtentId, "removed", rep.Removed,
		"previous_commit", rep.PreviousCommit, "last_index", rep.LastIndex, "term", rep.Term)
	return &pb.RecoverResponse{NodeId: s.self, RemovedVoters: rep.Removed, PreviousCommit: rep.PreviousCommit,
		LastIndex: rep.LastIndex, Term: rep.Term}, nil
}
