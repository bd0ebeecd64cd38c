// Package ui is the web dashboard every node serves on its HTTP port at
// /ui/ (issue 17, item 3; DESIGN §3 names "a web dashboard" among the
// operator's tools). It is one HTML page, a style sheet and plain
// JavaScript, embedded in the binary with go:embed: no CDN, no fonts, no
// build step, so the page works on a cluster without Internet access and
// always matches the binary that serves it.
//
// Routes (Register puts them on a node's mux):
//
//	GET /ui/                  the page and its assets (static/)
//	GET /ui/api/overview      the cluster's state as JSON, served by the
//	                          handler given in Options.Overview (package
//	                          overview); the page polls it every 2 s
//	GET /ui/api/metrics       a short history of cluster-wide throughput
//	                          and latency, computed here from the nodes'
//	                          Prometheus metrics (see Sampler)
//
// The page draws its charts itself as SVG. A fetch that fails keeps the
// last data on screen under a "node unreachable" banner rather than
// blanking it: an operator opens the dashboard precisely when things fail.
//
// Invariants:
//  1. Sampling costs nothing while nobody looks: the sampler runs only
//     while /ui/api/ was requested within SamplerOptions.IdleStop, and
//     stops by itself after that.
//  2. Memory is bounded: the history holds at most Window/Step points and
//     the sampler remembers one previous scrape per node, for at most
//     maxTargets nodes; a scrape reads at most maxScrapeBytes.
package ui
