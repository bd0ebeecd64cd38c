// Package buildinfo says which build of arbor is running.
//
// It implements no paper; it exists so that every process, log line and
// metric can be traced back to the code that produced it (DESIGN §2.7:
// operators need to know what runs where).
//
// Invariants:
//  1. Get never fails and never returns an empty Version: a build without
//     -ldflags version information reports the module version recorded by
//     the Go toolchain, or "(devel)".
//  2. The version set at link time wins over anything read at run time, so
//     release builds are labelled exactly as the release process says.
package buildinfo
