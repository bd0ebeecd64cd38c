package nfs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

var errBadTime = errors.New("nfs: bad time")

// statusGarbage is a handler's answer for arguments it cannot decode
// (GARBAGE_ARGS): never sent as a status.
const statusGarbage Status = 1<<32 - 1

// failBools is how many empty optional attributes (post_op_attr,
// pre_op_attr: FALSE) each procedure's failure result holds, so a
// failure can be answered for any procedure the same way.
var failBools = [...]int{
	ProcGetAttr: 0, ProcSetAttr: 2, ProcLookup: 1, ProcAccess: 1, ProcReadlink: 1, ProcRead: 1,
	ProcWrite: 2, ProcCreate: 2, ProcMkdir: 2, ProcSymlink: 2, ProcMknod: 2, ProcRemove: 2,
	ProcRmdir: 2, ProcRename: 4, ProcLink: 3, ProcReadDir: 1, ProcReadDirPlus: 1, ProcFSStat: 1,
	ProcFSInfo: 1, ProcPathConf: 1, ProcCommit: 2,
}

// request is one NFS call being served.
type request struct {
	r    *xdr.Reader
	w    *xdr.Writer // the result after the status, when it is OK
	cred Cred
	// err is the error behind a failure status (logged, and judged for
	// congestion).
	err error
	// retry: the call may have been applied by a gateway that died (the
	// duplicate-request cache found it started, drc.go): an answer that
	// means "already done" is success.
	retry bool
}

type handler func(g *Gateway, ctx context.Context, q *request) Status

var nfsHandlers = [...]handler{
	ProcGetAttr: (*Gateway).getAttr, ProcSetAttr: (*Gateway).setAttr, ProcLookup: (*Gateway).lookup,
	ProcAccess: (*Gateway).access, ProcReadlink: (*Gateway).readlink, ProcRead: (*Gateway).read,
	ProcWrite: (*Gateway).write, ProcCreate: (*Gateway).create, ProcMkdir: (*Gateway).mkdir,
	ProcSymlink: (*Gateway).symlink, ProcMknod: (*Gateway).mknod, ProcRemove: (*Gateway).remove,
	ProcRmdir: (*Gateway).rmdir, ProcRename: (*Gateway).rename, ProcLink: (*Gateway).link,
	ProcReadDir: (*Gateway).readDir, ProcReadDirPlus: (*Gateway).readDirPlus, ProcFSStat: (*Gateway).fsStat,
	ProcFSInfo: (*Gateway).fsInfo, ProcPathConf: (*Gateway).pathConf, ProcCommit: (*Gateway).commit,
}

// serveNFS serves one NFSv3 call: within the congestion window and
// OpTimeout.
func (g *Gateway) serveNFS(ctx context.Context, c *sunrpc.Call, conn sunrpc.ConnInfo, w *xdr.Writer) sunrpc.AcceptStat {
	if c.Proc == ProcNull {
		return sunrpc.Success
	}
	if c.Proc >= uint32(len(nfsHandlers)) {
		return sunrpc.ProcUnavail
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.OpTimeout)
	defer cancel()
	q := &request{r: xdr.NewReader(c.Args), w: xdr.NewWriter(nil), cred: credOf(c)}
	if err := g.window.Acquire(ctx); err != nil {
		w.Uint32(uint32(ErrJukebox))
		for range failBools[c.Proc] {
			w.Bool(false)
		}
		return sunrpc.Success
	}
	var key []byte
	if g.cfg.Replies != nil && needsRecord(c) {
		key = replyKey(c, conn.Remote)
		reply, retry, err := g.lookUpReply(ctx, key)
		if err != nil {
			g.window.Release(true)
			g.log.Warn("nfs: duplicate-request cache unavailable", "proc", c.Proc, "err", err)
			w.Uint32(uint32(ErrJukebox))
			for range failBools[c.Proc] {
				w.Bool(false)
			}
			return sunrpc.Success
		}
		if reply != nil {
			g.window.Release(false)
			g.stats.Replayed.Add(1)
			w.Raw(reply)
			return sunrpc.Success
		}
		q.retry = retry
	}
	st := nfsHandlers[c.Proc](g, ctx, q)
	g.window.Release(congests(st, q.err))
	if st == statusGarbage {
		return sunrpc.GarbageArgs
	}
	start := w.Len()
	if st == OK {
		w.Uint32(uint32(OK))
		w.Raw(q.w.Bytes())
	} else {
		if st == ErrIO || st == ErrJukebox || st == ErrServerFault {
			g.log.Warn("nfs: call failed", "proc", c.Proc, "status", st, "err", q.err)
		}
		w.Uint32(uint32(st))
		for range failBools[c.Proc] {
			w.Bool(false)
		}
	}
	if key != nil && st != ErrJukebox {
		// After the reply is sent (dispatch returns it): a retransmission
		// meanwhile finds the call started.
		reply := append([]byte(nil), w.Bytes()[start:]...)
		g.wg.Go(func() { g.recordReply(g.stopCtx, key, reply) })
	}
	return sunrpc.Success
}

