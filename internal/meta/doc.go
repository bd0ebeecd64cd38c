// Package meta is Arbor's metadata service (DESIGN.md §2.6): the metadata
// servers, each owning some tables of each file system's keys and running
// the file-system engine (internal/fs) over them, the Meta gRPC service
// they answer, and the client library (Client, FSClient) that
// internal/fsclient and the CLI reach them with. Speed comes from here: an
// owner answers from memory and merges concurrent operations into few
// MPSC commits. Yet all state stays in the extent store, so any server can
// die and others take its tables over without copying a page.
//
// # Tables
//
// A table (Ursa Minor §3.1) is a range [Lo, Hi) of directory ids D of one
// file system (fs.DRange; Hi 0: to the end). It owns every key filed under
// its ids, objects (F, 1, D, ...) and orphans (F, 2, D, ...); superblock,
// snapshot records, sessions and the blob and tract queues are shared and
// belong to no table. Ids are child-closest (fs doc.go, Handles), so a
// table holds whole subtrees and most operations touch one table.
//
// The directory's delegation map holds, per table: id, file system, range
// (ids as 8-byte big-endian keys), owner node, an epoch raised for every
// new owner (or new incarnation of the owner), and a lease.
// The owner renews the lease every RenewInterval and serves the table
// only until the last renewal's deadline, counted from before it was sent
// and less a safety margin. Reads from its cache are safe by that alone:
// nobody else may own the table earlier. Writes do not trust clocks; the
// header fences them.
//
// A table's own records sit at the head of its range, before the keys of
// its first directory id, so they share its leaf pages and a commit
// reaches them without touching another extent (records.go); the file
// system's scans skip them:
//
//	F, 1, lo, -1                    header: table, epoch, owner, range,
//	                                W (write epoch), Frozen (a snapshot)
//	F, 1, lo, -1, 1, session, slot  reply record: the last Seq applied
//
// Acquiring a table writes the owner's epoch and node into its header
// (tables.go). Every group commit reads the header of each table it writes
// and requires its epoch, owner and W unchanged and no freeze, so the
// header's page is in every commit's read set: once a new owner or a
// snapshot rewrites it, whatever the old owner still has in flight fails
// in the MPSC (FSS §3) instead of landing; the owner then drops the table
// (or, after a freeze, waits for the thaw).
//
// # The table store
//
// A server keeps one store per file system (store.go), the fs.MetaStore
// its engines run on. It caches the tables it owns by unit: everything
// filed under one directory id, loaded by one scan on first touch and
// forgotten, least recently used first, past Limits.CacheBytes (units
// with writes not yet durable stay). Caching needs no invalidation
// because the owner is its tables' only writer.
//
// Update runs an operation under the store's lock, reading only the
// cache: a unit not loaded makes it unlock, load and run again; touching a
// key of a table served elsewhere fails it with a *ForeignError (see
// BORROW below); reading a shared record is refused, as the commit could
// not check it. So one server's updates of a file system run one at a
// time. That is FSS §8's in-memory serialization of likely conflicts and
// Ursa Minor's lock manager (§3.5), coarsened to the whole store, which
// is cheap because nothing under the lock waits for I/O. The writes go to
// the cache at once (the next operation sees them) and to a queue, and
// Update returns once they are durable, or at once for an operation that
// may be answered early (Early replies, below). View reads owned keys
// from the cache and the rest from the tree, and waits for any write of
// another session it saw that is not durable yet.
//
// Group commit (commit.go): one committer per store commits up to
// Limits.BatchEntries queued operations as one B-tree transaction, one
// MPSC with the header checks above, halving a batch whose keys span too
// many pages. Queue order is commit order, so an operation that read
// another's write is durable no earlier. Nothing global is on this path:
// superblock counters are drawn in transactions of their own, only for
// overflow ids (shared.go). A failed commit is not retried here; as FSS
// §8 prescribes, the failure goes back to whoever can retry. Every queued
// operation (later ones may have read the failed ones' writes) is
// aborted, its units are forgotten so the next reader loads what the tree
// holds, and it fails with errRetry: RETRY, or AMBIGUOUS when the commit
// may have happened. Clients ask again; reply records make that safe.
//
// # Clients
//
// Client (client.go) routes each request by a directory id (a name's
// directory, a handle's D; the root for StatFS, sessions and snapshots)
// through the delegation map, cached per file system as in Ursa Minor
// §3.1. It rereads the map (at most every 50 ms) when a server answers
// NOT_OWNER, does not answer, or the map names no owner, and retries with
// jittered backoff until the request's context ends: NOT_OWNER with the
// new map, RETRY and AMBIGUOUS as they were. Errors follow one convention
// across the layers: a server's answer becomes a RemoteError that wraps
// its errno; a gRPC error is mapped once, in requestError (the few that
// refuse the request itself fail at once, the rest are retried); the
// directory's errors arrive as its client's sentinels (directory.ErrNotFound
// and the like, tested with errors.Is), never as directorypb codes.
//
// StatFS reports the cluster's capacity and use, the same for every file
// system (capacity.go).
//
// FSClient is one session's (a mount's) client of one file system. Its
// requests that are not idempotent (creates, links, removes, renames,
// xattr changes, block commits) are recorded: they carry a request id
// (session, slot, seq) kept across retries, where the slot is one of 256
// the session has, each with one request in flight and a seq that only
// grows. The server claims (session, slot), so a duplicate arriving
// meanwhile waits, and reads the slot's reply record in the routing
// table. If it holds this seq the request was applied: the answer is
// rebuilt from the current state (a lookup of the created name, the
// file's blocks) without running it again; an older seq is refused.
// Otherwise the operation's first write transaction writes the record,
// in the same MPSC as the effect: both land or neither. Exactly-once thus
// survives aborts and failovers because the idempotency record is in the
// store (FSS §2), not in a server's memory. CommitBlocks needs it most: a
// client that took an applied commit for failed would free tracts in use.
//
// Sessions (fs doc.go, Orphans): an FSClient writes its session record
// before its first request and renews it every 20 s. Opens are counted
// only in the memory of the server running the engine, so a table's new
// owner (a move, a failover, a split part) does not know which unlinked
// files are still open, and must not reclaim them yet. The FSClient tells
// each owner, once per delegation epoch, its open files in that table
// (SyncOpens): before its first request there at that epoch, and within a
// second anyway. The store reports a table's opens known
// (fs.Config.OpensKnown) once every live session, as read after it took
// the table, has synced, or once it has served the table longer than
// fs.SessionExpiry; until then the engine keeps such files as orphans of
// session 0. Every ReclaimInterval each server reclaims the orphans of
// expired sessions in its tables, and the owner of the table at id 0
// drains the shared queues of blobs and tracts to free (F, 3 and F, 5),
// so that one server does it. A session's releases (its last close of a
// file) are not requests of their own: they ride on its next request to
// the file's table, or go within 100 ms (releases.go); a late release
// only delays a reclaim, and an open of the file takes a queued one back.
//
// # Early replies
//
// DESIGN.md §2.6's asynchronous operations, after CephFS's unsafe replies
// and client replay. A recorded request may ask to be answered early
// (Header.early): the server answers once its operation is applied to
// the cache, before the group commit makes it durable, and its Ack names
// the store (one incarnation of one file system's table store on one
// server), the entry (seq) and the store's abort count (gen). The client
// keeps every such operation in its journal (journal.go) until the store
// says it is durable: every answer carries the store's durable entry, and
// a poller long-polls WaitSafe while the journal holds the store's
// entries (at most every 100 ms while nobody waits for durability: the
// answers tell the rest). Only the first write transaction of an operation (the one with
// its reply record) is answered early; later ones, and a transaction that
// drew ids from the shared counters (a replay would draw others), wait for
// durability, and so does everything that cannot be undone afterwards:
// emptying tracts (fs.DurableWaiter) and reclaiming an unlinked file's
// data (done in the background).
//
// Rules that keep replays sound:
//
//   - A transaction that reads another session's write not yet durable is
//     answered only once that write is (reads included: another client
//     sees a change once it is durable). So the operations of different
//     sessions that were answered early never depend on each other, and
//     their replays commute. A session's own writes are read at once.
//     A server reads the keys of tables it does not serve from the
//     committed tree, which misses what their owners answered early: a
//     lookup whose object lives in such a table (a hard link, a file
//     renamed across tables, a remote directory) says so and the client
//     asks the owner; READDIRPLUS leaves such entries without attributes.
//   - A replay's answer shows the state before the session's later
//     operations that are replayed after it: the client keeps nothing of
//     it (no cached directory attributes).
//   - Entries commit in queue order, so what survives a crash of a store
//     is a prefix of what it answered. A mutation sent to one server first
//     waits until what other servers answered this session earlier is
//     durable (journal.barrier), so what survives a crash of servers and
//     client together is a prefix of the client's operations.
//   - A commit that fails without a verdict is tried again (an unknown
//     outcome is settled by reading the written keys back: the owner is
//     the only writer); only a fenced commit (a new owner, a snapshot's
//     freeze) or retries that run out abort the queue. Aborted entries
//     answered early are lost: the store counts the abort and remembers
//     the range, so WaitSafe tells the client, and gates each table they
//     touched until their sessions have replayed them.
//   - The client replays what a store lost (WaitSafe says so, the store
//     is unknown after a restart, or it does not answer), oldest first, to
//     the owner of each operation's table now, with the first run's
//     request id (exactly once: reply records), time and, for a create,
//     handle and blob (fs takes only a blob of the file system's own, its
//     number in the GUID's first 8 bytes: EINVAL otherwise, so no replay
//     makes another's blob a file's data). Then it sends SyncOpens for
//     each table it replayed to, which lifts its gate for the session.
//   - A table taken over without a clean handover (its owner died, its
//     lease lapsed) is gated: nobody but replays is served until every
//     live session has synced with the new owner (each does within a
//     second, or at once when it next asks) or gateTimeout passes. A
//     handover that drained the table (move, split, borrow, a stopping
//     server) marks its header Clean and needs no gate. Snapshots drain
//     the owners before freezing (TablesRequest DRAIN), so nothing
//     answered early is missing from a snapshot taken after; the drain
//     first waits for the data holds its server placed (fs.WaitHolds:
//     files whose close returned before their data was written).
//
// Group commits of entries answered early are spaced by
// Limits.CommitInterval so more share one MPSC; an entry someone waits
// for (a durable answer, an fsync, a barrier: WaitSafe urgent) commits at
// once.
//
// # Failover
//
// The delegation coordinator (coordinator.go; Ursa Minor §3.1, §3.7) is
// whichever server holds the directory lease "meta/coordinator": the
// lease, not an election, keeps it unique. Every second it gives each
// table whose lease expired to the live metadata server with the fewest
// tables (avoiding the last owner), with SetDelegation at the expected
// epoch and require_expired, so the directory refuses while the old
// owner's lease runs (and the old owner stopped serving a margin before
// it). It tells the new owner, which acquires the table at once (else at
// its next map poll, every PollInterval); its header write fences any
// commit the old owner, cut off but alive, has in flight. Clients reread
// the map and retry with the same request ids. An owner whose renewal
// finds its lease expired but the table not yet reassigned takes it again
// at a new epoch.
//
// # Moves, splits and BORROW
//
// Nothing is copied: the pages stay in the extent store (Ursa Minor §3.4;
// moves.go). The owner pauses the table (requests get NOT_OWNER, queued
// writes become durable), changes the map at the expected epoch and
// forgets the table's units; the new owner, told at once, acquires it.
// A split cuts a table at a directory id and keeps both parts. Paused, it
// first copies the reply records into the right part's area, since
// retries of requests routed there will look there; then the map splits
// and both parts are acquired. Splits and snapshots take the file
// system's "tables" lock, so no freeze misses a new table.
//
// An operation whose keys span tables owned elsewhere fails with a
// *ForeignError; the server then BORROWs those tables (Ursa Minor §3.5),
// asking their owners to move them here, and runs the operation again as
// one MPSC. A borrowed table returns to its owner after 5 s unused
// (RETURN), so a run of cross-table renames borrows once.
//
// # Placement of new directories
//
// FlexGroup §3.5 (placement.go, remote.go), with metadata servers as the
// members. Once a second each server fetches every live server's table
// statistics (cached inodes and bytes, creates per second) and recomputes
// Urgency, Tolerance, RP and AT. A mkdir draws against RP of its parent's
// depth (in the root: always remote); a remote one goes to the server AT's
// weighted round robin picks, as a new root of the too-deep region whose
// id range is carved into a table of its own (split off, served here for
// the mkdir, then moved). Files always stay with their directory. Every
// table has a lease in the directory, renewed once a second (one
// RenewDelegations command per server renews all of its tables); placement
// stops going remote once the members serve 32 tables each on average.
//
// # Snapshots
//
// FlexGroup §4's coordinated snapshot, fenced in the table headers
// (snapshot.go, admin.go). The directory numbers snapshot n; every header
// gets Frozen = n, which fails the commits in flight and holds new writes
// (reads go on); the superblock records n and raises W past n; every
// header thaws at the new W. Writes before a table's freeze are in n,
// writes after its thaw are not, none commit between: n is the state at
// the bump. W sits in each header so that writes need not read the
// superblock. A store writes only while its tables agree on W, unfrozen,
// as its operations run at one W: it polls the headers of tables that are
// frozen or behind another's W, so a thaw it was not told about (a lost
// refresh) costs it a poll, not its writes. Every step is idempotent, so an
// owner that finds a table frozen for 10 s finishes the snapshot itself.
// Deleting snapshot n marks it deleting, has the owner of every table
// sweep it (naming the tables and epochs it expects each to serve; one
// that does not serve them refuses, and the deletion is asked again), and
// then removes its records.
//
// # Deviations from the papers and DESIGN.md
//
//   - Fencing is the header epoch in every commit's read set, not Ursa
//     Minor's capability revocation (§3.7); commits are atomic MPSCs, so
//     there is no clean bit or recovery (§3.4, §3.6), and a dead server's
//     tables are reassigned one by one, not recovered as a unit.
//   - Owners move their live tables, not the coordinator (no ADD, DROP):
//     the map's compare-and-set on the epoch serializes moves. BORROW asks
//     the owners directly; concurrent borrows are not queued and a
//     borrowed table may be taken away again: the operation then borrows
//     again, and after three borrows the client gets RETRY.
//   - Placement pulls statistics from every server instead of FlexGroup's
//     relayed refresh; usage is a lower bound (what owners cache) over
//     fixed capacities; RP is one value for every depth but the root's;
//     a remote directory is a new table moved away, not a remote hardlink.
//   - Snapshots do not evict caches (there are no FlexGroup RAL caches).
//   - Early replies (above) are not CephFS's: there are no capabilities
//     or delegated inode numbers; a replayed create takes its first run's
//     handle back (fs.WithWant), and sessions other than the writer wait
//     for durability instead of reading unsafe state. An operation
//     answered early and lost in a server crash is replayed after any
//     snapshot taken in between, so that snapshot misses it.
//
// # Tenancy
//
// A file system belongs to the tenant its directory record names (issue
// 15). Every Meta request of a caller whose certificate names a tenant is
// checked against the owner of the file system it names before it runs,
// and refused with PermissionDenied (EACCES at the client) if the file
// system is another's (tenancy.go).
package meta
