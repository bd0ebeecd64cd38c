// Package fs is Arbor's file system (DESIGN.md §2.6): the schema of FSS
// §4 on the B-tree, POSIX operations on it, file data in tracts of the
// tract store, and snapshots as versioned pairs. It is the engine a
// metadata server runs (internal/meta) for the file systems it serves; it
// knows nothing of FUSE or of the wire. Clients (internal/fsclient) ask it
// for metadata and read and write the tracts themselves: FileBlocks gives
// them a file's block map, CommitBlocks points it at the tracts they
// wrote. It reaches its stores only through two interfaces it owns
// (store.go): MetaStore (transactions over ordered keys; *btree.Tree
// through BTreeMeta, MemMeta in memory, a metadata server's tables) and
// DataStore (blobs of tracts; the tract client through TractData, MemData
// in memory). Callers name their session (a mount, a gateway) in the
// context (WithSession): orphans and open files are per session.
//
// # Schema (FSS §4, Figure 5)
//
// Keys are tuples (internal/btree/tuple), so they sort element by element;
// every key starts with the file system number F, so many file systems
// share one tree. The metadata servers keep them in the cluster's system
// B-tree (kv.SystemSpace), apart from every user's KV key space: no KV
// credential reaches it (issue 15).
// Versioned keys end with -S (see Snapshots).
//
//	F, 0                 superblock: epoch W, snapshot generation, id layout,
//	                     overflow counters (unversioned)
//	F, 0, 2, n           snapshot n's record (name, time, deleting)
//	F, 1, D, C, 2, -S    inode: attributes (C = 0: directory D)
//	F, 1, D, 0, 3, N, -S name map: name N in directory D -> handle, type, cookie
//	F, 1, D, 0, 4, c, -S cookie map: readdir position c -> handle, type, name
//	F, 1, D, C, 5, o, -S block map: the block at offset o -> blob, tract, length
//	F, 1, D, C, 6, X, -S extended attribute X
//	F, 1, D, C, 7, i, -S chunk i of a long symlink target
//	F, 1, D, C, 8, i, -S chunk i of a small file's inline data, of the
//	                     block pair version at S (inline.go)
//	F, 2, D, C           orphan: an object with no name left, to reclaim
//	F, 3, guid           a blob to delete from the data store
//	F, 4, mount          a mount's session (it may hold orphans open)
//	F, 5, guid, t        tracts of blob guid (t the first) that a committed
//	                     transaction replaced or cut off, to empty
//
// A directory's inode, names and cookies sort together, followed by the
// objects created in it, each inode followed by its blocks: creating a file
// touches neighbouring keys, mostly one leaf page.
//
// # Handles (Ursa Minor §3.3)
//
// A handle is (D, C): D is the directory the object was created in, C its
// number there (0 for the directory itself); the file system and snapshot
// complete FSS's (F, D, C, S). D is assigned by the child-closest policy
// with directory slots per level and the too-deep, too-wide and catch-all
// regions (layout.go), so a directory's subtree as created is a contiguous
// range of D and hence of keys. Handles never change and are never reused.
//
// # Transactions
//
// Every operation that changes metadata is one transaction (create: the
// parent's inode, the name, the cookie and the new inode; rename: both
// parents, both names, three cookies, the moved and the replaced object,
// an orphan record), within the store's 15 values. Every write transaction
// also reads the superblock. Directory moves between parents also write
// it: they check outside the transaction that the destination is not
// below the moved directory, and writing the superblock makes any two of
// them conflict, so the check of the later one sees the earlier.
//
// # Snapshots (FSS §4, FlexGroup §4)
//
// Snapshot numbers come from the cluster directory (1, 2, ...). The
// superblock holds the epoch W: writes carry W, and W is one more than the
// newest snapshot. Taking snapshot n is one transaction that raises W past
// n and records n. Because every write transaction reads the superblock,
// a write in flight either committed before (it is in n) or conflicts and
// runs again at the new epoch: FlexGroup's fence, bump and unfence, done
// by MPSC conflicts. Snapshot n is the state at the commit of the first
// bump past n, and never changes afterwards.
//
// A key's versions are pairs (prefix, -S). The newest version of a prefix
// with S <= s is what a reader at snapshot s sees; the negation sorts the
// newest first, so that read is one short scan whatever the number of old
// versions. A version's value starts with flags: tombstone (absent from S
// on) and has-older (older versions lie below it). A write at W changes
// the newest version where it is if no snapshot in [S, W-1] sees it (its
// S is W, or the snapshots that saw it are gone), else it adds a version
// at W: copy on write at the pair. Deleting likewise deletes the pair, or
// leaves a tombstone if something below must stay hidden.
//
// Writers learn which snapshots exist from the records F, 0, 2, n, cached
// and checked against the superblock's (W, generation) in every
// transaction. Deleting a snapshot marks its record (bumping the
// generation), sweeps the whole file system for versions and tracts no
// remaining snapshot or the live file system reads (only versions below
// the newest, which writers never change; each removal checks the pair is
// unchanged), deletes the blobs of files gone from every view, and removes
// the record.
//
// # Data (FSS §4, DESIGN §2.3)
//
// A regular file's bytes are tracts of its own blob (created at its first
// flush), of the file system's data layout: the directory's file-system
// record holds it (`arbor fs create --data ec:5+2`), and the mount's
// TractData (WithLayout) creates every new blob with it, so a file system
// can keep its file data erasure-coded (DESIGN §2.9) while its metadata
// stays replicated (the metadata server refuses a layout that survives
// more lost nodes than the metadata's extents and directory do: ec:D+P
// needs 2P+1 replicas of each, `arbor dev --metadata-replicas`; the
// cluster's default replicas:K is always accepted, as every file system
// naming no layout has it). The block map gives each block of the file a tract; blocks are
// small first and grow with the offset (blocks.go). A tract is written
// once and never changed: a flush writes every changed block to new tracts
// (allocated by the blob's atomic extend), then points the block map at
// them, then empties the tracts no snapshot needs any more. So a snapshot's
// blocks never change, and a reader holding an old block map pair reads
// either the old data or an emptied tract, which it detects by its length
// and reloads. Truncate cuts the boundary block's length in the pair
// (copying it if a snapshot shares it) and deletes the blocks past the end
// in batches, recorded in the inode (TrimFrom) so a crash is finished
// later.
//
// The client (internal/fsclient) buffers writes per file (write-back) and
// flushes them on close, fsync, release, and when the buffer is large: one
// flush writes its blocks' tracts in parallel and commits them ten to a
// transaction (CommitBlocks), each conditional on the pairs it read, so a
// flush that raced another writer fails with ErrRaced and starts again.
// Other clients see the data once flushed and re-opened (close-to-open
// consistency): an open drops the client's cached block map.
//
// A small file (at most MaxInlineBytes, 8 KiB: 68% of the files of a
// Linux source tree; the layout takes up to 16 KiB, the first block)
// keeps its bytes inline,
// next to its inode: its first block's pair holds the first
// InlineChunkBytes of the data itself (blockEntry.Inline), and chunks
// F, 1, D, C, 8, i hold the rest, each at the pair's version (inline.go):
// written, rewritten in place or copied on write, and deleted in the same
// transaction as the pair, so a reader of the pair version at S reads the
// chunks at S. Its Tract is a number the writer chose to tell its writes
// apart. Its flush is one metadata commit: no blob, no extend, no tract.
// It has no blob until it grows: a flush that writes the first block while
// the file is larger than MaxInlineBytes writes it to a tract like any
// other (the inline pair is its base), and a flush that writes only the
// first block of a file of at most MaxInlineBytes puts it inline again (a
// file truncated back to a small one goes back into the metadata at its
// next write, its tract freed). Snapshots version the pair and its chunks
// together, truncate cuts the data in place (a snapshot's version is a new
// pair with new chunks, no tract to copy), the sweep deletes a version's
// chunks with it, fsck counts inline pairs, checks they are the first
// block of a regular file, that every chunk their length calls for is
// there with its length at their version, and that no chunk belongs to no
// inline version; and nothing frees a tract for them.
//
// A data hold (SetHold, attr.go) lets a client's close return before its
// flush: the client records in the inode that its session still has the
// file's data on the way (HoldSession, and HoldUntil, HoldFor from now by
// the server's clock), then flushes; its flush's last commit (the one
// with a modification time) clears the hold, or SetUnhold if the flush
// failed. Meanwhile other sessions' Lookup, GetAttr, Open and FileBlocks
// of the file wait (polling the cache every holdPoll), so what they see
// after the writer's close is its data (close-to-open consistency); a
// hold whose writer died lapses at HoldUntil, leaving the file as it was.
// Snapshot readers never wait. A metadata server drains holds before a
// snapshot (WaitHolds).
//
// # Orphans
//
// When an object loses its last name, the transaction that removes the
// name either deletes it (nothing else holds it: an empty file, a device)
// or keeps its inode with no links and lists it under F, 2, naming a
// session that holds it open. It is reclaimed (blocks, attributes, inode,
// then its blob, through the queue F, 3) at once, or when its last open
// handle closes (Release). Opens are counted in the memory of whoever runs
// the FS; orphans of a session that disappeared (its record F, 4 expired)
// are reclaimed by ReclaimOrphans. Only the session an orphan's record
// names may still write to it. A metadata server that just took a table
// over does not know its opens until the sessions tell it (they do within
// a bound, Config.OpensKnown): an object that loses its last name meanwhile
// becomes an orphan naming no session (0), which any session that tells
// of its open may write, and which is reclaimed in the background once the
// opens are known. A session that does not tell in time (cut off from the
// cluster) finds its file gone: its flushes get ESTALE, as with NFS.
//
// # Freed tracts
//
// A transaction that replaces or deletes a block no snapshot shares lists
// the tract it named under F, 5 in the same commit; the tract is emptied
// after the commit and the record then deleted. A process that dies
// between the two leaves the record, and DeleteQueuedBlobs finishes the
// work: a tract is never leaked by a lost process, and never emptied
// before the commit that stopped naming it.
//
// # Invariants
//
//  1. Each live name has a live cookie with the same handle and name, and
//     the object it names exists; a directory has exactly one name (the
//     root none) and link count 2 + its subdirectories; another object's
//     link count is its number of names, and an object with none is an
//     orphan.
//  2. A version that has older versions below it says so (has-older), so
//     deleting it never uncovers them.
//  3. A cookie pair is written once (at the epoch the name records) and
//     then deleted: it never has older versions.
//  4. Every block pair names a tract of its file's blob holding at least
//     its length; no two pairs name one tract; a tract no pair names is
//     empty (or about to be emptied by the client that replaced it).
//  5. A snapshot's view never changes once its record exists.
//  6. An inline block pair version at S has exactly the chunks its length
//     calls for, at S, each of its length; every chunk belongs to such a
//     version (chunks follow their pair's versions, not invariant 2).
//
// Check (check.go, `arbor fsck`) verifies 1, 2, 4 and 6 in every view.
package fs
