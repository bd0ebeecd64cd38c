package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/raftengine"
)

// TestRecoverDirectoryOfflineRefuses: the directory recovery refuses a
// directory that is not a data dir, one a server holds, one no node ever
// started on and a node's store without a directory replica, and changes
// nothing in any of them. (The recovery itself runs on a real cluster in
// cmd/arbor's TestDirectoryLostQuorumRecoveredByOperator.)
func TestRecoverDirectoryOfflineRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := RecoverDirectoryOffline(dir, true); err == nil || !strings.Contains(err.Error(), "holds no arbor database") {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, dbDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refusal created %s: %v", dbDirName, err)
	}

	st, err := raftengine.OpenStore(filepath.Join(dir, dbDirName), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RecoverDirectoryOffline(dir, true); err == nil || !strings.Contains(err.Error(), "no node identity") {
		t.Fatalf("store without identity: %v", err)
	}

	st, err = raftengine.OpenStore(filepath.Join(dir, dbDirName), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkIdentity(st.DB, 4, "c", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	r, rep, err := RecoverDirectoryOffline(dir, true)
	if !errors.Is(err, ErrNoDirectoryReplica) || rep != nil || r.NodeID != 4 || !strings.Contains(err.Error(), "node 4") {
		t.Fatalf("store of a node that is no directory peer: %+v %v %v", r, rep, err)
	}

	lock, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = RecoverDirectoryOffline(dir, true)
	if err == nil || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "stop the node") {
		t.Fatalf("data dir in use: %v", err)
	}
	if err := lock.release(); err != nil {
		t.Fatal(err)
	}
}
