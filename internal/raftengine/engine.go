package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// Limits and defaults. Every limit is validated in Config.validate.
const (
	DefaultTickInterval   = 100 * time.Millisecond
	DefaultElectionTicks  = 10
	DefaultHeartbeatTicks = 2
	DefaultWorkers        = 8
	// DefaultMaxCommandBytes bounds one proposed command.
	DefaultMaxCommandBytes = 8 << 20
	// DefaultMaxMessageBytes bounds the entries in one append message.
	DefaultMaxMessageBytes = 1 << 20
	DefaultMaxInflightMsgs = 256
	// DefaultLogRetainEntries and DefaultLogRetainBytes trigger log
	// truncation.
	DefaultLogRetainEntries  = 4096
	DefaultLogRetainBytes    = 64 << 20
	DefaultSnapshotChunk     = 1 << 20
	DefaultSnapshotTimeout   = 10 * time.Minute
	DefaultSnapshotsInFlight = 4
	// keepaliveTicks is how often a node tells its peers it is up.
	keepaliveTicks = 3
	// diskCheckInterval is how often the free space is checked
	// (diskfull.go).
	diskCheckInterval = time.Second

	maxCommandBytesLimit = 64 << 20
	maxWorkers           = 1024
	// initialIndex and initialTerm are where the log of a bootstrapped group
	// starts: every initial voter writes the same starting point, so they
	// agree on the log before the first election.
	initialIndex = 5
	initialTerm  = 5
)

// Config configures an Engine. Zero values take the defaults above.
type Config struct {
	NodeID    uint64
	Store     *Store
	Transport Transport
	Factory   Factory
	Logger    *slog.Logger

	TickInterval   time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// Workers is how many goroutines run the groups of one scheduler
	// round in parallel (round.go). All groups of a round share one
	// synced write whatever their number, so workers only spread the CPU
	// work (raft steps, encoding, applying); a few more than the cores
	// cover state machines that wait on reads.
	Workers            int
	MaxCommandBytes    int
	MaxMessageBytes    int
	MaxInflightMsgs    int
	LogRetainEntries   int
	LogRetainBytes     int
	SnapshotChunkBytes int
	SnapshotTimeout    time.Duration
	SnapshotsInFlight  int
	// LivenessTimeout is how long a peer node may be silent before its
	// replicas count as down (see quiesce.go). Default: two election
	// timeouts.
	LivenessTimeout time.Duration
	// DisableLeaseReads makes every ReadIndex a heartbeat round (lease.go).
	DisableLeaseReads bool
	// MaxClockDrift bounds how much faster or slower than real time any
	// node's clock may run, as a fraction; leases are shortened by it
	// (lease.go). Default DefaultMaxClockDrift.
	MaxClockDrift float64

	// leaseOverride, if set (tests only), replaces the lease the clock
	// bounds allow: a test shows what a too long lease breaks.
	leaseOverride time.Duration

	// OnLeaderChange is called from a group's worker whenever a local
	// replica sees a new leader (0: none). It must not block.
	OnLeaderChange func(groupID, leader, term uint64)
}

