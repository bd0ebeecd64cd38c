package extent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// Recovery of an extent that lost its quorum (issue 13; the engine's side
// is raftengine.RecoverAlone).
//
// An extent's group needs a majority of its voters. While it has one,
// raft keeps every acknowledged write and the manager replaces dead
// replicas by itself. When a majority is gone for good (two of three
// replicas' disks lost), nothing can commit, and the only way back is to
// make one survivor the group's only voter: `arbor extent recover ID`,
// which calls PlanRecovery, prints the plan and its warning, and, given
// --yes-lose-unreplicated-writes, calls RecoverExtent. The manager then
// re-replicates the extent from the survivor as after any node death.
//
// Why never automatically: from the survivors alone, no one can tell a
// lost majority from a partitioned one. Two replicas cut off together
// (not dead) still form a quorum: they may have elected a leader and
// committed writes after the survivor's last news of them, and they will
// come back with them. Recovering the survivor alone would then lose those
// acknowledged writes and fork the extent's history. Only an operator, who
// knows that the disks are gone, can rule that out; the command's flag is
// that statement. (The safe automatic case is the ordinary one: while a
// majority of replicas lives, raft and the manager repair the extent with
// nothing lost.)
//
// What may be lost: writes (MPSC commits, transaction steps) that the lost
// replicas held and the chosen survivor did not. A write is acknowledged
// once a majority holds it, so with 2 of 3 replicas lost an acknowledged
// write survives only if the survivor was part of its majority. The plan
// picks the survivor with the most up-to-date log (raft's rule: highest
// last term, then highest last index), which holds every write any
// survivor holds.

// ReplicaLog is what one replica says about its copy of an extent.
type ReplicaLog struct {
	Node                uint64
	Answered, Exists    bool
	Voters, Learners    []uint64
	Leader              uint64
	Term                uint64
	Commit, Applied     uint64
	LastIndex, LastTerm uint64
	Err                 string
}

// RecoveryPlan is what recovering an extent would do.
type RecoveryPlan struct {
	Extent uint64
	// Replicas are the extent map's; Voters the group's, as the most
	// up-to-date survivor knows them.
	Replicas, Voters []uint64
	// Logs is every replica asked (the map's and the group's members).
	Logs []ReplicaLog
	// Survivors are the members that answered with a replica.
	Survivors []uint64
	// Chosen is the survivor to recover from (0: none survives).
	Chosen uint64
	// Quorum is true when a majority of the voters survives: nothing to
	// recover (raft elects a leader, the manager replaces the others).
	Quorum bool
}

// recoveryAskTimeout bounds the question to one replica.
const recoveryAskTimeout = 3 * time.Second

// PlanRecovery asks every replica of extent (the map's and the group's
// members) about its log and picks the most up-to-date survivor.
func (c *Client) PlanRecovery(ctx context.Context, extent uint64) (RecoveryPlan, error) {
	c.Forget(extent)
	e, err := c.extent(ctx, extent)
	if err != nil {
		return RecoveryPlan{}, err
	}
	plan := RecoveryPlan{Extent: extent, Replicas: slices.Clone(e.Replicas)}
	asked := map[uint64]*ReplicaLog{}
	ask := func(nodes []uint64) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range nodes {
			if asked[n] != nil {
				continue
			}
			l := &ReplicaLog{Node: n}
			asked[n] = l
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, recoveryAskTimeout)
				defer cancel()
				cl, err := c.NodeClient(actx, n)
				var st *pb.ReplicaStatusResponse
				if err == nil {
					st, err = cl.ReplicaStatus(actx, &pb.ReplicaStatusRequest{ExtentId: extent})
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					l.Err = err.Error()
					return
				}
				l.Answered, l.Exists = true, st.Exists
				l.Voters, l.Learners, l.Leader, l.Term = st.Voters, st.Learners, st.LeaderId, st.Term
				l.Commit, l.Applied, l.LastIndex, l.LastTerm = st.Commit, st.Applied, st.LastIndex, st.LastTerm
			}()
		}
		wg.Wait()
	}
	ask(e.Replicas)
	// Members the map does not list yet (a replica being added) count too.
	var more []uint64
	for _, l := range asked {
		if l.Exists {
			more = append(more, l.Voters...)
			more = append(more, l.Learners...)
		}
	}
	ask(more)
	for _, l := range asked {
		plan.Logs = append(plan.Logs, *l)
		if l.Exists {
			plan.Survivors = append(plan.Survivors, l.Node)
		}
	}
	slices.SortFunc(plan.Logs, func(a, b ReplicaLog) int { return cmp.Compare(a.Node, b.Node) })
	slices.Sort(plan.Survivors)
	var best *ReplicaLog
	for i := range plan.Logs {
		l := &plan.Logs[i]
		if !l.Exists {
			continue
		}
		if best == nil || l.LastTerm > best.LastTerm || (l.LastTerm == best.LastTerm && l.LastIndex > best.LastIndex) {
			best = l
		}
	}
	if best == nil {
		return plan, nil
	}
	plan.Chosen = best.Node
	plan.Voters = slices.Sorted(slices.Values(best.Voters))
	alive := 0
	for _, v := range plan.Voters {
		if slices.Contains(plan.Survivors, v) {
			alive++
		}
	}
	plan.Quorum = alive > len(plan.Voters)/2
	return plan, nil
}