// lookUpReply reads call key's record: the reply to send again (done), or
// whether the call was started before (retry); else it records that the
// call starts.
func (g *Gateway) lookUpReply(ctx context.Context, key []byte) (reply []byte, retry bool, err error) {
	v, ok, err := g.cfg.Replies.Begin(ctx, key, encodeRecord(replyStarted, time.Now(), nil))
	if err != nil || !ok {
		return nil, false, err
	}
	state, _, reply, err := decodeRecord(v)
	if err != nil {
		// A record that does not decode: run the call as retried, the
		// safe reading of a record of unknown state.
		g.log.Warn("nfs: duplicate-request record", "err", err)
	}
	if err == nil && state == replyDone {
		return reply, false, nil
	}
	g.stats.Retried.Add(1)
	return nil, true, nil
}

// recordReply records a call's reply. Failing to is no error for the
// call (it was applied): a retry will find the call started.
func (g *Gateway) recordReply(ctx context.Context, key, reply []byte) {
	rec := encodeRecord(replyDone, time.Now(), reply)
	if len(rec) > maxReplyRecordBytes {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.OpTimeout)
	defer cancel()
	if err := g.cfg.Replies.Put(ctx, key, rec); err != nil {
		g.log.Warn("nfs: recording a reply", "err", err)
	}
}

// congests reports whether a call's outcome imputes congestion (FSS §8):
// the store failed or was too slow, not an answer such as ENOENT.
func congests(st Status, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fs.ErrRaced) {
		return true
	}
	return st == ErrIO || st == ErrJukebox || st == ErrServerFault
}

// fail records err and returns its status.
func (q *request) fail(err error) Status {
	q.err = err
	return statusOf(err)
}

// failObj is fail for an error about the object a handle names: one that
// is gone answers STALE.
func (q *request) failObj(err error) Status {
	q.err = err
	if fs.Errno(err) == syscall.ENOENT {
		return ErrStale
	}
	return statusOf(err)
}

func (q *request) garbage() bool { return q.r.Err() != nil }

func (q *request) fh() []byte { return q.r.Opaque(maxHandleBytes) }

// name reads a file name: one past the file system's bound still decodes
// (its answer is NAMETOOLONG, not GARBAGE_ARGS).
func (q *request) name() string { return q.r.String(4 * fs.MaxNameBytes) }

// obj resolves a handle and reads its object's attributes.
func (g *Gateway) obj(ctx context.Context, q *request, raw []byte) (*session, fs.Handle, fs.Attr, Status) {
	s, fh, st := g.resolve(ctx, raw)
	if st != OK {
		return nil, fs.Handle{}, fs.Attr{}, st
	}
	a, err := s.fsys.GetAttr(ctx, fh.H)
	if err != nil {
		return nil, fs.Handle{}, fs.Attr{}, q.failObj(err)
	}
	return s, fh.H, a, OK
}

// dir is obj for a handle that must name a directory.
func (g *Gateway) dir(ctx context.Context, q *request, raw []byte) (*session, fs.Attr, Status) {
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return nil, a, st
	}
	if !a.IsDir() {
		return nil, a, ErrNotDir
	}
	return s, a, OK
}

func (g *Gateway) getAttr(ctx context.Context, q *request) Status {
	raw := q.fh()
	if q.garbage() {
		return statusGarbage
	}
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	putFattr(q.w, &a, s.fsid())
	return OK
}

func (g *Gateway) setAttr(ctx context.Context, q *request) Status {
	raw := q.fh()
	sa := getSattr(q.r)
	var guard *time.Time
	if q.r.Bool() {
		t := getTime(q.r)
		guard = &t
	}
	if q.garbage() {
		return statusGarbage
	}
	s, h, before, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	if guard != nil && !sameNFSTime(*guard, before.Ctime) && !q.retry {
		return ErrNotSync
	}
	if err := q.cred.maySetAttr(&before, &sa.in); err != nil {
		return q.fail(err)
	}
	in := sa.in
	if in.Valid&fs.SetSize != 0 && before.IsDir() {
		return ErrIsDir
	}
	if in.Valid&fs.SetSize != 0 && before.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return ErrInval
	}
	after := before
	if in.Valid != 0 {
		var err error
		if after, err = s.setAttr(ctx, h, in); err != nil {
			return q.failObj(err)
		}
	}
	putWcc(q.w, &before, &after, s.fsid())
	return OK
}

