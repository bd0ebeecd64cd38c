package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// The file-system operations of the Meta service. Each request names its
// file system and a directory id it is routed by (the directory of a
// name, the object of an attribute); the server answers it only if it
// serves that id's table, else NOT_OWNER. Recorded requests (the ones that
// are not idempotent: creates, links, removes, renames, exclusive xattr
// changes) carry a request id; the first transaction of their operation
// writes it into a reply record of the table, so a retry after a failover
// finds it and is answered without running again (FSS §8).

// request describes one file-system request to run.
type request struct {
	hdr *pb.Header
	// d is the directory id the request is routed by.
	d uint64
	// recorded requests apply once (a reply record).
	recorded bool
	create   bool
	// noGate: served even while the table's replay gate is up (session
	// records).
	noGate bool
}

// run runs fn for req on the engine of its file system and snapshot, as
// its session; a retried recorded request whose record is there runs
// rebuild instead, which answers from the current state. A recorded
// request that asks for it may be answered early (doc.go, Early replies):
// the Ack says so.
func (s *Server) run(ctx context.Context, req request, fn, rebuild func(ctx context.Context, f *fs.FS) error) (*pb.Error, *pb.Ack) {
	h := req.hdr
	if h == nil {
		return errorToPB(invalidf("no request header")), nil
	}
	st, err := s.fsOf(ctx, h.GetFs())
	if err != nil {
		return errorToPB(err), nil
	}
	t, ok := st.st.serves(req.d)
	if !ok {
		return errorToPB(fmt.Errorf("%w: directory %#x of file system %d", errNotOwner, req.d, h.GetFs())), nil
	}
	releases, err := releasesOf(st, t, h)
	if err != nil {
		return errorToPB(err), nil
	}
	engine, err := s.engine(ctx, st, h.GetSnapshot())
	if err != nil {
		return errorToPB(err), nil
	}
	replay := h.GetReplay() && req.recorded
	if !req.noGate {
		if ctx, err = st.st.waitGate(ctx, req.d, replay); err != nil {
			return errorToPB(fmt.Errorf("%w: %w", errRetry, err)), nil
		}
	}
	ctx = fs.WithSession(ctx, h.GetSession())
	now := time.Now()
	if replay && h.GetNowNs() != 0 {
		now = time.Unix(0, h.GetNowNs())
	}
	if replay {
		ctx = fs.WithReplay(ctx)
	}
	ctx = fs.WithOpTime(ctx, now)
	// The session's releases first, past the table's gate as a Release
	// would be, and before the reply record goes in ctx: a reclaim they
	// start is no part of the request.
	for _, rh := range releases {
		if err := engine.Release(ctx, rh); err != nil {
			s.log.Warn("a release carried by a request", "handle", rh, "session", h.GetSession(), "err", err)
		}
	}
	st.stats.count(t.id, req.create)
	var tag *replyTag
	if req.recorded && h.GetSeq() != 0 && h.GetSnapshot() == 0 {
		key := replyKey(st.f, t.r.Lo, h.GetSession(), h.GetSlot())
		done, dup, err := s.claim(ctx, st, key, h)
		if err != nil {
			return errorToPB(err), nil
		}
		defer done()
		if dup {
			// Applied already. Its record may not be durable yet (a retry
			// of a request answered early whose answer was lost on the
			// way): the Ack then names the record's entry, so that the
			// client keeps the request until it is durable and replays it
			// if the store loses it.
			p := st.st.pendingOf(key)
			if p != nil && !h.GetEarly() {
				if err := p.wait(ctx); err != nil {
					return errorToPB(err), nil
				}
				p = nil
			}
			if replay {
				return nil, st.st.ack(p, now)
			}
			return errorToPB(rebuild(ctx, engine)), st.st.ack(p, now)
		}
		tag = &replyTag{key: key, seq: h.GetSeq(), early: h.GetEarly() && h.GetSession() != 0}
		ctx = withReply(ctx, tag)
		if tag.early {
			ctx = fs.WithEarly(ctx)
		}
	}
	for attempt := 0; ; attempt++ {
		err = fn(ctx, engine)
		var foreign *ForeignError
		if !errors.As(err, &foreign) {
			break
		}
		if _, still := st.st.serves(req.d); !still {
			break // the routing table moved meanwhile: NOT_OWNER
		}
		// The operation needs tables served elsewhere as well: borrow
		// them and run it here (Ursa Minor §3.5).
		if attempt == maxBorrowAttempts {
			err = fmt.Errorf("%w: %w", errRetry, err)
			break
		}
		if berr := s.borrow(ctx, st.f, foreign.D); berr != nil {
			err = berr
			break
		}
		s.touchBorrowed(st, foreign.D)
	}
	var early *pending
	if tag != nil {
		early = tag.p
	}
	if err != nil && early != nil {
		// A failure after an early first transaction: answer it only once
		// that is durable, as nothing of it is replayed.
		_ = early.wait(ctx)
		early = nil
	}
	if req.recorded {
		return errorToPB(err), st.st.ack(early, now)
	}
	return errorToPB(err), nil
}

