package nfs

import (
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// Programs and versions (RFC 1813).
const (
	ProgNFS   = 100003
	ProgMount = 100005
	Version3  = 3
)

// NFSv3 procedures (RFC 1813 §3.3).
const (
	ProcNull = iota
	ProcGetAttr
	ProcSetAttr
	ProcLookup
	ProcAccess
	ProcReadlink
	ProcRead
	ProcWrite
	ProcCreate
	ProcMkdir
	ProcSymlink
	ProcMknod
	ProcRemove
	ProcRmdir
	ProcRename
	ProcLink
	ProcReadDir
	ProcReadDirPlus
	ProcFSStat
	ProcFSInfo
	ProcPathConf
	ProcCommit
)

// MOUNT v3 procedures (RFC 1813 Appendix I).
const (
	MountNull = iota
	MountMnt
	MountDump
	MountUmnt
	MountUmntAll
	MountExport
)

// Status is an nfsstat3 (and, for the codes they share, a mountstat3).
type Status uint32

// NFSv3 statuses.
const (
	OK             Status = 0
	ErrPerm        Status = 1
	ErrNoEnt       Status = 2
	ErrIO          Status = 5
	ErrNXIO        Status = 6
	ErrAccess      Status = 13
	ErrExist       Status = 17
	ErrXDev        Status = 18
	ErrNoDev       Status = 19
	ErrNotDir      Status = 20
	ErrIsDir       Status = 21
	ErrInval       Status = 22
	ErrFBig        Status = 27
	ErrNoSpc       Status = 28
	ErrROFS        Status = 30
	ErrMLink       Status = 31
	ErrNameTooLong Status = 63
	ErrNotEmpty    Status = 66
	ErrDQuot       Status = 69
	ErrStale       Status = 70
	ErrBadHandle   Status = 10001
	ErrNotSync     Status = 10002
	ErrBadCookie   Status = 10003
	ErrNotSupp     Status = 10004
	ErrTooSmall    Status = 10005
	ErrServerFault Status = 10006
	ErrBadType     Status = 10007
	ErrJukebox     Status = 10008
)

// File types (ftype3).
const (
	typeReg  = 1
	typeDir  = 2
	typeBlk  = 3
	typeChr  = 4
	typeLnk  = 5
	typeSock = 6
	typeFifo = 7
)

// Stable-how of WRITE.
const (
	Unstable = 0
	DataSync = 1
	FileSync = 2
)

// CREATE modes.
const (
	createUnchecked = 0
	createGuarded   = 1
	createExclusive = 2
)

// ACCESS bits.
const (
	accessRead    = 0x01
	accessLookup  = 0x02
	accessModify  = 0x04
	accessExtend  = 0x08
	accessDelete  = 0x10
	accessExecute = 0x20
)

// time_how of sattr3.
const (
	timeDontChange = 0
	timeServer     = 1
	timeClient     = 2
)

// statusOf maps an error from the file system to an NFS status (the fs
// error convention: a wrapped syscall.Errno, else an I/O failure).
func statusOf(err error) Status {
	if err == nil {
		return OK
	}
	switch fs.Errno(err) {
	case syscall.EPERM:
		return ErrPerm
	case syscall.ENOENT:
		return ErrNoEnt
	case syscall.ENXIO:
		return ErrNXIO
	case syscall.EACCES:
		return ErrAccess
	case syscall.EEXIST:
		return ErrExist
	case syscall.EXDEV:
		return ErrXDev
	case syscall.ENODEV:
		return ErrNoDev
	case syscall.ENOTDIR:
		return ErrNotDir
	case syscall.EISDIR:
		return ErrIsDir
	case syscall.EINVAL:
		return ErrInval
	case syscall.EFBIG:
		return ErrFBig
	case syscall.ENOSPC:
		return ErrNoSpc
	case syscall.EROFS:
		return ErrROFS
	case syscall.EMLINK:
		return ErrMLink
	case syscall.ENAMETOOLONG:
		return ErrNameTooLong
	case syscall.ENOTEMPTY:
		return ErrNotEmpty
	case syscall.EDQUOT:
		return ErrDQuot
	case syscall.ESTALE:
		return ErrStale
	case syscall.ENOTSUP:
		return ErrNotSupp
	case syscall.EAGAIN, syscall.EBUSY:
		return ErrJukebox
	}
	return ErrIO
}

func ftypeOf(mode uint32) uint32 {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return typeReg
	case syscall.S_IFDIR:
		return typeDir
	case syscall.S_IFBLK:
		return typeBlk
	case syscall.S_IFCHR:
		return typeChr
	case syscall.S_IFLNK:
		return typeLnk
	case syscall.S_IFSOCK:
		return typeSock
	case syscall.S_IFIFO:
		return typeFifo
	}
	return typeReg
}