// sameNFSTime compares times as NFS carries them (seconds and
// nanoseconds).
func sameNFSTime(a, b time.Time) bool {
	return a.Unix() == b.Unix() && a.Nanosecond() == b.Nanosecond()
}

// maySetAttr applies POSIX's rules for chmod, chown, truncate and utimes.
func (c Cred) maySetAttr(a *fs.Attr, in *fs.SetAttrIn) error {
	owner := c.Uid == 0 || c.Uid == a.Uid
	eperm := func(what string) error {
		return fmt.Errorf("uid %d may not %s %v: %w", c.Uid, what, a.Handle, syscall.EPERM)
	}
	if in.Valid&fs.SetMode != 0 && !owner {
		return eperm("chmod")
	}
	if in.Valid&fs.SetUid != 0 && in.Uid != a.Uid && c.Uid != 0 {
		return eperm("chown")
	}
	if in.Valid&fs.SetGid != 0 && in.Gid != a.Gid && c.Uid != 0 && !(c.Uid == a.Uid && c.inGroup(in.Gid)) {
		return eperm("chgrp")
	}
	if in.Valid&fs.SetSize != 0 && !owner {
		if err := c.check(a, permWrite); err != nil {
			return err
		}
	}
	if in.Valid&(fs.SetAtime|fs.SetMtime) != 0 && !owner {
		return eperm("set the times of")
	}
	if in.Valid&(fs.SetAtimeNow|fs.SetMtimeNow) != 0 && !owner {
		if err := c.check(a, permWrite); err != nil {
			return err
		}
	}
	return nil
}

func (g *Gateway) lookup(ctx context.Context, q *request) Status {
	raw, name := q.fh(), q.name()
	if q.garbage() {
		return statusGarbage
	}
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	if err := q.cred.check(&da, permExec); err != nil {
		return q.fail(err)
	}
	a, err := s.fsys.Lookup(ctx, da.Handle, name)
	if err != nil {
		return q.fail(err)
	}
	q.w.Opaque(s.handleOf(a.Handle).Encode())
	putPostAttr(q.w, &a, s.fsid())
	putPostAttr(q.w, &da, s.fsid())
	return OK
}

func (g *Gateway) access(ctx context.Context, q *request) Status {
	raw, want := q.fh(), q.r.Uint32()
	if q.garbage() {
		return statusGarbage
	}
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	var got uint32
	c := q.cred
	if c.permits(&a, permRead) {
		got |= accessRead
	}
	if c.permits(&a, permWrite) && s.snap == 0 {
		got |= accessModify | accessExtend
		if a.IsDir() {
			got |= accessDelete
		}
	}
	if c.permits(&a, permExec) {
		if a.IsDir() {
			got |= accessLookup
		} else {
			got |= accessExecute
		}
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.Uint32(want & got)
	return OK
}

func (g *Gateway) readlink(ctx context.Context, q *request) Status {
	raw := q.fh()
	if q.garbage() {
		return statusGarbage
	}
	s, h, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		return ErrInval
	}
	target, err := s.fsys.Readlink(ctx, h)
	if err != nil {
		return q.failObj(err)
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.String(target)
	return OK
}

func (g *Gateway) read(ctx context.Context, q *request) Status {
	raw, off, count := q.fh(), q.r.Uint64(), q.r.Uint32()
	if q.garbage() {
		return statusGarbage
	}
	s, h, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	switch a.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		return ErrIsDir
	default:
		return ErrInval
	}
	if q.cred.Uid != a.Uid { // an owner may read what it wrote (as nfsd)
		if err := q.cred.check(&a, permRead); err != nil {
			return q.fail(err)
		}
	}
	if off > fs.MaxFileBytes {
		return ErrInval
	}
	count = min(count, maxIO)
	if err := s.use(ctx, h, false); err != nil {
		return q.failObj(err)
	}
	buf := make([]byte, count)
	n, err := s.fsys.Read(ctx, h, int64(off), buf)
	if err != nil {
		return q.failObj(err)
	}
	if after, err := s.fsys.GetAttr(ctx, h); err == nil {
		a = after
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.Uint32(uint32(n))
	q.w.Bool(off+uint64(n) >= a.Size)
	q.w.Opaque(buf[:n])
	return OK
}

func (g *Gateway) verf() []byte { return binary.BigEndian.AppendUint64(nil, g.verifier.Load()) }

func (g *Gateway) write(ctx context.Context, q *request) Status {
	raw, off, count, stable := q.fh(), q.r.Uint64(), q.r.Uint32(), q.r.Uint32()
	data := q.r.Opaque(maxIO)
	if q.garbage() || stable > FileSync {
		return statusGarbage
	}
	if int(count) != len(data) {
		return ErrInval
	}
	s, h, before, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	if s.snap != 0 {
		return ErrROFS
	}
	switch before.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		return ErrIsDir
	default:
		return ErrInval
	}
	if q.cred.Uid != before.Uid {
		if err := q.cred.check(&before, permWrite); err != nil {
			return q.fail(err)
		}
	}
	if err := s.use(ctx, h, true); err != nil {
		return q.failObj(err)
	}
	verf := g.verf()
	n, err := s.fsys.Write(ctx, h, int64(off), data)
	if err != nil {
		return q.failObj(err)
	}
	committed := uint32(Unstable)
	if stable != Unstable {
		if err := s.fsys.Fsync(ctx, h); err != nil {
			g.newVerifier()
			return q.failObj(err)
		}
		committed = FileSync
	}
	after, err := s.fsys.GetAttr(ctx, h)
	putWcc(q.w, &before, attrOrNil(after, err), s.fsid())
	q.w.Uint32(uint32(n))
	q.w.Uint32(committed)
	q.w.Fixed(verf)
	return OK
}

