// Package nfs is Arbor's stateless NFSv3 gateway (DESIGN.md §2.7; FSS §8,
// Orca's presentation servers): NFS version 3 (RFC 1813) and MOUNT
// version 3 on one TCP port, over internal/gateway/sunrpc, serving every
// file system of a cluster through the metadata service's client library
// (internal/fsclient, as the FUSE mount does). A portmapper's GETPORT is
// answered too (portmap.go), on port 111 if asked.
//
// # Exports
//
// Every file system is exported as /NAME and each of its snapshots, read
// only, as /NAME/.snapshot/SNAP (mount.go); a path below an export
// mounts that directory. Each snapshot has an fsid of its own.
//
// # Stateless handles
//
// A file handle (handle.go) is (F, D, C, S) and the file system's
// generation: it names its object by itself, so any gateway answers any
// handle, and a gateway that restarts or is replaced is invisible to
// clients except for the delay. (D, C) is never reused within a file
// system, so an object that is gone answers NFS3ERR_STALE; a file
// system deleted (and another made under its number) makes its handles
// stale through the generation; bytes that are no handle answer
// NFS3ERR_BADHANDLE.
//
// What a gateway holds is cache: file system records (2 s), one client
// session per file system and snapshot, and the files it has open for
// READ and WRITE. A file opened more than a second ago is opened again
// before a READ, so reads see what was written through other gateways
// (close-to-open, which is what NFS clients' own attribute caches give).
//
// # Writes
//
// WRITE UNSTABLE buffers in the gateway's client (write-back); DATA_SYNC
// and FILE_SYNC flush and answer FILE_SYNC; COMMIT flushes the file and
// waits until its metadata is durable. Metadata changes are answered only
// once durable (the session is opened with durable metadata), as NFS
// demands. The write verifier is the gateway process's: it is drawn at
// start and drawn again whenever buffered writes may have been lost (a
// flush failed). A client whose gateway died and who moves to another
// sees another verifier, and resends what it had not committed, which is
// the rule: the dead gateway's unstable data is gone. (The verifier thus
// lives with the unstable data it vouches for; keeping it in the store
// would only be right if the unstable data were there too.) Files idle
// for idleRelease are released, which flushes them.
//
// # Permissions
//
// AUTH_SYS credentials (uid, gid and up to 16 groups) are checked by the
// gateway against the objects' modes as POSIX does (the kernel does this
// for a FUSE mount, default_permissions): search permission for LOOKUP,
// write and search on a directory to add or remove entries, the sticky
// bit, chmod and utimes for the owner, chown for root; an owner may READ
// and WRITE its own file whatever the mode (as Linux's nfsd, for files
// created read-only). AUTH_NONE is uid and gid 65534.
//
// # Congestion
//
// Every NFS call runs within the gateway's congestion window (window.go,
// FSS §8): additive increase on success, halving on an outcome that
// imputes congestion (I/O failure, deadline, a race the store gave up
// on). A call waits for a place until its deadline (OpTimeout, 55 s as
// Orca, under the clients' 60 s retry) and then answers NFS3ERR_JUKEBOX,
// on which clients wait and retry.
//
// # Errors
//
// The file system's errors are syscall.Errno values (internal/fs); they
// map to NFS3ERR_* once (statusOf). An error that wraps none is an I/O
// failure: NFS3ERR_IO. Arguments that do not decode get GARBAGE_ARGS,
// never a partial effect (every handler decodes all its arguments before
// it acts); FuzzCall runs arbitrary arguments through every procedure.
//
// # Duplicate requests
//
// Calls that are not idempotent go through a duplicate-request cache kept
// in the cluster's KV store, which every gateway shares (drc.go): a call
// retransmitted after a reconnect, or to another gateway after the first
// died, is answered from its recorded reply, or, if its first run was
// cut short, run in retry mode. A gateway commits the records of
// concurrent calls in groups (KVReplies: one transaction for up to 14).
// Within one gateway the metadata client also retries with request ids
// the metadata servers apply once.
//
// # Locks
//
// NLM v4 (program 100021) and the status monitor calls clients make
// (NSM, 100024) share the port (nlm.go): byte-range locks whose state is
// one record per file in the cluster's KV store (KVLocks), updated in one
// transaction, so any gateway sees every lock and a lock outlives the
// gateway that granted it, as FSS keeps lock state in the store. No
// gateway keeps waiters: a blocking LOCK in the way is answered
// NLM4_BLOCKED without a GRANTED callback, and the client asks again
// (Linux's lockd every 30 s; tools/nfsfuse every 200 ms). SM_NOTIFY and
// FREE_ALL drop a restarted client's locks. Locks of a client that
// vanishes without restarting stay until it comes back (NLM has no
// leases).
package nfs
