package nfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// NLM version 4 (byte-range locks for NFSv3; the Open Group's XNFS
// "Network Lock Manager Protocol", with RFC 1813's 64-bit offsets) and
// the calls of the status monitor NSM (program 100024) that clients make
// of a server, served on the gateway's port next to NFS and MOUNT.
//
// FSS keeps lock state in the store so that locks outlive a presentation
// server: here each file's locks are one record in the cluster's KV store
// (LockStore; KVLocks), read and replaced in one transaction, so every
// gateway sees them, a lock survives the gateway that granted it, and two
// gateways granting at once cannot both win. A gateway holds no lock
// state, so it has no grace period: after a restart nothing needs to be
// reclaimed (a reclaim is an ordinary LOCK).
//
// Locks are POSIX's: an owner (the client's caller name, its svid and
// its owner handle oh) holds ranges, shared or exclusive; a LOCK replaces
// the owner's locks over its range (a shared lock made exclusive, or the
// reverse), an UNLOCK cuts its range out of them, and ranges of other
// owners conflict when they overlap and one is exclusive. A length of 0
// runs to the end of any file.
//
// A blocking LOCK that conflicts is answered NLM4_BLOCKED and no GRANTED
// callback follows: the gateway keeps no queue of waiters (it would be
// state of one gateway). Clients poll: Linux's lockd sends the LOCK
// again after 30 s without a callback, and gets the lock once it is
// free; CANCEL has nothing to cancel and answers NLM4_GRANTED. The
// asynchronous _MSG/_RES procedures (which call back over another
// connection) and the DOS share reservations SHARE/UNSHARE are not
// served (PROC_UNAVAIL); Linux and libnfs use the synchronous calls.
//
// A client that restarts tells the servers it used through their status
// monitors (SM_NOTIFY) and its lock manager (FREE_ALL): the gateway drops
// every lock of that caller name. SM_MON, SM_UNMON and SM_STAT answer
// success and a fixed state number: the gateway never loses its locks, so
// clients never need to be told it restarted.
//
// LOCK, UNLOCK and CANCEL are idempotent for one owner (locking a range
// again, or unlocking what is unlocked, changes nothing), so they need no
// duplicate-request cache.
const (
	ProgNLM = 100021
	nlmV4   = 4
	ProgNSM = 100024
	nsmV1   = 1

	nlmProcNull    = 0
	nlmProcTest    = 1
	nlmProcLock    = 2
	nlmProcCancel  = 3
	nlmProcUnlock  = 4
	nlmProcNMLock  = 22
	nlmProcFreeAll = 23

	nsmProcNull    = 0
	nsmProcStat    = 1
	nsmProcMon     = 2
	nsmProcUnmon   = 3
	nsmProcUnmonAl = 4
	nsmProcSimu    = 5
	nsmProcNotify  = 6

	// lmMaxStr is LM_MAXSTRLEN, the longest caller name; maxOwnerBytes
	// the longest owner handle (oh) the gateway keeps (netobj is
	// unbounded; Linux sends about 40 bytes).
	lmMaxStr      = 1024
	maxOwnerBytes = 1024
	// nsmState is the state number the status monitor answers: odd
	// (up), and never changing, as the gateway's locks never go away.
	nsmState = 1
)

// NLM4 statuses.
const (
	nlm4Granted      = 0
	nlm4Denied       = 1
	nlm4DeniedNoLock = 2
	nlm4Blocked      = 3
	nlm4StaleFH      = 7
	nlm4FBig         = 8
)

// LockKeyPrefix starts every lock record's key in the KV store.
const LockKeyPrefix = "\x00arbor/nfs/nlm/"

// LockStore keeps the lock records: one per file, its key a file's.
type LockStore interface {
	// Update replaces key's record (nil: none) with what f returns from
	// it (nil: delete), in one transaction; an error of f changes
	// nothing and is returned.
	Update(ctx context.Context, key []byte, f func(old []byte) ([]byte, error)) error
	// Scan calls f with every record.
	Scan(ctx context.Context, f func(key, value []byte) error) error
}

