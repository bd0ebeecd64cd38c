package directory

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Membership is what re-growing the directory group's voters needs of the
// replication engine (*raftengine.Engine implements it).
type Membership interface {
	Status(groupID uint64) (raftengine.GroupStatus, error)
	StatusWithProgress(ctx context.Context, groupID uint64) (raftengine.GroupStatus, error)
	AddLearner(ctx context.Context, groupID, node uint64) error
	AddVoter(ctx context.Context, groupID, node uint64) error
}

// RegrowInterval is how often the directory's leader looks for configured
// peers missing from the group's voters.
const RegrowInterval = time.Second

// RegrowStep makes at most one membership change toward every configured
// peer being a voter of the directory group, on the leader (elsewhere it
// does nothing): a peer that is not a member is added as a learner, and a
// learner is promoted once its log has caught up with the leader's commit,
// so that a voter which cannot yet take part never counts towards the
// quorum. The group's voters equal the peers except after a recovery from a
// lost quorum (RecoverAloneOffline leaves the survivor alone), so this is
// how the peers that return with new disks (started with --directory-join)
// become voters again. It never removes a member. It returns what it
// changed ("" for nothing).
func RegrowStep(ctx context.Context, m Membership, peers []uint64) (string, error) {
	// The common case, from the cheap status: not the leader, or whole.
	st, err := m.Status(GroupID)
	if err != nil || !st.IsLeader() || !slices.ContainsFunc(peers, func(p uint64) bool { return !slices.Contains(st.Voters, p) }) {
		return "", err
	}
	if st, err = m.StatusWithProgress(ctx, GroupID); err != nil || !st.IsLeader() {
		return "", err
	}
	for _, p := range peers {
		if slices.Contains(st.Voters, p) || slices.Contains(st.Learners, p) {
			continue
		}
		if err := m.AddLearner(ctx, GroupID, p); err != nil {
			return "", fmt.Errorf("directory: add peer %d as a learner: %w", p, err)
		}
		return fmt.Sprintf("added peer %d as a learner", p), nil
	}
	for _, p := range st.Learners {
		pr, ok := st.Progress[p]
		if !slices.Contains(peers, p) || !ok || !pr.RecentActive || pr.Snapshot || pr.Match < st.Commit {
			continue
		}
		if err := m.AddVoter(ctx, GroupID, p); err != nil {
			return "", fmt.Errorf("directory: promote peer %d to voter: %w", p, err)
		}
		return fmt.Sprintf("promoted peer %d to voter (its log at %d, commit %d)", p, pr.Match, st.Commit), nil
	}
	return "", nil
}

// RunRegrow calls RegrowStep every interval until ctx ends, logging what it
// changes and, at most once a minute, why it could not.
func RunRegrow(ctx context.Context, m Membership, peers []uint64, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 10*interval)
		change, err := RegrowStep(sctx, m, peers)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && time.Since(lastWarn) > time.Minute:
			lastWarn = time.Now()
			log.Warn("directory voters not re-grown yet", "err", err)
		case change != "":
			log.Warn("directory membership changed toward the configured peers", "change", change, "peers", peers)
		}
	}
}
