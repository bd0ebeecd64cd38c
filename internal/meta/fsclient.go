package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/fs"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// FSClient is one session's client of one file system's metadata servers:
// the file-system operations of internal/fsclient's Metadata, each sent to
// the owner of the table of its directory. Its recorded requests take one
// of the session's request slots each (a slot has one request in flight;
// its sequence number grows), so a retry after a failover is recognised.
type FSClient struct {
	c       *Client
	f, snap uint64
	session uint64
	slots   chan uint64
	seqMu   sync.Mutex
	seqs    []uint64
	// opens are the files the session holds open; synced, the delegation
	// epoch at which each table's owner was last told of those in it
	// (SyncOpens): a table's new owner (or a new incarnation of the old
	// one, or a table split off) learns of them before anything else the
	// session asks of it, and within openCheck anyway, and it does not
	// reclaim at once a file that loses its last name until every live
	// session has told it.
	opensMu sync.Mutex
	opens   map[fs.Handle]bool
	synced  map[uint64]uint64
	// syncing counts SyncOpens in flight, syncsDone those finished: an
	// open answered while one was under way may be missing from what it
	// told a new owner (heldOpen tells it again). opensGen grows with every
	// open added: a sync marks its table told only if none was added
	// while it ran.
	syncing   int
	syncsDone uint64
	opensGen  uint64
	// sessionReady is closed once the session's record is written: no
	// request goes out before (a server waits for the opens of the
	// sessions it knows of).
	sessionReady chan struct{}
	readyOnce    sync.Once
	// sessionErr, set before sessionReady closes, is why the session can
	// never be written: the file system is not the caller's tenant's
	// (EACCES). Every request then fails with it.
	sessionErr error
	// j holds the operations answered early until they are durable
	// (journal.go); early says whether the session asks for early answers.
	j     *journal
	early bool
	// rel holds the session's releases until a request carries them, or
	// releaseDelay passes (releases.go).
	rel          *releaseQueue
	releaseDelay time.Duration
	// dirs are directories' attributes as this session's last change in
	// them left them (answers of creates, links, removes, renames), kept
	// dirAttrFor: the kernel asks for a directory's attributes after each
	// change in it.
	dirsMu   sync.Mutex
	dirs     map[fs.Handle]dirAttrs
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// dirAttrs are a directory's cached attributes.
type dirAttrs struct {
	a     fs.Attr
	until time.Time
}

// dirAttrFor is how long a directory's attributes from a change's answer
// are used: the kernel's attribute cache time (fuse, AttrTimeout), so a
// change another client made shows no later than it would anyway.
const dirAttrFor = time.Second

// forgetDir drops h's cached attributes (a change to it is on its way).
func (m *FSClient) forgetDir(h fs.Handle) {
	m.dirsMu.Lock()
	defer m.dirsMu.Unlock()
	delete(m.dirs, h)
}

// sawDir records directory attributes a change sent with header hdr
// answered (nil: forget h's). A replay's answer is not kept: it shows the
// directory before the session's later changes that are replayed after
// it (a chmod of the directory cleared its entry when it ran first, and
// the replayed create before it would bring the old mode back).
func (m *FSClient) sawDir(hdr *pb.Header, h fs.Handle, a *pb.Attr) {
	m.dirsMu.Lock()
	defer m.dirsMu.Unlock()
	if a == nil || hdr.GetReplay() {
		delete(m.dirs, h)
		return
	}
	da, err := attrFromPB(a)
	if err != nil || da.Handle != h || !da.IsDir() {
		delete(m.dirs, h)
		return
	}
	if old, ok := m.dirs[h]; ok && old.a.Ctime.After(da.Ctime) {
		return // an answer overtaken by a later change's
	}
	if len(m.dirs) >= maxCachedDirs {
		clear(m.dirs)
	}
	m.dirs[h] = dirAttrs{a: da, until: time.Now().Add(dirAttrFor)}
}

// cachedDir returns h's cached attributes, if fresh.
func (m *FSClient) cachedDir(h fs.Handle) (fs.Attr, bool) {
	m.dirsMu.Lock()
	defer m.dirsMu.Unlock()
	c, ok := m.dirs[h]
	if !ok || time.Now().After(c.until) {
		return fs.Attr{}, false
	}
	return c.a, true
}

// maxCachedDirs bounds the directories whose attributes are kept.
const maxCachedDirs = 4096

// sessionSlots is how many recorded requests a session has in flight at
// most (the reply records a table keeps per session).
const sessionSlots = 256

// sessionRenewal is how often a session's record is renewed (well within
// fs.SessionExpiry).
const sessionRenewal = 20 * time.Second

// FileSystem returns a client of file system f at snapshot snap (0: the
// live one) for session (non-zero, unique per client: a mount). For the
// live file system, the session's record is renewed in the background
// until Close.
func (c *Client) FileSystem(f, snap, session uint64) *FSClient {
	m := &FSClient{c: c, f: f, snap: snap, session: session, slots: make(chan uint64, sessionSlots),
		seqs: make([]uint64, sessionSlots), opens: map[fs.Handle]bool{}, synced: map[uint64]uint64{}, sessionReady: make(chan struct{}), stop: make(chan struct{}),
		early: !c.durable && snap == 0, dirs: map[fs.Handle]dirAttrs{}}
	m.j = newJournal(m)
	m.rel, m.releaseDelay = newReleaseQueue(), releaseDelay
	for i := range sessionSlots {
		m.slots <- uint64(i)
	}
	m.wg.Add(1)
	go m.sendQueuedReleases()
	if snap == 0 {
		m.wg.Add(2)
		go m.renewSession()
		go m.watchOpens()
	}
	return m
}

func (m *FSClient) renewSession() {
	defer m.wg.Done()
	renew := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), sessionRenewal)
		defer cancel()
		if err := m.sessionCall(ctx, false); err != nil {
			if errors.Is(err, syscall.EACCES) {
				// Refused for good: another tenant's file system.
				m.readyOnce.Do(func() {
					m.sessionErr = err
					close(m.sessionReady)
				})
				return 0
			}
			m.c.log.Warn("renewing the session record; trying again in a second", "fs", m.f, "session", m.session, "err", err)
			return time.Second
		}
		m.readyOnce.Do(func() { close(m.sessionReady) })
		return sessionRenewal
	}
	first := renew()
	if first == 0 {
		return
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			next := renew()
			if next == 0 {
				return
			}
			t.Reset(next)
		}
	}
}