func putTime(w *xdr.Writer, t time.Time) {
	ns := t.UnixNano()
	sec, nsec := ns/1e9, ns%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	w.Uint32(uint32(sec))
	w.Uint32(uint32(nsec))
}

func getTime(r *xdr.Reader) time.Time {
	sec, nsec := r.Uint32(), r.Uint32()
	if nsec >= 1e9 {
		r.Fail(errBadTime)
	}
	return time.Unix(int64(sec), int64(nsec))
}

// putFattr writes a fattr3 of a in file system fsid.
func putFattr(w *xdr.Writer, a *fs.Attr, fsid uint64) {
	w.Uint32(ftypeOf(a.Mode))
	w.Uint32(a.Mode & 0o7777)
	w.Uint32(a.Nlink)
	w.Uint32(a.Uid)
	w.Uint32(a.Gid)
	w.Uint64(a.Size)
	w.Uint64(a.Blocks * 512)
	w.Uint32(uint32(unixMajor(a.Rdev)))
	w.Uint32(uint32(unixMinor(a.Rdev)))
	w.Uint64(fsid)
	w.Uint64(a.Ino)
	putTime(w, a.Atime)
	putTime(w, a.Mtime)
	putTime(w, a.Ctime)
}

func putPostAttr(w *xdr.Writer, a *fs.Attr, fsid uint64) {
	if a == nil {
		w.Bool(false)
		return
	}
	w.Bool(true)
	putFattr(w, a, fsid)
}

// putWcc writes wcc_data: the attributes before (size, mtime, ctime) and
// after.
func putWcc(w *xdr.Writer, before, after *fs.Attr, fsid uint64) {
	if before == nil {
		w.Bool(false)
	} else {
		w.Bool(true)
		w.Uint64(before.Size)
		putTime(w, before.Mtime)
		putTime(w, before.Ctime)
	}
	putPostAttr(w, after, fsid)
}

// Linux's device number encoding (new_encode_dev): rdev as stat shows it.
func unixMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func unixMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }
func unixMkdev(major, minor uint64) uint64 {
	return (minor & 0xff) | (major&0xfff)<<8 | (minor&^0xff)<<12 | (major&^0xfff)<<32
}

// sattr is a decoded sattr3.
type sattr struct {
	in fs.SetAttrIn
}

func getSattr(r *xdr.Reader) sattr {
	var s sattr
	if r.Bool() {
		s.in.Valid |= fs.SetMode
		s.in.Mode = r.Uint32() & 0o7777
	}
	if r.Bool() {
		s.in.Valid |= fs.SetUid
		s.in.Uid = r.Uint32()
	}
	if r.Bool() {
		s.in.Valid |= fs.SetGid
		s.in.Gid = r.Uint32()
	}
	if r.Bool() {
		s.in.Valid |= fs.SetSize
		s.in.Size = r.Uint64()
	}
	switch how := r.Uint32(); how {
	case timeDontChange:
	case timeServer:
		s.in.Valid |= fs.SetAtimeNow
	case timeClient:
		s.in.Valid |= fs.SetAtime
		s.in.Atime = getTime(r)
	default:
		r.Fail(errBadTime)
	}
	switch how := r.Uint32(); how {
	case timeDontChange:
	case timeServer:
		s.in.Valid |= fs.SetMtimeNow
	case timeClient:
		s.in.Valid |= fs.SetMtime
		s.in.Mtime = getTime(r)
	default:
		r.Fail(errBadTime)
	}
	return s
}
