package overview

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/extent"
)

// ExtentReplicaTimeout bounds the question to one replica about its
// extent's leader.
const ExtentReplicaTimeout = 2 * time.Second

// ExtentView is one extent as `arbor extent list` prints it: its replicas
// and epoch from the directory's extent map, its leader from the replicas.
type ExtentView struct {
	ID          uint64   `json:"id"`
	Replicas    []uint64 `json:"replicas"`
	Replication uint32   `json:"replication"`
	// Leader is the replica that leads the extent's raft group; 0 if none
	// answered.
	Leader uint64 `json:"leader"`
	Epoch  uint64 `json:"epoch"`
}

// FetchExtents reads the extent map and asks the replicas of every
// extent, in parallel, who leads it.
func FetchExtents(ctx context.Context, cl *extent.Client) ([]ExtentView, error) {
	infos, err := cl.Extents(ctx)
	if err != nil {
		return nil, fmt.Errorf("list extents: %w", err)
	}
	views := make([]ExtentView, len(infos))
	var wg sync.WaitGroup
	for i, e := range infos {
		views[i] = ExtentView{ID: e.ID, Replicas: e.Replicas, Replication: e.Geometry.Replication, Epoch: e.Epoch}
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i].Leader = LeaderOf(ctx, cl, e.ID, e.Replicas)
		}()
	}
	wg.Wait()
	return views, nil
}

// LeaderOf asks every replica of an extent about its leader: a replica
// that says it leads wins, else the hint most replicas give (0: none
// answered).
func LeaderOf(ctx context.Context, cl *extent.Client, id uint64, replicas []uint64) uint64 {
	var mu sync.Mutex
	votes := map[uint64]int{}
	var self uint64
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, ExtentReplicaTimeout)
			defer cancel()
			st, err := cl.ReplicaStatus(rctx, r, id, false)
			if err != nil || !st.Exists || st.LeaderId == 0 {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			votes[st.LeaderId]++
			if st.LeaderId == st.NodeId {
				self = st.NodeId
			}
		}()
	}
	wg.Wait()
	if self != 0 {
		return self
	}
	var best uint64
	for l, n := range votes {
		if n > votes[best] || (n == votes[best] && l < best) {
			best = l
		}
	}
	return best
}