// openCheck is how often a session reads the delegation map to tell
// tables' new owners of its opens, should no request go there first.
const openCheck = time.Second

// watchOpens syncs the session's opens with every table's owner, every
// openCheck.
func (m *FSClient) watchOpens() {
	defer m.wg.Done()
	t := time.NewTicker(openCheck)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.syncAll()
		}
	}
}

// syncAll runs syncOpens for every table of the file system, with the
// delegation map read again.
func (m *FSClient) syncAll() {
	ctx, cancel := context.WithTimeout(context.Background(), openCheck)
	defer cancel()
	m.c.invalidate(m.f)
	rts, err := m.c.routes(ctx, m.f)
	if err != nil {
		return
	}
	for _, rt := range rts {
		m.syncRoute(ctx, rt)
	}
}

// syncRoute runs syncOpens with the owner of table rt, if it has one.
func (m *FSClient) syncRoute(ctx context.Context, rt route) {
	if rt.owner == 0 {
		return
	}
	if cl, err := m.c.peers.client(ctx, rt.owner); err == nil {
		m.syncOpens(ctx, rt, cl)
	}
}

func (m *FSClient) sessionCall(ctx context.Context, end bool) error {
	return m.c.call(ctx, m.f, fs.RootHandle.D, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		resp, err := cl.Session(ctx, &pb.SessionRequest{Header: m.header(), End: end})
		return resp.GetError(), err
	})
}

// Close waits for what the session was answered early to be durable,
// then ends the session: what it held open may be reclaimed.
func (m *FSClient) Close(ctx context.Context) error {
	var err error
	m.stopOnce.Do(func() {
		if m.snap == 0 {
			err = m.j.sync(ctx)
		}
		if rerr := m.sendReleases(ctx); rerr != nil {
			// Only a hint: ending the session below releases every open
			// it holds.
			m.c.log.Debug("sending the session's last releases", "fs", m.f, "session", m.session, "err", rerr)
		}
		close(m.stop)
		m.wg.Wait()
		if m.snap == 0 {
			if serr := m.sessionCall(ctx, true); err == nil {
				err = serr
			}
		}
	})
	return err
}

