// Package fuse mounts an Arbor file system in the kernel through FUSE,
// with github.com/hanwen/go-fuse/v2 (DESIGN.md §2.7, the FUSE client; FSS
// §4 presentation layer). It only translates: every operation is one call
// of the file-system client (internal/fsclient's FS), which asks the
// metadata service for metadata and reads and writes tracts itself.
// Directory listings use READDIRPLUS: the entries come with their
// attributes in one call, so `ls -l` costs no lookup per entry.
//
// # Kernel caching
//
// The kernel caches names and attributes for a short time (EntryTimeout,
// AttrTimeout; one second by default) and no negative entries on a live
// mount, so a name another mount created is found at once. File data
// follows close-to-open consistency, as the library does: an open keeps
// the kernel's page cache (FOPEN_KEEP_CACHE) only if the file's data
// generation is the one this mount saw at its previous open or attribute
// fetch; otherwise the kernel drops the cached pages. Reads past the
// cached size make the kernel fetch attributes again, so a file another
// mount grew reads in full. A snapshot never changes: it is mounted read
// only with long timeouts and the page cache always kept.
package fuse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
)

// Options configure a mount.
type Options struct {
	// Name shows as the mount's source (e.g. "arbor:default").
	Name string
	// EntryTimeout and AttrTimeout are how long the kernel caches names
	// and attributes (zero: 1 s on a live mount, 1 h on a snapshot).
	EntryTimeout, AttrTimeout time.Duration
	// AllowOther lets users other than the mounting one use the mount
	// (needs root or user_allow_other in /etc/fuse.conf).
	AllowOther bool
	// Debug logs every FUSE request.
	Debug  bool
	Logger *slog.Logger
}

// Mount is a mounted file system.
type Mount struct {
	server *gofuse.Server
	dir    string
	fsys   *fsclient.FS
	log    *slog.Logger
}

// maxWrite is the largest write the kernel sends in one request.
const maxWrite = 1 << 20

// New mounts fsys at dir. The caller keeps ownership of fsys: it closes
// it after Unmount.
func New(fsys *fsclient.FS, dir string, opts Options) (*Mount, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	snapshot := fsys.Snapshot() != 0
	entry, attr := opts.EntryTimeout, opts.AttrTimeout
	if entry == 0 {
		entry = time.Second
		if snapshot {
			entry = time.Hour
		}
	}
	if attr == 0 {
		attr = time.Second
		if snapshot {
			attr = time.Hour
		}
	}
	var negative time.Duration
	if snapshot {
		negative = time.Hour
	}
	r := &root{fsys: fsys, log: opts.Logger, snapshot: snapshot, attrTimeout: attr, gens: map[uint64]uint64{}}
	rootNode := &node{r: r, h: fs.RootHandle}
	name := opts.Name
	if name == "" {
		name = "arbor"
	}
	mopts := []string{"default_permissions"}
	if fsys.ReadOnly() {
		mopts = append(mopts, "ro")
	}
	gopts := &gofs.Options{
		MountOptions: gofuse.MountOptions{
			FsName:     name,
			Name:       "arbor",
			AllowOther: opts.AllowOther,
			Options:    mopts,
			MaxWrite:   maxWrite,
			// The kernel's read-ahead in requests as large as writes: a
			// sequential read crosses FUSE in 1 MiB pieces, not 128 KiB.
			MaxReadAhead:         maxWrite,
			Debug:                opts.Debug,
			DisableXAttrs:        false,
			EnableSymlinkCaching: true,
			MaxBackground:        64,
		},
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		RootStableAttr:  &gofs.StableAttr{Ino: 1, Mode: syscall.S_IFDIR},
		// Mode bits as stored: without it go-fuse shows a file or
		// directory of mode 0 as 0644 or 0755 (the kernel checks
		// permissions itself, default_permissions).
		NullPermissions: true,
	}
	server, err := gofs.Mount(dir, rootNode, gopts)
	if err != nil {
		return nil, fmt.Errorf("fuse: mount at %s: %w", dir, err)
	}
	return &Mount{server: server, dir: dir, fsys: fsys, log: opts.Logger}, nil
}

// Wait blocks until the file system is unmounted (by Unmount or by
// fusermount -u).
func (m *Mount) Wait() { m.server.Wait() }