func (c *Config) validate() error {
	if c.NodeID == 0 {
		return errors.New("raftengine: NodeID must be set")
	}
	if c.Store == nil || c.Transport == nil || c.Factory == nil {
		return errors.New("raftengine: Store, Transport and Factory must be set")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	setDefault := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.TickInterval == 0 {
		c.TickInterval = DefaultTickInterval
	}
	setDefault(&c.ElectionTicks, DefaultElectionTicks)
	setDefault(&c.HeartbeatTicks, DefaultHeartbeatTicks)
	setDefault(&c.Workers, DefaultWorkers)
	setDefault(&c.MaxCommandBytes, DefaultMaxCommandBytes)
	setDefault(&c.MaxMessageBytes, DefaultMaxMessageBytes)
	setDefault(&c.MaxInflightMsgs, DefaultMaxInflightMsgs)
	setDefault(&c.LogRetainEntries, DefaultLogRetainEntries)
	setDefault(&c.LogRetainBytes, DefaultLogRetainBytes)
	setDefault(&c.SnapshotChunkBytes, DefaultSnapshotChunk)
	setDefault(&c.SnapshotsInFlight, DefaultSnapshotsInFlight)
	if c.SnapshotTimeout == 0 {
		c.SnapshotTimeout = DefaultSnapshotTimeout
	}
	if c.LivenessTimeout == 0 {
		c.LivenessTimeout = 2 * time.Duration(c.ElectionTicks) * c.TickInterval
	}
	if c.MaxClockDrift == 0 {
		c.MaxClockDrift = DefaultMaxClockDrift
	}
	switch {
	case c.TickInterval < time.Millisecond:
		return fmt.Errorf("raftengine: TickInterval %v below 1ms", c.TickInterval)
	case c.HeartbeatTicks < 1 || c.ElectionTicks <= c.HeartbeatTicks:
		return fmt.Errorf("raftengine: need 1 <= HeartbeatTicks (%d) < ElectionTicks (%d)", c.HeartbeatTicks, c.ElectionTicks)
	case c.Workers < 1 || c.Workers > maxWorkers:
		return fmt.Errorf("raftengine: Workers %d outside [1, %d]", c.Workers, maxWorkers)
	case c.MaxCommandBytes < 1 || c.MaxCommandBytes > maxCommandBytesLimit:
		return fmt.Errorf("raftengine: MaxCommandBytes %d outside [1, %d]", c.MaxCommandBytes, maxCommandBytesLimit)
	case c.LogRetainEntries < 8:
		return fmt.Errorf("raftengine: LogRetainEntries %d below 8", c.LogRetainEntries)
	case c.MaxClockDrift < 0 || c.MaxClockDrift >= 0.5:
		return fmt.Errorf("raftengine: MaxClockDrift %v outside [0, 0.5)", c.MaxClockDrift)
	case c.LivenessTimeout <= c.TickInterval:
		return fmt.Errorf("raftengine: LivenessTimeout %v must exceed TickInterval", c.LivenessTimeout)
	}
	return nil
}

// Engine hosts this node's replicas of many raft groups. See doc.go.
type Engine struct {
	cfg   Config
	store *Store
	db    *pebble.DB
	log   *slog.Logger
	sched *scheduler

	mu     sync.RWMutex
	groups map[uint64]*group

	nextID        atomic.Uint64
	snapshotSeq   atomic.Uint64
	snapshotSlots chan struct{}

	liveMu sync.Mutex
	live   map[uint64]time.Time
	start  time.Time

	// lease is how long a completed ReadIndex round lets the leader answer
	// reads alone (lease.go); 0: never.
	lease time.Duration
	// voteQuiet is how long after its start the engine refuses votes (an
	// election timeout, if leases are on; lease.go).
	voteQuiet time.Duration
	// leaseHook, if set (tests only), runs after a read found the lease
	// valid and before it returns, as a pause of the leader would.
	leaseHook atomic.Pointer[func()]

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started atomic.Bool
	stopped atomic.Bool

	metrics engineMetrics

	// roundHook, if set (tests only), is called by every round that has
	// Readies, right before its batch is committed (committed false) and
	// right after (true).
	roundHook atomic.Pointer[func(committed bool)]
}

type engineMetrics struct {
	proposals, proposalsDropped, applied               atomic.Uint64
	readyBatches, syncedWrites, syncedReadies          atomic.Uint64
	rounds, roundSyncs                                 atomic.Uint64
	messagesSent, messagesReceived, messagesDropped    atomic.Uint64
	snapshotsSent, snapshotsApplied, snapshotBytesSent atomic.Uint64
	leaderChanges                                      atomic.Uint64
	leaseReads, readRounds                             atomic.Uint64
}

// Open reopens every replica stored on the node. Call Start to run them.
func Open(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg:           cfg,
		store:         cfg.Store,
		db:            cfg.Store.DB,
		log:           cfg.Logger.With("node", cfg.NodeID),
		groups:        map[uint64]*group{},
		snapshotSlots: make(chan struct{}, cfg.SnapshotsInFlight),
		live:          map[uint64]time.Time{},
		start:         time.Now(),
		lease:         cfg.leaseDuration(),
		voteQuiet:     cfg.voteQuiet(),
		ctx:           ctx,
		cancel:        cancel,
	}
	e.nextID.Store(uint64(time.Now().UnixNano()))
	descs, err := e.loadDescriptors()
	if err != nil {
		cancel()
		return nil, err
	}
	for _, d := range descs {
		g, err := e.openGroup(d)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("open group %d: %w", d.GroupID, err)
		}
		e.groups[d.GroupID] = g
	}
	e.log.Info("engine opened", "groups", len(e.groups))
	return e, nil
}

