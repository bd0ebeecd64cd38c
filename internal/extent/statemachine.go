package extent

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Transaction and housekeeping limits.
const (
	// maxTxnLifetime bounds how far in the future a transaction's expiry
	// may lie (beyond maxClockSkew): a prepared record left by a crashed
	// coordinator is resolved by background recovery at most this long
	// after it was made.
	maxTxnLifetime = 30 * time.Second
	// maxClockSkew is the clock difference between a coordinator and an
	// extent leader that expiry checks tolerate.
	maxClockSkew = 5 * time.Second
	// tombstoneRetention is how long after its expiry a COMMITTED or
	// ABORTED tombstone is kept. After expiry no extent prepares the
	// transaction any more, so the tombstone is only needed by recovery
	// walks in flight; this is generous.
	tombstoneRetention = 30 * time.Second
	// maxGCPerCommand bounds the tombstones one command deletes.
	maxGCPerCommand = 16
	// maxReadAttempts bounds the optimistic retries of a local read that
	// races with applies (see view).
	maxReadAttempts = 1000
	// maxFreeBlockProbes bounds the blocks a FreeBlocks call looks at.
	maxFreeBlockProbes = 4096
	// maxFreeBlocksListed bounds one FreeBlocks answer.
	maxFreeBlocksListed = 1024
	// maxPendingListed bounds the transactions Info lists.
	maxPendingListed = 100
)

// StateMachine is one replica of an extent (FSS §3, §6): the raftengine
// state machine of an extent group. All its state lives in the group's key
// space (keys.go); it keeps no copy of it in memory, only the Reader the
// engine gave it at Load, through which it serves linearizable reads once
// the engine's ReadIndex has returned (see view).
type StateMachine struct {
	id  uint64
	geo Geometry

	mu sync.RWMutex
	r  raftengine.Reader

	stats smStats
}

// Stats counts the commands a replica applied, by kind. Only commands that
// changed state count: a repeated or refused step does not.
type Stats struct {
	Commits, Prepares, PrepareDecides, DecideReleases, Releases, Aborts, Fences uint64
	// Refused counts commands that changed nothing because a condition
	// failed or the input was bad.
	Refused uint64
	// Repeats counts commands not applied because the extent remembered
	// their request id: the first reply was returned (replies.go).
	Repeats uint64
	// DeltaMismatches counts page deltas that did not rebuild the page
	// they promised (their command was refused, CODE_DELTA_MISMATCH).
	DeltaMismatches uint64
}

// TxnTransitions is the number of cross-extent state transitions of the
// two-phase commit (prepare, prepare-and-decide, decide-and-release,
// release).
func (s Stats) TxnTransitions() uint64 {
	return s.Prepares + s.PrepareDecides + s.DecideReleases + s.Releases
}

type smStats struct {
	commits, prepares, prepareDecides, decideReleases, releases, aborts, fences, refused, repeats atomic.Uint64
	deltaMismatches                                                                               atomic.Uint64
}

// NewStateMachine is the raftengine.Factory of extent groups.
func NewStateMachine(desc raftengine.GroupDescriptor) (raftengine.StateMachine, error) {
	g, err := geometryOfDescriptor(desc)
	if err != nil {
		return nil, err
	}
	return &StateMachine{id: desc.GroupID, geo: g}, nil
}

// ID returns the extent id.
func (sm *StateMachine) ID() uint64 { return sm.id }

// Geometry returns the extent's geometry.
func (sm *StateMachine) Geometry() Geometry { return sm.geo }

// Stats returns the replica's command counters.
func (sm *StateMachine) Stats() Stats {
	s := &sm.stats
	return Stats{
		Commits: s.commits.Load(), Prepares: s.prepares.Load(), PrepareDecides: s.prepareDecides.Load(),
		DecideReleases: s.decideReleases.Load(), Releases: s.releases.Load(), Aborts: s.aborts.Load(),
		Fences: s.fences.Load(), Refused: s.refused.Load(), Repeats: s.repeats.Load(),
		DeltaMismatches: s.deltaMismatches.Load(),
	}
}

// Load keeps r for reads. Nothing is cached: the key space is the state.
// The engine's Reader reads the live database (not a point-in-time copy),
// which is what lets reads see applies after Load; view makes each read
// consistent.
func (sm *StateMachine) Load(r raftengine.Reader) error {
	if _, err := loadMeta(r); err != nil {
		return err
	}
	sm.mu.Lock()
	sm.r = r
	sm.mu.Unlock()
	return nil
}

