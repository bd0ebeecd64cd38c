package btree

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// MemStore is the in-memory twin of the extent store behind PageStore
// (STYLE.md §2): extents of pages grouped in blocks, each page with a slot
// and each block with ownership, committed by multi-page store-conditional.
// It is faithful where the B-tree depends on it:
//
//   - slots: every commit to an extent takes the next slot number of that
//     extent (as a Raft index would) and stamps it on every page it writes;
//   - ownership: every Read and every op checks the block's generation and
//     tenant, and an unallocated block fails as stale;
//   - atomicity: a commit validates everything before changing anything;
//   - the 15-op bound and the page size are enforced;
//   - cross-extent commits can be left prepared (FSS §6): an injected crash
//     leaves a prefix of the extents, in extent order, holding their part of
//     the transaction; if the crash came after the last extent decided, the
//     transaction committed there and Resolve rolls the rest forward,
//     otherwise Resolve rolls the prefix back. Until then every access to a
//     held page fails with a *PreparedError;
//   - faults, drawn from a seeded generator: unavailable reads and commits,
//     ambiguous commits (applied or not, then an error), and outages of a
//     whole extent (a killed leader).
//
// It is safe for concurrent use.
type MemStore struct {
	mu      sync.Mutex
	extents map[uint64]*memExtent
	faults  MemFaults
	rng     *rand.Rand
	nextTxn uint64
	txns    map[uint64]*memTxn
	stats   MemStoreStats
}

// MemFaults are MemStore's injected failures; probabilities are in [0, 1].
type MemFaults struct {
	// ReadUnavailable fails a Read (or FreeBlocks) with ErrUnavailable.
	ReadUnavailable float64
	// CommitUnavailable fails a Commit with ErrUnavailable, unapplied.
	CommitUnavailable float64
	// CommitAmbiguous returns ErrAmbiguous from a Commit, which was applied
	// half of the time.
	CommitAmbiguous float64
	// PreparedCrash stops a cross-extent commit part way, leaving prepared
	// pages (see the type doc), and returns ErrAmbiguous.
	PreparedCrash float64
	// MaxDelay delays each call by a random duration up to it.
	MaxDelay time.Duration
}

// MemStoreStats counts what a MemStore did.
type MemStoreStats struct {
	Reads, Commits, FailedCommits, CrossExtentCommits, Resolves int64
}

type memExtent struct {
	id       uint64
	geom     Geometry
	slot     uint64 // last slot used
	blocks   []memBlock
	pages    map[uint64]*memPage
	down     bool
	prepared map[uint64]uint64 // page -> txn id holding it
}

type memBlock struct {
	allocated  bool
	generation uint64
	tenant     uint64
}

type memPage struct {
	data []byte
	slot uint64
}

// memTxn is a cross-extent transaction left prepared by a crash.
type memTxn struct {
	decided bool
	// pending are the ops of the extents still holding the transaction.
	pending map[uint64][]Op
}

// NewMemStore returns an empty store whose faults draw from seed.
func NewMemStore(seed uint64) *MemStore {
	return &MemStore{
		extents: map[uint64]*memExtent{},
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		txns:    map[uint64]*memTxn{},
		nextTxn: 1,
	}
}

// AddExtent creates extent id with geometry g, all blocks free.
func (s *MemStore) AddExtent(id uint64, g Geometry) error {
	if g.PageBytes <= 0 || g.PagesPerBlock <= 0 || g.Blocks <= 0 {
		return fmt.Errorf("memstore: bad geometry %+v", g)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.extents[id]; ok {
		return fmt.Errorf("memstore: extent %d exists", id)
	}
	s.extents[id] = &memExtent{
		id: id, geom: g,
		blocks:   make([]memBlock, g.Blocks),
		pages:    map[uint64]*memPage{},
		prepared: map[uint64]uint64{},
	}
	return nil
}

// SetFaults replaces the injected faults.
func (s *MemStore) SetFaults(f MemFaults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// SetDown starts (down) or ends an outage of an extent: every call that
// touches it fails with ErrUnavailable, as while its Raft group has no
// leader after a node kill.
func (s *MemStore) SetDown(extent uint64, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.extents[extent]; ok {
		e.down = down
	}
}

// Stats returns the counters.
func (s *MemStore) Stats() MemStoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// PreparedCount is the number of transactions still left prepared.
func (s *MemStore) PreparedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.txns)
}

func (s *MemStore) chance(p float64) bool { return p > 0 && s.rng.Float64() < p }

// delay sleeps the injected delay; it returns ctx's error if ctx ends first.
func (s *MemStore) delay(ctx context.Context) error {
	s.mu.Lock()
	var d time.Duration
	if s.faults.MaxDelay > 0 {
		d = time.Duration(s.rng.Int64N(int64(s.faults.MaxDelay)))
	}
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	}
}