func attrOrNil(a fs.Attr, err error) *fs.Attr {
	if err != nil {
		return nil
	}
	return &a
}

func (g *Gateway) commit(ctx context.Context, q *request) Status {
	raw, _, _ := q.fh(), q.r.Uint64(), q.r.Uint32()
	if q.garbage() {
		return statusGarbage
	}
	s, h, before, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	verf := g.verf()
	if err := s.fsys.Fsync(ctx, h); err != nil {
		// What the client wrote unstable may be lost: it must resend.
		g.newVerifier()
		return q.failObj(err)
	}
	s.mu.Lock()
	if of := s.files[h]; of != nil {
		of.dirty = false
	}
	s.mu.Unlock()
	after, err := s.fsys.GetAttr(ctx, h)
	putWcc(q.w, &before, attrOrNil(after, err), s.fsid())
	q.w.Fixed(verf)
	return OK
}

// mayChange checks that c may add or remove entries of directory da.
func (s *session) mayChange(c Cred, da *fs.Attr) error {
	if s.snap != 0 {
		return fmt.Errorf("snapshot %d: %w", s.snap, syscall.EROFS)
	}
	return c.check(da, permWrite|permExec)
}

// created answers a call that made an object: its handle and attributes,
// and the directory's before and after.
func (g *Gateway) created(ctx context.Context, q *request, s *session, a *fs.Attr, before *fs.Attr) Status {
	q.w.Bool(true)
	q.w.Opaque(s.handleOf(a.Handle).Encode())
	putPostAttr(q.w, a, s.fsid())
	after, err := s.fsys.GetAttr(ctx, before.Handle)
	putWcc(q.w, before, attrOrNil(after, err), s.fsid())
	return OK
}

// setRest applies what a create's sattr3 sets beyond the mode.
func (g *Gateway) setRest(ctx context.Context, q *request, s *session, a *fs.Attr, in fs.SetAttrIn) (fs.Attr, error) {
	in.Valid &^= fs.SetMode
	if in.Valid&fs.SetUid != 0 && in.Uid == a.Uid {
		in.Valid &^= fs.SetUid
	}
	if in.Valid&fs.SetGid != 0 && in.Gid == a.Gid {
		in.Valid &^= fs.SetGid
	}
	if in.Valid == 0 {
		return *a, nil
	}
	if err := q.cred.maySetAttr(a, &in); err != nil {
		return *a, err
	}
	return s.setAttr(ctx, a.Handle, in)
}

func modeOr(in fs.SetAttrIn, def uint32) uint32 {
	if in.Valid&fs.SetMode != 0 {
		return in.Mode
	}
	return def
}

