// Package raftengine is Arbor's multi-Raft replication engine (DESIGN.md
// §2.1). One Engine per node hosts that node's replicas of many raft groups:
// the directory group and, later, one group per extent. It is written once
// and used by every replicated layer, which supplies a StateMachine.
//
// It builds on go.etcd.io/raft/v3's RawNode (the algorithm, with no I/O or
// clock of its own) and adds what a node needs around it:
//
//   - Storage: every group's raft log, hard state and state-machine data live
//     in the node's one pebble database (keys.go).
//   - Scheduling: one scheduler runs the groups that have work in rounds
//     (scheduler.go, round.go). A round takes every group queued when it
//     starts, and each group contributes at most one raft Ready to it. The
//     round writes its Readies (entries, hard states, and the application
//     of their committed entries) into two pebble batches, one for the
//     Readies raft needs synced (MustSync) and one for the rest. It
//     commits the second without a sync, then the first with one sync:
//     however many groups make progress together, they share one fsync
//     (TiKV's raftstore does the same for the regions of one poll), and a
//     Ready that needs none does not wait for it. Only once a Ready's batch
//     is committed does the round send the messages that vouch for it,
//     answer proposers and readers, and call Advance. Installing a snapshot
//     is the one Ready persisted on its own, at once (rule 4). The begin
//     and finish phases run on up to Config.Workers goroutines; a group is
//     never processed by two of them at once, so per-group state needs no
//     locks. Metrics.SyncedReadies / Metrics.RoundSyncs is how many
//     Readies share one fsync.
//   - Transport: messages to the same node are batched across groups on one
//     stream per node pair (transport_grpc.go); LocalNetwork does the same in
//     one process for tests.
//   - Quiescence: idle groups stop ticking and heartbeating (quiesce.go).
//   - Snapshots: a replica that needs truncated entries, or a new one, gets
//     the state machine's key span streamed and installed atomically
//     (snapshot.go).
//   - Membership change (learner, voter, removal), leader transfer, and
//     linearizable reads: from the leader's lease when it holds one, else
//     by raft's ReadIndex, whose completion extends the lease (lease.go,
//     with the clock assumption it rests on).
//
// Invariants and ordering rules:
//
//  1. Persist before send: a Ready's entries and hard state are committed to
//     pebble (synced when raft says MustSync), in the same batch as the
//     application of its committed entries, before any proposer or reader
//     learns of those entries, before raft hears of it (Advance), and
//     before any message that vouches for that state goes out: MsgAppResp
//     (a follower's log), MsgVoteResp and MsgPreVoteResp (a vote). The
//     Ready's other messages leave before the commit, as soon as the Ready
//     is in the batch; above all a leader's MsgApp, so that the followers
//     write to their disks while the leader writes to its own (raft thesis
//     §10.2.1). This is raft's own split (raft.send puts exactly those
//     three types in msgsAfterAppend; with AsyncStorageWrites they ride on
//     MsgStorageAppend), mirrored by sendsBeforeSync and checked against
//     raft by a test. It is safe because raft counts the leader's own log
//     towards the commit quorum, and a candidate's own vote towards its
//     election, only through self-addressed responses that RawNode steps on
//     Advance, after the commit; an early vote request or heartbeat carries
//     a term that may not be durable yet, which raft's async mode allows
//     too. So a leader may crash with entries that its followers hold and
//     it does not, but no entry is committed without a quorum of durable
//     copies, and no write is acknowledged before its round is committed.
//  2. Applied state with data: the applied index, its term and the conf state
//     are written in the same batch as the state-machine writes of the
//     entries up to it (and, since they share the round's batch, as the
//     raft state of the Ready that carried them). On restart raft replays
//     from the applied index, so a state machine never sees an entry twice
//     or misses one. A state machine's in-memory effects may be visible
//     before the batch is durable; the entries are committed, so they come
//     back on restart.
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
//  7. A node whose disk is full (diskfull.go: its ballast released) writes
//     only what keeps its state consistent (hard state, applying entries
//     it already logged): it refuses proposals with ErrDiskFull and
//     snapshots, drops log entries sent to it, and hands its leaderships
//     to live peers, until space is back.
package raftengine
