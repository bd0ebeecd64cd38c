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
// A file of at most fs.MaxInlineBytes is flushed inline: its bytes go in
// the metadata commit, with no tract. chmod, chown and utimens of a
// regular file the client has open are held and sent with the file's next
// flush or close (set-id bits never are); its attributes, and a
// directory's as the client's last change in it left them, answer getattr
// for a second, and an object seen without extended attributes answers
// getxattr itself for a second: the kernel's own attribute cache time.
// Fsync, fsyncdir and syncfs (SyncMetadata) also wait until every
// metadata change the client was answered early is durable (Syncer).
//
// With FSConfig.FlushAfterClose (mounts, unless --durable) a file whose
// data goes to tracts is flushed after close returns, under a data hold
// that makes other clients wait for it (files.go, Flushes after close;
// fs.SetHold); the last close of a file (release), fsync, fsyncdir,
// syncfs, rename and unmount wait for those flushes.
//
// fsclienttest is the model test of this API, run over every kind of
// metadata service.
package fsclient
