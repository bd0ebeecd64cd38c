package directory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
	"github.com/arbor-storage/arbor/internal/security"
)

// Engine is what the service needs of the replication engine
// (*raftengine.Engine implements it).
type Engine interface {
	// Propose commits cmd to the group's log and returns Apply's result on
	// this node; only the leader accepts it (*raftengine.NotLeaderError).
	Propose(ctx context.Context, groupID uint64, cmd []byte) (any, error)
	// ReadIndex returns once the local state machine reflects every
	// command committed before the call; leader only.
	ReadIndex(ctx context.Context, groupID uint64) error
	Status(groupID uint64) (raftengine.GroupStatus, error)
}

// Service defaults and bounds.
const (
	defaultDetectorTick       = 250 * time.Millisecond
	defaultStatsFlushInterval = 10 * time.Second
	// detectorProposeTimeout bounds one proposal of the detector loop.
	detectorProposeTimeout = 2 * time.Second
)

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// NodeID is this node's id (its replica id in the directory group).
	NodeID uint64
	Engine Engine
	// StateMachine is the directory state machine the engine runs for
	// GroupID on this node.
	StateMachine *StateMachine
	// AddressOf maps a node id to its gRPC address for leader hints. If it
	// is nil or returns "", the directory's own node table is used.
	AddressOf func(nodeID uint64) string
	Detector  DetectorConfig
	// DetectorTick is how often the leader runs the failure detector
	// (default 250 ms or a quarter of the suspect timeout, if less; at most
	// half the suspect timeout).
	DetectorTick time.Duration
	// StatsFlushInterval is how often the leader records the member
	// statistics heartbeats carried (default 10 s).
	StatsFlushInterval time.Duration
	Logger             *slog.Logger
	// Now is the clock (default time.Now); the leader stamps commands with it.
	Now func() time.Time
}

// Service is the directory's gRPC server (directorypb.DirectoryServer).
// Register it with directorypb.RegisterDirectoryServer and run Run for as
// long as the node serves.
type Service struct {
	pb.UnimplementedDirectoryServer

	cfg ServiceConfig
	sm  *StateMachine
	log *slog.Logger

	mu  sync.Mutex // guards det and stats
	det *Detector
	// stats are the latest member statistics from heartbeats, not yet
	// recorded.
	stats map[uint64]*pb.MemberStats

	// Owned by Run.
	leading   bool
	term      uint64
	lastFlush time.Time
}

// NewService validates cfg and returns a service.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.NodeID == 0 || cfg.Engine == nil || cfg.StateMachine == nil {
		return nil, errors.New("directory: service needs a node id, an engine and the state machine")
	}
	if cfg.StatsFlushInterval == 0 {
		cfg.StatsFlushInterval = defaultStatsFlushInterval
	}
	if cfg.StatsFlushInterval < 0 {
		return nil, fmt.Errorf("directory: negative stats flush interval %v", cfg.StatsFlushInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	det, err := NewDetector(cfg.Detector)
	if err != nil {
		return nil, err
	}
	cfg.Detector = det.Config()
	if cfg.DetectorTick == 0 {
		cfg.DetectorTick = min(defaultDetectorTick, cfg.Detector.SuspectTimeout/4)
	}
	if cfg.DetectorTick <= 0 || cfg.DetectorTick > cfg.Detector.SuspectTimeout/2 {
		return nil, fmt.Errorf("directory: detector tick %v out of (0, %v] (half the suspect timeout)", cfg.DetectorTick, cfg.Detector.SuspectTimeout/2)
	}
	return &Service{
		cfg:   cfg,
		sm:    cfg.StateMachine,
		log:   cfg.Logger.With("component", "directory", "node", cfg.NodeID),
		det:   det,
		stats: map[uint64]*pb.MemberStats{},
	}, nil
}

func (s *Service) addressOf(id uint64) string {
	if s.cfg.AddressOf != nil {
		if a := s.cfg.AddressOf(id); a != "" {
			return a
		}
	}
	if n, ok := s.sm.Node(id); ok {
		return n.Address
	}
	return ""
}

// propose stamps cmd with the leader's time, commits it and returns its
// successful result, or a gRPC error.
func (s *Service) propose(ctx context.Context, cmd *pb.Command) (*pb.CommandResult, error) {
	cmd.NowUnixMs = s.cfg.Now().UnixMilli()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if ids := md.Get(requestIDMetadataKey); len(ids) > 0 {
			cmd.RequestId = []byte(ids[0])
		}
	}
	if err := checkStateless(cmd); err != nil {
		return nil, invalidArgument("%v", err)
	}
	data, err := EncodeCommand(cmd)
	if err != nil {
		return nil, invalidArgument("%v", err)
	}
	out, err := s.cfg.Engine.Propose(ctx, GroupID, data)
	if err != nil {
		return nil, s.engineError(err)
	}
	res, ok := out.(*pb.CommandResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "directory: apply returned %T", out)
	}
	if res.Code != pb.ErrorCode_OK {
		return nil, resultError(res)
	}
	return res, nil
}