// Unmount unmounts the file system; it fails while it is busy.
func (m *Mount) Unmount() error {
	if err := m.server.Unmount(); err != nil {
		return fmt.Errorf("fuse: unmount %s: %w", m.dir, err)
	}
	return nil
}

// Dir returns the mount point.
func (m *Mount) Dir() string { return m.dir }

// Mounted reports whether dir is a mount point (of any file system), as
// /proc/self/mountinfo lists them.
func Mounted(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == abs {
			return true
		}
	}
	return false
}

// root is what every node of one mount shares.
type root struct {
	fsys     *fsclient.FS
	log      *slog.Logger
	snapshot bool
	// attrTimeout is how long the kernel caches attributes (Options).
	attrTimeout time.Duration

	// gens is the data generation of each file as this mount last told
	// the kernel (by inode number): an open that finds another one tells
	// the kernel to drop its cached pages.
	mu   sync.Mutex
	gens map[uint64]uint64
}

func (r *root) sawGen(ino, gen uint64) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.gens[ino]
	r.gens[ino] = gen
	return !ok || old != gen
}

func (r *root) forget(ino uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gens, ino)
}

// errno turns a library error into the errno the kernel gets, logging
// errors that are not plain POSIX answers (I/O failures).
func (r *root) errno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	e := fs.Errno(err)
	if e == syscall.EIO || errors.Is(err, context.DeadlineExceeded) {
		r.log.Warn("fuse operation failed", "op", op, "err", err)
		return syscall.EIO
	}
	return e
}

// node is one object of the file system in the kernel's inode table.
type node struct {
	gofs.Inode
	r *root
	h fs.Handle
}

var (
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeReadlinker     = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
	_ gofs.NodeGetxattrer     = (*node)(nil)
	_ gofs.NodeSetxattrer     = (*node)(nil)
	_ gofs.NodeListxattrer    = (*node)(nil)
	_ gofs.NodeRemovexattrer  = (*node)(nil)
	_ gofs.NodeOnForgetter    = (*node)(nil)
)

func fillAttr(a *fs.Attr, out *gofuse.Attr) {
	out.Ino = a.Ino
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.Uid, a.Gid
	out.Rdev = uint32(a.Rdev)
	out.Blksize = 4096
	out.SetTimes(&a.Atime, &a.Mtime, &a.Ctime)
}

func caller(ctx context.Context) fs.Cred {
	if c, ok := gofuse.FromContext(ctx); ok {
		return fs.Cred{Uid: c.Uid, Gid: c.Gid}
	}
	return fs.Cred{}
}

// child returns the kernel inode of the object a describes, making it if
// the kernel does not know it yet.
func (n *node) child(ctx context.Context, a *fs.Attr, out *gofuse.EntryOut) *gofs.Inode {
	fillAttr(a, &out.Attr)
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG {
		n.r.mu.Lock()
		if _, ok := n.r.gens[a.Ino]; !ok {
			n.r.gens[a.Ino] = a.DataGen
		}
		n.r.mu.Unlock()
	}
	return n.NewInode(ctx, &node{r: n.r, h: a.Handle}, gofs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino})
}

// Lookup implements NodeLookuper.
func (n *node) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.Lookup(ctx, n.h, name)
	if err != nil {
		return nil, n.r.errno("lookup", err)
	}
	return n.child(ctx, &a, out), 0
}

// Getattr implements NodeGetattrer.
func (n *node) Getattr(ctx context.Context, _ gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.GetAttr(ctx, n.h)
	if err != nil {
		return n.r.errno("getattr", err)
	}
	fillAttr(&a, &out.Attr)
	return 0
}