func (g *Gateway) create(ctx context.Context, q *request) Status {
	raw, name := q.fh(), q.name()
	how := q.r.Uint32()
	var sa sattr
	var verf []byte
	switch how {
	case createUnchecked, createGuarded:
		sa = getSattr(q.r)
	case createExclusive:
		verf = q.r.Fixed(8)
	default:
		return statusGarbage
	}
	if q.garbage() {
		return statusGarbage
	}
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return q.fail(err)
	}
	mode := modeOr(sa.in, 0o644)
	if how == createExclusive {
		mode = 0o600
	}
	// Made with mknod, not create: NFS opens nothing, so the file is not
	// held open (and released later) at the gateway.
	a, err := s.fsys.Mknod(ctx, da.Handle, name, mode|syscall.S_IFREG, 0, q.cred.fs())
	if err == nil {
		switch how {
		case createExclusive:
			// The verifier goes in the times (as other servers do): a
			// retransmitted create finds it there; the client sets the
			// real attributes next.
			at, mt := exclusiveTimes(verf)
			a, err = s.setAttr(ctx, a.Handle, fs.SetAttrIn{Valid: fs.SetAtime | fs.SetMtime, Atime: at, Mtime: mt})
		default:
			a, err = g.setRest(ctx, q, s, &a, sa.in)
		}
		if err != nil {
			return q.fail(err)
		}
		return g.created(ctx, q, s, &a, &da)
	}
	if fs.Errno(err) != syscall.EEXIST || how == createGuarded && !q.retry {
		return q.fail(err)
	}
	a, lerr := s.fsys.Lookup(ctx, da.Handle, name)
	if lerr != nil {
		return q.fail(lerr)
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return ErrExist
	}
	if how == createExclusive {
		at, mt := exclusiveTimes(verf)
		if !sameNFSTime(a.Atime, at) || !sameNFSTime(a.Mtime, mt) {
			return ErrExist
		}
		return g.created(ctx, q, s, &a, &da)
	}
	// UNCHECKED on an existing file: only a size in the sattr applies.
	if sa.in.Valid&fs.SetSize != 0 {
		if q.cred.Uid != a.Uid {
			if err := q.cred.check(&a, permWrite); err != nil {
				return q.fail(err)
			}
		}
		if a, err = s.setAttr(ctx, a.Handle, fs.SetAttrIn{Valid: fs.SetSize, Size: sa.in.Size}); err != nil {
			return q.fail(err)
		}
	}
	return g.created(ctx, q, s, &a, &da)
}

// exclusiveTimes are the access and modification times an exclusive
// create's verifier is kept in.
func exclusiveTimes(verf []byte) (atime, mtime time.Time) {
	return time.Unix(int64(binary.BigEndian.Uint32(verf[:4])), 0), time.Unix(int64(binary.BigEndian.Uint32(verf[4:8])&0x3fffffff), 0)
}

func (g *Gateway) mkdir(ctx context.Context, q *request) Status {
	raw, name := q.fh(), q.name()
	sa := getSattr(q.r)
	if q.garbage() {
		return statusGarbage
	}
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return q.fail(err)
	}
	a, err := s.fsys.Mkdir(ctx, da.Handle, name, modeOr(sa.in, 0o755)|syscall.S_IFDIR, q.cred.fs())
	if err != nil {
		return g.madeBefore(ctx, q, s, &da, name, syscall.S_IFDIR, err)
	}
	if a, err = g.setRest(ctx, q, s, &a, sa.in); err != nil {
		return q.fail(err)
	}
	return g.created(ctx, q, s, &a, &da)
}

func (g *Gateway) symlink(ctx context.Context, q *request) Status {
	raw, name := q.fh(), q.name()
	sa := getSattr(q.r)
	target := q.r.String(64 << 10)
	if q.garbage() {
		return statusGarbage
	}
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return q.fail(err)
	}
	a, err := s.fsys.Symlink(ctx, da.Handle, name, target, q.cred.fs())
	if err != nil {
		return g.madeBefore(ctx, q, s, &da, name, syscall.S_IFLNK, err)
	}
	sa.in.Valid &^= fs.SetMode | fs.SetSize
	if a, err = g.setRest(ctx, q, s, &a, sa.in); err != nil {
		return q.fail(err)
	}
	return g.created(ctx, q, s, &a, &da)
}