// linearize makes the local state reflect every committed write (leader
// only), so that the reads after it are linearizable.
func (s *Service) linearize(ctx context.Context) error {
	if err := s.cfg.Engine.ReadIndex(ctx, GroupID); err != nil {
		return s.engineError(err)
	}
	return nil
}

// Run runs the failure detector while this replica leads the directory
// group, until ctx ends. On becoming leader it first catches up with every
// committed command, then gives every node a full timeout (Detector.Reset).
func (s *Service) Run(ctx context.Context) error {
	ticker := time.NewTicker(s.cfg.DetectorTick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			s.detectorStep(ctx)
		}
	}
}

func (s *Service) detectorStep(ctx context.Context) {
	st, err := s.cfg.Engine.Status(GroupID)
	if err != nil || !st.IsLeader() {
		if s.leading {
			s.log.Info("directory leadership lost; failure detector stopped", "term", s.term)
		}
		s.leading = false
		return
	}
	if !s.leading || st.Term != s.term {
		rctx, cancel := context.WithTimeout(ctx, detectorProposeTimeout)
		err := s.cfg.Engine.ReadIndex(rctx, GroupID)
		cancel()
		if err != nil {
			s.log.Debug("new directory leader cannot confirm its state yet", "err", err)
			return
		}
		s.mu.Lock()
		s.det.Reset(s.cfg.Now(), s.sm.Nodes())
		s.stats = map[uint64]*pb.MemberStats{}
		s.mu.Unlock()
		s.leading, s.term, s.lastFlush = true, st.Term, s.cfg.Now()
		s.log.Info("directory leader; failure detector started with a full grace period",
			"term", st.Term, "suspect_after", s.cfg.Detector.SuspectTimeout, "dead_after", s.cfg.Detector.DeadTimeout)
	}
	now := s.cfg.Now()
	s.mu.Lock()
	s.det.Sync(now, s.sm.Nodes())
	transitions := s.det.Tick(now)
	s.mu.Unlock()
	for _, tr := range transitions {
		pctx, cancel := context.WithTimeout(ctx, detectorProposeTimeout)
		_, err := s.propose(pctx, &pb.Command{Op: &pb.Command_SetNodeState{SetNodeState: tr.Command()}})
		cancel()
		level := slog.LevelInfo
		if tr.To == pb.NodeState_NODE_STATE_DEAD {
			level = slog.LevelWarn
		}
		if err != nil {
			s.log.Warn("failure detector transition not recorded", "transition", tr.String(), "err", err)
			continue
		}
		s.log.Log(ctx, level, "node state changed", "node_id", tr.NodeID, "epoch", tr.Epoch,
			"from", stateName(tr.From), "to", stateName(tr.To), "silent_for", now.Sub(tr.LastHeartbeat).Round(time.Millisecond))
	}
	if now.Sub(s.lastFlush) >= s.cfg.StatsFlushInterval {
		s.flushStats(ctx)
		s.lastFlush = now
	}
}

