// Package btree is Arbor's distributed B-tree (DESIGN.md §2.5; FSS §5,
// "Dendron"; Boxwood §3.7 for the B-link right links and background
// compression): a B+-tree whose pages are extent pages, changed only by
// multi-page store-conditional (MPSC, FSS §3). It holds all of Arbor's
// metadata and is exposed directly as the ordered key-value API (Get, Put,
// Delete, Scan, multi-key transactions).
//
// # The page store
//
// The tree reaches storage only through PageStore (store.go), a small
// interface owned by this package: linearizable page reads returning data
// and slot, and Commit of up to MaxOpsPerCommit ops (conditional writes,
// slot checks, writes to freshly allocated blocks, block allocation and
// free), with typed errors (conflict, stale pointer, prepared by another
// transaction with Resolve, unavailable, ambiguous, invalid, no space).
// Pages are named by tagged pointers (PageRef: extent, page, generation,
// tenant; FSS §3 block ownership). MemStore is its in-memory twin, faithful
// to MPSC down to injected ambiguous commits and prepared cross-extent
// transactions; the extent store's client is adapted to the interface.
//
// # Pages
//
// Every page is self-validating (page.go): it stores its kind, its height
// (leaves are 0), its fence keys [lo, hi) and a CRC, and holds only keys
// inside its fences. A reader that finds the key inside the fences of a
// page of the right height knows it has the right page, whatever path led
// there; so a transaction includes only the leaves of its keys, never
// their ancestors, and a commit names at most one page per key touched.
// Inner pages map separator keys to children; entry i's key is child i's
// low fence, so the first key is the page's own low fence. Every level is
// chained left to right by right links (Boxwood's B-link tree): scans
// follow them, and a walk that lands left of its key after a concurrent
// split moves right instead of restarting.
//
// Pages live in blocks of the tree's tenant. Page 0 of every block is the
// block header: a bitmap of the pages in use. A split puts the new page in
// a free page of its neighbour's block, or of its right neighbour's (FSS §5
// Figure 6). When the block is full, the block itself splits first, in a
// transaction of its own: its last pages of that level (up to four: with
// the new block, both headers, the moved run's left neighbour and at most
// two parents, 14 of MPSC's 15 pages) move to a new block as close as the
// store finds, in the same extent first, so each block keeps holding one
// key range of one level (an append past a block's last page just starts
// the next block). Keys near each other share pages, blocks and extents,
// so transactions over them are mostly single-extent. A moved or merged
// page's old place gets a free-page marker in the same commit, so a stale
// pointer to it fails validation.
//
// # The root
//
// The root never moves: it is page 1 of the tree's first block, made by
// Create, and its tagged pointer is the tree's name. Growing the tree
// splits the root's contents into two new pages and makes the root their
// parent; shrinking it pulls its only child's contents back up. Each of
// the cluster's KV trees (the system's, holding the file systems'
// metadata, a tenant's, the administrators') records its root pointer in
// the directory's config KV (package internal/kv: kv.Space); every client
// starts there.
//
// # Finding pages
//
// A per-client cache (cache.go) maps key ranges to pages, level by level.
// A lookup reads the cached page and validates it; a wrong guess is
// dropped and the key is found by walking down from the lowest cached
// ancestor that still validates, or from the root, in reads separate from
// the transaction (FSS §5). Reads are linearizable one at a time; only the
// commit's slot checks make a transaction's reads consistent.
//
// A client that writes most of the leaves it reads (a metadata server over
// the tables it owns, DESIGN.md §2.6) can also keep leaves themselves
// (Config.LeafCacheBytes, leafcache.go): its read-write transactions then
// take a cached leaf with its slot instead of reading it, and the commit's
// slot check is what validates it. A leaf another client changed fails
// the commit with a conflict; the transaction's leaves are forgotten and
// the next attempt reads them. A transaction that used a cached leaf always
// commits, even if it wrote nothing, and read-only transactions never use
// the leaf cache. Written leaves go into it at the slots the store reports.
// Splits use it too (FSS §5's structural changes): the full leaf, its
// parent, the block header and a free page's marker come from it when
// cached, as the split's MPSC writes each at the cached slot, and the
// pages a split wrote go into it, so the transaction that needed the
// split does not read its new leaf back. A split that fails reads every
// page afresh on its next attempt.
//
// # Transactions
//
// Update/View run a function against a Txn, which reads leaves into a
// working set and commits it with one MPSC: written pages as conditional
// writes, read pages as slot checks, plus any non-tree pages and block
// allocations or frees. A transaction touches at most MaxTxnValues (15)
// values; a value is a key, a leaf a scan reads, a non-tree page, or a
// block allocation or free. The store retries only calls that did not
// execute (no leader, a dead node); this layer runs the function again
// after conflicts, stale pointers, prepared transactions (resolved first)
// and unavailability, under the project's one retry policy
// (internal/retry): the caller's deadline, else Config.TxnTimeout
// (retry.DefaultTransaction, 30 s); jittered exponential backoff (Config's
// MinBackoff and MaxBackoff, retry.Fast: 1 ms to 200 ms); and at most
// Config.MaxAttempts (100) attempts, a bound for conflict storms, which
// the deadline usually reaches first when the store is unavailable.
// Get of a single key is one linearizable page read and needs no commit; a
// read-only transaction over several pages commits slot checks only.
// UpdatePages charges values per leaf instead of per key, for batches of
// many keys on few leaves (a metadata server's group commit).
//
// Structural changes are transactions of their own (rebalance.go). An
// insert that does not fit aborts its transaction, the page is split
// (after its parent, if the parent is full), and the transaction runs
// again. A delete just deletes; a page it leaves under a quarter full is
// queued for a background rebalancer that merges it with a sibling under
// the same parent (if both fit in three quarters of a page) or moves
// entries between them. A rebalance that is lost (crash, full queue) is
// harmless: the page is merely underfull, and is queued again when next
// written or scanned.
//
// # Ambiguous commits
//
// Every tree page remembers the ids of the last writerHistory (4)
// transaction attempts or structural changes that wrote it. After an
// ambiguous commit the transaction reads back a page it wrote: its own id
// there proves the commit applied; the id of the version it read, followed
// only by others, proves it did not and never will (the page's slot moved,
// so the commit's condition fails for good); a page still at the slot it
// read is first rewritten unchanged, conditional on that slot, so that a
// commit still in flight (a Raft entry applied late) can no longer apply.
// If no written page can tell, the caller gets an error wrapping
// ErrAmbiguous.
//
// # Invariants
//
//  1. Every page a reader uses has been validated: decodes with its CRC,
//     has the expected kind and height, and its fences contain the key.
//  2. The leaves' fences tile the key space: the first begins at the empty
//     key, each ends where the next begins, the last at +infinity; the same
//     holds at every level, and each level's right links follow that order.
//  3. Each inner entry's key is its child's low fence, and the next entry's
//     key (or the parent's high fence) is the child's high fence.
//  4. All leaves are at height 0 and every child is one below its parent.
//  5. A block header marks in use exactly the tree's pages of its block;
//     page 0 is the header itself. Splits and merges change pages, parent
//     and headers in one commit, so no crash leaks or loses a page.
//  6. A commit contains at most one page per value of its transaction, and
//     never a page above the leaves unless it is a structural change.
//
// Check (check.go) verifies invariants 2 to 5 on a quiet tree; the model
// tests (btreetest) check the rest against a map, over MemStore and over
// real extents (package extentstore).
//
// # Limits
//
// Keys are at most DefaultMaxKeyBytes (1 KiB) and values at most
// DefaultMaxValueBytes (4 KiB) on 8 KiB pages (Config can set others;
// Open refuses bounds a page cannot hold). A transaction touches at most 15
// values. Larger input is refused with ErrKeyTooLarge, ErrValueTooLarge or
// ErrTooManyValues before anything is written. Keys for structured data
// use the order-preserving tuple encoding of package tuple.
package btree