// maxBorrowAttempts bounds the borrows one request makes before the
// client is told to ask again.
const maxBorrowAttempts = 3

// claim makes the server the only one running the request of a session's
// slot, and tells whether its reply record says it was applied already
// (dup). done ends the claim.
func (s *Server) claim(ctx context.Context, st *fsState, key []byte, h *pb.Header) (done func(), dup bool, err error) {
	k := [2]uint64{h.GetSession(), h.GetSlot()}
	for {
		s.inflightMu.Lock()
		c := s.inflight[k]
		if c == nil {
			c = &call{seq: h.GetSeq(), done: make(chan struct{})}
			s.inflight[k] = c
			s.inflightMu.Unlock()
			done = func() {
				s.inflightMu.Lock()
				delete(s.inflight, k)
				s.inflightMu.Unlock()
				close(c.done)
			}
			break
		}
		s.inflightMu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	var rec *replyRecord
	err = st.st.View(ctx, func(tx fs.MetaTxn) error {
		v, ok, err := tx.Get(key)
		if err != nil || !ok {
			return err
		}
		rec, err = decodeReply(v)
		return err
	})
	switch {
	case err != nil:
		done()
		return nil, false, err
	case rec != nil && rec.Seq == h.GetSeq():
		return done, true, nil
	case rec != nil && rec.Seq > h.GetSeq() && h.GetReplay():
		// A later request of the slot was applied, so this one was too:
		// the session sent it only after this one's answer, and a store
		// makes its entries durable in order.
		return done, true, nil
	case rec != nil && rec.Seq > h.GetSeq():
		done()
		return nil, false, invalidf("request %d of slot %d of session %d is older than the slot's last applied (%d)", h.GetSeq(), h.GetSlot(), h.GetSession(), rec.Seq)
	}
	return done, false, nil
}

func attrResponse(e *pb.Error, ack *pb.Ack, a fs.Attr) *pb.AttrResponse {
	if e != nil {
		return &pb.AttrResponse{Error: e, Ack: ack}
	}
	return &pb.AttrResponse{Attr: attrToPB(a), Ack: ack}
}

// Lookup implements pb.MetaServer.
func (s *Server) Lookup(ctx context.Context, req *pb.LookupRequest) (*pb.AttrResponse, error) {
	var a fs.Attr
	foreign := false
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetDir().GetD()}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.Lookup(ctx, handleFromPB(req.GetDir()), req.GetName())
		foreign = err == nil && s.readForeign(req.GetHeader(), a.Handle)
		return err
	}, nil)
	resp := attrResponse(e, ack, a)
	resp.Foreign = foreign
	return resp, nil
}

// readForeign reports whether the attributes of h, read by a live
// (not snapshot) request, came from the committed state of a table served
// elsewhere (txn.Get reads foreign keys from the tree): they may miss
// changes that table's owner answered early, the reader's own included.
func (s *Server) readForeign(hdr *pb.Header, h fs.Handle) bool {
	if hdr.GetSnapshot() != 0 {
		return false
	}
	_, here := s.servesHere(hdr.GetFs(), h.D)
	return !here
}

