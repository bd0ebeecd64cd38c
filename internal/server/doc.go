// Package server runs one arbor node: the process behind `arbor server`
// (DESIGN §3, "one binary with roles"). It owns everything a node has
// exactly once (its data directory, its pebble DB, its gRPC and HTTP
// servers, its metrics registry, its fault injector) and hands them to the
// node's subsystems, the modules, through an Env.
//
// Life cycle (Start, then Shutdown; Run does both around a context):
//
//  1. Normalize and validate the Config; every problem is reported at once.
//  2. Lock DATA/LOCK (flock, non-blocking) and write DATA/arbor.pid.
//  3. Open the node's one pebble DB in DATA/db (raftengine.OpenStore, as
//     the raft engine needs it) and check the node identity stored in it
//     (key "n/identity"): the first start records (node id, cluster id),
//     every later start must match it.
//  4. Build the fault injector, the Prometheus registry, the gRPC server
//     (interceptors: recovery, cluster-id check, faults) with the faults
//     Admin service, and the HTTP server (/metrics, /healthz,
//     /debug/pprof/).
//  5. Init every module in order (they register services and metrics).
//  6. Serve gRPC and HTTP, then Start every module in order; a module's
//     services accept calls only once its Start returned (invariant 6).
//  7. On Shutdown: /healthz reports "stopping", modules Stop in reverse,
//     gRPC drains then stops, HTTP stops, connections, DB, pid file, lock.
//
// Modules (the hook point) are listed by Modules in modules.go; see it for
// where the raft engine, the directory group and the node agent plug in.
//
// Invariants:
//  1. At most one server runs per data directory (the flock), and a data
//     directory only ever serves the node and cluster it was created for
//     (the identity record).
//  2. Every call a node makes carries its cluster id ("arbor-cluster") and
//     node id ("arbor-node") and every call between nodes with the wrong
//     cluster id is refused (codes.FailedPrecondition): nodes of two
//     clusters never talk. Tools (no node id) may omit the cluster id.
//  3. Node-to-node traffic goes through Env.Dialer, so the fault-injection
//     switch (DESIGN §1) covers all of it.
//  4. Nothing is global: two nodes can run in one process (tests do).
//  5. The DB outlives every module and every gRPC handler: it is closed
//     only after all modules stopped and the gRPC server has waited for
//     its handlers.
//  6. No RPC reaches a module that is not running: the services a module
//     registers answer codes.Unavailable (which clients retry) until its
//     Start has returned, and again once its Stop begins (rpcGate).
//  7. A handler's panic is answered codes.Internal and the node serves
//     on, except a panic of the store (pebble's fatal errors: a failed
//     commit, a full disk), which crashes the process: it fails rather
//     than serve on a store it can no longer write.
package server