func (e *Engine) loadDescriptors() ([]GroupDescriptor, error) {
	iter, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDescriptor}, UpperBound: []byte{prefixDescriptor + 1}})
	if err != nil {
		return nil, err
	}
	defer iter.Close()
	var out []GroupDescriptor
	for valid := iter.First(); valid; valid = iter.Next() {
		var d enginepb.GroupDescriptor
		if err := proto.Unmarshal(iter.Value(), &d); err != nil {
			return nil, fmt.Errorf("decode group descriptor %x: %w", iter.Key(), err)
		}
		out = append(out, GroupDescriptor{GroupID: d.GetGroupId(), Kind: d.GetKind(), Params: d.GetParams()})
	}
	return out, iter.Error()
}

func (e *Engine) openGroup(desc GroupDescriptor) (*group, error) {
	var ap enginepb.AppliedState
	if err := getProto(e.db, appliedKey(desc.GroupID), &ap); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("load applied state: %w", err)
	}
	store, err := loadLogStore(e.db, desc.GroupID, &ap)
	if err != nil {
		return nil, err
	}
	sm, err := e.cfg.Factory(desc)
	if err != nil {
		return nil, fmt.Errorf("build %q state machine: %w", desc.Kind, err)
	}
	if err := sm.Load(prefixReader{r: e.db, prefix: dataPrefix(desc.GroupID)}); err != nil {
		return nil, fmt.Errorf("load %q state machine: %w", desc.Kind, err)
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        e.cfg.NodeID,
		ElectionTick:              e.cfg.ElectionTicks,
		HeartbeatTick:             e.cfg.HeartbeatTicks,
		Storage:                   store,
		Applied:                   ap.GetIndex(),
		MaxSizePerMsg:             uint64(e.cfg.MaxMessageBytes),
		MaxCommittedSizePerReady:  uint64(4 * e.cfg.MaxCommandBytes),
		MaxUncommittedEntriesSize: uint64(8 * e.cfg.MaxCommandBytes),
		MaxInflightMsgs:           e.cfg.MaxInflightMsgs,
		CheckQuorum:               true,
		PreVote:                   true,
		StepDownOnRemoval:         true,
		// Only leaders take proposals (invariant 5). A follower must refuse
		// one rather than forward it: a forwarded proposal may commit while
		// this replica reports it dropped.
		DisableProposalForwarding: true,
		Logger:                    raftLogger{e.log.With("group", desc.GroupID)},
	})
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	g := &group{
		e:            e,
		id:           desc.GroupID,
		desc:         desc,
		sm:           sm,
		rn:           rn,
		store:        store,
		applied:      ap.GetIndex(),
		appliedTerm:  ap.GetTerm(),
		confState:    store.confState,
		term:         store.hardState.GetTerm(),
		proposals:    map[uint64]*proposal{},
		snapshotsOut: map[uint64]uint64{},
	}
	g.publishStatus()
	return g, nil
}