// Sync waits until every operation the session was answered so far is
// durable (fsync, syncfs). It fails with EIO if, since the last Sync, an
// operation answered early was lost by its server and could not be
// applied again.
func (m *FSClient) Sync(ctx context.Context) error {
	if m.snap != 0 {
		return nil
	}
	return m.j.sync(ctx)
}

// JournalStats returns what the session's journal of early answers did.
func (m *FSClient) JournalStats() JournalStats { return m.j.Stats() }

// Unsafe returns how many operations the session was answered early and
// does not know durable yet.
func (m *FSClient) Unsafe() int { return m.j.pending() }

func (m *FSClient) stopped() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}

// Number returns the file system number.
func (m *FSClient) Number() uint64 { return m.f }

func (m *FSClient) header() *pb.Header {
	return &pb.Header{Fs: m.f, Snapshot: m.snap, Session: m.session}
}

// recorded returns a header with a request id: a free slot and its next
// sequence number; release gives the slot back.
func (m *FSClient) recorded(ctx context.Context) (*pb.Header, func(), error) {
	var slot uint64
	select {
	case slot = <-m.slots:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	m.seqMu.Lock()
	m.seqs[slot]++
	seq := m.seqs[slot]
	m.seqMu.Unlock()
	h := m.header()
	h.Slot, h.Seq = slot, seq
	return h, func() { m.slots <- slot }, nil
}

// sendFunc sends a request with header h to cl and returns the answer's
// error and Ack.
type sendFunc func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error)

// call sends a request routed by directory id d.
func (m *FSClient) call(ctx context.Context, d uint64, fn func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error)) error {
	return m.send(ctx, d, false, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		e, err := fn(ctx, cl, h)
		return e, nil, err
	})
}

// callRecorded sends a request that must apply once.
func (m *FSClient) callRecorded(ctx context.Context, d uint64, fn sendFunc) error {
	return m.send(ctx, d, true, fn)
}

// send sends a request routed by directory id d (recorded: it must apply
// once, and may be answered early), once the session's record is written.
// A recorded request first waits for what other servers answered early
// before (journal.barrier); an early answer goes to the journal.
func (m *FSClient) send(ctx context.Context, d uint64, recorded bool, fn sendFunc) error {
	if m.snap == 0 {
		select {
		case <-m.sessionReady:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for the session record: %w", syscall.EIO, ctx.Err())
		}
		if m.sessionErr != nil {
			return m.sessionErr
		}
	}
	h := m.header()
	if recorded {
		if err := m.j.full(ctx); err != nil {
			return err
		}
		var release func()
		var err error
		if h, release, err = m.recorded(ctx); err != nil {
			return err
		}
		defer release()
		h.Early = m.early
	}
	var last route
	var ack *pb.Ack
	var barrierErr error
	onRoute := func(ctx context.Context, rt route, cl pb.MetaClient) {
		m.syncOpens(ctx, rt, cl)
		if recorded && m.snap == 0 {
			barrierErr = m.j.barrier(ctx, rt.owner, true)
		}
		last = rt
	}
	err := m.c.callRouted(ctx, m.f, d, onRoute, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		if barrierErr != nil {
			return nil, barrierErr
		}
		// The session's queued releases of this table ride along
		// (releases.go); the header the journal keeps has none.
		rels := m.rel.take(last.r)
		h.Releases = handlesToPB(rels.hs)
		e, a, err := fn(ctx, cl, h)
		h.Releases = nil
		m.rel.finish(rels, releasesDelivered(e, err))
		ack = a
		return e, err
	})
	if recorded && m.snap == 0 && ack != nil {
		var op *unsafeOp
		if ack.GetSeq() != 0 {
			op = &unsafeOp{d: d, hdr: h, now: ack.GetNowNs(), again: fn}
		}
		m.j.note(op, last.owner, ack)
		if err == nil && op != nil {
			// An op lost before its answer got here is replayed first:
			// the caller's next request must find it applied.
			err = m.j.awaitReplay(ctx, op)
		}
	}
	return err
}

