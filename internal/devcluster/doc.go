// Package devcluster runs a whole arbor cluster on one machine: separate
// `arbor server` processes on free 127.0.0.1 ports, with their data under
// one directory (DESIGN §3, "a single machine runs a whole cluster for
// development"; DESIGN §4, "whole-cluster tests start real processes, kill
// them, restart them and cut them off"). It is the engine of `arbor dev`
// and the cluster-test harness of every package (see devclustertest).
//
// Layout of a cluster directory DIR:
//
//	DIR/dev.json       the cluster's layout: cluster id, node ids, ports, roles
//	DIR/dev.lock       flocked while a Cluster (arbor dev or a test) owns DIR
//	DIR/cluster        the directory voters' addresses, "host:port,host:port,..."
//	DIR/nfs            the nodes' NFS gateways, one host:port a line
//	DIR/<id>/          node <id>'s data dir: arbor.pid, arbor.log, db/, ...
//	DIR/tls/           the cluster's credentials (internal/security), made at
//	                   first start and reused: ca.crt, ca.key (the cluster CA),
//	                   node-<id>.crt/.key (arbor://node/node-<id>, for
//	                   127.0.0.1, ::1, localhost), admin.crt/.key
//	                   (arbor://admin) and admin.pem (the same as one
//	                   credential file for --credentials)
//
// Invariants:
//  1. One owner per cluster directory (dev.lock). So any arbor server still
//     running on a node's data dir while we own DIR is an orphan of a killed
//     owner, and is stopped before its node starts again.
//  2. A node keeps its id, cluster id and data for ever; its ports are kept
//     while they are free and re-chosen (and saved) when not.
//  3. Two clusters never talk: each has a random cluster id that its servers
//     check on every call (see internal/server), and its own CA, so a node
//     of one refuses the certificates of the other in the TLS handshake.
//  4. No process outlives its owner: nodes are stopped at Stop/Close, get
//     SIGTERM if the owner dies (Linux parent-death signal), and a pid file
//     is trusted only if its process is alive and really an arbor server of
//     that data dir.
package devcluster