// GetAttr implements pb.MetaServer.
func (s *Server) GetAttr(ctx context.Context, req *pb.GetAttrRequest) (*pb.AttrResponse, error) {
	var a fs.Attr
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetHandle().GetD()}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.GetAttr(ctx, handleFromPB(req.GetHandle()))
		return err
	}, nil)
	return attrResponse(e, ack, a), nil
}

// setAttrInFromPB reads attribute changes (nil: none).
func setAttrInFromPB(req *pb.SetAttrRequest) fs.SetAttrIn {
	if req == nil {
		return fs.SetAttrIn{}
	}
	return fs.SetAttrIn{Valid: req.GetValid(), Mode: req.GetMode(), Uid: req.GetUid(), Gid: req.GetGid(), Size: req.GetSize(),
		Atime: time.Unix(0, req.GetAtimeNs()), Mtime: time.Unix(0, req.GetMtimeNs()), Ctime: time.Unix(0, req.GetCtimeNs())}
}

// setAttrInToPB is setAttrInFromPB's inverse (no header nor handle).
func setAttrInToPB(in fs.SetAttrIn) *pb.SetAttrRequest {
	if in.Valid == 0 {
		return nil
	}
	return &pb.SetAttrRequest{Valid: in.Valid, Mode: in.Mode, Uid: in.Uid, Gid: in.Gid, Size: in.Size,
		AtimeNs: in.Atime.UnixNano(), MtimeNs: in.Mtime.UnixNano(), CtimeNs: in.Ctime.UnixNano()}
}

// SetAttr implements pb.MetaServer.
func (s *Server) SetAttr(ctx context.Context, req *pb.SetAttrRequest) (*pb.AttrResponse, error) {
	in := setAttrInFromPB(req)
	var a fs.Attr
	h := handleFromPB(req.GetHandle())
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: h.D, recorded: true}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.SetAttr(ctx, h, in)
		return err
	}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.GetAttr(ctx, h)
		return err
	})
	return attrResponse(e, ack, a), nil
}

// Create implements pb.MetaServer: files, nodes, directories, symlinks.
func (s *Server) Create(ctx context.Context, req *pb.CreateRequest) (*pb.AttrResponse, error) {
	dir := handleFromPB(req.GetDir())
	cred := fs.Cred{Uid: req.GetCred().GetUid(), Gid: req.GetCred().GetGid()}
	if w := req.GetWant(); w != nil && req.GetHeader().GetReplay() {
		want := fs.Want{Handle: handleFromPB(w)}
		if len(req.GetWantBlob()) != 0 {
			g, err := guidFromPB(req.GetWantBlob())
			if err != nil {
				return &pb.AttrResponse{Error: errorToPB(invalidf("%v", err))}, nil
			}
			want.Blob = g
		}
		ctx = fs.WithWant(ctx, want)
	}
	var a fs.Attr
	var da *pb.Attr
	var remote struct {
		tried         bool
		d, table, dst uint64
	}
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: dir.D, recorded: true, create: true}, func(ctx context.Context, f *fs.FS) (err error) {
		if req.GetKind() == pb.CreateRequest_DIRECTORY && !remote.tried && req.GetHeader().GetSnapshot() == 0 {
			// FlexGroup placement: most directories stay with their
			// parent; RP sends some to another server, as new tables.
			remote.tried = true
			if dst, ok := s.placeRemote(f, dir); ok && !req.GetHeader().GetReplay() && mkdirCanSucceed(ctx, f, dir, req.GetName()) {
				st, _ := s.fsOf(ctx, req.GetHeader().GetFs())
				d, table, perr := s.remoteDirectory(ctx, st, f)
				if perr != nil {
					s.log.Info("placing a directory on another server; keeping it here", "err", perr)
				} else {
					remote.d, remote.table, remote.dst = d, table, dst
					if r := replyOf(ctx); r != nil {
						r.early = false // a replay would not carve the table again
					}
				}
			}
		}
		switch req.GetKind() {
		case pb.CreateRequest_FILE:
			if a, err = f.Create(ctx, dir, req.GetName(), req.GetMode(), cred); err == nil && req.GetOpen() {
				f.OpenNew(ctx, a.Handle)
			}
		case pb.CreateRequest_NODE:
			a, err = f.Mknod(ctx, dir, req.GetName(), req.GetMode(), req.GetRdev(), cred)
		case pb.CreateRequest_DIRECTORY:
			if remote.d != 0 {
				a, err = f.MkdirAt(ctx, dir, req.GetName(), req.GetMode(), cred, remote.d)
			} else {
				a, err = f.Mkdir(ctx, dir, req.GetName(), req.GetMode(), cred)
			}
		case pb.CreateRequest_SYMLINK:
			a, err = f.Symlink(ctx, dir, req.GetName(), req.GetTarget(), cred)
		default:
			err = invalidf("create of kind %v", req.GetKind())
		}
		if err == nil {
			da = dirAttr(ctx, f, dir)
		}
		return err
	}, func(ctx context.Context, f *fs.FS) (err error) {
		if a, err = f.Lookup(ctx, dir, req.GetName()); err == nil && req.GetOpen() && !a.IsDir() {
			f.OpenNew(ctx, a.Handle)
		}
		return err
	})
	if remote.table != 0 {
		// The new directory's table goes to the server placement chose
		// (it was served here for the mkdir; used or not, it moves).
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			mctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
			defer cancel()
			if _, err := s.moveTable(mctx, remote.table, remote.dst); err != nil {
				s.log.Info("moving a remote directory's table to its server", "table", remote.table, "to", remote.dst, "err", err)
			}
		}()
	}
	resp := attrResponse(e, ack, a)
	if e == nil {
		resp.Dir = da
	}
	return resp, nil
}