// replayOne sends op again as a replay to its table's owner now; touched
// collects the routes replayed to.
func (m *FSClient) replayOne(ctx context.Context, op *unsafeOp, touched map[uint64]route) (node uint64, ack *pb.Ack, err error) {
	h := proto.Clone(op.hdr).(*pb.Header)
	h.Replay, h.NowNs, h.Early = true, op.now, m.early
	var last route
	var barrierErr error
	err = m.c.callRouted(ctx, m.f, op.d, func(ctx context.Context, rt route, cl pb.MetaClient) {
		barrierErr = m.j.barrier(ctx, rt.owner, false)
		last = rt
	}, func(ctx context.Context, cl pb.MetaClient) (*pb.Error, error) {
		if barrierErr != nil {
			return nil, barrierErr
		}
		e, a, err := op.again(ctx, cl, h)
		ack = a
		return e, err
	})
	if last.owner != 0 {
		touched[last.table] = last
	}
	return last.owner, ack, err
}

// syncOpens tells the owner of table rt, unless it was told at rt's epoch
// already, which files the session holds open in it (SyncOpens), after
// what the session was answered early elsewhere is durable or replayed
// here: a table's new owner serves nobody else until each session synced
// (doc.go, Early replies). One that fails is tried again before the next
// request to the table.
func (m *FSClient) syncOpens(ctx context.Context, rt route, cl pb.MetaClient) {
	if m.snap != 0 {
		return
	}
	m.opensMu.Lock()
	done := m.synced[rt.table] == rt.epoch
	m.opensMu.Unlock()
	if done {
		return
	}
	if err := m.j.barrier(ctx, rt.owner, true); err != nil {
		return
	}
	m.sendSyncOpens(ctx, rt, cl)
}

// sendSyncOpens sends SyncOpens for table rt.
func (m *FSClient) sendSyncOpens(ctx context.Context, rt route, cl pb.MetaClient) {
	m.opensMu.Lock()
	req := &pb.SyncOpensRequest{Header: m.header(), Table: rt.table, Epoch: rt.epoch}
	for h := range m.opens {
		if rt.r.Contains(h.D) {
			req.Handles = append(req.Handles, handleToPB(h))
		}
	}
	m.syncing++
	gen := m.opensGen
	m.opensMu.Unlock()
	resp, err := cl.SyncOpens(ctx, req)
	m.opensMu.Lock()
	defer m.opensMu.Unlock()
	m.syncing--
	m.syncsDone++
	if err != nil || resp.GetError() != nil || m.opensGen != gen {
		// A file opened meanwhile may be missing from what was sent: the
		// table counts as told only once a sync covers every open.
		return
	}
	m.synced[rt.table] = max(m.synced[rt.table], rt.epoch)
}

// syncMark is taken before an open is sent (heldOpen).
func (m *FSClient) syncMark() uint64 {
	m.opensMu.Lock()
	defer m.opensMu.Unlock()
	return m.syncsDone
}

// heldOpen records that the session holds hd open, its open sent after
// syncMark returned mark. A SyncOpens that ran meanwhile (a table moved:
// the open's own route, or the background watch) read the session's opens
// without hd and may have told hd's new owner the session holds nothing
// there, while the open was served by the old one. Then the owner is told
// again before the open returns: it must not reclaim hd once its last
// name goes.
func (m *FSClient) heldOpen(ctx context.Context, hd fs.Handle, mark uint64) {
	m.opensMu.Lock()
	m.opens[hd] = true
	m.opensGen++
	raced := m.syncsDone != mark || m.syncing > 0
	m.opensMu.Unlock()
	if !raced || m.snap != 0 {
		return
	}
	rts, err := m.c.routes(ctx, m.f)
	if err != nil {
		return // the table's synced epoch stays; the watch tells it within openCheck
	}
	for _, rt := range rts {
		if !rt.r.Contains(hd.D) {
			continue
		}
		m.opensMu.Lock()
		delete(m.synced, rt.table)
		m.opensMu.Unlock()
		m.syncRoute(ctx, rt)
	}
}

// opened records whether the session holds hd open.
func (m *FSClient) opened(hd fs.Handle, open bool) {
	m.opensMu.Lock()
	defer m.opensMu.Unlock()
	if open {
		m.opens[hd] = true
		m.opensGen++
	} else {
		delete(m.opens, hd)
	}
}

