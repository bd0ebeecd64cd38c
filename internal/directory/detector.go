package directory

import (
	"fmt"
	"time"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// HeartbeatInterval is how often every node heartbeats to the directory
// leader (DESIGN.md §2.2). NodeAgent uses it; the failure detector's
// timeouts are multiples of it.
const HeartbeatInterval = time.Second

// Failure detector defaults and bounds.
const (
	DefaultSuspectTimeout = 3 * time.Second
	DefaultDeadTimeout    = 10 * time.Second
	// minHeartbeatInterval and maxHeartbeatInterval bound a configured
	// heartbeat interval (tests use short ones).
	minHeartbeatInterval = time.Millisecond
	maxHeartbeatInterval = 10 * time.Second
	// suspectHeartbeats is the least suspect timeout in heartbeat
	// intervals: one lost heartbeat must not make a node suspect.
	suspectHeartbeats = 2
	maxDeadTimeout    = 10 * time.Minute
)

// DetectorConfig sets the failure detector's timeouts. Zero fields take the
// defaults: HeartbeatInterval, DefaultDeadTimeout, and a suspect timeout of
// 3/10 of the dead timeout (DefaultSuspectTimeout for the default), at least
// two heartbeat intervals.
type DetectorConfig struct {
	// HeartbeatInterval is how often nodes heartbeat.
	HeartbeatInterval time.Duration
	// SuspectTimeout is the silence after which an alive node is suspect.
	SuspectTimeout time.Duration
	// DeadTimeout is the silence after which a node is dead.
	DeadTimeout time.Duration
}

func (c *DetectorConfig) applyDefaults() error {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = HeartbeatInterval
	}
	if c.HeartbeatInterval < minHeartbeatInterval || c.HeartbeatInterval > maxHeartbeatInterval {
		return fmt.Errorf("directory: heartbeat interval %v out of [%v, %v]", c.HeartbeatInterval, minHeartbeatInterval, maxHeartbeatInterval)
	}
	if c.DeadTimeout == 0 {
		c.DeadTimeout = DefaultDeadTimeout
	}
	if c.SuspectTimeout == 0 {
		c.SuspectTimeout = max(c.DeadTimeout*3/10, suspectHeartbeats*c.HeartbeatInterval)
	}
	if min := suspectHeartbeats * c.HeartbeatInterval; c.SuspectTimeout < min {
		return fmt.Errorf("directory: suspect timeout %v below %d heartbeat intervals (%v)", c.SuspectTimeout, suspectHeartbeats, min)
	}
	if c.DeadTimeout <= c.SuspectTimeout || c.DeadTimeout > maxDeadTimeout {
		return fmt.Errorf("directory: dead timeout %v must exceed the suspect timeout %v and be at most %v (maxDeadTimeout)",
			c.DeadTimeout, c.SuspectTimeout, maxDeadTimeout)
	}
	return nil
}

// Transition is a verdict of the failure detector to propose as a
// SetNodeState command.
type Transition struct {
	NodeID, Epoch uint64
	From, To      pb.NodeState
	// LastHeartbeat is when the detector last heard from the node (or
	// started watching it).
	LastHeartbeat time.Time
}

func (t Transition) String() string {
	return fmt.Sprintf("node %d epoch %d: %s -> %s (last heard %d)", t.NodeID, t.Epoch,
		stateName(t.From), stateName(t.To), t.LastHeartbeat.UnixMilli())
}

// Command returns the SetNodeState command that carries out t.
func (t Transition) Command() *pb.SetNodeState {
	return &pb.SetNodeState{NodeId: t.NodeID, Epoch: t.Epoch, State: t.To, LastHeartbeatUnixMs: t.LastHeartbeat.UnixMilli()}
}

// Detector is the failure detector's deterministic core: it has no clock and
// no goroutines. The directory leader feeds it heartbeats and ticks with the
// time, and the committed node table with Sync; Tick returns the state
// changes to propose. It is not safe for concurrent use.
//
// It keeps, per incarnation (node, epoch), when it last heard from it.
// Silence past SuspectTimeout makes an alive node suspect, past DeadTimeout
// dead; a heartbeat makes a suspect node alive again. A dead node stays dead
// until it registers again (a new incarnation); a decommissioned one is never
// watched. Reset, on becoming leader, starts every node's silence at that
// moment: a new leader knows nothing of earlier heartbeats, so it gives
// every node a full timeout rather than kill it on stale information.
type Detector struct {
	cfg   DetectorConfig
	nodes map[uint64]*watch
}

type watch struct {
	epoch uint64
	// state is the committed state, or the one last proposed by Tick until
	// Sync says otherwise.
	state pb.NodeState
	// lastHeard is the last heartbeat, or when watching started.
	lastHeard time.Time
	// heard is set once a heartbeat of this incarnation has arrived since
	// watching started: only that can make a suspect node alive.
	heard bool
}