// servesHere reports whether directory id d of file system f is in a table
// served here (its keys are read from this server's cache).
func (s *Server) servesHere(f, d uint64) (table, bool) {
	s.mu.Lock()
	st := s.fss[f]
	s.mu.Unlock()
	if st == nil {
		return table{}, false
	}
	return st.st.serves(d)
}

// dirAttr returns directory h's attributes as the operation that just
// changed it left them (nil if they cannot be read: the client asks).
func dirAttr(ctx context.Context, f *fs.FS, h fs.Handle) *pb.Attr {
	a, err := f.GetAttr(ctx, h)
	if err != nil {
		return nil
	}
	return attrToPB(a)
}

// mkdirCanSucceed reports whether a mkdir of name in dir gets past its
// checks (a valid name, not there yet, in a directory), so that a remote
// placement, which carves and moves a table, is not made for a mkdir that
// fails: bad input changes nothing.
func mkdirCanSucceed(ctx context.Context, f *fs.FS, dir fs.Handle, name string) bool {
	if fs.CheckNewName(name) != nil {
		return false
	}
	if a, err := f.GetAttr(ctx, dir); err != nil || !a.IsDir() {
		return false
	}
	_, err := f.Lookup(ctx, dir, name)
	return errors.Is(err, syscall.ENOENT)
}

// Readlink implements pb.MetaServer.
func (s *Server) Readlink(ctx context.Context, req *pb.ReadlinkRequest) (*pb.ReadlinkResponse, error) {
	var target string
	e, _ := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetHandle().GetD()}, func(ctx context.Context, f *fs.FS) (err error) {
		target, err = f.Readlink(ctx, handleFromPB(req.GetHandle()))
		return err
	}, nil)
	return &pb.ReadlinkResponse{Error: e, Target: target}, nil
}

// Link implements pb.MetaServer.
func (s *Server) Link(ctx context.Context, req *pb.LinkRequest) (*pb.AttrResponse, error) {
	dir := handleFromPB(req.GetDir())
	var a fs.Attr
	var da *pb.Attr
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: dir.D, recorded: true}, func(ctx context.Context, f *fs.FS) (err error) {
		if a, err = f.Link(ctx, handleFromPB(req.GetHandle()), dir, req.GetName()); err == nil {
			da = dirAttr(ctx, f, dir)
		}
		return err
	}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.Lookup(ctx, dir, req.GetName())
		return err
	})
	resp := attrResponse(e, ack, a)
	if e == nil {
		resp.Dir = da
	}
	return resp, nil
}