func attrOf(resp *pb.AttrResponse, err error) (fs.Attr, error) {
	if err != nil {
		return fs.Attr{}, err
	}
	a, err := attrFromPB(resp.GetAttr())
	if err != nil {
		return fs.Attr{}, fmt.Errorf("%w: %w", syscall.EIO, err)
	}
	return a, nil
}

// attrCall runs a request answered with attributes.
func (m *FSClient) attrCall(ctx context.Context, d uint64, record bool, send func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error)) (fs.Attr, error) {
	var resp *pb.AttrResponse
	err := m.send(ctx, d, record, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		r, err := send(ctx, cl, h)
		if !h.GetReplay() {
			resp = r
		}
		return r.GetError(), r.GetAck(), err
	})
	return attrOf(resp, err)
}

// Lookup implements fsclient.Metadata.
func (m *FSClient) Lookup(ctx context.Context, dir fs.Handle, name string) (fs.Attr, error) {
	foreign := false
	a, err := m.attrCall(ctx, dir.D, false, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		resp, err := cl.Lookup(ctx, &pb.LookupRequest{Header: h, Dir: handleToPB(dir), Name: name})
		foreign = resp.GetForeign()
		return resp, err
	})
	if err == nil && foreign {
		// The object lives in another table: its owner has what this
		// session changed there (a link count, a mode) before it is
		// durable.
		return m.GetAttr(ctx, a.Handle)
	}
	return a, err
}

// GetAttr implements fsclient.Metadata: a directory this session just
// changed is answered from the change's answer.
func (m *FSClient) GetAttr(ctx context.Context, hd fs.Handle) (fs.Attr, error) {
	if a, ok := m.cachedDir(hd); ok {
		return a, nil
	}
	return m.attrCall(ctx, hd.D, false, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		return cl.GetAttr(ctx, &pb.GetAttrRequest{Header: h, Handle: handleToPB(hd)})
	})
}

// SetAttr implements fsclient.Metadata.
func (m *FSClient) SetAttr(ctx context.Context, hd fs.Handle, in fs.SetAttrIn) (fs.Attr, error) {
	m.forgetDir(hd)
	return m.attrCall(ctx, hd.D, true, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		return cl.SetAttr(ctx, &pb.SetAttrRequest{Header: h, Handle: handleToPB(hd), Valid: in.Valid, Mode: in.Mode, Uid: in.Uid,
			Gid: in.Gid, Size: in.Size, AtimeNs: in.Atime.UnixNano(), MtimeNs: in.Mtime.UnixNano(), CtimeNs: in.Ctime.UnixNano()})
	})
}

func (m *FSClient) create(ctx context.Context, req *pb.CreateRequest) (fs.Attr, error) {
	dir := handleFromPB(req.GetDir())
	return m.attrCall(ctx, req.GetDir().GetD(), true, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		req.Header = h
		resp, err := cl.Create(ctx, req)
		if err == nil && !h.GetReplay() && resp.GetError() == nil && resp.GetAck().GetSeq() != 0 {
			// A replay must give what this answer says.
			req.Want, req.WantBlob = resp.GetAttr().GetHandle(), resp.GetAttr().GetBlob()
		}
		m.sawDir(h, dir, resp.GetDir())
		return resp, err
	})
}

// Create implements fsclient.Metadata.
func (m *FSClient) Create(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred, open bool) (fs.Attr, error) {
	mark := m.syncMark()
	a, err := m.create(ctx, &pb.CreateRequest{Kind: pb.CreateRequest_FILE, Dir: handleToPB(dir), Name: name, Mode: mode,
		Cred: &pb.Cred{Uid: cred.Uid, Gid: cred.Gid}, Open: open})
	if err == nil && open {
		m.heldOpen(ctx, a.Handle, mark)
	}
	return a, err
}

// Mknod implements fsclient.Metadata.
func (m *FSClient) Mknod(ctx context.Context, dir fs.Handle, name string, mode uint32, rdev uint64, cred fs.Cred) (fs.Attr, error) {
	return m.create(ctx, &pb.CreateRequest{Kind: pb.CreateRequest_NODE, Dir: handleToPB(dir), Name: name, Mode: mode, Rdev: rdev,
		Cred: &pb.Cred{Uid: cred.Uid, Gid: cred.Gid}})
}

