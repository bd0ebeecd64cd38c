package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Node-level keys of the pebble DB. They live under the 'n' prefix, which
// the raft engine's key layout (internal/raftengine/keys.go: 'r', 'g', 's')
// leaves free.
var identityKey = []byte("n/identity")

// identityFormatVersion is the version of the stored identity record.
const identityFormatVersion = 1

// identity is what makes a data directory belong to one node of one
// cluster.
type identity struct {
	FormatVersion int       `json:"format_version"`
	NodeID        uint64    `json:"node_id"`
	ClusterID     string    `json:"cluster_id"`
	Created       time.Time `json:"created"`
}

// checkIdentity records the node's identity on first start and refuses to
// start a data directory that belongs to another node or cluster: reusing
// one would hand this node another node's replicas and Raft state.
func checkIdentity(db *pebble.DB, nodeID uint64, clusterID string, now time.Time) (created bool, err error) {
	id, found, err := readIdentity(db)
	switch {
	case err != nil:
		return false, err
	case !found:
		id := identity{FormatVersion: identityFormatVersion, NodeID: nodeID, ClusterID: clusterID, Created: now.UTC()}
		b, err := json.Marshal(id)
		if err != nil {
			return false, err
		}
		if err := db.Set(identityKey, b, pebble.Sync); err != nil {
			return false, fmt.Errorf("record node identity: %w", err)
		}
		return true, nil
	}
	if id.FormatVersion != identityFormatVersion {
		return false, fmt.Errorf("node identity record has format version %d; this build reads %d", id.FormatVersion, identityFormatVersion)
	}
	if id.NodeID != nodeID || id.ClusterID != clusterID {
		return false, fmt.Errorf("data dir belongs to node %d of cluster %q (since %s), but this server is configured as node %d of cluster %q: "+
			"use that node's own --node-id and --cluster-id, or another --data-dir",
			id.NodeID, id.ClusterID, id.Created.Format(time.RFC3339), nodeID, clusterID)
	}
	return false, nil
}

// readIdentity reads the identity checkIdentity recorded; found is false
// if there is none.
func readIdentity(db *pebble.DB) (id identity, found bool, err error) {
	v, closer, err := db.Get(identityKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return id, false, nil
	}
	if err != nil {
		return id, false, fmt.Errorf("read node identity: %w", err)
	}
	defer closer.Close()
	if err := json.Unmarshal(v, &id); err != nil {
		return id, false, fmt.Errorf("node identity record is corrupt: %w", err)
	}
	return id, true, nil
}