// ReplicaRecorder records an extent's replicas under its next epoch
// (*directory.Client implements it).
type ReplicaRecorder interface {
	GetExtent(ctx context.Context, req *dpb.GetExtentRequest) (*dpb.Extent, error)
	ChangeExtentReplicas(ctx context.Context, req *dpb.ChangeExtentReplicasRequest) (*dpb.Extent, error)
}

// RecoverExtent makes plan.Chosen's replica the only voter of the
// extent's group, keeping every entry it holds (whatever only the lost
// replicas held is lost), then records that replica alone in the extent
// map under the next epoch: from then on a lost replica that comes back
// is an orphan its node removes, and the extent manager adds new
// replicas. It refuses a plan whose extent still has a quorum or has no
// survivor. It returns what the replica reported and the new map entry.
func (c *Client) RecoverExtent(ctx context.Context, plan RecoveryPlan, dir ReplicaRecorder) (*pb.RecoverResponse, *dpb.Extent, error) {
	switch {
	case plan.Chosen == 0:
		return nil, nil, newError(ErrUnavailable, "recover", plan.Extent, "no replica of extent %d survives: nothing to recover from", plan.Extent)
	case plan.Quorum:
		return nil, nil, newError(ErrInvalid, "recover", plan.Extent,
			"extent %d still has a majority of its voters %v (survivors %v): raft and the extent manager repair it without loss", plan.Extent, plan.Voters, plan.Survivors)
	}
	cl, err := c.NodeClient(ctx, plan.Chosen)
	if err != nil {
		return nil, nil, newError(ErrUnavailable, "recover", plan.Extent, "%v", err)
	}
	resp, err := cl.Recover(ctx, &pb.RecoverRequest{ExtentId: plan.Extent, AcceptLoss: true})
	if err != nil {
		return nil, nil, rpcError("recover", plan.Extent, err, true)
	}
	c.Forget(plan.Extent)
	for attempt := 0; ; attempt++ {
		e, err := dir.GetExtent(ctx, &dpb.GetExtentRequest{ExtentId: plan.Extent})
		if err == nil {
			e, err = dir.ChangeExtentReplicas(ctx, &dpb.ChangeExtentReplicasRequest{
				ExtentId: plan.Extent, ExpectedEpoch: e.Epoch, Replicas: []uint64{plan.Chosen}})
		}
		if err == nil {
			c.Forget(plan.Extent)
			return resp, e, nil
		}
		// Another writer of the map (the manager) moved its epoch: read it
		// again.
		if !errors.Is(err, directory.ErrStaleEpoch) || attempt == 4 {
			return resp, nil, fmt.Errorf("extent %d is recovered on node %d, but recording it in the extent map failed (run the command again): %w",
				plan.Extent, plan.Chosen, err)
		}
	}
}

// String is the plan as the operator reads it.
func (p RecoveryPlan) String() string {
	s := fmt.Sprintf("extent %d: replicas %v, group voters %v\n", p.Extent, p.Replicas, p.Voters)
	for _, l := range p.Logs {
		switch {
		case !l.Answered:
			s += fmt.Sprintf("  node %d: no answer (%s)\n", l.Node, l.Err)
		case !l.Exists:
			s += fmt.Sprintf("  node %d: holds no replica\n", l.Node)
		default:
			s += fmt.Sprintf("  node %d: last entry %d (term %d), commit %d, applied %d, voters %v, leader %d\n",
				l.Node, l.LastIndex, l.LastTerm, l.Commit, l.Applied, l.Voters, l.Leader)
		}
	}
	return s
}