// nlmLock is one lock held: an owner's range.
type nlmLock struct {
	Host  string
	Owner []byte
	Svid  int32
	Excl  bool
	// Off and End (exclusive; math.MaxUint64: to the end of any file).
	Off, End uint64
}

func (l *nlmLock) sameOwner(o *nlmLock) bool {
	return l.Host == o.Host && l.Svid == o.Svid && bytes.Equal(l.Owner, o.Owner)
}

func (l *nlmLock) overlaps(o *nlmLock) bool { return l.Off < o.End && o.Off < l.End }

func (l *nlmLock) conflicts(o *nlmLock) bool {
	return !l.sameOwner(o) && l.overlaps(o) && (l.Excl || o.Excl)
}

// rangeEnd is the end of a range of length n at off (0: to the end).
func rangeEnd(off, n uint64) uint64 {
	if n == 0 || n > math.MaxUint64-off {
		return math.MaxUint64
	}
	return off + n
}

// cut returns locks without owner o's coverage of [o.Off, o.End).
func cut(locks []nlmLock, o *nlmLock) []nlmLock {
	out := make([]nlmLock, 0, len(locks)+1)
	for _, l := range locks {
		if !l.sameOwner(o) || !l.overlaps(o) {
			out = append(out, l)
			continue
		}
		if l.Off < o.Off {
			left := l
			left.End = o.Off
			out = append(out, left)
		}
		if l.End > o.End {
			right := l
			right.Off = o.End
			out = append(out, right)
		}
	}
	return out
}

// add returns locks with n added: n's owner's overlapping locks give way
// to it, and its ranges of n's kind that touch it merge with it.
func add(locks []nlmLock, n nlmLock) []nlmLock {
	locks = cut(locks, &n)
	out := locks[:0]
	for _, l := range locks {
		if l.sameOwner(&n) && l.Excl == n.Excl && l.Off <= n.End && n.Off <= l.End {
			n.Off, n.End = min(n.Off, l.Off), max(n.End, l.End)
			continue
		}
		out = append(out, l)
	}
	return append(out, n)
}

// Record encoding: version byte, then for each lock host, owner (both
// length-prefixed), svid, exclusive, offset, end.
const lockRecordVersion = 1

func encodeLocks(locks []nlmLock) []byte {
	if len(locks) == 0 {
		return nil
	}
	b := []byte{lockRecordVersion}
	for _, l := range locks {
		b = binary.BigEndian.AppendUint16(b, uint16(len(l.Host)))
		b = append(b, l.Host...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(l.Owner)))
		b = append(b, l.Owner...)
		b = binary.BigEndian.AppendUint32(b, uint32(l.Svid))
		if l.Excl {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.BigEndian.AppendUint64(b, l.Off)
		b = binary.BigEndian.AppendUint64(b, l.End)
	}
	return b
}

var errCorruptLocks = errors.New("nfs: lock record is corrupt")

func decodeLocks(b []byte) ([]nlmLock, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != lockRecordVersion {
		return nil, fmt.Errorf("%w: version %d", errCorruptLocks, b[0])
	}
	b = b[1:]
	var out []nlmLock
	str := func() ([]byte, bool) {
		if len(b) < 2 {
			return nil, false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return nil, false
		}
		s := b[2 : 2+n]
		b = b[2+n:]
		return s, true
	}
	for len(b) > 0 {
		host, ok1 := str()
		owner, ok2 := str()
		if !ok1 || !ok2 || len(b) < 4+1+16 {
			return nil, fmt.Errorf("%w: truncated", errCorruptLocks)
		}
		l := nlmLock{Host: string(host), Owner: append([]byte(nil), owner...),
			Svid: int32(binary.BigEndian.Uint32(b)), Excl: b[4] == 1,
			Off: binary.BigEndian.Uint64(b[5:]), End: binary.BigEndian.Uint64(b[13:])}
		if b[4] > 1 || l.Off >= l.End {
			return nil, fmt.Errorf("%w: bad lock", errCorruptLocks)
		}
		b = b[21:]
		out = append(out, l)
	}
	return out, nil
}