// NewDetector returns a detector watching nothing.
func NewDetector(cfg DetectorConfig) (*Detector, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg, nodes: map[uint64]*watch{}}, nil
}

// Config returns the detector's timeouts (defaults filled in).
func (d *Detector) Config() DetectorConfig { return d.cfg }

// Reset forgets everything and starts watching nodes as of now (the grace
// period of a new leader).
func (d *Detector) Reset(now time.Time, nodes []*pb.Node) {
	d.nodes = map[uint64]*watch{}
	d.Sync(now, nodes)
}

// Sync adopts the committed node table. A node or incarnation not watched
// yet is watched from now (its registration counts as hearing from it); a
// watched one takes the committed state; nodes no longer listed are
// forgotten.
func (d *Detector) Sync(now time.Time, nodes []*pb.Node) {
	listed := make(map[uint64]bool, len(nodes))
	for _, n := range nodes {
		listed[n.Id] = true
		w := d.nodes[n.Id]
		if w == nil || w.epoch != n.Epoch {
			d.nodes[n.Id] = &watch{epoch: n.Epoch, state: n.State, lastHeard: now}
			continue
		}
		w.state = n.State
	}
	for id := range d.nodes {
		if !listed[id] {
			delete(d.nodes, id)
		}
	}
}

// Heartbeat records a heartbeat of incarnation epoch of a node. It reports
// false if the detector does not watch that incarnation (not synced yet, or
// a stale epoch); the heartbeat is then ignored.
func (d *Detector) Heartbeat(nodeID, epoch uint64, now time.Time) bool {
	w := d.nodes[nodeID]
	if w == nil || w.epoch != epoch {
		return false
	}
	if now.After(w.lastHeard) {
		w.lastHeard = now
	}
	w.heard = true
	return true
}

// Tick returns the transitions due at now, by node id. It assumes they will
// be committed and does not return them again unless Sync reports another
// state.
func (d *Detector) Tick(now time.Time) []Transition {
	var out []Transition
	for _, id := range sortedKeys(d.nodes) {
		w := d.nodes[id]
		if w.state == pb.NodeState_NODE_STATE_DEAD || w.state == pb.NodeState_NODE_STATE_DECOMMISSIONED {
			continue
		}
		silence := now.Sub(w.lastHeard)
		to := w.state
		switch {
		case silence >= d.cfg.DeadTimeout:
			to = pb.NodeState_NODE_STATE_DEAD
		case silence >= d.cfg.SuspectTimeout:
			to = pb.NodeState_NODE_STATE_SUSPECT
		case w.state == pb.NodeState_NODE_STATE_SUSPECT && w.heard:
			to = pb.NodeState_NODE_STATE_ALIVE
		}
		if to != w.state {
			out = append(out, Transition{NodeID: id, Epoch: w.epoch, From: w.state, To: to, LastHeartbeat: w.lastHeard})
			w.state = to
		}
	}
	return out
}

// heartbeatVerdict tells a heartbeating incarnation what to do, given the
// committed record of its node.
func heartbeatVerdict(n *pb.Node, epoch uint64) (pb.HeartbeatAction, string) {
	switch {
	case n.State == pb.NodeState_NODE_STATE_DECOMMISSIONED:
		return pb.HeartbeatAction_HEARTBEAT_ACTION_SHUTDOWN, fmt.Sprintf("node %d is decommissioned", n.Id)
	case epoch != n.Epoch:
		return pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER, fmt.Sprintf("epoch %d is stale: node %d is at epoch %d", epoch, n.Id, n.Epoch)
	case n.State == pb.NodeState_NODE_STATE_DEAD:
		return pb.HeartbeatAction_HEARTBEAT_ACTION_REREGISTER, fmt.Sprintf("node %d was declared dead", n.Id)
	}
	return pb.HeartbeatAction_HEARTBEAT_ACTION_OK, ""
}

// stateName is the lower-case name of a state, as `arbor status` prints it.
func stateName(s pb.NodeState) string {
	switch s {
	case pb.NodeState_NODE_STATE_ALIVE:
		return "alive"
	case pb.NodeState_NODE_STATE_SUSPECT:
		return "suspect"
	case pb.NodeState_NODE_STATE_DEAD:
		return "dead"
	case pb.NodeState_NODE_STATE_DECOMMISSIONED:
		return "decommissioned"
	}
	return "unknown"
}

// StateName returns the lower-case name of a node state: alive, suspect,
// dead, decommissioned (or unknown).
func StateName(s pb.NodeState) string { return stateName(s) }
