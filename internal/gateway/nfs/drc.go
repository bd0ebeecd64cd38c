package nfs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// The duplicate-request cache (FSS §8: idempotency tokens live in the
// store, not in a presentation server). NFS over TCP still retransmits:
// after a reconnect, and to another gateway when the first died. A call
// that is not idempotent (GUARDED CREATE, MKDIR, SYMLINK, MKNOD, REMOVE,
// RMDIR, RENAME, LINK, guarded SETATTR: needsRecord) is keyed by a digest of (client host, AUTH_SYS
// machine name and ids, program, version, procedure, xid, arguments) and
// goes through a record in a ReplyStore shared by every gateway (the
// cluster's KV store, under ReplyKeyPrefix):
//
//  1. A record "done" holds the reply: it is sent again, and the call is
//     not run.
//  2. Otherwise a record "started" is written first (in the transaction
//     that read the key: one commit), then the call runs and is answered,
//     then "done" with its reply replaces it (after the reply: a
//     retransmission that comes first finds "started", which is safe).
//  3. A call that finds "started" was begun by a gateway that died (or is
//     still at it): it may or may not have been applied. It runs in retry
//     mode, where the answer that means "already done" is success: EXIST
//     for what it creates (the existing object is answered), NOENT for
//     what it removes, a SETATTR guard that no longer matches. This is
//     the one place the rule is not exact: an object made or removed by
//     someone else between the two attempts is taken for the first
//     attempt's.
//
// A store that does not answer fails the call with NFS3ERR_JUKEBOX (the
// client retries later) rather than running it unprotected. Records older
// than replyTTL are swept by every gateway: NFS clients give up on a call
// long before (60 s).

// ReplyStore keeps the duplicate-request cache's records. Values are at
// most maxReplyRecordBytes.
type ReplyStore interface {
	// Begin returns key's record if it has one; else it writes started
	// as key's record, in the same transaction.
	Begin(ctx context.Context, key, started []byte) (old []byte, found bool, err error)
	Put(ctx context.Context, key, value []byte) error
	// Sweep deletes records whose time (the 8 bytes after the state) is
	// before cutoff.
	Sweep(ctx context.Context, cutoff time.Time) error
}

// ReplyKeyPrefix starts every record's key in the KV store.
const ReplyKeyPrefix = "\x00arbor/nfs/drc/"

// Record states and bounds.
const (
	replyStarted = 1
	replyDone    = 2
	replyTTL     = 2 * time.Minute
	// maxReplyRecordBytes keeps a record within one KV value; a larger
	// reply (none of the procedures here makes one) is not kept.
	maxReplyRecordBytes = 3 << 10
	sweepEvery          = 30 * time.Second
)

// nonIdempotent are the procedures the cache protects.
var nonIdempotent = [...]bool{
	ProcSetAttr: true, ProcCreate: true, ProcMkdir: true, ProcSymlink: true, ProcMknod: true,
	ProcRemove: true, ProcRmdir: true, ProcRename: true, ProcLink: true, ProcCommit: false,
}

// needsRecord reports whether call c goes through the cache: the
// procedures above, but an UNCHECKED or EXCLUSIVE CREATE (run again, one
// answers the existing file; the other finds its verifier) and a SETATTR
// without a guard (setting the same attributes twice is setting them
// once), which are safe to run twice. Linux's client creates with those
// two modes.
func needsRecord(c *sunrpc.Call) bool {
	if c.Proc >= uint32(len(nonIdempotent)) || !nonIdempotent[c.Proc] {
		return false
	}
	r := xdr.NewReader(c.Args)
	switch c.Proc {
	case ProcCreate:
		r.Opaque(maxHandleBytes)
		r.String(4 * fs.MaxNameBytes)
		how := r.Uint32()
		return r.Err() != nil || how == createGuarded
	case ProcSetAttr:
		r.Opaque(maxHandleBytes)
		getSattr(r)
		guard := r.Bool()
		return r.Err() != nil || guard
	}
	return true
}