func (g *Gateway) mknod(ctx context.Context, q *request) Status {
	raw, name := q.fh(), q.name()
	typ := q.r.Uint32()
	var sa sattr
	var rdev uint64
	var ifmt uint32
	switch typ {
	case typeChr, typeBlk:
		sa = getSattr(q.r)
		major, minor := q.r.Uint32(), q.r.Uint32()
		rdev = unixMkdev(uint64(major), uint64(minor))
		ifmt = syscall.S_IFCHR
		if typ == typeBlk {
			ifmt = syscall.S_IFBLK
		}
	case typeSock:
		sa = getSattr(q.r)
		ifmt = syscall.S_IFSOCK
	case typeFifo:
		sa = getSattr(q.r)
		ifmt = syscall.S_IFIFO
	case typeReg, typeDir, typeLnk:
	default:
		return statusGarbage
	}
	if q.garbage() {
		return statusGarbage
	}
	if ifmt == 0 {
		return ErrBadType
	}
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return q.fail(err)
	}
	if (ifmt == syscall.S_IFCHR || ifmt == syscall.S_IFBLK) && q.cred.Uid != 0 {
		return ErrPerm
	}
	a, err := s.fsys.Mknod(ctx, da.Handle, name, modeOr(sa.in, 0o644)|ifmt, rdev, q.cred.fs())
	if err != nil {
		return g.madeBefore(ctx, q, s, &da, name, ifmt, err)
	}
	sa.in.Valid &^= fs.SetSize
	if a, err = g.setRest(ctx, q, s, &a, sa.in); err != nil {
		return q.fail(err)
	}
	return g.created(ctx, q, s, &a, &da)
}

// madeBefore answers a create that failed with err: in retry mode an
// object of the type the call makes already there is the first
// attempt's, and is answered.
func (g *Gateway) madeBefore(ctx context.Context, q *request, s *session, da *fs.Attr, name string, ifmt uint32, err error) Status {
	if !q.retry || fs.Errno(err) != syscall.EEXIST {
		return q.fail(err)
	}
	a, lerr := s.fsys.Lookup(ctx, da.Handle, name)
	if lerr != nil || a.Mode&syscall.S_IFMT != ifmt {
		return q.fail(err)
	}
	return g.created(ctx, q, s, &a, da)
}

// errGone marks a removal whose victim is missing in retry mode: the
// first attempt removed it.
var errGone = errors.New("nfs: removed by the first attempt")

// removal resolves directory raw for removing name: the session, the
// directory's attributes and the victim's. In retry mode a missing
// victim gives status OK and q.err errGone.
func (g *Gateway) removal(ctx context.Context, q *request, raw []byte, name string) (*session, fs.Attr, Status) {
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return nil, da, st
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return nil, da, q.fail(err)
	}
	if name == "." || name == ".." {
		return nil, da, ErrInval
	}
	victim, err := s.fsys.Lookup(ctx, da.Handle, name)
	if err != nil && q.retry && fs.Errno(err) == syscall.ENOENT {
		q.err = errGone
		return s, da, OK
	}
	if err != nil {
		return nil, da, q.fail(err)
	}
	if err := q.cred.mayDelete(&da, &victim); err != nil {
		return nil, da, q.fail(err)
	}
	return s, da, OK
}

func (g *Gateway) remove(ctx context.Context, q *request) Status {
	return g.removeEntry(ctx, q, FS.Unlink)
}

func (g *Gateway) rmdir(ctx context.Context, q *request) Status {
	return g.removeEntry(ctx, q, FS.Rmdir)
}

// removeEntry is REMOVE and RMDIR: they differ only in the call that
// removes the name (op).
func (g *Gateway) removeEntry(ctx context.Context, q *request, op func(FS, context.Context, fs.Handle, string) error) Status {
	raw, name := q.fh(), q.name()
	if q.garbage() {
		return statusGarbage
	}
	s, da, st := g.removal(ctx, q, raw, name)
	if st != OK {
		return st
	}
	if q.err != errGone {
		if err := op(s.fsys, ctx, da.Handle, name); err != nil {
			return q.fail(err)
		}
	}
	after, err := s.fsys.GetAttr(ctx, da.Handle)
	putWcc(q.w, &da, attrOrNil(after, err), s.fsid())
	return OK
}