// Remove implements pb.MetaServer: unlink(2) and rmdir(2).
func (s *Server) Remove(ctx context.Context, req *pb.RemoveRequest) (*pb.ErrorResponse, error) {
	dir := handleFromPB(req.GetDir())
	var da *pb.Attr
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: dir.D, recorded: true}, func(ctx context.Context, f *fs.FS) (err error) {
		if req.GetDirectory() {
			err = f.Rmdir(ctx, dir, req.GetName())
		} else {
			err = f.Unlink(ctx, dir, req.GetName())
		}
		if err == nil {
			da = dirAttr(ctx, f, dir)
		}
		return err
	}, func(context.Context, *fs.FS) error { return nil })
	resp := &pb.ErrorResponse{Error: e, Ack: ack}
	if e == nil {
		resp.Dir = da
	}
	return resp, nil
}

// Rename implements pb.MetaServer.
func (s *Server) Rename(ctx context.Context, req *pb.RenameRequest) (*pb.ErrorResponse, error) {
	src, dst := handleFromPB(req.GetSrcDir()), handleFromPB(req.GetDstDir())
	var sa, da *pb.Attr
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: src.D, recorded: true}, func(ctx context.Context, f *fs.FS) error {
		err := f.Rename(ctx, src, req.GetSrcName(), dst, req.GetDstName(), req.GetFlags())
		if err == nil {
			sa = dirAttr(ctx, f, src)
			if dst == src {
				da = sa
			} else if _, here := s.servesHere(req.GetHeader().GetFs(), dst.D); here {
				da = dirAttr(ctx, f, dst)
			}
		}
		return err
	}, func(context.Context, *fs.FS) error { return nil })
	resp := &pb.ErrorResponse{Error: e, Ack: ack}
	if e == nil {
		resp.Dir, resp.DstDir = sa, da
	}
	return resp, nil
}

// ReadDir implements pb.MetaServer (READDIR and READDIRPLUS).
func (s *Server) ReadDir(ctx context.Context, req *pb.ReadDirRequest) (*pb.ReadDirResponse, error) {
	dir := handleFromPB(req.GetDir())
	var out []*pb.DirEntry
	e, _ := s.run(ctx, request{hdr: req.GetHeader(), d: dir.D}, func(ctx context.Context, f *fs.FS) error {
		out = nil
		if req.GetPlus() {
			es, err := f.ReadDirPlus(ctx, dir, req.GetAfter(), int(req.GetMax()))
			for _, x := range es {
				de := &pb.DirEntry{Name: x.Name, Handle: handleToPB(x.Handle), Type: x.Type, Cookie: x.Cookie}
				// An object of a table served elsewhere goes without
				// attributes (readForeign): the client looks it up.
				if x.OK && !s.readForeign(req.GetHeader(), x.Handle) {
					de.Attr = attrToPB(x.Attr)
				}
				out = append(out, de)
			}
			return err
		}
		es, err := f.ReadDir(ctx, dir, req.GetAfter(), int(req.GetMax()))
		for _, x := range es {
			out = append(out, &pb.DirEntry{Name: x.Name, Handle: handleToPB(x.Handle), Type: x.Type, Cookie: x.Cookie})
		}
		return err
	}, nil)
	return &pb.ReadDirResponse{Error: e, Entries: out}, nil
}