// replyKey is the key of call c from a client at remote.
func replyKey(c *sunrpc.Call, remote net.Addr) []byte {
	h := sha256.New()
	host := ""
	if remote != nil {
		host, _, _ = net.SplitHostPort(remote.String())
	}
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(len(host)))
	b = append(b, host...)
	if c.Sys != nil {
		b = binary.BigEndian.AppendUint32(b, uint32(len(c.Sys.MachineName)))
		b = append(b, c.Sys.MachineName...)
		b = binary.BigEndian.AppendUint32(b, c.Sys.Uid)
		b = binary.BigEndian.AppendUint32(b, c.Sys.Gid)
	}
	for _, v := range []uint32{c.Prog, c.Vers, c.Proc, c.Xid} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	h.Write(b)
	h.Write(c.Args)
	return h.Sum([]byte(ReplyKeyPrefix))
}

func encodeRecord(state byte, at time.Time, reply []byte) []byte {
	b := append([]byte{state}, binary.BigEndian.AppendUint64(nil, uint64(at.UnixMilli()))...)
	return append(b, reply...)
}

func decodeRecord(v []byte) (state byte, at time.Time, reply []byte, err error) {
	if len(v) < 9 || (v[0] != replyStarted && v[0] != replyDone) {
		return 0, time.Time{}, nil, fmt.Errorf("nfs: duplicate-request record of %d bytes is corrupt", len(v))
	}
	return v[0], time.UnixMilli(int64(binary.BigEndian.Uint64(v[1:9]))), v[9:], nil
}

// MemReplies is a ReplyStore in memory: one gateway's, for tests and a
// gateway run without the cluster's KV store.
type MemReplies struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemReplies returns an empty store.
func NewMemReplies() *MemReplies { return &MemReplies{m: map[string][]byte{}} }

// Begin implements ReplyStore.
func (s *MemReplies) Begin(_ context.Context, key, started []byte) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[string(key)]; ok {
		return v, true, nil
	}
	s.m[string(key)] = append([]byte(nil), started...)
	return nil, false, nil
}

// Put implements ReplyStore.
func (s *MemReplies) Put(_ context.Context, key, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[string(key)] = append([]byte(nil), value...)
	return nil
}

// Sweep implements ReplyStore.
func (s *MemReplies) Sweep(_ context.Context, cutoff time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if _, at, _, err := decodeRecord(v); err != nil || at.Before(cutoff) {
			delete(s.m, k)
		}
	}
	return nil
}

// KVReplies is a ReplyStore in the cluster's KV store (internal/kv), which
// every gateway reaches: a call retried at another gateway finds the
// record the first one wrote. Open opens the tree on first use (the
// cluster's storage may not be up when a gateway starts).
//
// Concurrent Begins and Puts are committed in groups: each waits in a
// queue, and one transaction takes up to maxReplyBatch of them (every
// record is a key of its own, so a group touches one value each). With
// sixteen clients creating at once, one commit a call made the cache
// cost more than the create itself (BENCHMARKS.md, "NFS gateway"); a
// group pays one commit for all. A caller whose context ends stops
// waiting; its record may still be written, which a retransmission reads
// as a call begun and not finished (retry mode): safe.
type KVReplies struct {
	Open func(ctx context.Context) (*btree.Tree, error)

	mu sync.Mutex
	// begins and puts wait for a group: Begins first, as their calls
	// wait for them (a Put comes after its call's reply).
	begins, puts []*replyOp
	// leaders is how many goroutines commit groups (at most
	// maxReplyLeaders).
	leaders int
	// groups counts the group commits made.
	groups atomic.Int64
}

// replyOp is one Begin or Put waiting for its group's commit.
type replyOp struct {
	begin      bool
	key, value []byte
	// Results, set before done is closed.
	old   []byte
	found bool
	err   error
	done  chan struct{}
}

const (
	// maxSweepKeys bounds the records one sweep deletes.
	maxSweepKeys = 4096
	// maxReplyBatch bounds the records of one group commit, within a
	// transaction's MaxTxnValues.
	maxReplyBatch = btree.MaxTxnValues - 1
	// maxReplyLeaders bounds the group commits in flight.
	maxReplyLeaders = 2
	// replyBatchTimeout bounds one group's commit (its callers have
	// their own deadlines).
	replyBatchTimeout = 30 * time.Second
)

