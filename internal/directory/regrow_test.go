package directory

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// fakeMembership is a leader's view of the directory group: what the
// engine would report and do, applied at once.
type fakeMembership struct {
	st      raftengine.GroupStatus
	changes []string
	fail    error
}

func (f *fakeMembership) Status(gid uint64) (raftengine.GroupStatus, error) {
	st, err := f.StatusWithProgress(context.Background(), gid)
	st.Progress = nil
	return st, err
}

func (f *fakeMembership) StatusWithProgress(context.Context, uint64) (raftengine.GroupStatus, error) {
	st := f.st
	st.Voters, st.Learners = slices.Clone(st.Voters), slices.Clone(st.Learners)
	return st, nil
}

func (f *fakeMembership) AddLearner(_ context.Context, gid, node uint64) error {
	if f.fail != nil {
		return f.fail
	}
	if gid != GroupID || slices.Contains(f.st.Voters, node) || slices.Contains(f.st.Learners, node) {
		return errors.New("bad learner change")
	}
	f.st.Learners = append(f.st.Learners, node)
	f.changes = append(f.changes, "learner")
	return nil
}

func (f *fakeMembership) AddVoter(_ context.Context, gid, node uint64) error {
	i := slices.Index(f.st.Learners, node)
	if gid != GroupID || i < 0 {
		return errors.New("promotion of a non-learner")
	}
	f.st.Learners = slices.Delete(f.st.Learners, i, i+1)
	f.st.Voters = append(f.st.Voters, node)
	f.changes = append(f.changes, "voter")
	return nil
}

// TestRegrowStepAddsPeersBack: after a recovery left the survivor alone,
// the leader adds every configured peer as a learner, one change per step,
// and promotes a learner only once it is active, not being sent a snapshot
// and caught up with the commit; a follower changes nothing, and a member
// that is not a configured peer is left alone.
func TestRegrowStepAddsPeersBack(t *testing.T) {
	ctx := context.Background()
	peers := []uint64{1, 2, 3}
	f := &fakeMembership{st: raftengine.GroupStatus{NodeID: 1, Leader: 1, Commit: 50, Voters: []uint64{1}, Learners: []uint64{9},
		Progress: map[uint64]raftengine.ReplicaProgress{1: {Match: 50, RecentActive: true}, 9: {Match: 50, RecentActive: true}}}}

	// A follower does nothing.
	f.st.Leader = 2
	if ch, err := RegrowStep(ctx, f, peers); ch != "" || err != nil || len(f.changes) != 0 {
		t.Fatalf("follower: %q %v %v, want nothing", ch, err, f.changes)
	}
	f.st.Leader = 1

	for _, want := range [][]uint64{{9, 2}, {9, 2, 3}} {
		if ch, err := RegrowStep(ctx, f, peers); ch == "" || err != nil || !slices.Equal(f.st.Learners, want) {
			t.Fatalf("step: %q %v learners %v, want %v", ch, err, f.st.Learners, want)
		}
	}
	// Learners not caught up, inactive or in a snapshot: nothing.
	for _, pr := range []map[uint64]raftengine.ReplicaProgress{
		{2: {Match: 49, RecentActive: true}, 3: {Match: 0, RecentActive: true}},
		{2: {Match: 50}, 3: {Match: 60}},
		{2: {Match: 50, RecentActive: true, Snapshot: true}},
		{},
	} {
		f.st.Progress = pr
		if ch, err := RegrowStep(ctx, f, peers); ch != "" || err != nil || !slices.Equal(f.st.Voters, []uint64{1}) {
			t.Fatalf("progress %v: %q %v voters %v, want no promotion", pr, ch, err, f.st.Voters)
		}
	}
	f.st.Progress = map[uint64]raftengine.ReplicaProgress{2: {Match: 50, RecentActive: true}, 3: {Match: 51, RecentActive: true}}
	for range 3 {
		if _, err := RegrowStep(ctx, f, peers); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(f.st.Voters, []uint64{1, 2, 3}) || !slices.Equal(f.st.Learners, []uint64{9}) {
		t.Fatalf("voters %v learners %v, want [1 2 3] and the unconfigured learner 9 untouched", f.st.Voters, f.st.Learners)
	}
	if ch, err := RegrowStep(ctx, f, peers); ch != "" || err != nil {
		t.Fatalf("full membership: %q %v, want nothing to do", ch, err)
	}

	// An engine refusal is reported, nothing is claimed.
	f = &fakeMembership{st: raftengine.GroupStatus{NodeID: 1, Leader: 1, Voters: []uint64{1}}, fail: errors.New("not leader any more")}
	if ch, err := RegrowStep(ctx, f, peers); ch != "" || err == nil {
		t.Fatalf("refused change: %q %v, want the error", ch, err)
	}
}