func (sm *StateMachine) reader() raftengine.Reader {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.r
}

// pointInTime is a Reader that can also read one consistent state
// (raftengine's reader over pebble: an iterator's view).
type pointInTime interface {
	View(fn func(r raftengine.Reader) error) error
}

// view runs fn against a consistent state of the replica: one that some
// applied index produced in full. Applies commit to the database after
// Apply returns, in batches, while reads run concurrently. A reader with
// point-in-time views gives one at once. Otherwise: every batch that
// changes anything rewrites Meta (whose applied index makes it unique),
// and batches become visible atomically and in order, so if Meta reads the
// same before and after fn, no batch landed in between and fn saw one
// state. fn may run several times; it must only read.
func (sm *StateMachine) view(fn func(r raftengine.Reader) error) error {
	r := sm.reader()
	if r == nil {
		return errNoReader
	}
	if pit, ok := r.(pointInTime); ok {
		return pit.View(fn)
	}
	for attempt := range maxReadAttempts {
		before, err := getOptional(r, keyMeta)
		if err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
		after, err := getOptional(r, keyMeta)
		if err != nil {
			return err
		}
		if bytes.Equal(before, after) {
			return nil
		}
		if attempt%8 == 7 {
			time.Sleep(50 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
	return fmt.Errorf("extent %d: no consistent read after %d attempts", sm.id, maxReadAttempts)
}

func getOptional(r raftengine.Reader, key []byte) ([]byte, error) {
	v, err := r.Get(key)
	if errors.Is(err, raftengine.ErrNotFound) {
		return nil, nil
	}
	return v, err
}

func loadMeta(r raftengine.Reader) (*pb.Meta, error) {
	v, err := getOptional(r, keyMeta)
	if err != nil || v == nil {
		return &pb.Meta{}, err
	}
	var m pb.Meta
	if err := proto.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("%w: meta: %v", errCorrupt, err)
	}
	return &m, nil
}

func getBlock(r raftengine.Reader, b uint64) (blockRec, error) {
	v, err := getOptional(r, blockKey(b))
	if err != nil || v == nil {
		return blockRec{}, err
	}
	return decodeBlockRec(v)
}

// getHolder returns the transaction holding key (a page or block lock), or
// 0.
func getHolder(r raftengine.Reader, key []byte) (uint64, error) {
	v, err := getOptional(r, key)
	if err != nil || v == nil {
		return 0, err
	}
	return decodeTxnID(v)
}

func getRecord(r raftengine.Reader, id uint64) (*pb.TxnRecord, error) {
	v, err := getOptional(r, txnKey(id))
	if err != nil || v == nil {
		return nil, err
	}
	return DecodeTxnRecord(v)
}

// firstHeldPage returns the transaction holding any page of block b, or 0.
func (sm *StateMachine) firstHeldPage(r raftengine.Reader, b uint64) (uint64, error) {
	first := sm.geo.FirstPage(b)
	var holder uint64
	errFound := errors.New("found")
	err := r.Scan(pageLockKey(first), pageLockKey(first+sm.geo.PagesPerBlock()), func(_, v []byte) error {
		id, err := decodeTxnID(v)
		if err != nil || id == 0 {
			return err // a released lock
		}
		holder = id
		return errFound
	})
	if err != nil && !errors.Is(err, errFound) {
		return 0, err
	}
	return holder, nil
}

// holderResult is the refusal of an access to something a prepared
// transaction holds.
func (sm *StateMachine) holderResult(r raftengine.Reader, id uint64, what string) (*pb.CommandResult, error) {
	rec, err := getRecord(r, id)
	if err != nil {
		return nil, err
	}
	holder := &pb.TxnRecord{TxnId: id, ExtentId: sm.id, State: pb.TxnState_TXN_STATE_PREPARED}
	if rec != nil {
		holder = summary(rec)
	}
	return &pb.CommandResult{
		Code:    pb.Code_CODE_PREPARED,
		Message: fmt.Sprintf("%s is held by prepared transaction %016x", what, id),
		Holder:  holder,
	}, nil
}

// summary is a record without its part (elements, reservations): what
// replies carry.
func summary(rec *pb.TxnRecord) *pb.TxnRecord {
	return &pb.TxnRecord{
		TxnId: rec.TxnId, ExtentId: rec.ExtentId, PrevExtent: rec.PrevExtent, NextExtent: rec.NextExtent,
		State: rec.State, ExpiryUnixMs: rec.ExpiryUnixMs,
	}
}

// checkPagePointer validates p against this extent's geometry.
func (sm *StateMachine) checkPagePointer(p Pointer) *pb.CommandResult {
	if p.Extent != sm.id {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "pointer %v is for extent %d, not %d", p, p.Extent, sm.id)
	}
	if p.Page >= sm.geo.Pages() {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "page %d does not exist: extent %d has %d pages", p.Page, sm.id, sm.geo.Pages())
	}
	return nil
}