// lockKey is the key of file fh's record: the handle's file system,
// object, snapshot and generation.
func lockKey(fh FileHandle) []byte {
	b := []byte(LockKeyPrefix)
	for _, v := range []uint64{fh.F, fh.H.D, fh.H.C, fh.S, fh.Gen} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

// errNoLocks is what a record that would outgrow its value answers:
// NLM4_DENIED_NOLOCKS.
var errNoLocks = errors.New("nfs: too many locks on one file")

// Programs for NLM and NSM.
func (g *Gateway) lockPrograms() []sunrpc.Program {
	return []sunrpc.Program{
		{Prog: ProgNLM, Low: nlmV4, High: nlmV4, Serve: g.serveNLM},
		{Prog: ProgNSM, Low: nsmV1, High: nsmV1, Serve: g.serveNSM},
	}
}

// nlmArgs are the decoded arguments of TEST, LOCK, CANCEL and UNLOCK.
type nlmArgs struct {
	cookie []byte
	block  bool
	excl   bool
	fh     []byte
	lock   nlmLock
}

// readLock reads an nlm4_lock.
func readLock(r *xdr.Reader, a *nlmArgs) {
	a.lock.Host = r.String(lmMaxStr)
	a.fh = r.Opaque(maxHandleBytes)
	a.lock.Owner = r.Opaque(maxOwnerBytes)
	a.lock.Svid = r.Int32()
	off, n := r.Uint64(), r.Uint64()
	a.lock.Off, a.lock.End = off, rangeEnd(off, n)
	a.lock.Excl = a.excl
}

func (g *Gateway) serveNLM(ctx context.Context, c *sunrpc.Call, _ sunrpc.ConnInfo, w *xdr.Writer) sunrpc.AcceptStat {
	r := xdr.NewReader(c.Args)
	var a nlmArgs
	switch c.Proc {
	case nlmProcNull:
		return sunrpc.Success
	case nlmProcTest:
		a.cookie = r.Opaque(maxOwnerBytes)
		a.excl = r.Bool()
		readLock(r, &a)
	case nlmProcLock, nlmProcNMLock:
		a.cookie = r.Opaque(maxOwnerBytes)
		a.block = r.Bool()
		a.excl = r.Bool()
		readLock(r, &a)
		r.Bool()  // reclaim: an ordinary LOCK here
		r.Int32() // the client's NSM state
	case nlmProcCancel:
		a.cookie = r.Opaque(maxOwnerBytes)
		a.block = r.Bool()
		a.excl = r.Bool()
		readLock(r, &a)
	case nlmProcUnlock:
		a.cookie = r.Opaque(maxOwnerBytes)
		readLock(r, &a)
	case nlmProcFreeAll:
		host := r.String(lmMaxStr)
		r.Int32()
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		g.freeAll(ctx, host)
		return sunrpc.Success
	default:
		return sunrpc.ProcUnavail
	}
	if r.Err() != nil || r.Remaining() != 0 {
		return sunrpc.GarbageArgs
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.OpTimeout)
	defer cancel()
	st, holder := g.nlmCall(ctx, c.Proc, &a)
	w.Opaque(a.cookie)
	w.Uint32(st)
	if c.Proc == nlmProcTest && st == nlm4Denied {
		w.Bool(holder.Excl)
		w.Int32(holder.Svid)
		w.Opaque(holder.Owner)
		w.Uint64(holder.Off)
		if holder.End == math.MaxUint64 {
			w.Uint64(0)
		} else {
			w.Uint64(holder.End - holder.Off)
		}
	}
	return sunrpc.Success
}

// nlmCall runs TEST, LOCK, CANCEL or UNLOCK and returns the NLM4 status
// (and, for a TEST denied, the lock in the way).
func (g *Gateway) nlmCall(ctx context.Context, proc uint32, a *nlmArgs) (uint32, nlmLock) {
	if g.cfg.Locks == nil {
		return nlm4DeniedNoLock, nlmLock{}
	}
	if a.lock.Off >= a.lock.End {
		return nlm4FBig, nlmLock{}
	}
	s, fh, st := g.resolve(ctx, a.fh)
	switch st {
	case OK:
	case ErrStale:
		return g.nlmGone(ctx, proc, fh), nlmLock{}
	case ErrBadHandle:
		return nlm4StaleFH, nlmLock{}
	default:
		return nlm4DeniedNoLock, nlmLock{}
	}
	if proc == nlmProcCancel {
		// No waiters are queued: there is nothing to cancel.
		return nlm4Granted, nlmLock{}
	}
	if _, err := s.fsys.GetAttr(ctx, fh.H); err != nil {
		if fs.Errno(err) == syscall.ENOENT || statusOf(err) == ErrStale {
			return g.nlmGone(ctx, proc, fh), nlmLock{}
		}
		g.log.Warn("nlm: reading a locked file's attributes", "err", err)
		return nlm4DeniedNoLock, nlmLock{}
	}
	var (
		status = uint32(nlm4Granted)
		holder nlmLock
	)
	key := lockKey(fh)
	err := g.cfg.Locks.Update(ctx, key, func(old []byte) ([]byte, error) {
		status, holder = nlm4Granted, nlmLock{}
		locks, err := decodeLocks(old)
		if err != nil {
			return nil, err
		}
		if proc == nlmProcUnlock {
			return encodeLocks(cut(locks, &a.lock)), nil
		}
		for i := range locks {
			if locks[i].conflicts(&a.lock) {
				holder = locks[i]
				switch {
				case proc == nlmProcTest:
					status = nlm4Denied
				case a.block:
					status = nlm4Blocked
				default:
					status = nlm4Denied
				}
				return old, nil
			}
		}
		if proc == nlmProcTest {
			return old, nil
		}
		rec := encodeLocks(add(locks, a.lock))
		if len(rec) > maxLockRecordBytes {
			return nil, errNoLocks
		}
		return rec, nil
	})
	if err != nil {
		if !errors.Is(err, errNoLocks) {
			g.log.Warn("nlm: lock record", "proc", proc, "err", err)
		}
		return nlm4DeniedNoLock, nlmLock{}
	}
	return status, holder
}

// nlmGone answers a call on a file (or file system) that no longer
// exists. Its handle is stale, but an UNLOCK still succeeds and drops the
// file's record: a client unlocks after removing a file it held locked
// (close after unlink), and no later call can reach the record, since a
// new file never gets the removed one's handle (the generation differs).
func (g *Gateway) nlmGone(ctx context.Context, proc uint32, fh FileHandle) uint32 {
	if proc != nlmProcUnlock {
		return nlm4StaleFH
	}
	err := g.cfg.Locks.Update(ctx, lockKey(fh), func([]byte) ([]byte, error) { return nil, nil })
	if err != nil {
		g.log.Warn("nlm: dropping a removed file's locks", "err", err)
		return nlm4DeniedNoLock
	}
	return nlm4Granted
}

// maxLockRecordBytes keeps a file's record within one KV value (the
// tree's default value bound, 4 KiB): about a hundred locks with Linux's
// caller names and owners.
const maxLockRecordBytes = btree.DefaultMaxValueBytes

// freeAll drops every lock of caller name host (FREE_ALL, SM_NOTIFY: the
// client restarted and holds nothing any more).
func (g *Gateway) freeAll(ctx context.Context, host string) {
	if g.cfg.Locks == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.OpTimeout)
	defer cancel()
	var keys [][]byte
	err := g.cfg.Locks.Scan(ctx, func(k, v []byte) error {
		locks, err := decodeLocks(v)
		if err != nil {
			return nil
		}
		for _, l := range locks {
			if l.Host == host {
				keys = append(keys, append([]byte(nil), k...))
				break
			}
		}
		return nil
	})
	if err != nil {
		g.log.Warn("nlm: freeing a client's locks", "host", host, "err", err)
		return
	}
	for _, k := range keys {
		err := g.cfg.Locks.Update(ctx, k, func(old []byte) ([]byte, error) {
			locks, err := decodeLocks(old)
			if err != nil {
				return nil, err
			}
			kept := locks[:0]
			for _, l := range locks {
				if l.Host != host {
					kept = append(kept, l)
				}
			}
			return encodeLocks(kept), nil
		})
		if err != nil {
			g.log.Warn("nlm: freeing a client's locks", "host", host, "err", err)
		}
	}
}