// Xattr implements pb.MetaServer.
func (s *Server) Xattr(ctx context.Context, req *pb.XattrRequest) (*pb.XattrResponse, error) {
	h := handleFromPB(req.GetHandle())
	resp := &pb.XattrResponse{}
	r := request{hdr: req.GetHeader(), d: h.D}
	var fn func(ctx context.Context, f *fs.FS) error
	var rebuild func(ctx context.Context, f *fs.FS) error
	switch req.GetOp() {
	case pb.XattrRequest_GET:
		fn = func(ctx context.Context, f *fs.FS) (err error) {
			resp.Value, err = f.GetXattr(ctx, h, req.GetName())
			return err
		}
	case pb.XattrRequest_LIST:
		fn = func(ctx context.Context, f *fs.FS) (err error) {
			resp.Names, err = f.ListXattr(ctx, h)
			return err
		}
	case pb.XattrRequest_SET:
		r.recorded = true
		fn = func(ctx context.Context, f *fs.FS) error {
			return f.SetXattr(ctx, h, req.GetName(), req.GetValue(), req.GetFlags())
		}
		rebuild = func(context.Context, *fs.FS) error { return nil }
	case pb.XattrRequest_REMOVE:
		r.recorded = true
		fn = func(ctx context.Context, f *fs.FS) error { return f.RemoveXattr(ctx, h, req.GetName()) }
		rebuild = func(context.Context, *fs.FS) error { return nil }
	default:
		return &pb.XattrResponse{Error: errorToPB(invalidf("xattr operation %v", req.GetOp()))}, nil
	}
	e, ack := s.run(ctx, r, fn, rebuild)
	if e != nil {
		return &pb.XattrResponse{Error: e, Ack: ack}, nil
	}
	resp.Ack = ack
	return resp, nil
}

// Open implements pb.MetaServer.
func (s *Server) Open(ctx context.Context, req *pb.OpenRequest) (*pb.AttrResponse, error) {
	var a fs.Attr
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetHandle().GetD()}, func(ctx context.Context, f *fs.FS) (err error) {
		a, err = f.Open(ctx, handleFromPB(req.GetHandle()))
		return err
	}, nil)
	return attrResponse(e, ack, a), nil
}

// Release implements pb.MetaServer.
func (s *Server) Release(ctx context.Context, req *pb.OpenRequest) (*pb.ErrorResponse, error) {
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetHandle().GetD()}, func(ctx context.Context, f *fs.FS) error {
		h := handleFromPB(req.GetHandle())
		if carries(req.GetHeader(), h) {
			return nil // released with the header's
		}
		return f.Release(ctx, h)
	}, nil)
	return &pb.ErrorResponse{Error: e, Ack: ack}, nil
}

// releasesOf returns the releases header h carries (Header.releases), each
// of a file in table t: a session routes them by its delegation map, so
// one filed in another table means that map is stale, and the request is
// refused with NOT_OWNER before anything is recorded (the session sends
// them again with its new map). A release must not be lost while the
// session lives: the file would stay unreclaimed until it ends.
func releasesOf(st *fsState, t table, h *pb.Header) ([]fs.Handle, error) {
	n := len(h.GetReleases())
	if n == 0 {
		return nil, nil
	}
	if n > maxReleasesPerRequest {
		return nil, invalidf("%d releases in one request (the bound is %d)", n, maxReleasesPerRequest)
	}
	if h.GetSession() == 0 {
		return nil, invalidf("releases without a session")
	}
	out := make([]fs.Handle, n)
	for i, x := range h.GetReleases() {
		out[i] = handleFromPB(x)
		if out[i].IsDir() {
			return nil, invalidf("release of directory %v", out[i])
		}
		if rt, ok := st.st.serves(out[i].D); !ok || rt.id != t.id {
			return nil, fmt.Errorf("%w: a release of %v is not in table %d", errNotOwner, out[i], t.id)
		}
	}
	return out, nil
}

// maxReleasesPerRequest bounds the releases one request carries
// (releases.go sends at most maxReleasesSent).
const maxReleasesPerRequest = 1024