// Start runs the engine: its workers, its ticker, and its transport's
// incoming traffic. It returns at once; Stop ends it.
func (e *Engine) Start() error {
	if e.started.Swap(true) {
		return errors.New("raftengine: already started")
	}
	e.sched = newScheduler(e.processRound)
	e.cfg.Transport.Listen(e)
	e.wg.Add(2)
	go e.tickLoop()
	go e.diskLoop()
	e.mu.RLock()
	gids := make([]uint64, 0, len(e.groups))
	for gid := range e.groups {
		gids = append(gids, gid)
	}
	e.mu.RUnlock()
	e.sched.enqueueAll(gids)
	return nil
}

// Stop stops every replica. Pending calls fail with ErrStopped. The store
// is left open: its owner closes it.
func (e *Engine) Stop() {
	if e.stopped.Swap(true) {
		return
	}
	e.cancel()
	e.mu.RLock()
	for _, g := range e.groups {
		g.stopped.Store(true)
	}
	e.mu.RUnlock()
	if e.sched != nil {
		// Let the workers fail whatever is pending, then stop them.
		e.mu.RLock()
		for gid := range e.groups {
			e.sched.enqueue(gid)
		}
		e.mu.RUnlock()
		e.sched.stop()
	}
	e.wg.Wait()
	e.mu.RLock()
	for _, g := range e.groups {
		g.failInbox(g.takeInbox(), ErrStopped)
	}
	e.mu.RUnlock()
	e.log.Info("engine stopped")
}

func (e *Engine) group(gid uint64) *group {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.groups[gid]
}

func (e *Engine) liveGroup(gid uint64) (*group, error) {
	if e.stopped.Load() {
		return nil, ErrStopped
	}
	g := e.group(gid)
	if g == nil {
		return nil, fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
	}
	if g.stopped.Load() {
		return nil, fmt.Errorf("group %d: %w", gid, ErrStopped)
	}
	return g, nil
}

// CreateGroup creates the local replica of a group. With voters, it
// bootstraps a new group whose initial members are voters (every one of
// them must be created the same way, and this node must be one). Without
// voters, it creates an empty replica that waits to be added to an existing
// group by a membership change, and receives its state by snapshot.
func (e *Engine) CreateGroup(ctx context.Context, desc GroupDescriptor, voters []uint64) error {
	if desc.GroupID == 0 {
		return errors.New("raftengine: group id 0 is reserved")
	}
	if desc.Kind == "" {
		return errors.New("raftengine: group kind must be set")
	}
	if len(voters) > 0 && !slices.Contains(voters, e.cfg.NodeID) {
		return fmt.Errorf("raftengine: bootstrapping group %d on node %d, which is not among its voters %v", desc.GroupID, e.cfg.NodeID, voters)
	}
	if e.stopped.Load() {
		return ErrStopped
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.groups[desc.GroupID] != nil {
		return fmt.Errorf("group %d: %w", desc.GroupID, ErrGroupExists)
	}
	b := e.db.NewBatch()
	defer b.Close()
	if err := setProto(b, descriptorKey(desc.GroupID), &enginepb.GroupDescriptor{
		GroupId: desc.GroupID, Kind: desc.Kind, Params: desc.Params,
	}); err != nil {
		return err
	}
	hs := &raftpb.HardState{}
	var tomb enginepb.TruncatedState
	if err := getProto(e.db, tombstoneKey(desc.GroupID), &tomb); err == nil {
		// A replica of this group lived here before: never vote again in
		// a term it may already have voted in.
		hs.Term = proto.Uint64(tomb.GetTerm())
	}
	if len(voters) > 0 {
		cs, err := proto.Marshal(&raftpb.ConfState{Voters: slices.Clone(voters)})
		if err != nil {
			return err
		}
		if err := setProto(b, truncatedKey(desc.GroupID), &enginepb.TruncatedState{Index: initialIndex, Term: initialTerm}); err != nil {
			return err
		}
		if err := setProto(b, appliedKey(desc.GroupID), &enginepb.AppliedState{Index: initialIndex, Term: initialTerm, ConfState: cs}); err != nil {
			return err
		}
		hs.Term = proto.Uint64(max(hs.GetTerm(), initialTerm))
		hs.Commit = proto.Uint64(initialIndex)
	}
	if err := setProto(b, hardStateKey(desc.GroupID), hs); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("create group %d: %w", desc.GroupID, err)
	}
	g, err := e.openGroup(desc)
	if err != nil {
		return fmt.Errorf("open new group %d: %w", desc.GroupID, err)
	}
	e.groups[desc.GroupID] = g
	if e.sched != nil {
		e.sched.enqueue(desc.GroupID)
	}
	e.log.Info("group created", "group", desc.GroupID, "kind", desc.Kind, "voters", voters)
	return nil
}