// Setattr implements NodeSetattrer.
func (n *node) Setattr(ctx context.Context, _ gofs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	var s fs.SetAttrIn
	if m, ok := in.GetMode(); ok {
		s.Valid |= fs.SetMode
		s.Mode = m
	}
	if u, ok := in.GetUID(); ok {
		s.Valid |= fs.SetUid
		s.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		s.Valid |= fs.SetGid
		s.Gid = g
	}
	if sz, ok := in.GetSize(); ok {
		s.Valid |= fs.SetSize
		s.Size = sz
	}
	if in.Valid&gofuse.FATTR_ATIME_NOW != 0 {
		s.Valid |= fs.SetAtimeNow
	} else if t, ok := in.GetATime(); ok {
		s.Valid |= fs.SetAtime
		s.Atime = t
	}
	if in.Valid&gofuse.FATTR_MTIME_NOW != 0 {
		s.Valid |= fs.SetMtimeNow
	} else if t, ok := in.GetMTime(); ok {
		s.Valid |= fs.SetMtime
		s.Mtime = t
	}
	if t, ok := in.GetCTime(); ok {
		s.Valid |= fs.SetCtime
		s.Ctime = t
	}
	a, err := n.r.fsys.SetAttr(ctx, n.h, s)
	if err != nil {
		return n.r.errno("setattr", err)
	}
	if s.Valid&fs.SetSize != 0 {
		n.r.sawGen(a.Ino, a.DataGen)
	}
	fillAttr(&a, &out.Attr)
	// As for any attributes this mount hands out: without a timeout the
	// kernel asks for them again at once (tar's chown, chmod and utimens
	// of a file each cost a GETATTR more).
	out.SetTimeout(n.r.attrTimeout)
	return 0
}

// Create implements NodeCreater.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.Create(ctx, n.h, name, mode&^syscall.S_IFMT|syscall.S_IFREG, caller(ctx))
	if err != nil {
		return nil, nil, 0, n.r.errno("create", err)
	}
	n.r.sawGen(a.Ino, a.DataGen)
	ch := n.child(ctx, &a, out)
	return ch, &handle{r: n.r, h: a.Handle}, 0, 0
}

// Mknod implements NodeMknoder.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.Mknod(ctx, n.h, name, mode, uint64(dev), caller(ctx))
	if err != nil {
		return nil, n.r.errno("mknod", err)
	}
	return n.child(ctx, &a, out), 0
}

// Mkdir implements NodeMkdirer.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.Mkdir(ctx, n.h, name, mode&^syscall.S_IFMT|syscall.S_IFDIR, caller(ctx))
	if err != nil {
		return nil, n.r.errno("mkdir", err)
	}
	return n.child(ctx, &a, out), 0
}

// Symlink implements NodeSymlinker.
func (n *node) Symlink(ctx context.Context, target, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	a, err := n.r.fsys.Symlink(ctx, n.h, name, target, caller(ctx))
	if err != nil {
		return nil, n.r.errno("symlink", err)
	}
	return n.child(ctx, &a, out), 0
}

// Readlink implements NodeReadlinker.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	t, err := n.r.fsys.Readlink(ctx, n.h)
	if err != nil {
		return nil, n.r.errno("readlink", err)
	}
	return []byte(t), 0
}

// Link implements NodeLinker.
func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	a, err := n.r.fsys.Link(ctx, t.h, n.h, name)
	if err != nil {
		return nil, n.r.errno("link", err)
	}
	return n.child(ctx, &a, out), 0
}

// Unlink implements NodeUnlinker.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	return n.r.errno("unlink", n.r.fsys.Unlink(ctx, n.h, name))
}

// Rmdir implements NodeRmdirer.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	return n.r.errno("rmdir", n.r.fsys.Rmdir(ctx, n.h, name))
}

// Rename implements NodeRenamer.
func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	p, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	return n.r.errno("rename", n.r.fsys.Rename(ctx, n.h, name, p.h, newName, flags))
}

// Statfs implements NodeStatfser.
func (n *node) Statfs(ctx context.Context, out *gofuse.StatfsOut) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	s, err := n.r.fsys.StatFS(ctx)
	if err != nil {
		return n.r.errno("statfs", err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.Frsize, out.NameLen = s.Bsize, s.Frsize, s.NameLen
	return 0
}

// Getxattr implements NodeGetxattrer.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	v, err := n.r.fsys.GetXattr(ctx, n.h, attr)
	if err != nil {
		return 0, n.r.errno("getxattr", err)
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// Setxattr implements NodeSetxattrer.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	return n.r.errno("setxattr", n.r.fsys.SetXattr(ctx, n.h, attr, data, flags))
}

// Listxattr implements NodeListxattrer.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	names, err := n.r.fsys.ListXattr(ctx, n.h)
	if err != nil {
		return 0, n.r.errno("listxattr", err)
	}
	var buf []byte
	for _, name := range names {
		buf = append(append(buf, name...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(buf)), 0
	}
	if len(dest) < len(buf) {
		return uint32(len(buf)), syscall.ERANGE
	}
	return uint32(copy(dest, buf)), 0
}

// Removexattr implements NodeRemovexattrer.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	return n.r.errno("removexattr", n.r.fsys.RemoveXattr(ctx, n.h, attr))
}