func (g *Gateway) rename(ctx context.Context, q *request) Status {
	fromRaw, fromName := q.fh(), q.name()
	toRaw, toName := q.fh(), q.name()
	if q.garbage() {
		return statusGarbage
	}
	s, from, st := g.removal(ctx, q, fromRaw, fromName)
	if st != OK {
		return st
	}
	s2, to, st := g.dir(ctx, q, toRaw)
	if st != OK {
		return st
	}
	if s2 != s {
		return ErrXDev
	}
	if err := s.mayChange(q.cred, &to); err != nil {
		return q.fail(err)
	}
	if toName == "." || toName == ".." {
		return ErrInval
	}
	if victim, err := s.fsys.Lookup(ctx, to.Handle, toName); err == nil {
		if err := q.cred.mayDelete(&to, &victim); err != nil {
			return q.fail(err)
		}
	}
	if q.err == errGone {
		// Retried, its source gone: done before if the target is there.
		if _, err := s.fsys.Lookup(ctx, to.Handle, toName); err != nil {
			return q.fail(err)
		}
	} else if err := s.fsys.Rename(ctx, from.Handle, fromName, to.Handle, toName, 0); err != nil {
		return q.fail(err)
	}
	fa, err := s.fsys.GetAttr(ctx, from.Handle)
	putWcc(q.w, &from, attrOrNil(fa, err), s.fsid())
	ta, err := s.fsys.GetAttr(ctx, to.Handle)
	putWcc(q.w, &to, attrOrNil(ta, err), s.fsid())
	return OK
}

func (g *Gateway) link(ctx context.Context, q *request) Status {
	raw := q.fh()
	dirRaw, name := q.fh(), q.name()
	if q.garbage() {
		return statusGarbage
	}
	s, h, _, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	s2, da, st := g.dir(ctx, q, dirRaw)
	if st != OK {
		return st
	}
	if s2 != s {
		return ErrXDev
	}
	if err := s.mayChange(q.cred, &da); err != nil {
		return q.fail(err)
	}
	a, err := s.fsys.Link(ctx, h, da.Handle, name)
	if err != nil && q.retry && fs.Errno(err) == syscall.EEXIST {
		// Retried: done before if the name is this object's.
		if la, lerr := s.fsys.Lookup(ctx, da.Handle, name); lerr == nil && la.Handle == h {
			a, err = la, nil
		}
	}
	if err != nil {
		return q.fail(err)
	}
	putPostAttr(q.w, &a, s.fsid())
	after, err := s.fsys.GetAttr(ctx, da.Handle)
	putWcc(q.w, &da, attrOrNil(after, err), s.fsid())
	return OK
}

// Cookies: 1 and 2 are "." and ".." (the file system's own cookies start
// at 3), so a listing resumes at any entry. Cookies never change, so the
// cookie verifier is the file system's generation: a client's verifier
// for another file system (or an older one under the same number) is
// refused BAD_COOKIE.
const (
	cookieDot    = 1
	cookieDotDot = 2
)

// readDirBudget is what one entry costs in a READDIR reply, and in a
// READDIRPLUS one with attributes and handle.
func entryBytes(name string, plus bool) int {
	n := 4 + 8 + 4 + (len(name)+3)&^3 + 8
	if plus {
		n += 4 + 84 + 4 + 4 + (handleBytes+3)&^3
	}
	return n
}

func (g *Gateway) readDir(ctx context.Context, q *request) Status {
	raw, cookie, verf, count := q.fh(), q.r.Uint64(), q.r.Fixed(8), q.r.Uint32()
	if q.garbage() {
		return statusGarbage
	}
	return g.listDir(ctx, q, raw, cookie, verf, count, false)
}

func (g *Gateway) readDirPlus(ctx context.Context, q *request) Status {
	raw, cookie, verf := q.fh(), q.r.Uint64(), q.r.Fixed(8)
	_, maxCount := q.r.Uint32(), q.r.Uint32()
	if q.garbage() {
		return statusGarbage
	}
	return g.listDir(ctx, q, raw, cookie, verf, maxCount, true)
}