// Geometry implements PageStore.
func (s *MemStore) Geometry(ctx context.Context, extent uint64) (Geometry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.extents[extent]
	if !ok {
		return Geometry{}, fmt.Errorf("%w: no extent %d", ErrInvalid, extent)
	}
	return e.geom, nil
}

// checkOwner reports why ref may not be used, or nil.
func (e *memExtent) checkOwner(ref PageRef) error {
	if ref.Page >= uint64(e.geom.Blocks*e.geom.PagesPerBlock) {
		return fmt.Errorf("%w: page %v beyond extent %d", ErrInvalid, ref, e.id)
	}
	b := e.blocks[ref.Page/uint64(e.geom.PagesPerBlock)]
	if !b.allocated || b.generation != ref.Generation || b.tenant != ref.Tenant {
		return fmt.Errorf("%w: %v (block generation %d, tenant %d, allocated %v)", ErrStale, ref, b.generation, b.tenant, b.allocated)
	}
	return nil
}

// heldBy returns the transaction holding page (or its block), if any.
func (e *memExtent) heldBy(page uint64) (uint64, bool) {
	if id, ok := e.prepared[page]; ok {
		return id, true
	}
	id, ok := e.prepared[e.geom.BlockOf(page)|blockLockBit]
	return id, ok
}

// blockLockBit marks, in memExtent.prepared, a lock on a whole block (held
// by a prepared allocation or free) rather than on one page.
const blockLockBit = 1 << 63

// Read implements PageStore.
func (s *MemStore) Read(ctx context.Context, ref PageRef) ([]byte, uint64, error) {
	if err := s.delay(ctx); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Reads++
	e, ok := s.extents[ref.Extent]
	if !ok {
		return nil, 0, fmt.Errorf("%w: no extent %d", ErrInvalid, ref.Extent)
	}
	if e.down || s.chance(s.faults.ReadUnavailable) {
		return nil, 0, fmt.Errorf("%w: read %v (injected)", ErrUnavailable, ref)
	}
	if err := e.checkOwner(ref); err != nil {
		return nil, 0, err
	}
	if id, held := e.heldBy(ref.Page); held {
		return nil, 0, &PreparedError{Txn: PreparedTxn{ID: id, Extent: e.id}, Ref: ref}
	}
	p := e.pages[ref.Page]
	if p == nil {
		return []byte{}, 0, nil
	}
	return slices.Clone(p.data), p.slot, nil
}