func (s *Service) flushStats(ctx context.Context) {
	s.mu.Lock()
	var batch []*pb.MemberStats
	for _, id := range sortedKeys(s.stats) {
		batch = append(batch, s.stats[id])
	}
	s.stats = map[uint64]*pb.MemberStats{}
	s.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, detectorProposeTimeout)
	defer cancel()
	if _, err := s.propose(pctx, &pb.Command{Op: &pb.Command_UpdateMemberStats{UpdateMemberStats: &pb.UpdateMemberStats{Stats: batch}}}); err != nil {
		s.log.Debug("member statistics not recorded", "err", err)
	}
}

// --- Cluster and nodes ---

func (s *Service) InitCluster(ctx context.Context, req *pb.InitClusterRequest) (*pb.ClusterInfo, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_InitCluster{InitCluster: req}})
	if err != nil {
		return nil, err
	}
	return res.GetCluster(), nil
}

func (s *Service) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	if !req.Local {
		if err := s.linearize(ctx); err != nil {
			return nil, err
		}
	}
	st, err := s.cfg.Engine.Status(GroupID)
	if err != nil {
		return nil, s.engineError(err)
	}
	resp := &pb.StatusResponse{
		LeaderId:     st.Leader,
		Term:         st.Term,
		Voters:       append([]uint64(nil), st.Voters...),
		Learners:     append([]uint64(nil), st.Learners...),
		Nodes:        s.sm.Nodes(),
		Cluster:      s.sm.Cluster(),
		NodeId:       s.cfg.NodeID,
		AppliedIndex: st.Applied,
	}
	if st.Leader != 0 {
		resp.LeaderAddress = s.addressOf(st.Leader)
	}
	return resp, nil
}

func (s *Service) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_RegisterNode{RegisterNode: req}})
	if err != nil {
		return nil, err
	}
	n := res.GetNode()
	s.log.Info("node registered", "node_id", n.Id, "epoch", n.Epoch, "address", n.Address, "roles", n.Roles)
	return &pb.RegisterResponse{Node: n, Cluster: s.sm.Cluster(), HeartbeatIntervalMs: s.cfg.Detector.HeartbeatInterval.Milliseconds()}, nil
}

// Heartbeat is served by the leader from memory: it feeds the failure
// detector and never writes to the log (DESIGN.md §2.2).
func (s *Service) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if req.NodeId == 0 || req.Epoch == 0 {
		return nil, invalidArgument("node_id and epoch are required")
	}
	if st := req.Stats; st != nil {
		if err := checkLoad(st.Load); err != nil {
			return nil, invalidArgument("stats: %v", err)
		}
		if st.FreeBytes > st.CapacityBytes {
			return nil, invalidArgument("stats: free_bytes %d exceeds capacity_bytes %d", st.FreeBytes, st.CapacityBytes)
		}
	}
	gs, err := s.cfg.Engine.Status(GroupID)
	if err != nil {
		return nil, s.engineError(err)
	}
	if !gs.IsLeader() {
		return nil, s.notLeader(gs.Leader)
	}
	n, ok := s.sm.Node(req.NodeId)
	if !ok || n.Epoch < req.Epoch {
		// This leader may not have applied a registration committed under
		// its predecessor yet.
		if err := s.linearize(ctx); err != nil {
			return nil, err
		}
		n, ok = s.sm.Node(req.NodeId)
	}
	if !ok {
		return nil, resultError(failf(pb.ErrorCode_UNKNOWN_NODE, "node %d is not registered; register first", req.NodeId))
	}
	action, reason := heartbeatVerdict(n, req.Epoch)
	if action == pb.HeartbeatAction_HEARTBEAT_ACTION_OK {
		now := s.cfg.Now()
		s.mu.Lock()
		s.det.Heartbeat(n.Id, n.Epoch, now)
		if req.Stats != nil {
			st := clone(req.Stats)
			st.NodeId = n.Id
			s.stats[n.Id] = st
		}
		s.mu.Unlock()
	}
	return &pb.HeartbeatResponse{
		Action:              action,
		Reason:              reason,
		State:               n.State,
		Epoch:               n.Epoch,
		TltVersion:          s.sm.TLTVersion(),
		HeartbeatIntervalMs: s.cfg.Detector.HeartbeatInterval.Milliseconds(),
	}, nil
}