// Begin implements ReplyStore: a transaction reads the key and, if it is
// missing, writes started.
func (s *KVReplies) Begin(ctx context.Context, key, started []byte) (old []byte, found bool, err error) {
	op := &replyOp{begin: true, key: key, value: started, done: make(chan struct{})}
	if err := s.run(ctx, op); err != nil {
		return nil, false, err
	}
	return op.old, op.found, nil
}

// Put implements ReplyStore.
func (s *KVReplies) Put(ctx context.Context, key, value []byte) error {
	return s.run(ctx, &replyOp{key: key, value: value, done: make(chan struct{})})
}

// run queues op for a group commit and waits for it.
func (s *KVReplies) run(ctx context.Context, op *replyOp) error {
	s.mu.Lock()
	if op.begin {
		s.begins = append(s.begins, op)
	} else {
		s.puts = append(s.puts, op)
	}
	if s.leaders < maxReplyLeaders {
		s.leaders++
		go s.lead(context.WithoutCancel(ctx))
	}
	s.mu.Unlock()
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lead commits the queued operations in groups until none wait.
func (s *KVReplies) lead(ctx context.Context) {
	for {
		s.mu.Lock()
		if len(s.begins)+len(s.puts) == 0 {
			s.leaders--
			s.mu.Unlock()
			return
		}
		n := min(len(s.begins), maxReplyBatch)
		batch := append([]*replyOp(nil), s.begins[:n]...)
		s.begins = s.begins[n:]
		m := min(len(s.puts), maxReplyBatch-n)
		batch = append(batch, s.puts[:m]...)
		s.puts = s.puts[m:]
		s.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, replyBatchTimeout)
		s.groups.Add(1)
		err := s.commit(cctx, batch)
		if err != nil && len(batch) > 1 {
			// One operation may have failed the group (its key, a
			// transaction bound): each goes alone.
			for _, op := range batch {
				octx, ocancel := context.WithTimeout(ctx, replyBatchTimeout)
				op.err = s.commit(octx, []*replyOp{op})
				ocancel()
			}
		} else {
			for _, op := range batch {
				op.err = err
			}
		}
		cancel()
		for _, op := range batch {
			close(op.done)
		}
	}
}

// commit runs ops in one transaction.
func (s *KVReplies) commit(ctx context.Context, ops []*replyOp) error {
	t, err := s.Open(ctx)
	if err != nil {
		return err
	}
	return t.Update(ctx, func(tx *btree.Txn) error {
		for _, op := range ops {
			if !op.begin {
				if err := tx.Put(op.key, op.value); err != nil {
					return err
				}
				continue
			}
			v, ok, err := tx.Get(op.key)
			if err != nil {
				return err
			}
			if ok {
				op.old, op.found = append([]byte(nil), v...), true
				continue
			}
			op.old, op.found = nil, false
			if err := tx.Put(op.key, op.value); err != nil {
				return err
			}
		}
		return nil
	})
}

// Sweep implements ReplyStore.
func (s *KVReplies) Sweep(ctx context.Context, cutoff time.Time) error {
	t, err := s.Open(ctx)
	if err != nil {
		return err
	}
	from := []byte(ReplyKeyPrefix)
	to := []byte(ReplyKeyPrefix[:len(ReplyKeyPrefix)-1] + "0") // '/'+1
	var old [][]byte
	errEnough := errors.New("enough")
	err = t.Scan(ctx, from, to, func(k, v []byte) error {
		if _, at, _, err := decodeRecord(v); err != nil || at.Before(cutoff) {
			old = append(old, append([]byte(nil), k...))
		}
		if len(old) >= maxSweepKeys {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return err
	}
	for len(old) > 0 {
		n := min(len(old), btree.MaxTxnValues-1)
		batch := old[:n]
		old = old[n:]
		if err := t.Update(ctx, func(tx *btree.Txn) error {
			for _, k := range batch {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}