// SyncOpens implements pb.MetaServer: a session tells the owner of a
// table, at the epoch it found it at, which of its files it holds open
// there.
func (s *Server) SyncOpens(ctx context.Context, req *pb.SyncOpensRequest) (*pb.ErrorResponse, error) {
	h := req.GetHeader()
	if h.GetSession() == 0 {
		return &pb.ErrorResponse{Error: errorToPB(invalidf("no session"))}, nil
	}
	if len(req.GetHandles()) > maxSyncedOpens {
		return &pb.ErrorResponse{Error: errorToPB(invalidf("%d open files in one request (the bound is %d)", len(req.GetHandles()), maxSyncedOpens))}, nil
	}
	if h.GetSnapshot() != 0 {
		return &pb.ErrorResponse{}, nil // nothing is reclaimed in a snapshot
	}
	st, err := s.fsOf(ctx, h.GetFs())
	if err != nil {
		return &pb.ErrorResponse{Error: errorToPB(err)}, nil
	}
	hs := make([]fs.Handle, len(req.GetHandles()))
	for i, x := range req.GetHandles() {
		hs[i] = handleFromPB(x)
	}
	st.live.HoldOpens(h.GetSession(), hs)
	if !st.st.syncedOpens(req.GetTable(), req.GetEpoch(), h.GetSession()) {
		return &pb.ErrorResponse{Error: errorToPB(fmt.Errorf("%w: table %d at epoch %d", errNotOwner, req.GetTable(), req.GetEpoch()))}, nil
	}
	st.st.replayed(req.GetTable(), h.GetSession())
	return &pb.ErrorResponse{}, nil
}

// WaitSafe implements pb.MetaServer: how durable a store's entries are
// (doc.go, Early replies).
func (s *Server) WaitSafe(ctx context.Context, req *pb.WaitSafeRequest) (*pb.WaitSafeResponse, error) {
	if !s.ready() {
		return &pb.WaitSafeResponse{Error: errorToPB(errNotReady)}, nil
	}
	s.mu.Lock()
	st := s.fss[req.GetFs()]
	s.mu.Unlock()
	if st == nil || st.st.id != req.GetStore() {
		return &pb.WaitSafeResponse{Unknown: true}, nil
	}
	wait := maxSafeWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)*3/4)
	}
	state := st.st.waitSafe(ctx, req.GetAfter(), req.GetGen(), req.GetUrgent(), wait)
	resp := &pb.WaitSafeResponse{Durable: state.durable, Gen: state.gen, Unknown: !state.known}
	for _, r := range state.lost {
		resp.Lost = append(resp.Lost, &pb.SeqRange{From: r.from, To: r.to})
	}
	return resp, nil
}

// maxSafeWait bounds how long WaitSafe waits for news.
const maxSafeWait = 5 * time.Second

// maxSyncedOpens bounds the open files one SyncOpens names (a session
// with more sends several).
const maxSyncedOpens = 1 << 16

// StatFS implements pb.MetaServer (routed by the root directory). Its
// block counts are the cluster's capacity and use (capacity.go), cached
// for capacityTTL.
func (s *Server) StatFS(ctx context.Context, req *pb.StatFSRequest) (*pb.StatFSResponse, error) {
	var sf fs.StatFS
	e, _ := s.run(ctx, request{hdr: req.GetHeader(), d: fs.RootHandle.D}, func(ctx context.Context, f *fs.FS) error {
		base, err := f.StatFS(ctx)
		if err != nil {
			return err
		}
		c, err := s.capacity.get(ctx)
		if err != nil {
			return err
		}
		sf = base.WithCapacity(c)
		return nil
	}, nil)
	return &pb.StatFSResponse{Error: e, Blocks: sf.Blocks, Bfree: sf.Bfree, Bavail: sf.Bavail, Files: sf.Files, Ffree: sf.Ffree,
		Bsize: sf.Bsize, Frsize: sf.Frsize, NameLen: sf.NameLen}, nil
}