func (s *Service) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	return &pb.ListNodesResponse{Nodes: s.sm.Nodes()}, nil
}

func (s *Service) GetNode(ctx context.Context, req *pb.GetNodeRequest) (*pb.Node, error) {
	if req.NodeId == 0 {
		return nil, invalidArgument("node_id is required")
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	n, ok := s.sm.Node(req.NodeId)
	if !ok {
		return nil, resultError(failf(pb.ErrorCode_UNKNOWN_NODE, "node %d is not registered", req.NodeId))
	}
	return n, nil
}

func (s *Service) Decommission(ctx context.Context, req *pb.DecommissionRequest) (*pb.Node, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_DecommissionNode{DecommissionNode: req}})
	if err != nil {
		return nil, err
	}
	s.log.Warn("node decommissioned", "node_id", req.NodeId)
	return res.GetNode(), nil
}

func (s *Service) GetMemberStats(ctx context.Context, _ *pb.GetMemberStatsRequest) (*pb.GetMemberStatsResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	return &pb.GetMemberStatsResponse{Stats: s.sm.MemberStats()}, nil
}

// --- Leases ---

func (s *Service) GrantLease(ctx context.Context, req *pb.GrantLeaseRequest) (*pb.Lease, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_GrantLease{GrantLease: req}})
	if err != nil {
		return nil, err
	}
	return res.GetLease(), nil
}

func (s *Service) RenewLease(ctx context.Context, req *pb.RenewLeaseRequest) (*pb.Lease, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_RenewLease{RenewLease: req}})
	if err != nil {
		return nil, err
	}
	return res.GetLease(), nil
}

func (s *Service) ReleaseLease(ctx context.Context, req *pb.ReleaseLeaseRequest) (*pb.Lease, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_ReleaseLease{ReleaseLease: req}})
	if err != nil {
		return nil, err
	}
	if req.Force {
		s.log.Warn("lease released by force", "lease", req.Name)
	}
	return res.GetLease(), nil
}

func (s *Service) GetLease(ctx context.Context, req *pb.GetLeaseRequest) (*pb.Lease, error) {
	if err := checkLeaseName(req.Name); err != nil {
		return nil, invalidArgument("%v", err)
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	l, ok := s.sm.Lease(req.Name)
	if !ok {
		return nil, notFound("lease %q does not exist", req.Name)
	}
	return l, nil
}

// --- Configuration table ---

// TenantConfigPrefix is the part of the configuration table tenant t's
// credentials may read and write (the root of its KV key space); the rest
// of the table (the cluster's settings, the tenants, other tenants' keys)
// is refused to them with PermissionDenied.
func TenantConfigPrefix(t string) string { return "tenants/" + t + "/" }

// checkTenantKey refuses a tenant caller a configuration key (or listing
// prefix) outside its own part of the table.
func checkTenantKey(ctx context.Context, key string) error {
	if t, ok := security.CallerTenant(ctx); ok && !strings.HasPrefix(key, TenantConfigPrefix(t)) {
		return security.PermissionDenied("tenant %q reaches only configuration keys under %q", t, TenantConfigPrefix(t))
	}
	return nil
}

func (s *Service) GetConfig(ctx context.Context, req *pb.GetConfigRequest) (*pb.ConfigEntry, error) {
	if err := checkConfigKey(req.Key); err != nil {
		return nil, invalidArgument("%v", err)
	}
	if err := checkTenantKey(ctx, req.Key); err != nil {
		return nil, err
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	e, ok := s.sm.Config(req.Key)
	if !ok {
		return nil, notFound("key %q does not exist", req.Key)
	}
	return e, nil
}

// listLimit clamps a requested page size.
func listLimit(limit uint32) int {
	if limit == 0 || limit > maxListEntries {
		return maxListEntries
	}
	return int(limit)
}

func (s *Service) ListConfig(ctx context.Context, req *pb.ListConfigRequest) (*pb.ListConfigResponse, error) {
	if len(req.Prefix) > maxConfigKeyBytes || len(req.StartAfter) > maxConfigKeyBytes {
		return nil, invalidArgument("prefix and start_after are limited to %d bytes (maxConfigKeyBytes)", maxConfigKeyBytes)
	}
	if err := checkTenantKey(ctx, req.Prefix); err != nil {
		return nil, err
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	entries, more := s.sm.ListConfig(req.Prefix, req.StartAfter, listLimit(req.Limit))
	return &pb.ListConfigResponse{Entries: entries, More: more}, nil
}

func (s *Service) PutConfig(ctx context.Context, req *pb.PutConfigRequest) (*pb.ConfigEntry, error) {
	if err := checkTenantKey(ctx, req.Key); err != nil {
		return nil, err
	}
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_PutConfig{PutConfig: req}})
	if err != nil {
		return nil, err
	}
	return res.GetConfigEntry(), nil
}

func (s *Service) DeleteConfig(ctx context.Context, req *pb.DeleteConfigRequest) (*pb.DeleteConfigResponse, error) {
	if err := checkTenantKey(ctx, req.Key); err != nil {
		return nil, err
	}
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_DeleteConfig{DeleteConfig: req}})
	if err != nil {
		return nil, err
	}
	return &pb.DeleteConfigResponse{Version: res.GetVersion()}, nil
}