// RemoveGroup destroys the local replica of a group: its log, its state and
// its descriptor. It remembers the replica's term so that a later replica of
// the same group on this node never votes twice in one term. Removing a
// replica from the group's membership is a separate step
// (ChangeMembership); a replica removed from the membership destroys itself.
func (e *Engine) RemoveGroup(ctx context.Context, gid uint64) error {
	e.mu.Lock()
	g := e.groups[gid]
	if g == nil {
		e.mu.Unlock()
		return fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
	}
	delete(e.groups, gid)
	e.mu.Unlock()
	g.stopped.Store(true)
	// Wait for a worker that may be processing the group to finish.
	if e.sched != nil {
		e.sched.waitIdle(gid)
	}
	g.failInbox(g.takeInbox(), ErrGroupNotFound)
	for _, p := range g.proposals {
		p.finish(nil, ErrGroupNotFound)
	}
	b := e.db.NewBatch()
	defer b.Close()
	rs, re := raftSpan(gid)
	ss, se := stateSpan(gid)
	for _, err := range []error{
		b.DeleteRange(rs, re, nil),
		b.DeleteRange(ss, se, nil),
		b.Delete(descriptorKey(gid), nil),
		setProto(b, tombstoneKey(gid), &enginepb.TruncatedState{Term: g.store.hardState.GetTerm()}),
	} {
		if err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("remove group %d: %w", gid, err)
	}
	e.log.Info("group replica removed", "group", gid)
	return nil
}

// destroyAsync removes a replica that applied its own removal from the
// group. It runs off the worker, which RemoveGroup waits for.
func (e *Engine) destroyAsync(gid uint64) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := e.RemoveGroup(e.ctx, gid); err != nil && !errors.Is(err, ErrGroupNotFound) {
			e.log.Error("remove replica after its removal from the group", "group", gid, "err", err)
		}
	}()
}

// Propose replicates cmd through the group's log and returns the result of
// applying it on this node. Only the leader accepts proposals; others
// return *NotLeaderError. If ctx ends first the outcome is unknown: the
// command may still be applied.
func (e *Engine) Propose(ctx context.Context, gid uint64, cmd []byte) (any, error) {
	if len(cmd) > e.cfg.MaxCommandBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(cmd), e.cfg.MaxCommandBytes)
	}
	return e.propose(ctx, gid, &proposal{cmd: cmd})
}

// ChangeMembership proposes a membership change and waits until it is
// applied on this node. A new replica must first be created on its node
// (CreateGroup without voters); add it as a learner, let it catch up, then
// promote it. Only one change may be in flight per group.
func (e *Engine) ChangeMembership(ctx context.Context, gid uint64, cc *raftpb.ConfChangeV2) error {
	_, err := e.propose(ctx, gid, &proposal{cc: cc})
	return err
}

// AddLearner, AddVoter and RemoveReplica are the common membership changes.
func (e *Engine) AddLearner(ctx context.Context, gid, node uint64) error {
	return e.ChangeMembership(ctx, gid, singleChange(raftpb.ConfChangeType_ConfChangeAddLearnerNode, node))
}

// AddVoter adds node as a voter, or promotes it if it is a learner.
func (e *Engine) AddVoter(ctx context.Context, gid, node uint64) error {
	return e.ChangeMembership(ctx, gid, singleChange(raftpb.ConfChangeType_ConfChangeAddNode, node))
}

