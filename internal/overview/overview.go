// Package overview gathers the state of a whole running cluster in one
// call: its nodes and their disks, the directory group, the tract locator
// table (TLT), the extents, the metadata tables, the file systems and
// their snapshots, recovery progress, and a list of what is degraded.
// `arbor status` prints it and every node's web dashboard serves it
// (Handler) at GET /ui/api/overview.
//
// Every section is gathered on its own, in parallel, under its own
// timeout, and carries its own "error" string: a node that was just
// killed makes the sections that need it say so, but never blanks the
// others, and Gather returns within a few seconds.
//
// # JSON shape
//
//	{
//	  "time": "2026-11-26T07:00:00Z",  // when the gathering started (UTC)
//	  "took_ms": 41,
//	  "directory": {"leader": 2, "leader_address": "host:port", "term": 3,
//	                "voters": [1,2,3], "learners": [], "answered_by": 2,
//	                "stale": false,      // true: no leader answered; a member's local view
//	                "error": "..."},     // omitted when empty, like every "error"
//	  "nodes": [{"id": 1, "address": "host:port", "http_address": "host:port",
//	             "domain": "rack-1", "state": "alive|suspect|dead|decommissioned",
//	             "roles": ["directory","storage","meta"], "directory": "leader|voter|learner|",
//	             "disks": [{"path": "/d1", "capacity_bytes": 0, "used_bytes": 0}],
//	             "capacity_bytes": 0, "used_bytes": 0, "free_bytes": 0, "load": 0.0,
//	             "state_changed_unix_ms": 0}],
//	  "capacity": {"capacity_bytes": 0, "used_bytes": 0, "free_bytes": 0, "error": "..."},
//	  "tlt": {"version": 7, "replication": 3, "tract_size": 8388608,
//	          "servers": [{"server": "1/0", "address": "...", "domain": "...", "state": "alive",
//	                       "slots": 0, "primary": 0, "pending": 0, "tracts": 0, "bytes": 0,
//	                       "catching_up": 0, "error": "..."}],
//	          "rows": [{"row": 0, "version": 1, "slots": ["1/0","2/0"], "pending": ["1:3/0"],
//	                    "behind": ["3/0 (2 tracts, 1.0 MiB copied)"]}],
//	          "rows_catching_up": 0, "recovered_bytes": 0, "error": "..."},
//	  "extents": {"extents": [{"id": 1000, "replicas": [1,2,3], "replication": 3,
//	                           "leader": 2, "epoch": 1}], "error": "..."},
//	  "tables": {"tables": [{"table": 1, "file_system": 1, "lo": "0x0", "hi": "end",
//	                         "owner": 2, "epoch": 1, "lease_expiry_unix_ms": 0,
//	                         "inodes": 0, "cached_keys": 0, "ops_per_second": 0,
//	                         "creates_per_second": 0, "reported": true}],
//	             "inodes_cv_tables": 0, "load_cv_tables": 0,
//	             "inodes_cv_servers": 0, "load_cv_servers": 0,
//	             "servers": [1,2,3], "error": "..."},
//	  "file_systems": {"file_systems": [{"number": 1, "name": "home",
//	                   "created": "RFC 3339", "snapshots": [{"number": 1, "name": "s",
//	                   "created": "RFC 3339"}]}], "error": "..."},
//	  "recovery": {"in_progress": false, "rows": 64, "rows_catching_up": 0,
//	               "rows_recovering": 0, "recovered_bytes": 0,
//	               "extents_under_replicated": 0},
//	  "degraded": [{"kind": "node_dead", "subject": "node 3", "message": "..."}]
//	}
//
// Lists are never null. The kinds of Problem are the Kind... constants.
package overview

import "time"

// Overview is the whole cluster's state at one moment. Each section's
// Error says why it could not be read; the other sections are still
// filled.
type Overview struct {
	// Time is when the gathering started.
	Time time.Time `json:"time"`
	// TookMs is how long gathering took.
	TookMs      int64             `json:"took_ms"`
	Directory   Directory         `json:"directory"`
	Nodes       []Node            `json:"nodes"`
	Capacity    Capacity          `json:"capacity"`
	TLT         TLTSection        `json:"tlt"`
	Extents     ExtentSection     `json:"extents"`
	Tables      TableSection      `json:"tables"`
	FileSystems FileSystemSection `json:"file_systems"`
	Recovery    Recovery          `json:"recovery"`
	// Gateways are the NFS gateways announced in the directory, each
	// probed (GatewaysError: they could not be listed).
	Gateways      []Gateway `json:"gateways"`
	GatewaysError string    `json:"gateways_error,omitempty"`
	// Degraded lists what needs attention; empty when all is well.
	Degraded []Problem `json:"degraded"`
}

// Directory is the directory group's state. Its Error also covers Nodes,
// which come from the same answer.
type Directory struct {
	// Leader is the node leading the directory group; 0 if none.
	Leader        uint64   `json:"leader"`
	LeaderAddress string   `json:"leader_address"`
	Term          uint64   `json:"term"`
	Voters        []uint64 `json:"voters"`
	Learners      []uint64 `json:"learners"`
	// AnsweredBy is the member whose view this is.
	AnsweredBy uint64 `json:"answered_by"`
	// Stale is set when no leader answered and the view is a member's
	// local, possibly out of date, state.
	Stale bool   `json:"stale"`
	Error string `json:"error,omitempty"`
}

