package directory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// ErrDecommissioned is returned by NodeAgent.Run when the directory says
// the node is decommissioned: the process must stop serving.
var ErrDecommissioned = errors.New("directory: node is decommissioned")

// AgentDirectory is what a NodeAgent needs of the directory (*Client
// implements it).
type AgentDirectory interface {
	Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error)
	Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error)
}

// AgentConfig configures a NodeAgent.
type AgentConfig struct {
	Directory AgentDirectory
	// Node is what the agent registers: id, addresses, failure domain,
	// disks and roles.
	Node *pb.RegisterRequest
	// Stats, if set, is called before each heartbeat; its figures travel
	// with the heartbeat to the placement heuristics.
	Stats func() *pb.MemberStats
	// OnRegistered, if set, is called after each (re-)registration with
	// the node's record. Authority held under an earlier epoch is void:
	// leases, delegations and TLT positions must be dropped.
	OnRegistered func(node *pb.Node)
	// Interval between heartbeats (default HeartbeatInterval); it must
	// match the directory's DetectorConfig.HeartbeatInterval.
	Interval time.Duration
	Logger   *slog.Logger
}

// NodeAgent keeps one node registered and heartbeating. Every server process
// runs one.
type NodeAgent struct {
	cfg     AgentConfig
	log     *slog.Logger
	epoch   atomic.Uint64
	lastAck atomic.Int64 // unix ns of the send time of the last acknowledged heartbeat
}

// NewNodeAgent validates cfg and returns an agent; Run starts it.
func NewNodeAgent(cfg AgentConfig) (*NodeAgent, error) {
	if cfg.Directory == nil || cfg.Node == nil {
		return nil, errors.New("directory: agent needs a directory and a node")
	}
	if err := checkRegister(cfg.Node); err != nil {
		return nil, fmt.Errorf("directory: agent: %w", err)
	}
	if cfg.Interval == 0 {
		cfg.Interval = HeartbeatInterval
	}
	if cfg.Interval < minHeartbeatInterval || cfg.Interval > maxHeartbeatInterval {
		return nil, fmt.Errorf("directory: agent heartbeat interval %v out of [%v, %v]", cfg.Interval, minHeartbeatInterval, maxHeartbeatInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Node = proto.Clone(cfg.Node).(*pb.RegisterRequest)
	return &NodeAgent{cfg: cfg, log: cfg.Logger.With("component", "directory-agent", "node", cfg.Node.NodeId)}, nil
}

// Epoch returns the node's current epoch (0 before the first registration).
func (a *NodeAgent) Epoch() uint64 { return a.epoch.Load() }

// LastAck returns when the last heartbeat the leader accepted was sent (zero
// before any). A node silent past the directory's dead timeout, measured
// from this moment on its own clock, must consider its authority gone.
func (a *NodeAgent) LastAck() time.Time {
	ns := a.lastAck.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Run registers the node and heartbeats every interval, registering again
// whenever the directory asks, until ctx ends (nil) or the node is
// decommissioned (ErrDecommissioned).
func (a *NodeAgent) Run(ctx context.Context) error {
	if err := a.register(ctx); err != nil {
		return err
	}
	ticker := time.NewTicker(a.cfg.Interval)
	defer ticker.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		req := &pb.HeartbeatRequest{NodeId: a.cfg.Node.NodeId, Epoch: a.epoch.Load()}
		if a.cfg.Stats != nil {
			req.Stats = a.cfg.Stats()
		}
		sent := time.Now()
		hctx, cancel := context.WithTimeout(ctx, a.cfg.Interval)
		resp, err := a.cfg.Directory.Heartbeat(hctx, req)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if CodeOf(err) == pb.ErrorCode_UNKNOWN_NODE {
				a.log.Warn("directory does not know this node; registering again")
				if err := a.register(ctx); err != nil {
					return err
				}
				continue
			}
			failures++
			// One lost heartbeat is normal; a run of them is news.
			if failures == 3 {
				a.log.Warn("heartbeats are failing", "err", err)
			} else {
				a.log.Debug("heartbeat failed", "err", err)
			}
			continue
		}
		if failures >= 3 {
			a.log.Info("heartbeats acknowledged again", "failed", failures)
		}
		failures = 0
		switch resp.Action {
		case pb.HeartbeatAction_HEARTBEAT_ACTION_OK:
			a.lastAck.Store(sent.UnixNano())
		case pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER:
			a.log.Warn("directory asks this node to register again", "reason", resp.Reason, "epoch", req.Epoch)
			if err := a.register(ctx); err != nil {
				return err
			}
		case pb.HeartbeatAction_HEARTBEAT_ACTION_SHUTDOWN:
			a.log.Error("directory says this node is decommissioned", "reason", resp.Reason)
			return ErrDecommissioned
		default:
			a.log.Warn("unknown heartbeat action", "action", resp.Action)
		}
	}
}

// register registers until it succeeds, ctx ends (nil) or the node is
// decommissioned.
func (a *NodeAgent) register(ctx context.Context) error {
	backoff := minRetryBackoff
	for {
		sent := time.Now()
		resp, err := a.cfg.Directory.Register(ctx, a.cfg.Node)
		if err == nil {
			n := resp.Node
			a.epoch.Store(n.Epoch)
			a.lastAck.Store(sent.UnixNano())
			a.log.Info("registered with the directory", "epoch", n.Epoch, "address", n.Address, "roles", n.Roles)
			if a.cfg.OnRegistered != nil {
				a.cfg.OnRegistered(n)
			}
			return nil
		}
		if CodeOf(err) == pb.ErrorCode_DECOMMISSIONED {
			a.log.Error("registration refused: this node is decommissioned")
			return ErrDecommissioned
		}
		if ctx.Err() != nil {
			return nil
		}
		a.log.Warn("registration failed; retrying", "err", err, "backoff", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}