// OnForget implements NodeOnForgetter.
func (n *node) OnForget() { n.r.forget(fs.InoOf(n.h)) }

// Open implements NodeOpener: close-to-open, see the package comment.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	if n.r.fsys.ReadOnly() && flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	a, err := n.r.fsys.Open(ctx, n.h)
	if err != nil {
		return nil, 0, n.r.errno("open", err)
	}
	var fuseFlags uint32
	if n.r.snapshot || !n.r.sawGen(a.Ino, a.DataGen) {
		fuseFlags |= gofuse.FOPEN_KEEP_CACHE
	}
	return &handle{r: n.r, h: n.h}, fuseFlags, 0
}

// OpendirHandle implements NodeOpendirHandler.
func (n *node) OpendirHandle(ctx context.Context, _ uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	if _, err := n.r.fsys.GetAttr(ctx, n.h); err != nil {
		return nil, 0, n.r.errno("opendir", err)
	}
	var flags uint32
	if n.r.snapshot {
		flags |= gofuse.FOPEN_CACHE_DIR | gofuse.FOPEN_KEEP_CACHE
	}
	return &dirHandle{n: n}, flags, 0
}

// handle is an open regular file.
type handle struct {
	r *root
	h fs.Handle
	// wrote is set by the handle's first write: only then can its close
	// change the data generation.
	wrote atomic.Bool
}

var (
	_ gofs.FileAllocater = (*handle)(nil)
	_ gofs.FileReader    = (*handle)(nil)
	_ gofs.FileWriter    = (*handle)(nil)
	_ gofs.FileFlusher   = (*handle)(nil)
	_ gofs.FileFsyncer   = (*handle)(nil)
	_ gofs.FileReleaser  = (*handle)(nil)
)

// Allocate implements FileAllocater: posix_fallocate(3). Space is never
// reserved (the cluster's capacity is shared), so mode 0 only extends the
// file to off+size and FALLOC_FL_KEEP_SIZE does nothing; hole punching and
// the other modes are not supported.
func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	const keepSize = 0x1 // FALLOC_FL_KEEP_SIZE
	switch mode {
	case 0, keepSize:
	default:
		return syscall.EOPNOTSUPP
	}
	if h.r.fsys.ReadOnly() {
		return syscall.EROFS
	}
	end := off + size
	if end < off {
		return syscall.EFBIG
	}
	a, err := h.r.fsys.GetAttr(ctx, h.h)
	if err != nil {
		return h.r.errno("fallocate", err)
	}
	if mode == keepSize || end <= a.Size {
		return 0
	}
	_, err = h.r.fsys.SetAttr(ctx, h.h, fs.SetAttrIn{Valid: fs.SetSize, Size: end})
	return h.r.errno("fallocate", err)
}

// Read implements FileReader.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	n, err := h.r.fsys.Read(ctx, h.h, off, dest)
	if err != nil {
		return nil, h.r.errno("read", err)
	}
	return gofuse.ReadResultData(dest[:n]), 0
}

// Write implements FileWriter.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	ctx, cancel := opContext(ctx)
	defer cancel()
	h.wrote.Store(true)
	n, err := h.r.fsys.Write(ctx, h.h, off, data)
	if err != nil {
		return uint32(n), h.r.errno("write", err)
	}
	return uint32(n), 0
}

// Flush implements FileFlusher: close flushes (close-to-open).
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	if h.r.fsys.ReadOnly() {
		return 0
	}
	return h.r.errno("flush", h.r.fsys.Flush(ctx, h.h))
}

// Fsync implements FileFsyncer.
func (h *handle) Fsync(ctx context.Context, _ uint32) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	if h.r.fsys.ReadOnly() {
		return 0
	}
	return h.r.errno("fsync", h.r.fsys.Fsync(ctx, h.h))
}