func (g *Gateway) listDir(ctx context.Context, q *request, raw []byte, cookie uint64, verf []byte, count uint32, plus bool) Status {
	s, da, st := g.dir(ctx, q, raw)
	if st != OK {
		return st
	}
	want := binary.BigEndian.AppendUint64(nil, s.info.Gen)
	if cookie != 0 && string(verf) != string(want) && binary.BigEndian.Uint64(verf) != 0 {
		return ErrBadCookie
	}
	if err := q.cred.check(&da, permRead); err != nil {
		return q.fail(err)
	}
	budget := min(int(count), maxReadDirReply) - (4 + 84 + 8 + 4 + 4 + 64)
	if budget < entryBytes("", plus) {
		return ErrTooSmall
	}
	fsid := s.fsid()
	body := xdr.NewWriter(nil)
	n := 0
	put := func(name string, a *fs.Attr, h fs.Handle, c uint64) bool {
		size := entryBytes(name, plus)
		if size > budget {
			return false
		}
		budget -= size
		n++
		body.Bool(true)
		body.Uint64(fs.InoOf(h))
		body.String(name)
		body.Uint64(c)
		if plus {
			putPostAttr(body, a, fsid)
			body.Bool(true)
			body.Opaque(s.handleOf(h).Encode())
		}
		return true
	}
	full := false
	if cookie < cookieDot && !put(".", &da, da.Handle, cookieDot) {
		full = true
	}
	if !full && cookie < cookieDotDot {
		pa, err := s.fsys.Lookup(ctx, da.Handle, "..")
		if err != nil {
			return q.failObj(err)
		}
		if !put("..", &pa, pa.Handle, cookieDotDot) {
			full = true
		}
	}
	after := max(cookie, cookieDotDot)
	eof := false
	for !full {
		var es []fs.DirEntryPlus
		var err error
		if plus {
			es, err = s.fsys.ReadDirPlus(ctx, da.Handle, after, 256)
		} else {
			var plain []fs.DirEntry
			plain, err = s.fsys.ReadDir(ctx, da.Handle, after, 256)
			es = make([]fs.DirEntryPlus, len(plain))
			for i := range plain {
				es[i].DirEntry = plain[i]
			}
		}
		if err != nil {
			return q.failObj(err)
		}
		if len(es) == 0 {
			eof = true
			break
		}
		for i := range es {
			e := &es[i]
			var a *fs.Attr
			if plus {
				if !e.OK {
					if ea, err := s.fsys.GetAttr(ctx, e.Handle); err == nil {
						e.Attr, e.OK = ea, true
					}
				}
				if e.OK {
					a = &e.Attr
				}
			}
			if !put(e.Name, a, e.Handle, e.Cookie) {
				full = true
				break
			}
			after = e.Cookie
		}
	}
	if n == 0 && !eof {
		return ErrTooSmall
	}
	putPostAttr(q.w, &da, fsid)
	q.w.Fixed(want)
	q.w.Raw(body.Bytes())
	q.w.Bool(false)
	q.w.Bool(eof)
	return OK
}

func (g *Gateway) fsStat(ctx context.Context, q *request) Status {
	raw := q.fh()
	if q.garbage() {
		return statusGarbage
	}
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	sf, err := s.fsys.StatFS(ctx)
	if err != nil {
		return q.fail(err)
	}
	unit := uint64(sf.Frsize)
	if unit == 0 {
		unit = uint64(sf.Bsize)
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.Uint64(sf.Blocks * unit)
	q.w.Uint64(sf.Bfree * unit)
	q.w.Uint64(sf.Bavail * unit)
	q.w.Uint64(sf.Files)
	q.w.Uint64(sf.Ffree)
	q.w.Uint64(sf.Ffree)
	q.w.Uint32(0) // invarsec: the figures change any time
	return OK
}

// FSINFO properties.
const (
	fsfLink        = 0x1
	fsfSymlink     = 0x2
	fsfHomogeneous = 0x8
	fsfCanSetTime  = 0x10
)

func (g *Gateway) fsInfo(ctx context.Context, q *request) Status {
	raw := q.fh()
	if q.garbage() {
		return statusGarbage
	}
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.Uint32(maxIO)
	q.w.Uint32(prefIO)
	q.w.Uint32(4096)
	q.w.Uint32(maxIO)
	q.w.Uint32(prefIO)
	q.w.Uint32(4096)
	q.w.Uint32(64 << 10)
	q.w.Uint64(fs.MaxFileBytes)
	q.w.Uint32(0) // time_delta: nanoseconds
	q.w.Uint32(1)
	q.w.Uint32(fsfLink | fsfSymlink | fsfHomogeneous | fsfCanSetTime)
	return OK
}

func (g *Gateway) pathConf(ctx context.Context, q *request) Status {
	raw := q.fh()
	if q.garbage() {
		return statusGarbage
	}
	s, _, a, st := g.obj(ctx, q, raw)
	if st != OK {
		return st
	}
	putPostAttr(q.w, &a, s.fsid())
	q.w.Uint32(maxLinks)
	q.w.Uint32(fs.MaxNameBytes)
	q.w.Bool(true)  // no_trunc
	q.w.Bool(true)  // chown_restricted
	q.w.Bool(false) // case_insensitive
	q.w.Bool(true)  // case_preserving
	return OK
}

// maxLinks is the file system's bound on an object's links.
const maxLinks = 1 << 20