// ReadPage reads page p: its data and slot, after checking p's ownership
// tag against its block, atomically with the read (FSS §3). It is
// linearizable when called on the leader after ReadIndex. A refusal
// (invalid pointer, stale ownership, prepared page) is returned as a
// result, an I/O failure as an error.
func (sm *StateMachine) ReadPage(p Pointer) (Page, *pb.CommandResult, error) {
	if res := sm.checkPagePointer(p); res != nil {
		return Page{}, res, nil
	}
	var page Page
	var refused *pb.CommandResult
	b := sm.geo.BlockOf(p.Page)
	err := sm.view(func(r raftengine.Reader) error {
		page, refused = Page{}, nil
		blk, err := getBlock(r, b)
		if err != nil {
			return err
		}
		if !blk.owns(p) {
			refused = staleResult(p, blk)
			return nil
		}
		for _, key := range [][]byte{blockLockKey(b), pageLockKey(p.Page)} {
			holder, err := getHolder(r, key)
			if err != nil {
				return err
			}
			if holder != 0 {
				refused, err = sm.holderResult(r, holder, fmt.Sprintf("page %d", p.Page))
				return err
			}
		}
		v, err := getOptional(r, pageKey(p.Page))
		if err != nil || v == nil {
			return err
		}
		slot, data, err := decodePage(v)
		if err != nil {
			return err
		}
		page = Page{Data: bytes.Clone(data), Slot: slot}
		return nil
	})
	return page, refused, err
}

// Check answers whether every page elems check is still at its slot,
// owned as the pointer says and locked by no prepared transaction: a
// read-only transaction's validation, by the same rules as an MPSC's
// checks but read (from one consistent state) instead of applied. It is
// linearizable when called on the leader after ReadIndex. The refusal, if
// any, is returned as a result; only check elements are allowed.
func (sm *StateMachine) Check(elems []*pb.Element) (*pb.CommandResult, error) {
	for i, e := range elems {
		if _, ok := e.GetOp().(*pb.Element_Check); !ok {
			return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: a check may hold only checks", i), nil
		}
	}
	var refused *pb.CommandResult
	err := sm.view(func(r raftengine.Reader) error {
		meta, err := loadMeta(r)
		if err != nil {
			return err
		}
		a := &applier{sm: sm, geo: sm.geo, w: readOnlyWriter{r}, meta: meta}
		if refused = a.validate(elems); refused != nil {
			return nil
		}
		_, _, _, refused, err = a.plan(elems)
		return err
	})
	if err != nil || refused != nil {
		return refused, err
	}
	return &pb.CommandResult{Code: pb.Code_CODE_OK}, nil
}

// readOnlyWriter lets the applier's checks run over a Reader; planning
// checks writes nothing.
type readOnlyWriter struct{ raftengine.Reader }

var errReadOnly = errors.New("extent: write during a read-only check")

func (readOnlyWriter) Set(_, _ []byte) error         { return errReadOnly }
func (readOnlyWriter) Delete(_ []byte) error         { return errReadOnly }
func (readOnlyWriter) DeleteRange(_, _ []byte) error { return errReadOnly }

func staleResult(p Pointer, blk blockRec) *pb.CommandResult {
	if !blk.allocated {
		return refusal(pb.Code_CODE_STALE, "pointer %v: block is not allocated (generation %d)", p, blk.generation)
	}
	return refusal(pb.Code_CODE_STALE, "pointer %v: block is generation %d, tenant %d, read-only %v", p, blk.generation, blk.tenant, blk.readOnly)
}