// Mkdir implements fsclient.Metadata.
func (m *FSClient) Mkdir(ctx context.Context, dir fs.Handle, name string, mode uint32, cred fs.Cred) (fs.Attr, error) {
	return m.create(ctx, &pb.CreateRequest{Kind: pb.CreateRequest_DIRECTORY, Dir: handleToPB(dir), Name: name, Mode: mode,
		Cred: &pb.Cred{Uid: cred.Uid, Gid: cred.Gid}})
}

// Symlink implements fsclient.Metadata.
func (m *FSClient) Symlink(ctx context.Context, dir fs.Handle, name, target string, cred fs.Cred) (fs.Attr, error) {
	return m.create(ctx, &pb.CreateRequest{Kind: pb.CreateRequest_SYMLINK, Dir: handleToPB(dir), Name: name, Target: target,
		Cred: &pb.Cred{Uid: cred.Uid, Gid: cred.Gid}})
}

// Readlink implements fsclient.Metadata.
func (m *FSClient) Readlink(ctx context.Context, hd fs.Handle) (string, error) {
	var target string
	err := m.call(ctx, hd.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error) {
		resp, err := cl.Readlink(ctx, &pb.ReadlinkRequest{Header: h, Handle: handleToPB(hd)})
		target = resp.GetTarget()
		return resp.GetError(), err
	})
	return target, err
}

// Link implements fsclient.Metadata.
func (m *FSClient) Link(ctx context.Context, hd, dir fs.Handle, name string) (fs.Attr, error) {
	return m.attrCall(ctx, dir.D, true, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		resp, err := cl.Link(ctx, &pb.LinkRequest{Header: h, Handle: handleToPB(hd), Dir: handleToPB(dir), Name: name})
		m.sawDir(h, dir, resp.GetDir())
		return resp, err
	})
}

func (m *FSClient) remove(ctx context.Context, dir fs.Handle, name string, directory bool) error {
	return m.callRecorded(ctx, dir.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		resp, err := cl.Remove(ctx, &pb.RemoveRequest{Header: h, Dir: handleToPB(dir), Name: name, Directory: directory})
		m.sawDir(h, dir, resp.GetDir())
		return resp.GetError(), resp.GetAck(), err
	})
}

// Unlink implements fsclient.Metadata.
func (m *FSClient) Unlink(ctx context.Context, dir fs.Handle, name string) error {
	return m.remove(ctx, dir, name, false)
}

// Rmdir implements fsclient.Metadata.
func (m *FSClient) Rmdir(ctx context.Context, dir fs.Handle, name string) error {
	return m.remove(ctx, dir, name, true)
}

// Rename implements fsclient.Metadata.
func (m *FSClient) Rename(ctx context.Context, srcDir fs.Handle, srcName string, dstDir fs.Handle, dstName string, flags uint32) error {
	return m.callRecorded(ctx, srcDir.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		resp, err := cl.Rename(ctx, &pb.RenameRequest{Header: h, SrcDir: handleToPB(srcDir), SrcName: srcName,
			DstDir: handleToPB(dstDir), DstName: dstName, Flags: flags})
		m.sawDir(h, srcDir, resp.GetDir())
		m.sawDir(h, dstDir, resp.GetDstDir())
		return resp.GetError(), resp.GetAck(), err
	})
}

func (m *FSClient) readDir(ctx context.Context, dir fs.Handle, after uint64, max int, plus bool) ([]*pb.DirEntry, error) {
	var out []*pb.DirEntry
	err := m.call(ctx, dir.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error) {
		resp, err := cl.ReadDir(ctx, &pb.ReadDirRequest{Header: h, Dir: handleToPB(dir), After: after, Max: uint32(max), Plus: plus})
		out = resp.GetEntries()
		return resp.GetError(), err
	})
	return out, err
}

// ReadDir implements fsclient.Metadata.
func (m *FSClient) ReadDir(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntry, error) {
	es, err := m.readDir(ctx, dir, after, max, false)
	if err != nil {
		return nil, err
	}
	out := make([]fs.DirEntry, len(es))
	for i, e := range es {
		out[i] = fs.DirEntry{Name: e.GetName(), Handle: handleFromPB(e.GetHandle()), Type: e.GetType(), Cookie: e.GetCookie()}
	}
	return out, nil
}