// serveNSM answers the status monitor's calls a client makes of a server.
func (g *Gateway) serveNSM(ctx context.Context, c *sunrpc.Call, _ sunrpc.ConnInfo, w *xdr.Writer) sunrpc.AcceptStat {
	r := xdr.NewReader(c.Args)
	switch c.Proc {
	case nsmProcNull, nsmProcSimu:
		return sunrpc.Success
	case nsmProcStat: // sm_name → sm_stat_res
		r.String(lmMaxStr)
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		w.Uint32(0) // stat_succ
		w.Int32(nsmState)
	case nsmProcMon: // mon → sm_stat_res
		r.String(lmMaxStr)
		r.String(lmMaxStr)
		r.Int32()
		r.Int32()
		r.Int32()
		r.Fixed(16)
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		w.Uint32(0)
		w.Int32(nsmState)
	case nsmProcUnmon: // mon_id → sm_stat
		r.String(lmMaxStr)
		r.String(lmMaxStr)
		r.Int32()
		r.Int32()
		r.Int32()
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		w.Int32(nsmState)
	case nsmProcUnmonAl: // my_id → sm_stat
		r.String(lmMaxStr)
		r.Int32()
		r.Int32()
		r.Int32()
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		w.Int32(nsmState)
	case nsmProcNotify: // stat_chge: the client restarted
		host := r.String(lmMaxStr)
		r.Int32()
		if r.Err() != nil || r.Remaining() != 0 {
			return sunrpc.GarbageArgs
		}
		g.freeAll(ctx, host)
	default:
		return sunrpc.ProcUnavail
	}
	return sunrpc.Success
}