// Release implements FileReleaser. The kernel does not wait for it, so it
// runs on a context of its own.
func (h *handle) Release(context.Context) syscall.Errno {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	gen, known, err := h.r.fsys.ReleaseGen(ctx, h.h)
	if err == nil && h.wrote.Load() {
		// Our own flush changed the data generation; the kernel's pages
		// are what we wrote, so they stay valid. The client knows the
		// generation its flush made; ask only when it does not.
		if !known {
			a, aerr := h.r.fsys.GetAttr(ctx, h.h)
			gen, known = a.DataGen, aerr == nil
		}
		if known {
			h.r.sawGen(fs.InoOf(h.h), gen)
		}
	}
	return h.r.errno("release", err)
}

// opContext detaches an operation from the kernel's interrupts. The Go
// runtime preempts threads with signals, and the kernel turns a signal
// during a FUSE call into an interrupt that cancels the request's context:
// metadata transactions would give up half way (a create that committed
// but answered EIO). Operations run to the end instead, bounded by
// opTimeout (the stores retry failures inside it).
func opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
}

// opTimeout bounds one operation; past it the caller gets EIO.
const opTimeout = 10 * time.Minute

// releaseTimeout bounds the flush at a file's last close.
const releaseTimeout = 5 * time.Minute

// dirHandle is an open directory: entries are read in batches after the
// last cookie handed out, so a listing is stable while names change. Each
// batch carries the entries' attributes, which answer the lookups of a
// READDIRPLUS.
type dirHandle struct {
	n *node

	mu    sync.Mutex
	pos   uint64 // cookie of the last entry returned (1: ".", 2: "..")
	batch []fs.DirEntryPlus
	last  *fs.DirEntryPlus // the entry Readdirent returned last
	atEnd bool
}

var (
	_ gofs.FileReaddirenter = (*dirHandle)(nil)
	_ gofs.FileSeekdirer    = (*dirHandle)(nil)
	_ gofs.FileLookuper     = (*dirHandle)(nil)
	_ gofs.FileFsyncdirer   = (*dirHandle)(nil)
)

// Fsyncdir implements FileFsyncdirer: every metadata change this mount
// was answered early becomes durable, and so does the data of every file
// it closed (fsclient.FS.SyncClosed). Linux does not pass syncfs(2) on
// to a FUSE file system, so this is how a program makes all it wrote
// durable at once.
func (d *dirHandle) Fsyncdir(ctx context.Context, _ uint32) syscall.Errno {
	ctx, cancel := opContext(ctx)
	defer cancel()
	return d.n.r.errno("fsyncdir", d.n.r.fsys.SyncClosed(ctx))
}

// Lookup implements FileLookuper: READDIRPLUS asks for the entry just
// listed, whose attributes came with the listing.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.mu.Lock()
	e := d.last
	d.mu.Unlock()
	if e != nil && e.Name == name && e.OK {
		a := e.Attr
		return d.n.child(ctx, &a, out), 0
	}
	return d.n.Lookup(ctx, name, out)
}

const readdirBatch = 256

// Readdirent implements FileReaddirenter.
func (d *dirHandle) Readdirent(ctx context.Context) (*gofuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = nil
	switch d.pos {
	case 0:
		d.pos = 1
		return &gofuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: fs.InoOf(d.n.h), Off: 1}, 0
	case 1:
		d.pos = 2
		return &gofuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: 1, Off: 2}, 0
	}
	if len(d.batch) == 0 {
		if d.atEnd {
			return nil, 0
		}
		after := d.pos
		if after < 3 {
			after = 0
		}
		// Only a batch fetch needs an operation context: most calls
		// return an entry of the batch in hand.
		octx, cancel := opContext(ctx)
		es, err := d.n.r.fsys.ReadDirPlus(octx, d.n.h, after, readdirBatch)
		cancel()
		if err != nil {
			return nil, d.n.r.errno("readdir", err)
		}
		d.batch = es
		if len(es) < readdirBatch {
			d.atEnd = true
		}
		if len(es) == 0 {
			return nil, 0
		}
	}
	e := &d.batch[0]
	d.batch = d.batch[1:]
	d.pos = e.Cookie
	d.last = e
	return &gofuse.DirEntry{Name: e.Name, Mode: e.Type, Ino: fs.InoOf(e.Handle), Off: e.Cookie}, 0
}

// Seekdir implements FileSeekdirer: off is a cookie handed out before.
func (d *dirHandle) Seekdir(_ context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pos, d.batch, d.atEnd, d.last = off, nil, false, nil
	return 0
}
