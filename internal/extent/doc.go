// Package extent is Arbor's extent store (DESIGN.md §2.4): FSS's DASD (FSS
// §3 "pages, blocks, extents" and "block ownership", §6 "DASD", §8 "no
// retries in the storage layer"). It is what the B-tree (internal/btree)
// stores its pages in.
//
// An extent is an array of pages, grouped in blocks, replicated by one
// Raft group of the replication engine (internal/raftengine). Its
// geometry (page size, block size, extent size, replication) is fixed at
// creation and carried in the group's descriptor. The extents a cluster
// creates for itself get the replication of `arbor server
// --metadata-replicas` (default DefaultReplication, 3; `arbor dev
// --metadata-replicas`), chosen when the cluster is created: they hold
// every file system's metadata and the KV store, and 2f+1 replicas
// survive f lost nodes. A file system whose data survives more (an
// ec:D+P layout survives P) needs 2P+1 (internal/meta refuses the layout
// otherwise). The only way to change
// anything is a multi-page store-conditional (MPSC): up to 15 elements
// (conditional page writes, slot checks, block allocations and frees),
// applied atomically or not at all.
//
// # Pieces
//
//   - StateMachine (statemachine.go, apply.go, keys.go, record.go): one
//     extent replica, the deterministic core. Every command validates and
//     checks everything before it writes (plan, then execute), so a refused
//     command changes nothing.
//   - Server (server.go): the Extent gRPC service of a node. Reads and
//     writes are served by the extent's leader; a follower forwards a call
//     once to the leader it knows (never further), and every reply names
//     the leader. Replies to writes are remembered by request id in the
//     extent's replicated state for two minutes (replies.go), so a
//     duplicated or resent request (the network's, the fault injector's,
//     a client's after a lost reply) runs once and its repeat gets the
//     first reply, across leader changes and restarts.
//   - Client (client.go, txn.go): the library. It caches the extent map
//     (from the directory), node addresses and leaders; every call has a
//     deadline (the context's, else CallTimeout, 1 s as FSS §8's MPSC
//     deadline: retry.DefaultStoreCall). Within it the client retries,
//     under the project's policy (internal/retry), only what is safe
//     whatever happened: a call that ran nothing (no leader, a moved
//     leader, a dead node, which it routes around), and a write whose
//     reply was lost, resent under its request id, which the extent
//     remembers (replies.go). Everything else is the caller's to decide.
//   - Manager (manager.go): placement, on the directory leader: it creates
//     a new cluster's first extents and re-replicates the extents of dead
//     nodes. Node (node.go) wires all of it on one node, with the
//     background recovery of abandoned transactions.
//
// # The API the B-tree uses
//
//	c, _ := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: opts})
//	exts, _ := c.Extents(ctx)                     // the extent map: ids, geometries
//	g, _ := c.Geometry(ctx, ext)                  // PageSizeBytes, PagesPerBlock(), Blocks()
//	free, _ := c.FreeBlocks(ctx, ext, nearPage, n) // hint: free blocks near a page
//	rs, _ := c.Commit(ctx, []extent.Element{
//		extent.AllocateBlock(free[0], tenant),     // or extent.Allocate(ext, tenant): lowest free block
//		extent.Write(ptr, slot, data),             // conditional write (slot 0: fresh page)
//		extent.Check(other, otherSlot),            // read-set check
//		extent.Free(oldBlock),
//	})                                             // rs[i].Slot, rs[i].Block per element
//	page, err := c.ReadPage(ctx, ptr)             // page.Data, page.Slot, linearizable
//	if ref, ok := extent.PreparedTxn(err); ok {
//		c.Recover(ctx, ref)                        // finish or abort it (FSS §6), then read again
//	}
//
// A write may carry its page as an edit script against the page at the
// slot it names instead of the full image (extent.WriteDelta, built by
// EncodeDelta; delta.go says why a slot names exactly one base and how
// the script is encoded): the replica rebuilds the page in plan, before
// it writes anything, and refuses the whole MPSC with ErrDeltaMismatch
// (an ErrInvalid) unless the rebuilt page has the length and CRC-32C the
// writer gave; the writer then sends the full image. A cross-extent
// prepare keeps the rebuilt page in its record, never the script.
//
// A Pointer is the tagged pointer of FSS §3 (extent, page, generation,
// tenant, read-only bit); a block's pointer points at its first page and
// ptr.WithPage(p) points at another page of the same block. Elements apply
// in order, so a write may follow the allocation of its block in the same
// MPSC (with slot 0: a newly allocated block's pages are empty). A page
// holds at most PageSizeBytes; a read returns what the last write stored
// (an unwritten page, or one of a block freed since, is empty, standing
// for zeros, with slot 0).
//
// Errors (errors.go) wrap exactly one kind: ErrConflict (a slot moved, a
// block is no longer free), ErrStale (ownership mismatch: stale generation,
// wrong tenant, read-only bit), ErrPrepared (a prepared cross-extent
// transaction holds the page; PreparedTxn names it), ErrAborted (the
// cross-extent transaction was fenced by recovery or passed its expiry),
// ErrNoSpace, ErrInvalid (bad input), ErrNotFound (unknown extent),
// ErrUnavailable (not executed: no leader, node down), ErrPermissionDenied
// (the node refused the caller's credential what the call names: a tenant
// naming another owner's page; not retried) and ErrAmbiguous (a write's
// outcome is unknown). Only ErrAmbiguous may hide a change.
//
// # Slots, ownership, allocation
//
// A page's slot is the Raft index of the entry that last wrote it: the
// MPSC's entry, or for a cross-extent transaction the entry that applied
// the write at that extent (its decide-and-release, or the last extent's
// prepare-and-decide). Pages are allocated lazily: an extent's pebble keys
// exist only for blocks ever allocated and pages ever written. A block's
// ownership is (generation, tenant, read-only bit, allocated); allocation
// and free each bump the generation; freeing deletes the block's pages.
// Tenant 0 owns nothing. Every page access, read or write, compares the
// pointer's tag with its block's ownership in the same state it reads or
// writes the page.
//
// # Cross-extent MPSC: FSS §6 in 2n state transitions
//
// Over extents E1 < E2 < ... < En (one part per extent; all of an extent's
// elements go in one step), each transition one raft entry in one extent:
// prepare E1..E(n-1) (record the part and the list pointers prev/next, lock
// the pages and blocks the part touches, reserve allocated blocks), then
// prepare-and-decide En (check and apply its part: the commit point), then
// decide-and-release E1..E(n-1) from the head (apply, unlock, leave a
// COMMITTED tombstone), then release En. Before the commit point the
// prepared extents are a prefix of the list, after it the unreleased ones
// are a suffix. Recover, given any prepared record, walks forward fencing
// each next extent (no record becomes an ABORTED tombstone: the promise
// never to prepare or decide, which is how FSS's "promise" is extracted);
// a DECIDED/COMMITTED extent means commit (walk back to the suffix's head,
// release forward), a fenced one means abort (abort backward from the last
// prepared extent). A conflicting access meets ErrPrepared with the
// holder's id; readers recover, and every extent leader recovers the
// transactions of its extents that are past their expiry (the coordinator's
// deadline plus a second), so nothing stays locked.
//
// # Identity and storage
//
// An extent is the engine group of kind Kind whose id is the extent id,
// from the directory's extent map: ids are in [FirstExtentID=1000,
// MaxExtentID); smaller ids are system groups (1: the directory). The
// geometry is in the descriptor's params (extentpb.GroupParams). All of an
// extent's state is in its group's key space (keys.go), inside the
// engine's 's' prefix; the package claims no pebble prefix of its own.
// Default geometry: 8 KiB pages, 256 KiB blocks, 1 GiB extents, 3
// replicas; pages are at most 256 KiB so that an MPSC of 15 full pages is
// one raft entry under the engine's 8 MiB command limit.
//
// # Invariants
//
//  1. Apply is deterministic: time comes from the command (the proposing
//     leader's clock) and the extent's clock never goes back (max of the
//     commands'); tombstones are collected by that clock.
//  2. A command that is refused (any code but OK) writes nothing but,
//     when it carries a request id, its remembered reply (replies.go);
//     every command that writes rewrites Meta, whose applied index makes
//     it the state's version.
//  3. Reads are linearizable: the leader runs a ReadIndex (answered from
//     its lease when it holds one), then reads its replica through the
//     Reader the engine gave Load, in one pebble iterator's view, so a
//     read sees exactly one applied state (pebble publishes batches
//     atomically and in order; a Reader without views falls back to
//     reading Meta before and after). Check validates a read-only
//     transaction the same way, with an MPSC's checks, and no raft entry.
//     This relies on the engine's Reader staying valid while the replica
//     lives, which it does (it reads the node's database) as raftengine's
//     contract states.
//  4. A page or block locked by a PREPARED record is neither read nor
//     written nor freed until the record is decided or aborted; an
//     allocation reserved by one is not handed out twice.
//  5. A transaction commits only at its last extent's prepare-and-decide;
//     an extent with an ABORTED record (a fence) never prepares or decides
//     it, and after its expiry no extent prepares it, so after a fence, or
//     after the expiry, the outcome is final.
//  6. The transaction record decoder (DecodeTxnRecord) accepts only
//     well-formed records (checked per state); it is fuzzed.
//  7. A page delta writes only the page its writer promised: it is
//     applied to the page at the slot it names (one content: delta.go),
//     and only if the result has the promised length and CRC-32C; else
//     the MPSC is refused whole (ErrDeltaMismatch). Records hold rebuilt
//     pages, never scripts. ApplyDelta is fuzzed (FuzzApplyDelta).
//
// # Placement (the extent manager)
//
// While its node leads the directory group, the manager (1) creates extents
// until the map holds InitialExtents (4), each on one node per failure
// domain where it can, least-loaded first; (2) for every extent with a
// replica on a dead, decommissioned or unknown node, or with fewer replicas
// than its replication: creates an empty replica on a new node (a failure
// domain the extent lacks, least loaded), AddLearner at the leader, waits
// until it has caught up (snapshot), AddVoter, RemoveReplica of the dead
// ones, and records the new replica set in the extent map under the next
// epoch; (3) every 30 s, checks that every replica exists. Each step is
// idempotent and the raft membership is the truth between steps, so a
// manager that stops half-way is resumed by the next pass or the next
// leader. Its progress is logged and exported (arbor_extent_manager_*).
//
// # Tenancy
//
// A caller whose certificate names tenant T may name only pages and blocks
// owned by security.ExtentTenant(T) (issue 15; FSS §3): the owner tag of
// every pointer it sends, and of every block it allocates, is checked
// against its authenticated tenant before the request runs; a transaction
// step that names only a transaction id, and a query of one, is checked
// by the extent's leader against the part the transaction's record holds
// (a follower does not forward it for a tenant); and no answer shows T
// another owner's transaction or block ownership (tenancy.go lists the
// rules and why an id-only fence stays open).
package extent