// RemoveReplica removes node from the group's membership.
func (e *Engine) RemoveReplica(ctx context.Context, gid, node uint64) error {
	return e.ChangeMembership(ctx, gid, singleChange(raftpb.ConfChangeType_ConfChangeRemoveNode, node))
}

func singleChange(t raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeV2 {
	return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: t.Enum(), NodeId: proto.Uint64(node)}}}
}

func (e *Engine) propose(ctx context.Context, gid uint64, p *proposal) (any, error) {
	g, err := e.liveGroup(gid)
	if err != nil {
		return nil, err
	}
	// A replica that last saw another node lead refuses at once, rather
	// than after waiting for a round (and its fsync) to ask raft. Only a
	// replica that believes it leads, or knows no leader, asks raft, which
	// alone decides whether to accept; a refusal here never reaches raft,
	// so it is safe whatever raft's state, at worst naming the leader of a
	// moment ago.
	if st := g.status.Load(); st.Leader != 0 && st.Leader != e.cfg.NodeID {
		return nil, &NotLeaderError{GroupID: gid, Leader: st.Leader}
	}
	if e.store.Full() {
		return nil, fmt.Errorf("group %d on node %d: %w", gid, e.cfg.NodeID, ErrDiskFull)
	}
	p.id = e.nextID.Add(1)
	p.done = make(chan proposalResult, 1)
	if !g.enqueue(func(in *inbox) { in.proposals = append(in.proposals, p) }) {
		return nil, ErrStopped
	}
	select {
	case r := <-p.done:
		return r.result, r.err
	case <-ctx.Done():
		g.enqueue(func(in *inbox) { in.canceled = append(in.canceled, p.id) })
		return nil, ctx.Err()
	}
}

// ReadIndex returns once the local state machine reflects every command
// committed before the call: a read of it then is linearizable. Only the
// leader serves it: from its lease if it holds one (lease.go), else after
// a heartbeat round confirms the leadership (raft's ReadIndex).
func (e *Engine) ReadIndex(ctx context.Context, gid uint64) error {
	g, err := e.liveGroup(gid)
	if err != nil {
		return err
	}
	if e.leaseRead(g) {
		return nil
	}
	return e.readIndexRound(ctx, g)
}