// QueryTxn returns this extent's record of transaction id (state NONE if
// there is none).
func (sm *StateMachine) QueryTxn(id uint64) (*pb.TxnRecord, error) {
	var out *pb.TxnRecord
	err := sm.view(func(r raftengine.Reader) error {
		rec, err := getRecord(r, id)
		out = rec
		return err
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return &pb.TxnRecord{TxnId: id, ExtentId: sm.id}, nil
	}
	return summary(out), nil
}

// record returns this replica's whole record of transaction id, its part
// included (nil if there is none): what the server checks a tenant's
// steps and answers against (tenancy.go). Replies carry summaries only.
func (sm *StateMachine) record(id uint64) (*pb.TxnRecord, error) {
	var out *pb.TxnRecord
	err := sm.view(func(r raftengine.Reader) error {
		rec, err := getRecord(r, id)
		out = rec
		return err
	})
	return out, err
}

// FreeBlocks lists up to limit free blocks, those nearest to the block of
// nearPage first (ties: lower first), probing at most maxFreeBlockProbes
// blocks. A block held by a prepared allocation is not free.
func (sm *StateMachine) FreeBlocks(nearPage uint64, limit int) ([]FreeBlock, error) {
	limit = min(max(limit, 1), maxFreeBlocksListed)
	blocks := sm.geo.Blocks()
	near := min(sm.geo.BlockOf(nearPage), blocks-1)
	var out []FreeBlock
	err := sm.view(func(r raftengine.Reader) error {
		out = out[:0]
		probe := func(b uint64) error {
			blk, err := getBlock(r, b)
			if err != nil || blk.allocated {
				return err
			}
			holder, err := getHolder(r, blockLockKey(b))
			if err != nil || holder != 0 {
				return err
			}
			out = append(out, FreeBlock{Extent: sm.id, Page: sm.geo.FirstPage(b), Generation: blk.generation})
			return nil
		}
		for d := uint64(0); d < blocks && len(out) < limit && 2*d < maxFreeBlockProbes; d++ {
			if d <= near {
				if err := probe(near - d); err != nil {
					return err
				}
			}
			if d > 0 && near+d < blocks && len(out) < limit {
				if err := probe(near + d); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return out, err
}

// Info returns the extent's bookkeeping and up to maxPendingListed of its
// PREPARED or DECIDED transactions.
func (sm *StateMachine) Info() (*pb.Meta, []*pb.TxnRecord, error) {
	var meta *pb.Meta
	var pending []*pb.TxnRecord
	err := sm.view(func(r raftengine.Reader) error {
		var err error
		if meta, err = loadMeta(r); err != nil {
			return err
		}
		pending, err = scanPending(r, func(*pb.TxnRecord) bool { return true }, maxPendingListed)
		return err
	})
	return meta, pending, err
}

// Stale returns up to limit PREPARED or DECIDED transactions whose expiry
// is before beforeUnixMs: their coordinator is gone, recovery must resolve
// them.
func (sm *StateMachine) Stale(beforeUnixMs int64, limit int) ([]*pb.TxnRecord, error) {
	var out []*pb.TxnRecord
	err := sm.view(func(r raftengine.Reader) error {
		var err error
		out, err = scanPending(r, func(rec *pb.TxnRecord) bool { return rec.ExpiryUnixMs < beforeUnixMs }, limit)
		return err
	})
	return out, err
}

func scanPending(r raftengine.Reader, keep func(*pb.TxnRecord) bool, limit int) ([]*pb.TxnRecord, error) {
	var out []*pb.TxnRecord
	errEnough := errors.New("enough")
	err := r.Scan([]byte{prefixTxn}, []byte{prefixTxn + 1}, func(_, v []byte) error {
		rec, err := DecodeTxnRecord(v)
		if err != nil {
			return err
		}
		if (rec.State == pb.TxnState_TXN_STATE_PREPARED || rec.State == pb.TxnState_TXN_STATE_DECIDED) && keep(rec) {
			out = append(out, summary(rec))
			if len(out) >= limit {
				return errEnough
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, err
	}
	return out, nil
}

func refusal(code pb.Code, format string, args ...any) *pb.CommandResult {
	return &pb.CommandResult{Code: code, Message: fmt.Sprintf(format, args...)}
}
