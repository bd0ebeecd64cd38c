package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/arbor-storage/arbor/internal/directory"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// DirectoryReplica describes the directory replica in a stopped node's
// data directory: whose it is and how up to date its log is (raft's
// election rule: higher LastTerm, then higher LastIndex, is more up to
// date), which is what an operator compares between survivors.
type DirectoryReplica struct {
	DataDir   string
	NodeID    uint64
	ClusterID string
	raftengine.GroupStatus
}

// Alone reports whether the replica is already its group's only member.
func (r DirectoryReplica) Alone() bool {
	return slices.Equal(r.Voters, []uint64{r.NodeID}) && len(r.Learners) == 0
}

// ErrNoDirectoryReplica is returned for a data directory whose node holds
// no replica of the directory group (it is not a directory peer, or it was
// never started as one).
var ErrNoDirectoryReplica = errors.New("no directory replica")

// RecoverDirectoryOffline is the directory's recovery from a lost quorum
// (internal/directory/doc.go, "Losing the directory's quorum"), on the data
// directory of a stopped node: it locks dataDir (refusing if a server runs
// on it), reads the node's identity and its directory replica, and, if
// apply is set, makes that replica the only voter of the directory group
// (raftengine.RecoverAloneOffline), keeping every entry it holds. Without
// apply it changes nothing and only describes the replica. The report is
// nil when nothing was rewritten (apply unset, or the replica already
// alone).
func RecoverDirectoryOffline(dataDir string, apply bool) (DirectoryReplica, *raftengine.RecoveryReport, error) {
	rep := DirectoryReplica{DataDir: dataDir}
	dbDir := filepath.Join(dataDir, dbDirName)
	if _, err := os.Stat(dbDir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return rep, nil, fmt.Errorf("data dir %s holds no arbor database (%s): is it a node's --data-dir?", dataDir, dbDir)
		}
		return rep, nil, fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return rep, nil, fmt.Errorf("%w: stop the node before recovering its directory replica", err)
	}
	defer lock.release()
	st, err := raftengine.OpenStore(dbDir, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return rep, nil, fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	defer st.Close()
	id, found, err := readIdentity(st.DB)
	if err != nil {
		return rep, nil, fmt.Errorf("data dir %s: %w", dataDir, err)
	}
	if !found {
		return rep, nil, fmt.Errorf("data dir %s: no node identity recorded: no node ever started on it", dataDir)
	}
	rep.NodeID, rep.ClusterID = id.NodeID, id.ClusterID
	rep.GroupStatus, err = raftengine.InspectOffline(st, id.NodeID, directory.GroupID)
	if errors.Is(err, raftengine.ErrGroupNotFound) {
		return rep, nil, fmt.Errorf("data dir %s: node %d: %w (it is not a directory peer, or never ran as one)", dataDir, id.NodeID, ErrNoDirectoryReplica)
	}
	if err != nil {
		return rep, nil, fmt.Errorf("data dir %s: node %d: %w", dataDir, id.NodeID, err)
	}
	if rep.Kind != directory.Kind {
		return rep, nil, fmt.Errorf("data dir %s: node %d: group %d is a %q group, not the directory", dataDir, id.NodeID, directory.GroupID, rep.Kind)
	}
	if !apply || rep.Alone() {
		return rep, nil, nil
	}
	rr, err := raftengine.RecoverAloneOffline(st, id.NodeID, directory.GroupID)
	if err != nil {
		return rep, nil, fmt.Errorf("data dir %s: node %d: %w", dataDir, id.NodeID, err)
	}
	return rep, &rr, nil
}
