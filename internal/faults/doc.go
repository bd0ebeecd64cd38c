// Package faults is arbor's fault-injection switch (DESIGN §1, after FSS §3:
// "every failure path is exercised all the time"). It makes any gRPC call or
// stream message fail, be delayed or be duplicated with a set probability,
// and cuts nodes off from each other (partitions), at run time.
//
// It is a set of gRPC interceptors around an Injector. The configuration
// comes from --faults or ARBOR_FAULTS (see Parse for the syntax) and can be
// changed while the node runs through the Admin service (faultspb).
//
// How faults are applied:
//
//   - Unary calls are decided by the client. A failure is, at random, a lost
//     request (the server never sees the call) or a lost reply (the server
//     executes the call, the client gets an error). Both return the same
//     status, so callers see an ambiguous failure, as on a real network.
//     A duplicate sends the same request again after the first, so the
//     server executes it twice; the caller gets the first reply.
//   - Streams: opening a stream can fail (request lost) or be delayed. Then
//     every message is decided by its sender: client-to-server messages by
//     the client interceptor, server-to-client messages by the server
//     interceptor. A failed message is dropped silently, a delayed one waits
//     before it is sent, a duplicated one is sent twice.
//   - Partitions are enforced by the receiver. Every outgoing call carries
//     the caller's node id in the "arbor-node" metadata; a server whose
//     injector blocks that node rejects the call, and every later message of
//     an open stream in either direction, with codes.Unavailable. To cut two
//     nodes apart, block each one on the other.
//
// Invariants:
//  1. Reproducibility: every decision draws the same number of values from
//     one seeded PCG stream, whatever the outcome, so for a given seed the
//     k-th decision of an injector is the same in every run. (Which call is
//     the k-th depends on goroutine scheduling; a single caller replays
//     exactly.) A zero seed is replaced by a random one, which Config
//     reports so a failing run can be replayed.
//  2. The two kinds of failure are indistinguishable to the caller: same
//     code, same message.
//  3. The Admin service itself is never faulted or partitioned, so a test
//     can always heal what it broke.
//  4. Calls without "arbor-node" metadata (operator tools, tests) are never
//     partitioned: a partition is a relation between nodes.
//  5. Every message hop is decided at most once (see above), so the
//     configured probabilities are the probabilities a message sees.
package faults