// --- File systems ---

func (s *Service) CreateFileSystem(ctx context.Context, req *pb.CreateFileSystemRequest) (*pb.FileSystem, error) {
	if req.Tenant != "" {
		if err := security.CheckName(req.Tenant); err != nil {
			return nil, invalidArgument("tenant: %v", err)
		}
	}
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_CreateFileSystem{CreateFileSystem: req}})
	if err != nil {
		return nil, err
	}
	return res.GetFileSystem(), nil
}

func (s *Service) DeleteFileSystem(ctx context.Context, req *pb.DeleteFileSystemRequest) (*pb.FileSystem, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_DeleteFileSystem{DeleteFileSystem: req}})
	if err != nil {
		return nil, err
	}
	return res.GetFileSystem(), nil
}

func (s *Service) GetFileSystem(ctx context.Context, req *pb.GetFileSystemRequest) (*pb.FileSystem, error) {
	if req.Number == 0 && req.Name == "" {
		return nil, invalidArgument("number or name is required")
	}
	if len(req.Name) > MaxFileSystemNameBytes {
		return nil, invalidArgument("name is %d bytes, limit %d (maxFileSystemNameBytes)", len(req.Name), MaxFileSystemNameBytes)
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	var f *pb.FileSystem
	var ok bool
	if req.Number != 0 {
		f, ok = s.sm.FileSystem(req.Number)
	} else {
		f, ok = s.sm.FileSystemByName(req.Name)
	}
	if !ok {
		return nil, notFound("file system %d %q does not exist", req.Number, req.Name)
	}
	if t, ok := security.CallerTenant(ctx); ok && f.GetTenant() != t {
		return nil, security.PermissionDenied("file system %d %q is not tenant %q's", f.GetNumber(), f.GetName(), t)
	}
	return f, nil
}

// ListFileSystems lists every file system, or a tenant's own only.
func (s *Service) ListFileSystems(ctx context.Context, _ *pb.ListFileSystemsRequest) (*pb.ListFileSystemsResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	fss := s.sm.FileSystems()
	if t, ok := security.CallerTenant(ctx); ok {
		fss = slices.DeleteFunc(fss, func(f *pb.FileSystem) bool { return f.GetTenant() != t })
	}
	return &pb.ListFileSystemsResponse{FileSystems: fss}, nil
}

func (s *Service) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.Snapshot, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_CreateSnapshot{CreateSnapshot: req}})
	if err != nil {
		return nil, err
	}
	return res.GetSnapshot(), nil
}

func (s *Service) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*pb.FileSystem, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_DeleteSnapshot{DeleteSnapshot: req}})
	if err != nil {
		return nil, err
	}
	return res.GetFileSystem(), nil
}

// --- TLT ---

func (s *Service) GetTLT(ctx context.Context, _ *pb.GetTLTRequest) (*pb.TLT, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	t := s.sm.TLT()
	if t == nil {
		return nil, notFound("no TLT is installed")
	}
	return t, nil
}

