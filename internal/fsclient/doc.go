// Package fsclient is one client's view of an Arbor file system (DESIGN.md
// §2.6 and §2.7): the POSIX operations the FUSE mount and the NFS gateway
// serve. Metadata goes to the metadata service through the Metadata
// interface (internal/meta's FSClient over gRPC, or Local: a file system
// run in the same process); file data goes straight to the tract store.
// Writes are buffered per file (write-back) and flushed on close, fsync,
// release and when the buffer is large; reads go through a tract cache.
// Close-to-open consistency: an open drops what the client cached of the
// file's blocks, so it sees what other clients flushed before.
//
// fsclienttest is the model test of this API, run over every kind of
// metadata service.
package fsclient
