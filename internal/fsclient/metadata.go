package fsclient

import (
	"context"

	"github.com/arbor-storage/arbor/internal/fs"
)

// Metadata is what a file-system client asks of the metadata service
// (DESIGN.md §2.6): every operation but the data itself. The metadata
// servers' client (internal/meta) implements it over gRPC; Local runs a
// file system in the same process. Errors wrap a syscall.Errno for POSIX
// answers (fs.Errno), fs.ErrRaced when a block commit lost a race, and
// anything else is an I/O failure.
//
// Contract, beyond the fs.FS method of the same name:
//   - Create with open also opens the new file for the client's session,
//     as Open does.
//   - Open says the client's session holds a file open (again: harmless),
//     Release that it no longer does (the client calls it at its last
//     close): a regular file whose last name goes while open is kept until
//     no session holds it.
//   - Mutating calls are applied at most once even when the client retries
//     them after a failure (the metadata servers record replies).
type Metadata interface {
	Lookup(ctx context.Context, dir fs.Handle, name string) (fs.Attr, error)
	GetAttr(ctx context.Context, h fs.Handle) (fs.Attr, error)
	SetAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error)
	Create(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred, open bool) (fs.Attr, error)
	Mknod(ctx context.Context, dir fs.Handle, name string, mode uint32, rdev uint64, cred fs.Cred) (fs.Attr, error)
	Mkdir(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error)
	Symlink(ctx context.Context, dir fs.Handle, name, target string, cred fs.Cred) (fs.Attr, error)
	Readlink(ctx context.Context, h fs.Handle) (string, error)
	Link(ctx context.Context, h, dir fs.Handle, name string) (fs.Attr, error)
	Unlink(ctx context.Context, dir fs.Handle, name string) error
	Rmdir(ctx context.Context, dir fs.Handle, name string) error
	Rename(ctx context.Context, srcDir fs.Handle, srcName string, dstDir fs.Handle, dstName string, flags uint32) error
	ReadDir(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntry, error)
	ReadDirPlus(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntryPlus, error)
	GetXattr(ctx context.Context, h fs.Handle, name string) ([]byte, error)
	SetXattr(ctx context.Context, h fs.Handle, name string, value []byte, flags uint32) error
	ListXattr(ctx context.Context, h fs.Handle) ([]string, error)
	RemoveXattr(ctx context.Context, h fs.Handle, name string) error
	Open(ctx context.Context, h fs.Handle) (fs.Attr, error)
	Release(ctx context.Context, h fs.Handle) error
	StatFS(ctx context.Context) (fs.StatFS, error)
	FileBlocks(ctx context.Context, h fs.Handle, starts []uint64) (fs.FileState, []fs.BlockRef, error)
	CommitBlocks(ctx context.Context, h fs.Handle, blob fs.GUID, blocks []fs.NewBlock, c fs.Commit) (fs.BlocksCommitted, error)
}

// Syncer is implemented by a Metadata whose server may answer a change
// before it is durable (internal/meta's early replies): Sync waits until
// every change answered so far is durable.
type Syncer interface {
	Sync(ctx context.Context) error
}

// Local is Metadata over a file system run in this process, for one
// session: tests, and tools that run a file system themselves.
type Local struct {
	FS      *fs.FS
	Session uint64
}

var _ Metadata = Local{}

func (l Local) ctx(ctx context.Context) context.Context { return fs.WithSession(ctx, l.Session) }

func (l Local) Lookup(ctx context.Context, dir fs.Handle, name string) (fs.Attr, error) {
	return l.FS.Lookup(l.ctx(ctx), dir, name)
}

func (l Local) GetAttr(ctx context.Context, h fs.Handle) (fs.Attr, error) {
	return l.FS.GetAttr(l.ctx(ctx), h)
}

func (l Local) SetAttr(ctx context.Context, h fs.Handle, in fs.SetAttrIn) (fs.Attr, error) {
	return l.FS.SetAttr(l.ctx(ctx), h, in)
}