func (s *Service) InstallTLT(ctx context.Context, req *pb.InstallTLTRequest) (*pb.TLTVersion, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_InstallTlt{InstallTlt: req}})
	if err != nil {
		return nil, err
	}
	return res.GetTlt(), nil
}

func (s *Service) UpdateTLTRows(ctx context.Context, req *pb.UpdateTLTRowsRequest) (*pb.TLTVersion, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_UpdateTltRows{UpdateTltRows: req}})
	if err != nil {
		return nil, err
	}
	return res.GetTlt(), nil
}

// --- Extents ---

func (s *Service) CreateExtent(ctx context.Context, req *pb.CreateExtentRequest) (*pb.Extent, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_CreateExtent{CreateExtent: req}})
	if err != nil {
		return nil, err
	}
	return res.GetExtent(), nil
}

func (s *Service) GetExtent(ctx context.Context, req *pb.GetExtentRequest) (*pb.Extent, error) {
	if req.ExtentId == 0 {
		return nil, invalidArgument("extent_id is required")
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	e, ok := s.sm.Extent(req.ExtentId)
	if !ok {
		return nil, notFound("extent %d does not exist", req.ExtentId)
	}
	return e, nil
}

func (s *Service) ListExtents(ctx context.Context, req *pb.ListExtentsRequest) (*pb.ListExtentsResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	extents, more := s.sm.Extents(req.StartAfter, listLimit(req.Limit))
	return &pb.ListExtentsResponse{Extents: extents, More: more}, nil
}

func (s *Service) ChangeExtentReplicas(ctx context.Context, req *pb.ChangeExtentReplicasRequest) (*pb.Extent, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_ChangeExtentReplicas{ChangeExtentReplicas: req}})
	if err != nil {
		return nil, err
	}
	return res.GetExtent(), nil
}

// --- Delegation map ---

func (s *Service) GetDelegationMap(ctx context.Context, req *pb.GetDelegationMapRequest) (*pb.DelegationMap, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	m := s.sm.DelegationMap(req.FileSystem)
	if t, ok := security.CallerTenant(ctx); ok {
		// A tenant sees the tables of its own file systems only.
		owned := map[uint64]bool{}
		for _, f := range s.sm.FileSystems() {
			owned[f.GetNumber()] = f.GetTenant() == t
		}
		m.Delegations = slices.DeleteFunc(m.Delegations, func(d *pb.Delegation) bool { return !owned[d.GetFileSystem()] })
	}
	return m, nil
}

func (s *Service) SetDelegation(ctx context.Context, req *pb.SetDelegationRequest) (*pb.Delegation, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_SetDelegation{SetDelegation: req}})
	if err != nil {
		return nil, err
	}
	return res.GetDelegation(), nil
}

func (s *Service) RenewDelegation(ctx context.Context, req *pb.RenewDelegationRequest) (*pb.Delegation, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_RenewDelegation{RenewDelegation: req}})
	if err != nil {
		return nil, err
	}
	return res.GetDelegation(), nil
}

func (s *Service) RenewDelegations(ctx context.Context, req *pb.RenewDelegationsRequest) (*pb.RenewDelegationsResponse, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_RenewDelegations{RenewDelegations: req}})
	if err != nil {
		return nil, err
	}
	return res.GetRenewals(), nil
}

func (s *Service) SplitDelegation(ctx context.Context, req *pb.SplitDelegationRequest) (*pb.DelegationPair, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_SplitDelegation{SplitDelegation: req}})
	if err != nil {
		return nil, err
	}
	return res.GetDelegationPair(), nil
}

func (s *Service) DeleteDelegation(ctx context.Context, req *pb.DeleteDelegationRequest) (*pb.DeleteDelegationResponse, error) {
	res, err := s.propose(ctx, &pb.Command{Op: &pb.Command_DeleteDelegation{DeleteDelegation: req}})
	if err != nil {
		return nil, err
	}
	return &pb.DeleteDelegationResponse{Version: res.GetVersion()}, nil
}
