package nfs

import (
	"context"
	"errors"
	"strings"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// MOUNT v3 (RFC 1813 Appendix I). Every file system is exported as
// /NAME and each of its snapshots, read only, as /NAME/.snapshot/SNAP; a
// path below an export mounts that directory. The gateway keeps no list
// of mounts (DUMP answers none, UMNT does nothing): a mount is only a
// handle, which any gateway answers.

// mountPathBytes bounds a mount path (MNTPATHLEN).
const mountPathBytes = 1024

// snapshotDir is the path component under which snapshots are exported.
const snapshotDir = ".snapshot"

func (g *Gateway) serveMount(ctx context.Context, c *sunrpc.Call, _ sunrpc.ConnInfo, w *xdr.Writer) sunrpc.AcceptStat {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.OpTimeout)
	defer cancel()
	r := xdr.NewReader(c.Args)
	switch c.Proc {
	case MountNull, MountUmntAll:
		return sunrpc.Success
	case MountDump:
		w.Bool(false)
		return sunrpc.Success
	case MountUmnt:
		r.String(mountPathBytes)
		if r.Err() != nil {
			return sunrpc.GarbageArgs
		}
		return sunrpc.Success
	case MountMnt:
		path := r.String(mountPathBytes)
		if r.Err() != nil {
			return sunrpc.GarbageArgs
		}
		fh, st := g.mnt(ctx, path, credOf(c))
		w.Uint32(uint32(st))
		if st == OK {
			w.Opaque(fh.Encode())
			w.Uint32(1)
			w.Uint32(sunrpc.AuthSys)
		}
		return sunrpc.Success
	case MountExport:
		fss, err := g.cfg.Backend.FileSystems(ctx)
		if err != nil {
			g.log.Warn("nfs: listing file systems for EXPORT", "err", err)
			return sunrpc.SystemErr
		}
		for _, f := range fss {
			w.Bool(true)
			w.String("/" + f.Name)
			w.Bool(false) // no groups: open to all
			for _, sn := range f.Snapshots {
				w.Bool(true)
				w.String("/" + f.Name + "/" + snapshotDir + "/" + sn.Name)
				w.Bool(false)
			}
		}
		w.Bool(false)
		return sunrpc.Success
	}
	return sunrpc.ProcUnavail
}

// mnt resolves a mount path to a directory handle.
func (g *Gateway) mnt(ctx context.Context, path string, cred Cred) (FileHandle, Status) {
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 {
		return FileHandle{}, ErrNoEnt
	}
	info, err := g.cfg.Backend.FileSystemByName(ctx, parts[0])
	if errors.Is(err, ErrNoFileSystem) {
		return FileHandle{}, ErrNoEnt
	}
	if err != nil {
		g.log.Warn("nfs: MNT: looking up a file system", "path", path, "err", err)
		return FileHandle{}, ErrServerFault
	}
	parts = parts[1:]
	var snap uint64
	if len(parts) >= 2 && parts[0] == snapshotDir {
		for _, sn := range info.Snapshots {
			if sn.Name == parts[1] {
				snap = sn.Number
			}
		}
		if snap == 0 {
			return FileHandle{}, ErrNoEnt
		}
		parts = parts[2:]
	}
	s, err := g.session(ctx, info, snap)
	if err != nil {
		g.log.Warn("nfs: MNT: opening a file system", "fs", info.Name, "err", err)
		return FileHandle{}, ErrServerFault
	}
	h := fs.RootHandle
	a, err := s.fsys.GetAttr(ctx, h)
	for _, p := range parts {
		if err != nil {
			break
		}
		if err = cred.check(&a, permExec); err != nil {
			break
		}
		a, err = s.fsys.Lookup(ctx, h, p)
		h = a.Handle
	}
	if err != nil {
		st := statusOf(err)
		if st == ErrIO {
			g.log.Warn("nfs: MNT: walking the path", "path", path, "err", err)
		}
		return FileHandle{}, st
	}
	if !a.IsDir() {
		return FileHandle{}, ErrNotDir
	}
	return s.handleOf(h), OK
}
