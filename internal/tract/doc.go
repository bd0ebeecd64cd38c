// Package tract is Arbor's tract store: Flat Datacenter Storage's blobs of
// fixed-size tracts, placed over every disk by the tract locator table
// (DESIGN.md §2.3; FDS §2 and §3; Boxwood §3.4 for catching up a replica
// that was away).
//
// # Pieces
//
//   - Layout (layout.go, table.go): the deterministic core. BuildTable
//     makes the TLT from all pairs of tractservers in distinct failure
//     domains plus k-2 more per row, weighted by disk size, with every
//     server primary about equally often (FDS §3.3, §3.3.1); PlanRepair
//     takes dead tractservers out (FDS §3.2); PlanGrowth gives new or
//     returning ones pending entries and PlanCommit commits them (FDS
//     §3.4). They are pure functions of a table and the servers' states.
//     The locator is (SHA-1(guid)[:8] + tract) mod len(TLT) (FDS §2.2).
//   - Manager (manager.go): runs on every directory member and acts while
//     it leads the directory group. It initialises the cluster's tract
//     size, installs the first table once the set of tractservers is
//     stable, and each tick repairs, commits and grows through the
//     directory's conditional row updates, reading the tractservers'
//     Status to know who is in sync.
//   - Service (service.go, disk.go, rw.go, sync.go, scrub.go): a node's
//     tractservers, one per configured disk (Store, store.go), behind one
//     gRPC service (tractpb.TractServer).
//   - Client (client.go, verify.go): the FDS API (create, open, close,
//     delete, get size, extend, write tract, read tract, get simultaneous
//     limit), with Async variants and Verify.
//
// # Data layout
//
// Tract data lives in one file per tract version under DISK/tracts/XX/
// (XX the first byte of the GUID), named GUID.TRACT.ROWVERSION.SEQ, so a
// short tract costs its size. Records live in the node's pebble database
// under prefix 't' (owned by this package):
//
//	t m <disk:4> <guid:16> <tract:8, sign flipped>   TractMeta: row, stamp, length, CRC-32C, replication, incarnation
//	t r <disk:4> <row:4>                             RowSync: last row version (and slot) caught up at
//	t u <disk:4> <guid:16> <tract:8, sign flipped>   a version the primary stored and may not have forwarded (reforward.go)
//
// and every record is cached in memory. The metadata tract (-1) has no
// file: its record carries the BlobMeta (length in tracts, replication,
// incarnation, a tombstone flag, recent request ids).
//
// # Protocol
//
// Every request carries the row version of the client's TLT. A tractserver
// refuses an older one (STALE_TLT with the current version: the client
// refreshes and retries) and fetches the table when it sees a newer one. A
// tractserver polls the TLT every 500 ms and stops serving if it has not
// reached the directory for its validity (at most half the directory's
// dead timeout), so one cut off from the directory stops before it can be
// replaced.
//
// Writes go to the row's primary (slot 0). It gives the write a stamp
// (row version, then a sequence per tract), stores it, forwards it to the
// blob's other slots and the row's pending entries for those slots, and
// replies once all have stored it. Blob metadata operations (create,
// extend, delete) go to the primary of the metadata tract's row, which
// decides them under the tract's lock and forwards the new record to every
// member; extend is atomic and returns the new size, and a retried
// mutation (same request id) is answered with its first result.
//
// Blob metadata with a member missing: a row whose member died and that
// no server can replace (a cluster of exactly k failure domains, as 7
// nodes with rows of 7 for ec:5+2) keeps the dead member, and every blob
// operation on it would wait for its return. The primary therefore also
// acknowledges an operation when every member that did not store it is
// on a node the directory has declared dead (the forward refused,
// timed out or answered TLT_BEHIND) and a majority of the row's slots,
// itself included, did store it (forwardRecord). A node declared dead
// loses its TLT continuity and catches up every row it holds before it
// serves again, and a successor catches up from the primary, so no
// member serves the row without the record; a promoted primary is a
// complete member, which holds it. Before the declaration (a node just
// killed, or one cut off from this primary alone) operations wait, as
// writes do; past a majority missing they wait too, so a row never
// writes on with most of its members away. A version
// whose forward failed (or was cut short by a crash) stays marked on the
// primary, which forwards it again until its replicas hold it or it is no
// longer the row's primary (reforward.go): the primary's version wins. Reads go
// to any readable slot member; a blob with replication r uses slots
// 0..r-1 of each row (FDS §3.3).
//
// A member that joins a row, or sees its row's version change, catches up
// from the primary (sync.go): it lists the primary's tracts written at or
// after the row version it last caught up at (everything, if it never held
// the row or now holds a lower slot), copies those whose stamp differs
// from its own, and deletes its own tracts of that window that the primary
// lacks. A server back from an absence thus copies only the writes it
// missed (Boxwood's degraded-mode catch-up), and the manager gives it back
// the rows it still holds data of. A primary that was promoted (its old
// primary died) first pulls what it lacks from the row's complete replicas.
// Rows catch up in parallel (8 per disk, 4 tracts per row at a time).
//
// A row none of whose live members holds a complete copy waits, unrepaired,
// for a dead member to return (RowsWaiting; `arbor tlt` names them): a
// kill is not a lost disk. A dead member that will never return is given
// up by decommissioning its node (`arbor tlt forget-member NODE
// --yes-lose-unreplicated-writes`, which refuses a node not declared dead):
// no row waits for a decommissioned member, and a row whose complete
// copies were all on given-up members takes the live slot member holding
// the most tracts (RepairInput.Held, from its row status) as its primary;
// the others catch up from it, losing what only the given-up members held
// (TestForgottenMemberRowRepaired).
//
// # Erasure-coded blobs (DESIGN.md §2.9)
//
// A blob's layout is chosen at creation and kept in its metadata (tract
// -1, BlobMeta.ec): replicas:K, or ec:D+P (Reed-Solomon from
// klauspost/reedsolomon, FSS's 5+2 by default). Files ec.go (layout,
// client), ec_server.go (shard RPCs), ec_rebuild.go (rebuild and repair),
// ec_repair.go (the queue of stripes written with shards missing),
// rangeio.go (byte ranges).
//
//   - Placement: we extend the table's rows rather than derive stripes
//     from several of them. Each data tract of an ec:D+P blob is one
//     stripe; shard i of tract t lives on slot i of row Locate(g, t), so a
//     TLT built with k >= D+P slots per row (the tract store's
//     replication option) places a stripe exactly as FDS places k
//     replicas: on servers in distinct failure domains, spread over every
//     disk, and repaired slot by slot by the same PlanRepair. A stripe
//     made of several rows' members would change shape whenever any of
//     those rows did, and distinct domains across rows could not be kept
//     by the per-row repair. Replicated blobs keep using the first r
//     slots. Creating an ec:D+P blob is refused (INVALID_ARGUMENT,
//     nothing created) when the rows have fewer than D+P slots or when a
//     row's first D+P slots share a failure domain (the manager lets
//     domains repeat only when there are too few).
//   - Writes: the client encodes the tract (D data shards of
//     ceil(len/D) bytes, the last zero-padded, and P parity shards) and
//     sends shard i to slot i's server and to the pending entries for
//     slot i, all in parallel (WriteShard). Every shard of one write
//     carries the same random write id, the tract's length, its CRC-32C
//     and the write's generation: one more than the highest the client
//     finds among the stripe's shards (a metadata read of every slot, of
//     which D+1 must answer). A server refuses a client shard no newer
//     than the one it holds (a late retry, or an uncoordinated concurrent
//     writer).
//   - Acknowledgement (issue 16's "D+1 with the rest repaired"): a write
//     is acknowledged when every shard is durable on all its targets, or,
//     when some shards' servers cannot be reached (the connection
//     refused, cut off from the directory, or not answering in time while
//     the directory no longer holds them alive: a dead member no server
//     can replace, as on a cluster of exactly D+P failure domains), when at
//     least D+1 shards are durable and every other one failed only for
//     want of its server, or because its server's disk is full (OVERLOADED:
//     a full node refuses every write until space is freed, so waiting for
//     it would stall every stripe of its rows). Any other refusal by a
//     live server fails the attempt, which is retried whole after a TLT
//     refresh. The missing
//     shards are rebuilt by their server: a restarted server rebuilds the
//     shards of every row it holds (replica rows by their catch-up, rows
//     it leads by recheckShards), a server back from a cut-off catches up
//     every row, a replaced one is rebuilt by its successor; for the
//     rest (a server refused, full or timed out that then answers again,
//     having neither restarted nor left) the writer asks a member of the row that
//     stored its shard to repair the stripe (RepairStripe, ec_repair.go):
//     it queues the stripe and, once the write has settled and every
//     server of the stripe is alive, rewrites the missed shards as the
//     scrubber would; the scrubber's parity pass remains the backstop. A
//     timeout to a server the directory holds alive (a slow one) is not a
//     missing server: the write is retried whole. Why D+1: two writes cannot both hold D+1
//     of the D+P shards (for D >= P), so an acknowledged write outvotes
//     every older one, and it survives one more lost shard.
//   - The stripe's write (chooseWrite, one rule for reads, rebuilds,
//     verify and the scrubber) is the newest generation of which D shards
//     are found. A shard that missed writes has an older generation and is
//     never read as the tract's: while D+1 shards of the acknowledged
//     write survive, no older write has D.
//   - Partial writes and appends (rangeio.go) read-modify-write the
//     stripe: read the tract (reconstructing it if need be), patch, write
//     the whole stripe with a new write id. Tracts are the unit of
//     concurrency: concurrent writers of one tract must coordinate, as in
//     FDS; Extend gives concurrent appenders disjoint tracts.
//   - Reads read the D data shards (slots 0..D-1) in parallel; if one is
//     missing, fails its checksum, belongs to another write or its
//     server cannot answer, they read the parity shards too and decode
//     from the stripe's write (chooseWrite), and check the decoded tract
//     against the writer's CRC-32C. A tract of which D servers answer
//     without any shard is a hole (every acknowledged write reached D+1
//     servers, and D+1 + D > D+P).
//   - Shards are records of their own (TractMeta.shard): a server holds
//     at most one shard per tract, whatever its index. Catch-ups from the
//     primary neither list, copy nor drop them; instead a member that
//     catches up a row (a new member, a pending entry, a promoted primary,
//     a server back from an absence) rebuilds, before it calls the row in
//     sync, every shard of its slot it lacks or holds of another write or
//     index: it lists the shards of the row's other members, picks each
//     stripe's write (chooseWrite), reads D of them and decodes its own
//     (ReconstructSome), installing it only if its record did not change
//     meanwhile and is not of a newer generation. Each affected row is rebuilt by its own new
//     member, so recovery reads from all surviving disks and writes to
//     all new ones at once (FDS §3.2). A promoted primary holds another
//     slot's shard; it rebuilds shard 0 over it, which keeps at least D
//     distinct shards readable at every step.
//   - A corrupt shard (checksum) is never served: the read decodes
//     around it, and the server rebuilds it from the others (on read, on
//     verify's listing and in the scrubber). Verify and the scrubber check
//     parity: Verify reads every shard of every stripe and recomputes the
//     parity; the scrubber of each stripe's slot-0 server does the same
//     in the background and rewrites a shard that is missing or of
//     another write (WriteShard, conditional on the record it read).
//
// # Invariants
//
//  1. The stamps of one tract's writes are totally ordered, and the
//     primary stores each write before any replica (so a replica never
//     holds a newer version than the primary of the same row version).
//  2. A write or metadata operation is acknowledged only once every slot
//     of its replication and every pending entry for those slots has
//     stored it (a metadata operation: every one not on a node declared
//     dead, and a majority of the row's slots); so every member of a row
//     at version v that serves holds every write acknowledged at v (a
//     member declared dead catches up before it serves again).
//  3. A request under an old row version is refused and changes nothing;
//     every refused or malformed request changes nothing.
//  4. A member serves reads only if it holds every tract of its slot: it
//     is in sync at the row's version, or it was in sync at the previous
//     version and has stayed a member (in the same or a higher slot) with
//     an unbroken view of the table; a primary serves only once complete.
//     Promotion prefers such a member.
//  5. A catch-up deletes only tracts of its window that a complete primary
//     lacks, and never replaces a write of the row's current version by an
//     older one.
//  6. Every tract's data is checked against its CRC-32C when written (the
//     client's checksum), forwarded, copied and read; a mismatch on disk
//     is repaired from another replica (on read, on verify and by the
//     scrubber) and is never served.
//  7. A file is written (and synced, with SyncWrites) before the record
//     naming it; a record always names a complete file. A small tract
//     (Config.EmbedBytes) keeps its data in the database, written with its
//     record in one batch.
//  8. Tracts of a deleted blob (or of an earlier incarnation of its GUID)
//     are never read as the blob's; the scrubber reclaims them.
//
// # Known limits
//
// Erasure-coded writes go on with up to P-1 shards' servers unreachable
// (D+1 durable), so with a dead member no server can replace, ec blobs
// are written degraded (they survive one more loss until the member
// returns and rebuilds); with P down they stall until one returns or is
// replaced. Blob metadata operations (create, extend, delete) wait for a
// dead member of the metadata tract's row only until the directory
// declares it dead (then they go on while a majority of the row is
// left); replicated writes still need every slot of their replication:
// with a dead member no server can replace, they stall until it
// returns. A shard missed while its server was out of reach but never
// restarted nor cut off from the directory is rewritten from the repair
// queue of the member its writer asked, once the write has settled
// (TornStripeGrace, a minute by default) and the server is alive again;
// the queue is in memory and bounded (maxQueuedRepairs), so a stripe
// whose queue was lost to a restart, or refused when full, waits for the
// scrubber's parity pass (VerifyInterval); reads decode around it
// meanwhile. A stripe whose writer died between its shard
// writes may hold shards of two writes; reads pick the newest with D
// shards or more, and if neither has D, that tract is lost: reads fail
// (never return wrong data), verify reports it, and a rebuild skips it
// rather than hold back its row's catch-up. A catch-up of a row that holds
// stripes lists the shards of every member of the row, so a member that
// does not answer (a partition) delays it by up to the RPC timeout; a row
// whose primary and catching-up member hold no shard asks only the primary
// (rebuildShards).
//
// A full node (Config.DiskFull) refuses the writes it is sent (OVERLOADED:
// replicated writes stall until it has room, erasure-coded ones miss its
// shard), but its own catch-ups of rows it holds (sync.go: copying tracts,
// rebuilding shards) still write.
//
// Tombstones of deleted blobs are kept (a few hundred bytes each). The
// scrubber asks each blob's metadata primary once per pass. Writes to a
// row stall (and are retried by the client) from a member's death until
// the directory declares it dead. The TLT is fetched whole.
//
// # Tenancy
//
// A blob belongs to the tenant recorded in its metadata at create (issue
// 15); a tenant's credential reaches only its own blobs: its blob
// operations are checked by the blob's primary, its tract and shard reads
// and writes by the serving tractserver (tenancy.go).
package tract