// FileBlocks implements pb.MetaServer.
func (s *Server) FileBlocks(ctx context.Context, req *pb.FileBlocksRequest) (*pb.FileBlocksResponse, error) {
	if n := len(req.GetStarts()); n > maxBlocksPerRequest {
		return &pb.FileBlocksResponse{Error: errorToPB(invalidf("%d blocks in one request (the bound is %d)", n, maxBlocksPerRequest))}, nil
	}
	var state fs.FileState
	var refs []fs.BlockRef
	e, _ := s.run(ctx, request{hdr: req.GetHeader(), d: req.GetHandle().GetD()}, func(ctx context.Context, f *fs.FS) (err error) {
		state, refs, err = f.FileBlocks(ctx, handleFromPB(req.GetHandle()), req.GetStarts())
		return err
	}, nil)
	if e != nil {
		return &pb.FileBlocksResponse{Error: e}, nil
	}
	resp := &pb.FileBlocksResponse{State: &pb.FileState{Mode: state.Mode, Size: state.Size, BlobExists: state.BlobExists, DataGen: state.DataGen}}
	if !state.Blob.IsZero() {
		resp.State.Blob = state.Blob[:]
	}
	for _, b := range refs {
		resp.Blocks = append(resp.Blocks, blockToPB(b))
	}
	return resp, nil
}

// maxBlocksPerRequest bounds the block map pairs one FileBlocks asks for.
const maxBlocksPerRequest = 4096

// CommitBlocks implements pb.MetaServer.
func (s *Server) CommitBlocks(ctx context.Context, req *pb.CommitBlocksRequest) (*pb.CommitBlocksResponse, error) {
	blob, err := guidFromPB(req.GetBlob())
	if err != nil {
		return &pb.CommitBlocksResponse{Error: errorToPB(invalidf("%v", err))}, nil
	}
	if len(req.GetBlocks()) > fs.MaxBlocksPerCommit {
		return &pb.CommitBlocksResponse{Error: errorToPB(invalidf("%d blocks in one commit (the bound is %d)", len(req.GetBlocks()), fs.MaxBlocksPerCommit))}, nil
	}
	nbs := make([]fs.NewBlock, len(req.GetBlocks()))
	for i, b := range req.GetBlocks() {
		nbs[i] = fs.NewBlock{Start: b.GetStart(), Tract: b.GetTract(), Length: b.GetLength(), Base: blockFromPB(b.GetBase()), Inline: b.GetInline()}
	}
	var res fs.BlocksCommitted
	h := handleFromPB(req.GetHandle())
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: h.D, recorded: true}, func(ctx context.Context, f *fs.FS) (err error) {
		res, err = f.CommitBlocks(ctx, h, blob, nbs, fs.Commit{Size: req.GetSize(), Mtime: req.GetMtimeNs(), Attrs: setAttrInFromPB(req.GetAttrs())})
		return err
	}, func(ctx context.Context, f *fs.FS) error {
		// Applied already (the client lost the answer): the blocks as they
		// are now, which that commit or a later one wrote.
		starts := make([]uint64, len(nbs))
		for i, b := range nbs {
			starts[i] = b.Start
		}
		st, refs, err := f.FileBlocks(ctx, h, starts)
		res = fs.BlocksCommitted{Blocks: refs, Size: st.Size, DataGen: st.DataGen}
		return err
	})
	if e != nil {
		return &pb.CommitBlocksResponse{Error: e, Ack: ack}, nil
	}
	resp := &pb.CommitBlocksResponse{Size: res.Size, DataGen: res.DataGen, Ack: ack}
	for _, b := range res.Blocks {
		resp.Blocks = append(resp.Blocks, blockToPB(b))
	}
	return resp, nil
}

// Session implements pb.MetaServer: a client's session record, renewed
// while it lives (orphans it holds open stay) and ended at unmount.
func (s *Server) Session(ctx context.Context, req *pb.SessionRequest) (*pb.ErrorResponse, error) {
	sess := req.GetHeader().GetSession()
	if sess == 0 {
		return &pb.ErrorResponse{Error: errorToPB(invalidf("session 0"))}, nil
	}
	e, ack := s.run(ctx, request{hdr: req.GetHeader(), d: fs.RootHandle.D, noGate: true}, func(ctx context.Context, f *fs.FS) error {
		if req.GetEnd() {
			return f.EndSession(ctx, sess)
		}
		if err := f.RenewSession(ctx, sess); err != nil {
			return err
		}
		if st, err := s.fsOf(ctx, req.GetHeader().GetFs()); err == nil {
			st.st.addLive(sess)
		}
		return nil
	}, nil)
	return &pb.ErrorResponse{Error: e, Ack: ack}, nil
}