// ReadDirPlus implements fsclient.Metadata.
func (m *FSClient) ReadDirPlus(ctx context.Context, dir fs.Handle, after uint64, max int) ([]fs.DirEntryPlus, error) {
	es, err := m.readDir(ctx, dir, after, max, true)
	if err != nil {
		return nil, err
	}
	out := make([]fs.DirEntryPlus, len(es))
	for i, e := range es {
		out[i].DirEntry = fs.DirEntry{Name: e.GetName(), Handle: handleFromPB(e.GetHandle()), Type: e.GetType(), Cookie: e.GetCookie()}
		if e.GetAttr() != nil {
			a, err := attrFromPB(e.GetAttr())
			if err != nil {
				return nil, fmt.Errorf("%w: %w", syscall.EIO, err)
			}
			out[i].Attr, out[i].OK = a, true
		}
	}
	return out, nil
}

func (m *FSClient) xattr(ctx context.Context, req *pb.XattrRequest) (*pb.XattrResponse, error) {
	var out *pb.XattrResponse
	fn := func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		req.Header = h
		resp, err := cl.Xattr(ctx, req)
		if !h.GetReplay() {
			out = resp
		}
		return resp.GetError(), resp.GetAck(), err
	}
	recorded := req.GetOp() == pb.XattrRequest_SET || req.GetOp() == pb.XattrRequest_REMOVE
	if recorded {
		m.forgetDir(handleFromPB(req.GetHandle()))
	}
	err := m.send(ctx, req.GetHandle().GetD(), recorded, fn)
	return out, err
}

// GetXattr implements fsclient.Metadata.
func (m *FSClient) GetXattr(ctx context.Context, h fs.Handle, name string) ([]byte, error) {
	resp, err := m.xattr(ctx, &pb.XattrRequest{Op: pb.XattrRequest_GET, Handle: handleToPB(h), Name: name})
	if resp.GetValue() == nil && err == nil {
		return []byte{}, nil
	}
	return resp.GetValue(), err
}

// SetXattr implements fsclient.Metadata.
func (m *FSClient) SetXattr(ctx context.Context, h fs.Handle, name string, value []byte, flags uint32) error {
	_, err := m.xattr(ctx, &pb.XattrRequest{Op: pb.XattrRequest_SET, Handle: handleToPB(h), Name: name, Value: value, Flags: flags})
	return err
}

// ListXattr implements fsclient.Metadata.
func (m *FSClient) ListXattr(ctx context.Context, h fs.Handle) ([]string, error) {
	resp, err := m.xattr(ctx, &pb.XattrRequest{Op: pb.XattrRequest_LIST, Handle: handleToPB(h)})
	return resp.GetNames(), err
}

// RemoveXattr implements fsclient.Metadata.
func (m *FSClient) RemoveXattr(ctx context.Context, h fs.Handle, name string) error {
	_, err := m.xattr(ctx, &pb.XattrRequest{Op: pb.XattrRequest_REMOVE, Handle: handleToPB(h), Name: name})
	return err
}

// Open implements fsclient.Metadata.
func (m *FSClient) Open(ctx context.Context, hd fs.Handle) (fs.Attr, error) {
	dropped, err := m.rel.cancel(ctx, hd)
	if err != nil {
		if dropped {
			m.rel.add(hd)
		}
		return fs.Attr{}, fmt.Errorf("%w: waiting for a release of %v to be answered: %w", syscall.EIO, hd, err)
	}
	mark := m.syncMark()
	a, err := m.attrCall(ctx, hd.D, false, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.AttrResponse, error) {
		return cl.Open(ctx, &pb.OpenRequest{Header: h, Handle: handleToPB(hd)})
	})
	if err != nil && dropped {
		// The open that was to take the queued release's place did not
		// happen: the server still counts the earlier open.
		m.rel.add(hd)
	}
	if err == nil && !a.IsDir() {
		m.heldOpen(ctx, hd, mark)
	}
	return a, err
}

// Release implements fsclient.Metadata: queued, it goes with the next
// request to hd's table, or within releaseDelay (releases.go). A
// directory needs none (opens are counted for regular files), nor does a
// session without a number (it is told nothing of opens).
func (m *FSClient) Release(ctx context.Context, hd fs.Handle) error {
	m.opened(hd, false)
	if hd.IsDir() {
		return nil
	}
	if m.session != 0 {
		m.rel.add(hd)
		return nil
	}
	return m.call(ctx, hd.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error) {
		resp, err := cl.Release(ctx, &pb.OpenRequest{Header: h, Handle: handleToPB(hd)})
		return resp.GetError(), err
	})
}