// Gateway is one NFS gateway (internal/gateway/nfs): where it serves,
// the node running it (0: a standalone arbor gateway nfs), and whether it
// answered an NFS NULL call just now (State "up" or "down", with the
// error).
type Gateway struct {
	Address string `json:"address"`
	Node    uint64 `json:"node,omitempty"`
	State   string `json:"state"`
	Error   string `json:"error,omitempty"`
}

// Gateway states.
const (
	GatewayUp   = "up"
	GatewayDown = "down"
)

// Node states as the directory's failure detector names them.
const (
	StateAlive          = "alive"
	StateSuspect        = "suspect"
	StateDead           = "dead"
	StateDecommissioned = "decommissioned"
)

// Node is one node as the directory knows it, with its disks and the
// figures it last reported.
type Node struct {
	ID          uint64 `json:"id"`
	Address     string `json:"address"`
	HTTPAddress string `json:"http_address"`
	Domain      string `json:"domain"`
	// State is one of the State... constants.
	State string   `json:"state"`
	Roles []string `json:"roles"`
	// Directory is "leader", "voter" or "learner" for directory members,
	// else empty.
	Directory string `json:"directory"`
	Disks     []Disk `json:"disks"`
	// CapacityBytes and UsedBytes sum the disks (as registered); FreeBytes
	// and Load are from the node's last heartbeat report (0 if none).
	CapacityBytes      uint64  `json:"capacity_bytes"`
	UsedBytes          uint64  `json:"used_bytes"`
	FreeBytes          uint64  `json:"free_bytes"`
	Load               float64 `json:"load"`
	StateChangedUnixMs int64   `json:"state_changed_unix_ms"`
}

// Disk is one of a node's disks.
type Disk struct {
	Path          string `json:"path"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
}

// Capacity sums the nodes that are not decommissioned. Error is set when
// the nodes' reported figures could not be read.
type Capacity struct {
	CapacityBytes uint64 `json:"capacity_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
	FreeBytes     uint64 `json:"free_bytes"`
	Error         string `json:"error,omitempty"`
}

// TLTSection is the tract locator table as `arbor tlt` shows it.
type TLTSection struct {
	TLTView
	Error string `json:"error,omitempty"`
}

// ExtentSection lists the extents with their replicas and leaders.
type ExtentSection struct {
	Extents []ExtentView `json:"extents"`
	Error   string       `json:"error,omitempty"`
}

// TableSection lists the metadata tables with their owners and balance,
// and the live metadata servers.
type TableSection struct {
	TableList
	Servers []uint64 `json:"servers"`
	Error   string   `json:"error,omitempty"`
}

// FileSystemSection lists the file systems.
type FileSystemSection struct {
	FileSystems []FileSystem `json:"file_systems"`
	Error       string       `json:"error,omitempty"`
}

// FileSystem is one file system and its snapshots.
type FileSystem struct {
	Number uint64 `json:"number"`
	Name   string `json:"name"`
	// Created is RFC 3339, UTC.
	Created   string     `json:"created"`
	Snapshots []Snapshot `json:"snapshots"`
}

// Snapshot is one snapshot of a file system.
type Snapshot struct {
	Number  uint64 `json:"number"`
	Name    string `json:"name"`
	Created string `json:"created"`
}

// Recovery is re-replication progress, from the TLT and extent sections.
type Recovery struct {
	// InProgress is set while a live member of a TLT row is copying.
	InProgress bool `json:"in_progress"`
	Rows       int  `json:"rows"`
	// RowsCatchingUp counts TLT rows with a member not yet in sync,
	// including members that are down (as `arbor tlt` counts them).
	RowsCatchingUp int `json:"rows_catching_up"`
	// RowsRecovering counts rows with a member not in sync that is not
	// down: a replacement or a pending member copying.
	RowsRecovering int `json:"rows_recovering"`
	// RecoveredBytes is what catch-ups copied since the nodes started.
	RecoveredBytes uint64 `json:"recovered_bytes"`
	// ExtentsUnderReplicated counts extents with fewer live replicas than
	// their replication.
	ExtentsUnderReplicated int `json:"extents_under_replicated"`
}

// Problem is one thing that is degraded.
type Problem struct {
	// Kind is one of the Kind... constants.
	Kind string `json:"kind"`
	// Subject names what is degraded: "node 3", "extent 1000", "table 4",
	// "tlt", "directory".
	Subject string `json:"subject"`
	Message string `json:"message"`
}

// The kinds of Problem.
const (
	KindNoDirectoryLeader     = "no_directory_leader"
	KindNodeDead              = "node_dead"
	KindNodeSuspect           = "node_suspect"
	KindExtentUnderReplicated = "extent_under_replicated"
	KindExtentNoLeader        = "extent_no_leader"
	KindTractsUnderReplicated = "tracts_under_replicated"
	KindRecovery              = "recovery_in_progress"
	KindTableNoOwner          = "table_without_owner"
	// KindSectionUnavailable: a section could not be read at all.
	KindSectionUnavailable = "unavailable"
)