// MemLocks is a LockStore in memory: one gateway's, for tests and a
// gateway run without the cluster's KV store.
type MemLocks struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemLocks returns an empty store.
func NewMemLocks() *MemLocks { return &MemLocks{m: map[string][]byte{}} }

// Update implements LockStore.
func (s *MemLocks) Update(_ context.Context, key []byte, f func(old []byte) ([]byte, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := f(s.m[string(key)])
	if err != nil {
		return err
	}
	if v == nil {
		delete(s.m, string(key))
	} else {
		s.m[string(key)] = append([]byte(nil), v...)
	}
	return nil
}

// Scan implements LockStore.
func (s *MemLocks) Scan(_ context.Context, f func(key, value []byte) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if err := f([]byte(k), v); err != nil {
			return err
		}
	}
	return nil
}

// KVLocks is a LockStore in the cluster's KV store (internal/kv), which
// every gateway reaches. Open opens the tree on first use.
type KVLocks struct {
	Open func(ctx context.Context) (*btree.Tree, error)
}

// Update implements LockStore: one transaction reads and replaces the
// record (the tree retries it on a conflict).
func (s KVLocks) Update(ctx context.Context, key []byte, f func(old []byte) ([]byte, error)) error {
	t, err := s.Open(ctx)
	if err != nil {
		return err
	}
	return t.Update(ctx, func(tx *btree.Txn) error {
		v, ok, err := tx.Get(key)
		if err != nil {
			return err
		}
		var old []byte
		if ok {
			old = append([]byte(nil), v...)
		}
		nv, err := f(old)
		if err != nil {
			return err
		}
		if nv == nil {
			if ok {
				return tx.Delete(key)
			}
			return nil
		}
		if bytes.Equal(nv, old) {
			return nil
		}
		return tx.Put(key, nv)
	})
}

// Scan implements LockStore.
func (s KVLocks) Scan(ctx context.Context, f func(key, value []byte) error) error {
	t, err := s.Open(ctx)
	if err != nil {
		return err
	}
	from := []byte(LockKeyPrefix)
	to := []byte(LockKeyPrefix[:len(LockKeyPrefix)-1] + "0") // '/'+1
	return t.Scan(ctx, from, to, f)
}