func (l Local) Create(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred, open bool) (fs.Attr, error) {
	ctx = l.ctx(ctx)
	a, err := l.FS.Create(ctx, dir, name, mode, cred)
	if err == nil && open {
		l.FS.OpenNew(ctx, a.Handle)
	}
	return a, err
}

func (l Local) Mknod(ctx context.Context, dir fs.Handle, name string, mode uint32, rdev uint64, cred fs.Cred) (fs.Attr, error) {
	return l.FS.Mknod(l.ctx(ctx), dir, name, mode, rdev, cred)
}

func (l Local) Mkdir(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error) {
	return l.FS.Mkdir(l.ctx(ctx), dir, name, mode, cred)
}

func (l Local) Symlink(ctx context.Context, dir fs.Handle, name, target string, cred fs.Cred) (fs.Attr, error) {
	return l.FS.Symlink(l.ctx(ctx), dir, name, target, cred)
}

func (l Local) Readlink(ctx context.Context, h fs.Handle) (string, error) {
	return l.FS.Readlink(l.ctx(ctx), h)
}

func (l Local) Link(ctx context.Context, h, dir fs.Handle, name string) (fs.Attr, error) {
	return l.FS.Link(l.ctx(ctx), h, dir, name)
}

func (l Local) Unlink(ctx context.Context, dir fs.Handle, name string) error {
	return l.FS.Unlink(l.ctx(ctx), dir, name)
}

func (l Local) Rmdir(ctx context.Context, dir fs.Handle, name string) error {
	return l.FS.Rmdir(l.ctx(ctx), dir, name)
}

func (l Local) Rename(ctx context.Context, srcDir fs.Handle, srcName string, dstDir fs.Handle, dstName string, flags uint32) error {
	return l.FS.Rename(l.ctx(ctx), srcDir, srcName, dstDir, dstName, flags)
}

func (l Local) ReadDir(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntry, error) {
	return l.FS.ReadDir(l.ctx(ctx), dir, after, max)
}

func (l Local) ReadDirPlus(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntryPlus, error) {
	return l.FS.ReadDirPlus(l.ctx(ctx), dir, after, max)
}

func (l Local) GetXattr(ctx context.Context, h fs.Handle, name string) ([]byte, error) {
	return l.FS.GetXattr(l.ctx(ctx), h, name)
}

func (l Local) SetXattr(ctx context.Context, h fs.Handle, name string, value []byte, flags uint32) error {
	return l.FS.SetXattr(l.ctx(ctx), h, name, value, flags)
}

func (l Local) ListXattr(ctx context.Context, h fs.Handle) ([]string, error) {
	return l.FS.ListXattr(l.ctx(ctx), h)
}

func (l Local) RemoveXattr(ctx context.Context, h fs.Handle, name string) error {
	return l.FS.RemoveXattr(l.ctx(ctx), h, name)
}

func (l Local) Open(ctx context.Context, h fs.Handle) (fs.Attr, error) {
	return l.FS.Open(l.ctx(ctx), h)
}

func (l Local) Release(ctx context.Context, h fs.Handle) error {
	return l.FS.Release(l.ctx(ctx), h)
}

func (l Local) StatFS(ctx context.Context) (fs.StatFS, error) { return l.FS.StatFS(l.ctx(ctx)) }

func (l Local) FileBlocks(ctx context.Context, h fs.Handle, starts []uint64) (fs.FileState, []fs.BlockRef, error) {
	return l.FS.FileBlocks(l.ctx(ctx), h, starts)
}

func (l Local) CommitBlocks(ctx context.Context, h fs.Handle, blob fs.GUID, blocks []fs.NewBlock, c fs.Commit) (fs.BlocksCommitted, error) {
	return l.FS.CommitBlocks(l.ctx(ctx), h, blob, blocks, c)
}
