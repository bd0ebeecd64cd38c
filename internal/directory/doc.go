// Package directory is Arbor's cluster configuration service: one Raft group
// (GroupID, 3 voters in development, 5 in production) on the multi-Raft
// engine (internal/raftengine) that holds the small state needed to
// bootstrap and steer everything else (DESIGN.md §2.2).
//
// It unifies, in one replicated state machine:
//   - FSS's Minsk configuration table (FSS §2, §6): a key-value table with
//     versions and compare-and-set, used for bootstrap configuration;
//   - Boxwood's Paxos service, lock service and failure detector (Boxwood
//     §3.1-§3.3): the node table with incarnation epochs, named leases, and a
//     heartbeat failure detector run by the leader;
//   - the FDS metadata server (FDS §3.1-§3.4): the tract locator table with
//     per-row versions and pending entries for growth;
//   - the Ursa Minor delegation coordinator (Ursa Minor §3.3-§3.4): the
//     delegation map of tables to metadata servers, fenced by epochs;
//   - the extent map and the file-system list the extent store and the
//     namespace need.
//
// # Layers
//
// StateMachine (statemachine.go, apply*.go) is the deterministic core: it
// decodes and validates a command, applies it to the engine's key space and
// returns a directorypb.CommandResult. Detector (detector.go) is the failure
// detector's deterministic core: heartbeats and ticks in, state transitions
// out, no clock and no goroutines. Service (service.go) is the thin
// concurrent shell: the gRPC server, which proposes commands, serves reads
// after a ReadIndex, and on the leader runs the detector loop. Client and
// NodeAgent (client.go, agent.go) are the other side of the wire.
//
// # Key layout
//
// All durable state lives in the engine's key space of the group (keys are
// relative to the group; the engine adds its prefix). Ids are big-endian so
// scans return them in order; every value is a deterministic protobuf
// encoding.
//
//	c/cluster           ClusterInfo (absent until InitCluster)
//	c/clock             8-byte big-endian: time of the last applied command (ms)
//	c/counters          Counters: next file system, extent and table ids; delegation map version
//	n/<id:8>            Node
//	s/<id:8>            MemberStats
//	t/header            TLT without rows: version, tract size, replication
//	t/row/<row:4>       TLTRow, rows 0..n-1 with no gaps
//	e/<extent id:8>     Extent
//	d/<table id:8>      Delegation
//	f/<number:8>        FileSystem with its snapshot list
//	l/<name>            Lease (kept after release, so epochs never repeat)
//	k/<key>             ConfigEntry
//
// An in-memory mirror of all of it, guarded by an RWMutex, serves reads; Load
// rebuilds it from the key space (at start-up and after a snapshot).
//
// # Invariants
//
//  1. Apply is deterministic: its writes and result depend only on the state
//     and the command. Time comes from the command (now_unix_ms, chosen by the
//     proposing leader), and the applied time never goes backwards: a
//     command is applied at max(its time, the last applied time), so a new
//     leader with a slower clock cannot revive an expired lease.
//  2. A command that is refused (any code but OK), malformed or undecodable
//     changes nothing: every handler validates everything before it records
//     a write, and writes are carried out only on OK.
//  3. The mirror equals what Load builds from the key space after every
//     command (checked after every command in the tests, and by the fuzzer).
//  4. Every grant of authority carries a number that only grows: a node's
//     epoch (bumped by every registration), a lease's epoch (bumped when it
//     changes holder), a table's epoch (bumped when its owner or range
//     changes), an extent's epoch (bumped when its replicas change), TLT row
//     versions (set to the new table version whenever a row changes) and
//     config versions (the Raft index of the write). A request made under an
//     older number is refused with STALE_EPOCH (CONFLICT for config), so a
//     node back from a partition cannot act on old authority (FDS §3.2, Ursa
//     Minor §3.4).
//  5. DECOMMISSIONED is final. DEAD is left only by registering again, which
//     gives a new epoch; a lease granted to an earlier incarnation cannot be
//     renewed by a later one.
//  6. Table key ranges of one file system never overlap, so at most one
//     metadata server owns a key; a file system with tables cannot be
//     deleted.
//  7. Every table has a named limit (limits.go); a command that would exceed
//     one is refused.
//
// # Failure detection
//
// Every node heartbeats the leader each HeartbeatInterval (NodeAgent).
// Heartbeats are kept in the leader's memory only; the leader's detector
// proposes SetNodeState when a node has been silent for SuspectTimeout
// (ALIVE -> SUSPECT), DeadTimeout (-> DEAD), or heartbeats again
// (SUSPECT -> ALIVE). Transitions name the epoch they judge, so a verdict on
// an old incarnation never touches a new one. A new leader first catches up
// (ReadIndex) and then gives every node a full timeout from the moment it
// took over: a leader change never kills a node. A heartbeat from a dead
// node or a stale epoch is answered REREGISTER; from a decommissioned node,
// SHUTDOWN.
//
// # Leases
//
// A lease is held by (node, node epoch) until expiry_unix_ms, judged on the
// directory's applied clock. The directory's clock and the holder's are not
// synchronised, so the holder must stop acting on a lease before it expires
// by its own reckoning: it measures the duration from when it sent the grant
// or renew request (not from when the reply arrived), and gives up
// LeaseSafetyMargin (or more, for clock drift) before the end:
// HolderDeadline computes that moment. Another node
// can only get the lease after the directory has applied a command at or
// after the expiry, which happens no earlier than the holder's own deadline.
// Forced release (ReleaseLease with force) breaks this and is for operators
// who know the holder is gone. A lease's epoch is a fencing token: resources
// a lease protects should refuse requests carrying an older epoch, which
// makes even a late holder harmless (Boxwood §3.3).
//
// Table delegations carry a lease too, but their safety does not rest on it:
// a new owner writes the table's new epoch into the table header, which
// fences every transaction of the old owner (DESIGN.md §2.6).
//
// # Losing the directory's quorum
//
// The directory is one raft group on the --directory-peers (3 in
// development, 5 in production). While a majority of them lives, raft
// keeps every acknowledged change and elects a new leader in about an
// election timeout; nothing else is needed. If a majority is lost for good
// (their disks gone), the directory cannot commit, and the cluster cannot
// register nodes, declare deaths, move tables or change the extent map,
// although extents and tracts keep serving what their clients already
// know.
//
// Recovery is an operator's command, never automatic (a dead majority cannot
// be told from a cut-off one that still commits), on the stopped node's
// store: `arbor directory recover --data-dir DIR` describes the replica
// (voters, last term and index: compare the survivors and pick the most
// up to date) and changes nothing; with --yes-lose-unreplicated-writes it
// applies raftengine.RecoverAloneOffline (server.RecoverDirectoryOffline):
// the replica becomes the group's only voter, keeping every entry it holds
// (raftengine/recover.go says what it keeps and loses). It refuses a data
// dir a server holds and a store with no directory replica. Restarted
// with the same flags, the node leads the directory alone.
//
// The group grows back to the configured peers by membership changes:
// the leader runs RegrowStep every RegrowInterval, which adds each peer of
// --directory-peers that is not a member as a learner and promotes a
// learner to voter once it is active and caught up with the commit (so a
// new voter never holds the quorum back while it catches up); it never
// removes a member, and with the group whole it does nothing. A lost peer
// returns on an empty data dir with --directory-join: its node creates an
// empty replica (no voters) that waits for the leader's snapshot, instead
// of bootstrapping the group from --directory-peers. That flag is what
// keeps the directory from forking: lost peers restarted empty without it
// would bootstrap a group of the old membership among themselves (two of
// three: a quorum) that the recovered one never hears of. A lost peer must
// never return with its old data (the command's warning says so): two of
// them would still form a quorum of the old membership.
//
// The procedure, step by step, is in README.md ("Operations: losing a
// majority"); TestDirectoryLostQuorumRecoveredByOperator (cmd/arbor) runs
// it on real processes.
//
// # Service contract
//
// Only the leader serves; other replicas answer codes.Unavailable with a
// NotLeader detail (leader id and address) and Client follows it. Writes are
// proposed to the log; reads run a ReadIndex first and are linearizable
// (Status with local set is the exception: any replica, possibly stale).
// Refused commands map to gRPC codes (INVALID_ARGUMENT -> InvalidArgument,
// UNKNOWN_NODE/NOT_FOUND -> NotFound, STALE_EPOCH, LEASE_HELD, EXPIRED,
// NODE_DEAD, DECOMMISSIONED, NOT_INITIALIZED -> FailedPrecondition, CONFLICT ->
// Aborted, ALREADY_EXISTS -> AlreadyExists, LIMIT_EXCEEDED ->
// ResourceExhausted) with the CommandResult attached as a detail (ResultOf,
// CodeOf).
package directory
