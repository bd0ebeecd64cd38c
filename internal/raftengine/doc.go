// Package raftengine is Arbor's multi-Raft replication engine (DESIGN.md
// §2.1). One Engine per node hosts that node's replicas of many raft groups:
// the directory group and, later, one group per extent. It is written once
// and used by every replicated layer, which supplies a StateMachine.
//
// It builds on go.etcd.io/raft/v3's RawNode (the algorithm, with no I/O or
// clock of its own) and adds what a node needs around it:
//
//   - Storage: every group's raft log, hard state and state-machine data live
//     in the node's one pebble database (keys.go). Raft state is synced
//     before any message that depends on it is sent.
//   - Scheduling: one scheduler runs rounds over every group that has work
//     (scheduler.go); a round persists the Readies of all its groups in one
//     batch with one sync (round.go). A group is never processed by two
//     workers at once, so per-group state needs no locks.
//   - Transport: messages to the same node are batched across groups on one
//     stream per node pair (transport_grpc.go); LocalNetwork does the same in
//     one process for tests.
//   - Quiescence: idle groups stop ticking and heartbeating (quiesce.go).
//   - Snapshots: a replica that needs truncated entries, or a new one, gets
//     the state machine's key span streamed and installed atomically
//     (snapshot.go).
//   - Membership change (learner, voter, removal), leader transfer, and
//     linearizable reads by ReadIndex.
//
// Invariants and ordering rules:
//
//  1. Persist before send: a Ready's entries and hard state are committed to
//     pebble (synced when raft says MustSync), in the same batch as the
//     application of its committed entries, before any proposer or reader
//     learns of them and before any message that vouches for them goes out:
//     MsgAppResp, MsgVoteResp, MsgPreVoteResp (raft's msgsAfterAppend). The
//     other messages (a leader's MsgApp above all) go out before the sync,
//     as raft's asynchronous storage writes send them; the leader's own
//     log counts towards the commit quorum only once durable
//     (sendsBeforeSync in group.go).
//  2. Applied state with data: the applied index, its term and the conf state
//     are written in the same batch as the state-machine writes of the
//     entries up to it. On restart raft replays from the applied index, so a
//     state machine never sees an entry twice or misses one.
//  3. Truncate after durable apply: log entries are removed only up to the
//     applied index and only by a synced batch, which (the WAL being
//     ordered) makes every earlier unsynced apply durable first.
//  4. A snapshot replaces a group's state-machine span and applied state in
//     one atomic ingest, and never wipes raft log entries first.
//  5. Only leaders accept proposals, reads and membership changes; others
//     answer *NotLeaderError with a hint. A proposer learns the outcome of
//     its command exactly once: its result when applied, ErrProposalDropped
//     when raft refused it or another leader overwrote its log position, or
//     its context's error when it stopped waiting (outcome unknown).
//  6. A replica removed from its group's membership destroys its local data
//     and leaves a tombstone of its term, so a later replica of the same
//     group on the same node cannot vote twice in one term.
package raftengine