// FreeBlocks implements PageStore.
func (s *MemStore) FreeBlocks(ctx context.Context, extent uint64, near uint64, n int) ([]FreeBlock, error) {
	if err := s.delay(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.extents[extent]
	if !ok {
		return nil, fmt.Errorf("%w: no extent %d", ErrInvalid, extent)
	}
	if e.down || s.chance(s.faults.ReadUnavailable) {
		return nil, fmt.Errorf("%w: free blocks of extent %d (injected)", ErrUnavailable, extent)
	}
	ppb := uint64(e.geom.PagesPerBlock)
	center := int(min(near/ppb, uint64(len(e.blocks)-1)))
	var out []FreeBlock
	consider := func(b int) {
		if b < 0 || b >= len(e.blocks) || len(out) >= n || e.blocks[b].allocated {
			return
		}
		if _, held := e.prepared[uint64(b)*ppb|blockLockBit]; held {
			return
		}
		out = append(out, FreeBlock{Extent: extent, Page: uint64(b) * ppb, Generation: e.blocks[b].generation})
	}
	consider(center)
	for d := 1; len(out) < n && (center-d >= 0 || center+d < len(e.blocks)); d++ {
		consider(center + d)
		consider(center - d)
	}
	return out, nil
}

// Commit implements PageStore.
func (s *MemStore) Commit(ctx context.Context, ops []Op) ([]uint64, error) {
	if err := s.delay(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Commits++
	slots, err := s.commitLocked(ops)
	if err != nil {
		s.stats.FailedCommits++
	}
	return slots, err
}

func (s *MemStore) commitLocked(ops []Op) ([]uint64, error) {
	byExtent, order, err := s.validateShape(ops)
	if err != nil {
		return nil, err
	}
	for _, id := range order {
		if s.extents[id].down {
			return nil, fmt.Errorf("%w: extent %d has no leader (injected)", ErrUnavailable, id)
		}
	}
	if s.chance(s.faults.CommitUnavailable) {
		return nil, fmt.Errorf("%w: commit (injected)", ErrUnavailable)
	}
	for _, id := range order {
		if err := s.extents[id].check(byExtent[id]); err != nil {
			return nil, err
		}
	}
	if len(order) > 1 {
		s.stats.CrossExtentCommits++
		if s.chance(s.faults.PreparedCrash) {
			return nil, s.crashPrepared(byExtent, order)
		}
	}
	ambiguous := s.chance(s.faults.CommitAmbiguous)
	if ambiguous && s.rng.IntN(2) == 0 {
		return nil, fmt.Errorf("%w: commit reply lost before apply (injected)", ErrAmbiguous)
	}
	for _, id := range order {
		s.extents[id].apply(byExtent[id])
	}
	if ambiguous {
		return nil, fmt.Errorf("%w: commit reply lost after apply (injected)", ErrAmbiguous)
	}
	// Like the extent store, a cross-extent commit reports no slots.
	slots := make([]uint64, len(ops))
	if len(order) == 1 {
		for i, op := range ops {
			if op.Kind == OpWrite || op.Kind == OpWriteFresh {
				slots[i] = s.extents[op.Ref.Extent].slot
			}
		}
	}
	return slots, nil
}

// validateShape checks what does not depend on the store's state and
// groups the ops by extent, extents in increasing order.
func (s *MemStore) validateShape(ops []Op) (map[uint64][]Op, []uint64, error) {
	if len(ops) == 0 || len(ops) > MaxOpsPerCommit {
		return nil, nil, fmt.Errorf("%w: %d ops (want 1 to %d)", ErrInvalid, len(ops), MaxOpsPerCommit)
	}
	type pageKey struct{ extent, page uint64 }
	seen := map[pageKey]bool{}
	allocated := map[pageKey]bool{}
	byExtent := map[uint64][]Op{}
	var order []uint64
	for i, op := range ops {
		e, ok := s.extents[op.Ref.Extent]
		if !ok {
			return nil, nil, fmt.Errorf("%w: op %d: no extent %d", ErrInvalid, i, op.Ref.Extent)
		}
		if op.Ref.Page >= uint64(e.geom.Blocks*e.geom.PagesPerBlock) {
			return nil, nil, fmt.Errorf("%w: op %d: page %d beyond extent %d", ErrInvalid, i, op.Ref.Page, e.id)
		}
		k := pageKey{op.Ref.Extent, op.Ref.Page}
		switch op.Kind {
		case OpWrite, OpCheck, OpWriteFresh:
			if len(op.Data) > e.geom.PageBytes {
				return nil, nil, fmt.Errorf("%w: op %d: %d bytes exceed page size %d", ErrInvalid, i, len(op.Data), e.geom.PageBytes)
			}
			if op.Kind == OpWriteFresh && !allocated[pageKey{op.Ref.Extent, e.geom.BlockOf(op.Ref.Page)}] {
				return nil, nil, fmt.Errorf("%w: op %d: fresh write to %v outside a block allocated before it", ErrInvalid, i, op.Ref)
			}
		case OpAllocBlock, OpFreeBlock:
			if e.geom.BlockOf(op.Ref.Page) != op.Ref.Page {
				return nil, nil, fmt.Errorf("%w: op %d: %v is not a block's first page", ErrInvalid, i, op.Ref)
			}
			if op.Kind == OpAllocBlock {
				if op.Ref.Generation != op.Slot+1 {
					return nil, nil, fmt.Errorf("%w: op %d: allocation must take generation %d to %d", ErrInvalid, i, op.Slot, op.Slot+1)
				}
				allocated[k] = true
			}
			k.page |= blockLockBit
		default:
			return nil, nil, fmt.Errorf("%w: op %d: unknown kind %v", ErrInvalid, i, op.Kind)
		}
		if seen[k] {
			return nil, nil, fmt.Errorf("%w: op %d: %v named twice", ErrInvalid, i, op.Ref)
		}
		seen[k] = true
		if _, ok := byExtent[op.Ref.Extent]; !ok {
			order = append(order, op.Ref.Extent)
		}
		byExtent[op.Ref.Extent] = append(byExtent[op.Ref.Extent], op)
	}
	slices.Sort(order)
	return byExtent, order, nil
}

// check validates one extent's ops against its state, in order (an
// allocation is visible to the ops after it).
func (e *memExtent) check(ops []Op) error {
	ppb := uint64(e.geom.PagesPerBlock)
	alloc := map[uint64]memBlock{} // block index -> state after earlier ops
	owner := func(ref PageRef) error {
		bi := ref.Page / ppb
		b, ok := alloc[bi]
		if !ok {
			return e.checkOwner(ref)
		}
		if !b.allocated || b.generation != ref.Generation || b.tenant != ref.Tenant {
			return fmt.Errorf("%w: %v (block changed earlier in the commit)", ErrStale, ref)
		}
		return nil
	}
	for _, op := range ops {
		bi := op.Ref.Page / ppb
		if op.Kind == OpAllocBlock || op.Kind == OpFreeBlock {
			if id, held := e.prepared[op.Ref.Page|blockLockBit]; held {
				return &PreparedError{Txn: PreparedTxn{ID: id, Extent: e.id}, Ref: op.Ref}
			}
		} else if id, held := e.heldBy(op.Ref.Page); held {
			return &PreparedError{Txn: PreparedTxn{ID: id, Extent: e.id}, Ref: op.Ref}
		}
		switch op.Kind {
		case OpWrite, OpCheck:
			if err := owner(op.Ref); err != nil {
				return err
			}
			var slot uint64
			if p := e.pages[op.Ref.Page]; p != nil {
				slot = p.slot
			}
			if slot != op.Slot {
				return fmt.Errorf("%w: %v at slot %d, read at %d", ErrConflict, op.Ref, slot, op.Slot)
			}
		case OpWriteFresh:
			if err := owner(op.Ref); err != nil {
				return err
			}
		case OpAllocBlock:
			b := e.blocks[bi]
			if a, ok := alloc[bi]; ok {
				b = a
			}
			if b.allocated {
				return fmt.Errorf("%w: block %v already allocated", ErrConflict, op.Ref)
			}
			if b.generation != op.Slot {
				return fmt.Errorf("%w: free block %v at generation %d, listed at %d", ErrConflict, op.Ref, b.generation, op.Slot)
			}
			alloc[bi] = memBlock{allocated: true, generation: op.Ref.Generation, tenant: op.Ref.Tenant}
		case OpFreeBlock:
			if err := owner(op.Ref); err != nil {
				return err
			}
			alloc[bi] = memBlock{generation: op.Ref.Generation + 1}
		}
	}
	return nil
}

// apply carries out ops that check accepted, at the extent's next slot.
func (e *memExtent) apply(ops []Op) {
	e.slot++
	ppb := uint64(e.geom.PagesPerBlock)
	clearBlock := func(first uint64) {
		for p := first; p < first+ppb; p++ {
			if _, ok := e.pages[p]; ok {
				e.pages[p] = &memPage{data: nil, slot: e.slot}
			}
		}
	}
	for _, op := range ops {
		bi := op.Ref.Page / ppb
		switch op.Kind {
		case OpWrite, OpWriteFresh:
			e.pages[op.Ref.Page] = &memPage{data: slices.Clone(op.Data), slot: e.slot}
		case OpAllocBlock:
			e.blocks[bi] = memBlock{allocated: true, generation: op.Ref.Generation, tenant: op.Ref.Tenant}
			clearBlock(op.Ref.Page)
		case OpFreeBlock:
			e.blocks[bi] = memBlock{generation: op.Ref.Generation + 1}
			clearBlock(op.Ref.Page)
		}
	}
}

// crashPrepared leaves a checked cross-extent commit part way through the
// linked-list two-phase commit (FSS §6): extents are visited in order; a
// prefix of them is prepared, and if the crash came after the last extent
// decided, that extent has applied its part.
func (s *MemStore) crashPrepared(byExtent map[uint64][]Op, order []uint64) error {
	id := s.nextTxn
	s.nextTxn++
	prepared := 1 + s.rng.IntN(len(order)) // extents reached: 1..n
	t := &memTxn{pending: map[uint64][]Op{}}
	if prepared == len(order) {
		// The last extent got prepare-and-decide: committed there.
		t.decided = true
		last := order[len(order)-1]
		s.extents[last].apply(byExtent[last])
		prepared--
	}
	for _, eid := range order[:prepared] {
		e := s.extents[eid]
		t.pending[eid] = byExtent[eid]
		for _, op := range byExtent[eid] {
			k := op.Ref.Page
			if op.Kind == OpAllocBlock || op.Kind == OpFreeBlock {
				k |= blockLockBit
			}
			e.prepared[k] = id
		}
	}
	if len(t.pending) == 0 {
		return fmt.Errorf("%w: cross-extent commit lost its reply after deciding (injected)", ErrAmbiguous)
	}
	s.txns[id] = t
	return fmt.Errorf("%w: cross-extent commit interrupted after %d prepares (injected)", ErrAmbiguous, prepared)
}

// Resolve implements PageStore: a decided transaction is rolled forward on
// the extents still holding it, an undecided one is rolled back.
func (s *MemStore) Resolve(ctx context.Context, txn PreparedTxn) error {
	if err := s.delay(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Resolves++
	t, ok := s.txns[txn.ID]
	if !ok {
		return nil // already resolved by someone else
	}
	for eid := range t.pending {
		if s.extents[eid].down {
			return fmt.Errorf("%w: resolving transaction %d: extent %d has no leader", ErrUnavailable, txn.ID, eid)
		}
	}
	for eid, ops := range t.pending {
		e := s.extents[eid]
		for k, holder := range e.prepared {
			if holder == txn.ID {
				delete(e.prepared, k)
			}
		}
		if t.decided {
			e.apply(ops)
		}
	}
	delete(s.txns, txn.ID)
	return nil
}