// StatFS implements fsclient.Metadata.
func (m *FSClient) StatFS(ctx context.Context) (fs.StatFS, error) {
	var out fs.StatFS
	err := m.call(ctx, fs.RootHandle.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error) {
		resp, err := cl.StatFS(ctx, &pb.StatFSRequest{Header: h})
		out = fs.StatFS{Blocks: resp.GetBlocks(), Bfree: resp.GetBfree(), Bavail: resp.GetBavail(), Files: resp.GetFiles(),
			Ffree: resp.GetFfree(), Bsize: resp.GetBsize(), Frsize: resp.GetFrsize(), NameLen: resp.GetNameLen()}
		return resp.GetError(), err
	})
	return out, err
}

// FileBlocks implements fsclient.Metadata.
func (m *FSClient) FileBlocks(ctx context.Context, hd fs.Handle, starts []uint64) (fs.FileState, []fs.BlockRef, error) {
	var resp *pb.FileBlocksResponse
	err := m.call(ctx, hd.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, error) {
		var err error
		resp, err = cl.FileBlocks(ctx, &pb.FileBlocksRequest{Header: h, Handle: handleToPB(hd), Starts: starts})
		return resp.GetError(), err
	})
	if err != nil {
		return fs.FileState{}, nil, err
	}
	blob, err := guidFromPB(resp.GetState().GetBlob())
	if err != nil {
		return fs.FileState{}, nil, fmt.Errorf("%w: %w", syscall.EIO, err)
	}
	st := resp.GetState()
	state := fs.FileState{Mode: st.GetMode(), Size: st.GetSize(), Blob: blob, BlobExists: st.GetBlobExists(), DataGen: st.GetDataGen()}
	if len(resp.GetBlocks()) != len(starts) {
		return fs.FileState{}, nil, fmt.Errorf("%w: %d block pairs for %d blocks asked", syscall.EIO, len(resp.GetBlocks()), len(starts))
	}
	refs := make([]fs.BlockRef, len(starts))
	for i, b := range resp.GetBlocks() {
		refs[i] = blockFromPB(b)
	}
	return state, refs, nil
}

// CommitBlocks implements fsclient.Metadata. It is recorded: a commit
// whose answer was lost is not applied twice, and its retry is told it was
// applied (a flush that took it for failed would free tracts the file
// names).
func (m *FSClient) CommitBlocks(ctx context.Context, hd fs.Handle, blob fs.GUID, blocks []fs.NewBlock, c fs.Commit) (fs.BlocksCommitted, error) {
	req := &pb.CommitBlocksRequest{Handle: handleToPB(hd), Blob: blob[:], Size: c.Size, MtimeNs: c.Mtime, Attrs: setAttrInToPB(c.Attrs)}
	for _, b := range blocks {
		req.Blocks = append(req.Blocks, &pb.NewBlock{Start: b.Start, Tract: b.Tract, Length: b.Length, Base: blockToPB(b.Base), Inline: b.Inline})
	}
	var resp *pb.CommitBlocksResponse
	err := m.callRecorded(ctx, hd.D, func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error) {
		req.Header = h
		r, err := cl.CommitBlocks(ctx, req)
		if !h.GetReplay() {
			resp = r
		}
		return r.GetError(), r.GetAck(), err
	})
	if err != nil {
		return fs.BlocksCommitted{}, err
	}
	if len(resp.GetBlocks()) != len(blocks) {
		return fs.BlocksCommitted{}, fmt.Errorf("%w: %d block pairs for %d blocks committed", syscall.EIO, len(resp.GetBlocks()), len(blocks))
	}
	out := fs.BlocksCommitted{Size: resp.GetSize(), DataGen: resp.GetDataGen()}
	for _, b := range resp.GetBlocks() {
		out.Blocks = append(out.Blocks, blockFromPB(b))
	}
	return out, nil
}

// IsRemote reports whether err came from a metadata server's answer (as
// opposed to the client giving up).
func IsRemote(err error) bool {
	var r *RemoteError
	return errors.As(err, &r)
}
