// Package nemesis runs a whole arbor cluster through a bad week: a real
// dev cluster (internal/devcluster, five nodes by default) under a mixed
// workload, while a nemesis kills, restarts, partitions and slows its
// nodes, and checkers prove after every cycle that nothing acknowledged
// was lost (DESIGN §4, "whole-cluster tests start real processes, kill
// them, restart them and cut them off, and check that no acknowledged
// write is lost"; FSS §3's fault-injection testing; issue 13). It is what
// `arbor debug nemesis` and `make chaos` run, and, for a few cycles, a test
// of `make test`. With Config.Data "ec:D+P" (`--data`, `make chaos-ec`:
// 7 nodes, ec:5+2) the file system's data and the workload's blobs are
// erasure-coded, on a cluster whose TLT rows have D+P slots and whose
// directory and metadata extents have 2P+1 members, so that the kills of
// two nodes stay within what both survive.
//
// # The workload
//
//   - Two FUSE mounts (`arbor mount` processes) of one file system, one
//     writer each: files with seeded contents created, fsynced and closed,
//     renamed, removed and read back.
//   - Blobs put (several tracts each) and read back through the tract
//     store's client.
//   - Single-key KV puts with known values, and a bank: KV transactions
//     that move amounts between a few accounts, and audits that read every
//     account in one transaction. The total never changes, and the bank's
//     history is checked for linearizability with porcupine.
//
// An operation is acknowledged when every call of it succeeded (for a
// file: create, write, fsync and close). An operation that failed has an
// unknown outcome: its objects are "uncertain" and are checked only for
// being absent or intact, never required.
//
// # A cycle
//
// The nemesis picks one fault from its seeded generator: kill -9 of one
// or two nodes (the directory leader, a table owner or an extent leader
// on purpose some of the time, else at random), a graceful restart, a
// partition of one node or of a minority (the fault switch), slow RPCs or
// failing and duplicated RPCs on every node. It holds the fault while the
// workload runs, then heals it (restarts what it killed) and measures the
// recovery: the time until the cluster reports healthy, and until a KV
// put, a blob put and a file write all succeed again. Then the workload
// pauses and the checks run: every acknowledged file (through both
// mounts), blob and key reads back with its checksum, no file appears that
// nobody created, `arbor fsck`, `arbor kv check` and `arbor blob verify`
// pass (each may retry while re-replication finishes), the bank's total
// holds and its history since the last pause is linearizable. A node that
// exits on its own, or a panic in a node's log, is a failure too.
//
// # Reproducibility
//
// One seed (Config.Seed, ARBOR_SEED in the test and `--seed` on the
// command line) drives every choice: faults, victims, hold times, file
// names, sizes and contents, keys, transfers. The processes' scheduling is
// not seeded, so a replay makes the same choices but not the same
// interleavings.
//
// Invariants the run checks (a violated one is reported with the cycle,
// and makes the run fail):
//  1. Every acknowledged file, blob and key reads back, byte for byte.
//  2. Nothing appears that no operation created (a removed file does not
//     come back).
//  3. The bank's total never changes, and its history is linearizable.
//  4. fsck, kv check and blob verify pass once recovery is over.
//  5. No node exits unexpectedly or logs a panic.
package nemesis