// readIndexRound is ReadIndex by a heartbeat round; its completion
// extends the leader's lease.
func (e *Engine) readIndexRound(ctx context.Context, g *group) error {
	e.metrics.readRounds.Add(1)
	r := &readRequest{ctx: binary.BigEndian.AppendUint64(nil, e.nextID.Add(1)), done: make(chan error, 1)}
	if !g.enqueue(func(in *inbox) { in.reads = append(in.reads, r) }) {
		return ErrStopped
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TransferLeadership hands the group's leadership from this replica, which
// must be the leader (else *NotLeaderError), to node to, and waits until
// this replica sees it happen. It fails if leadership goes elsewhere.
func (e *Engine) TransferLeadership(ctx context.Context, gid, to uint64) error {
	g, err := e.liveGroup(gid)
	if err != nil {
		return err
	}
	st := g.status.Load()
	if st.Leader == to {
		return nil
	}
	if !st.IsLeader() {
		return &NotLeaderError{GroupID: gid, Leader: st.Leader}
	}
	retry := time.Duration(e.cfg.ElectionTicks) * e.cfg.TickInterval
	tick := time.NewTicker(e.cfg.TickInterval)
	defer tick.Stop()
	var asked time.Time
	for {
		st := g.status.Load()
		switch {
		case st.Leader == to:
			return nil
		case st.Leader != 0 && st.Leader != e.cfg.NodeID:
			return fmt.Errorf("transfer leadership of group %d to node %d: node %d took it", gid, to, st.Leader)
		case st.Leader == e.cfg.NodeID && time.Since(asked) > retry:
			// Raft abandons a transfer after an election timeout; ask again.
			g.enqueue(func(in *inbox) { in.transfers = append(in.transfers, to) })
			asked = time.Now()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("transfer leadership of group %d to node %d: %w", gid, to, ctx.Err())
		}
	}
}

// Status returns the last published status of the local replica, without
// per-replica progress.
func (e *Engine) Status(gid uint64) (GroupStatus, error) {
	g := e.group(gid)
	if g == nil {
		return GroupStatus{}, fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
	}
	return *g.status.Load(), nil
}

// StatusWithProgress is Status plus, on the leader, each replica's progress.
func (e *Engine) StatusWithProgress(ctx context.Context, gid uint64) (GroupStatus, error) {
	g, err := e.liveGroup(gid)
	if err != nil {
		return GroupStatus{}, err
	}
	ch := make(chan GroupStatus, 1)
	if !g.enqueue(func(in *inbox) { in.progress = append(in.progress, ch) }) {
		return GroupStatus{}, ErrStopped
	}
	select {
	case st := <-ch:
		return st, nil
	case <-ctx.Done():
		return GroupStatus{}, ctx.Err()
	}
}

// StateMachine returns the state machine of the local replica.
func (e *Engine) StateMachine(gid uint64) (StateMachine, error) {
	g := e.group(gid)
	if g == nil {
		return nil, fmt.Errorf("group %d: %w", gid, ErrGroupNotFound)
	}
	return g.sm, nil
}

// Groups lists the local replicas, in order.
func (e *Engine) Groups() []uint64 {
	e.mu.RLock()
	out := make([]uint64, 0, len(e.groups))
	for gid := range e.groups {
		out = append(out, gid)
	}
	e.mu.RUnlock()
	slices.Sort(out)
	return out
}

// NodeID returns the engine's node id.
func (e *Engine) NodeID() uint64 { return e.cfg.NodeID }

// Metrics returns a snapshot of the engine's counters.
func (e *Engine) Metrics() Metrics {
	m := Metrics{
		Proposals:         e.metrics.proposals.Load(),
		ProposalsDropped:  e.metrics.proposalsDropped.Load(),
		Applied:           e.metrics.applied.Load(),
		ReadyBatches:      e.metrics.readyBatches.Load(),
		SyncedWrites:      e.metrics.syncedWrites.Load(),
		SyncedReadies:     e.metrics.syncedReadies.Load(),
		Rounds:            e.metrics.rounds.Load(),
		RoundSyncs:        e.metrics.roundSyncs.Load(),
		MessagesSent:      e.metrics.messagesSent.Load(),
		MessagesReceived:  e.metrics.messagesReceived.Load(),
		MessagesDropped:   e.metrics.messagesDropped.Load(),
		SnapshotsSent:     e.metrics.snapshotsSent.Load(),
		SnapshotsApplied:  e.metrics.snapshotsApplied.Load(),
		SnapshotBytesSent: e.metrics.snapshotBytesSent.Load(),
		LeaderChanges:     e.metrics.leaderChanges.Load(),
		LeaseReads:        e.metrics.leaseReads.Load(),
		ReadRounds:        e.metrics.readRounds.Load(),
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	m.Groups = len(e.groups)
	for _, g := range e.groups {
		st := g.status.Load()
		if st.IsLeader() {
			m.Leaders++
		}
		if st.Quiesced {
			m.Quiesced++
		}
	}
	return m
}

// HandleMessages implements Handler.
func (e *Engine) HandleMessages(from uint64, envs []Envelope) {
	e.touch(from)
	if len(envs) == 0 || e.stopped.Load() {
		return
	}
	e.metrics.messagesReceived.Add(uint64(len(envs)))
	full := e.store.Full()
	e.mu.RLock()
	defer e.mu.RUnlock()
	gids := make([]uint64, 0, 4)
	for _, env := range envs {
		g := e.groups[env.GroupID]
		if g == nil || g.stopped.Load() || full && growsLog(env.Message) {
			e.metrics.messagesDropped.Add(1)
			continue
		}
		g.mu.Lock()
		g.in.msgs = append(g.in.msgs, env)
		g.mu.Unlock()
		if len(gids) == 0 || gids[len(gids)-1] != env.GroupID {
			gids = append(gids, env.GroupID)
		}
	}
	if e.sched != nil {
		e.sched.enqueueAll(gids)
	}
}

// growsLog reports whether stepping m would write entries or a snapshot
// to this replica's log, which a node whose disk is full refuses
// (diskfull.go): the leader goes on with the other replicas.
func growsLog(m *raftpb.Message) bool {
	if m == nil {
		return false
	}
	t := m.GetType()
	return t == raftpb.MessageType_MsgApp && len(m.GetEntries()) > 0 || t == raftpb.MessageType_MsgSnap
}

// watchDisk checks the store's free space (diskfull.go); while the disk is
// full it hands the leadership of every group led here to another live
// voter, since a leader that refuses proposals stalls its group.
func (e *Engine) watchDisk(ctx context.Context) {
	e.store.disk.poll(ctx)
	if !e.store.Full() {
		return
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	for _, g := range e.groups {
		st := g.status.Load()
		if g.stopped.Load() || !st.IsLeader() {
			continue
		}
		for _, to := range st.Voters {
			if to != e.cfg.NodeID && e.isLive(to) {
				g.enqueue(func(in *inbox) { in.transfers = append(in.transfers, to) })
				break
			}
		}
	}
}

func (e *Engine) touch(node uint64) {
	e.liveMu.Lock()
	e.live[node] = time.Now()
	e.liveMu.Unlock()
}

// isLive reports whether node was heard from within LivenessTimeout; a node
// not heard from since start-up gets that long as grace.
func (e *Engine) isLive(node uint64) bool {
	if node == e.cfg.NodeID {
		return true
	}
	e.liveMu.Lock()
	t, ok := e.live[node]
	e.liveMu.Unlock()
	if !ok {
		t = e.start
	}
	return time.Since(t) < e.cfg.LivenessTimeout
}

func (e *Engine) tickLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.TickInterval)
	defer t.Stop()
	var n uint64
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		n++
		e.tick(n%keepaliveTicks == 0)
	}
}

// diskLoop runs watchDisk every diskCheckInterval, on its own goroutine:
// a slow statfs or the writing of a ballast (diskfull.go) must not hold
// back the ticks of every group.
func (e *Engine) diskLoop() {
	defer e.wg.Done()
	t := time.NewTicker(diskCheckInterval)
	defer t.Stop()
	for {
		e.watchDisk(e.ctx)
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Engine) tick(keepalive bool) {
	e.mu.RLock()
	gids := make([]uint64, 0, len(e.groups))
	var peers map[uint64]struct{}
	if keepalive {
		peers = map[uint64]struct{}{}
	}
	for gid, g := range e.groups {
		if g.stopped.Load() {
			continue
		}
		st := g.status.Load()
		if keepalive {
			for _, id := range st.Voters {
				peers[id] = struct{}{}
			}
			for _, id := range st.Learners {
				peers[id] = struct{}{}
			}
		}
		if g.quiesced.Load() {
			if st.Leader == 0 || (st.Leader != e.cfg.NodeID && !e.isLive(st.Leader)) {
				g.mu.Lock()
				g.in.wake = true
				g.mu.Unlock()
				gids = append(gids, gid)
			}
			continue
		}
		g.mu.Lock()
		g.in.ticks++
		g.mu.Unlock()
		gids = append(gids, gid)
	}
	e.mu.RUnlock()
	e.sched.enqueueAll(gids)
	for id := range peers {
		if id != e.cfg.NodeID {
			e.cfg.Transport.Send(id, nil)
		}
	}
}

// raftLogger routes raft's logging to slog. Raft is chatty per group, so
// its info messages go to debug.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)                 { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Info(v ...any)                  { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any)  { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)               { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any)                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...any)                 { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...any) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
func (r raftLogger) Panic(v ...any) { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...any) {
	panic(fmt.Sprintf(format, v...))
}
