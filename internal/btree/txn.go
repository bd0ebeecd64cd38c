package btree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/arbor-storage/arbor/internal/invariants"
	"math/rand/v2"
	"slices"
)

// KV is one key-value pair.
type KV struct {
	Key, Value []byte
}

// Txn is one attempt of a transaction: it reads the pages of the keys it
// touches (one leaf per key, found through the key-to-page cache), changes
// copies of them, and commits them with one MPSC, conditional on every page
// it read (FSS §5). Pages read and not written go into the commit as slot
// checks, so a committed transaction is serializable with every other.
//
// A Txn is used by one goroutine, only inside the function given to
// Update or View. Its methods return an error that also sticks: once one
// failed, the attempt will not commit, whatever the function returns.
type Txn struct {
	t        *Tree
	ctx      context.Context
	id       uint64
	readOnly bool
	// perPage charges values per leaf page instead of per key (UpdatePages).
	perPage bool
	done    bool
	err     error

	pages []*txnPage
	// byAddr holds the tree pages by place, whatever their generation: a
	// stale pointer from the leaf cache and a fresh one can name one page.
	byAddr map[pageAddr]*txnPage
	keys   map[string]bool
	extra  []*extraPage
	extraM map[PageRef]*extraPage
	blocks []Op // OpAllocBlock and OpFreeBlock, in call order
	values int
}

// pageAddr is where a page lives, the part of a PageRef a commit may name
// only once.
type pageAddr struct{ extent, page uint64 }

func addrOf(r PageRef) pageAddr { return pageAddr{r.Extent, r.Page} }

type txnPage struct {
	ref   PageRef
	p     *page
	slot  uint64
	dirty bool
	// cached: the page came from the leaf cache, unread (leafcache.go).
	cached bool
	// written is the stamped page the commit writes (set by ops).
	written *page
	// readWriter is the newest writer of the version read (see probe).
	readWriter uint64
}

type extraPage struct {
	ref   PageRef
	data  []byte
	slot  uint64
	fresh bool // in a block this transaction allocates
	read  bool
	dirty bool
}

func (t *Tree) newTxn(ctx context.Context, readOnly bool) *Txn {
	return &Txn{
		t: t, ctx: ctx, id: rand.Uint64() | 1, readOnly: readOnly,
		byAddr: map[pageAddr]*txnPage{}, keys: map[string]bool{}, extraM: map[PageRef]*extraPage{},
	}
}

// fail records err as the attempt's sticky error and returns it.
func (tx *Txn) fail(err error) error {
	if tx.err == nil {
		tx.err = err
	}
	return err
}

func (tx *Txn) usable() error {
	if tx.done {
		return ErrTxnDone
	}
	return tx.err
}

// countValue charges one value against MaxTxnValues.
func (tx *Txn) countValue(what string) error {
	if tx.values+1 > MaxTxnValues {
		return tx.fail(fmt.Errorf("%w: %s would be value %d, the bound is %d", ErrTooManyValues, what, tx.values+1, MaxTxnValues))
	}
	tx.values++
	return nil
}

func (tx *Txn) countKey(k []byte) error {
	if tx.perPage || tx.keys[string(k)] {
		return nil
	}
	if err := tx.countValue(fmt.Sprintf("key %q", k)); err != nil {
		return err
	}
	tx.keys[string(k)] = true
	return nil
}

func (tx *Txn) checkKey(k []byte) error {
	if len(k) > tx.t.maxKey {
		return tx.fail(fmt.Errorf("%w: %d bytes, the bound is %d", ErrKeyTooLarge, len(k), tx.t.maxKey))
	}
	return nil
}

// leafFor returns the transaction's copy of the leaf owning k, reading it
// (into the read set) if the transaction has not yet.
func (tx *Txn) leafFor(k []byte) (*txnPage, error) {
	for _, tp := range tx.pages {
		if tp.p.height == 0 && tp.p.owns(k) {
			return tp, nil
		}
	}
	if tx.perPage {
		if err := tx.countValue(fmt.Sprintf("leaf of %q", k)); err != nil {
			return nil, err
		}
	}
	loc, cached, err := tx.findLeaf(k)
	if err != nil {
		return nil, tx.fail(err)
	}
	if _, ok := tx.byAddr[addrOf(loc.ref)]; ok {
		// The copy this transaction holds no longer owns k, so the page
		// changed (or was freed and reused) since it was read: this
		// attempt cannot commit.
		return nil, tx.fail(retry("leaf changed during the transaction", nil))
	}
	tp := &txnPage{ref: loc.ref, p: loc.p, slot: loc.slot, cached: cached, readWriter: loc.p.writer()}
	tx.pages = append(tx.pages, tp)
	tx.byAddr[addrOf(loc.ref)] = tp
	return tp, nil
}

// findLeaf returns the leaf owning k: from the leaf cache in a read-write
// transaction when the tree keeps one (leafcache.go), else read from the
// store (and then remembered in the leaf cache).
func (tx *Txn) findLeaf(k []byte) (located, bool, error) {
	leaves := tx.t.leaves
	if leaves != nil && !tx.readOnly {
		if ref, ok := tx.t.cache.lookup(0, k); ok {
			if p, slot, ok := leaves.get(ref); ok && p.kind == kindLeaf && p.height == 0 && p.owns(k) {
				tx.t.metrics.leafCacheHits.Add(1)
				return located{ref, p, slot}, true, nil
			}
		}
		tx.t.leafCacheMiss()
	}
	loc, err := tx.t.locate(tx.ctx, k, 0)
	if err != nil {
		return located{}, false, err
	}
	leaves.put(loc.ref, loc.p, loc.slot)
	return loc, false, nil
}

// Get returns k's value and whether k is present.
func (tx *Txn) Get(k []byte) ([]byte, bool, error) {
	if err := tx.usable(); err != nil {
		return nil, false, err
	}
	if err := tx.checkKey(k); err != nil {
		return nil, false, err
	}
	if err := tx.countKey(k); err != nil {
		return nil, false, err
	}
	tp, err := tx.leafFor(k)
	if err != nil {
		return nil, false, err
	}
	i, ok := tp.p.search(k)
	if !ok {
		return nil, false, nil
	}
	return bytes.Clone(tp.p.vals[i]), true, nil
}

// Put sets k to v.
func (tx *Txn) Put(k, v []byte) error {
	if err := tx.usable(); err != nil {
		return err
	}
	if tx.readOnly {
		return tx.fail(errors.New("btree: Put in a read-only transaction"))
	}
	if err := tx.checkKey(k); err != nil {
		return err
	}
	if len(v) > tx.t.maxValue {
		return tx.fail(fmt.Errorf("%w: %d bytes, the bound is %d", ErrValueTooLarge, len(v), tx.t.maxValue))
	}
	if err := tx.countKey(k); err != nil {
		return err
	}
	tp, err := tx.leafFor(k)
	if err != nil {
		return err
	}
	pageBytes, err := tx.t.pageBytes(tx.ctx, tp.ref.Extent)
	if err != nil {
		return tx.fail(err)
	}
	i, found := tp.p.search(k)
	grow := 2*lenBytes + len(k) + len(v)
	if found {
		grow = len(v) - len(tp.p.vals[i])
	}
	if tp.p.size()+grow > pageBytes {
		ns := &errNeedSplit{ref: tp.ref, height: 0, lo: tp.p.lo, key: bytes.Clone(k)}
		if tp.dirty {
			// The transaction's own writes fill it: cut where they would
			// be halved.
			full := tp.p.clone()
			if found {
				full.vals[i] = v
			} else {
				full.keys = slices.Insert(full.keys, i, k)
				full.vals = slices.Insert(full.vals, i, v)
			}
			if _, sep, ok := splitPoint(full, k); ok {
				ns.sep = sep
			}
		}
		return tx.fail(ns)
	}
	if !tp.dirty {
		tp.p = tp.p.clone()
		tp.dirty = true
	}
	v = bytes.Clone(v)
	if v == nil {
		v = []byte{}
	}
	if found {
		tp.p.vals[i] = v
		return nil
	}
	tp.p.keys = slices.Insert(tp.p.keys, i, bytes.Clone(k))
	tp.p.vals = slices.Insert(tp.p.vals, i, v)
	return nil
}

// Delete removes k; deleting a missing key is not an error. The page it
// leaves may be underfull: a later transaction rebalances it (FSS §5).
func (tx *Txn) Delete(k []byte) error {
	if err := tx.usable(); err != nil {
		return err
	}
	if tx.readOnly {
		return tx.fail(errors.New("btree: Delete in a read-only transaction"))
	}
	if err := tx.checkKey(k); err != nil {
		return err
	}
	if err := tx.countKey(k); err != nil {
		return err
	}
	tp, err := tx.leafFor(k)
	if err != nil {
		return err
	}
	i, found := tp.p.search(k)
	if !found {
		return nil
	}
	if !tp.dirty {
		tp.p = tp.p.clone()
		tp.dirty = true
	}
	tp.p.keys = slices.Delete(tp.p.keys, i, i+1)
	tp.p.vals = slices.Delete(tp.p.vals, i, i+1)
	return nil
}

// Scan returns up to limit pairs (all if limit <= 0) with keys in
// [from, to), in order; a nil to means no upper bound. It is atomic with
// the rest of the transaction: every leaf it reads is in the commit, and
// each leaf not already in the transaction counts as one value.
func (tx *Txn) Scan(from, to []byte, limit int) ([]KV, error) {
	if err := tx.usable(); err != nil {
		return nil, err
	}
	if to != nil && bytes.Compare(from, to) > 0 {
		return nil, tx.fail(fmt.Errorf("%w: from %q is after to %q", ErrBadRange, from, to))
	}
	var out []KV
	resume := bytes.Clone(from)
	for limit <= 0 || len(out) < limit {
		tp, err := tx.scanLeaf(resume)
		if err != nil {
			return nil, err
		}
		i, _ := tp.p.search(resume)
		for ; i < len(tp.p.keys) && (limit <= 0 || len(out) < limit); i++ {
			if to != nil && bytes.Compare(tp.p.keys[i], to) >= 0 {
				return out, nil
			}
			out = append(out, KV{Key: bytes.Clone(tp.p.keys[i]), Value: bytes.Clone(tp.p.vals[i])})
		}
		if tp.p.hiInf || (to != nil && bytes.Compare(tp.p.hi, to) >= 0) {
			break
		}
		resume = tp.p.hi
	}
	return out, nil
}

func (tx *Txn) scanLeaf(k []byte) (*txnPage, error) {
	for _, tp := range tx.pages {
		if tp.p.height == 0 && tp.p.owns(k) {
			return tp, nil
		}
	}
	if !tx.perPage {
		if err := tx.countValue(fmt.Sprintf("scanned page at %q", k)); err != nil {
			return nil, err
		}
	}
	return tx.leafFor(k)
}

// ReadPage reads a page that is not a tree page (a data block's page, say)
// into the transaction: the commit checks it is unchanged. It counts as one
// value.
func (tx *Txn) ReadPage(ref PageRef) ([]byte, error) {
	if err := tx.usable(); err != nil {
		return nil, err
	}
	ep, err := tx.extraPage(ref)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(ep.data), nil
}

func (tx *Txn) extraPage(ref PageRef) (*extraPage, error) {
	if ep, ok := tx.extraM[ref]; ok {
		return ep, nil
	}
	if _, ok := tx.byAddr[addrOf(ref)]; ok {
		return nil, tx.fail(fmt.Errorf("btree: page %v is a tree page of this transaction", ref))
	}
	if err := tx.countValue(fmt.Sprintf("page %v", ref)); err != nil {
		return nil, err
	}
	ep := &extraPage{ref: ref}
	if tx.allocatesBlockOf(ref) {
		ep.fresh = true
	} else {
		data, slot, err := tx.t.readRaw(tx.ctx, ref)
		if err != nil {
			return nil, tx.fail(err)
		}
		ep.data, ep.slot, ep.read = data, slot, true
	}
	tx.extra = append(tx.extra, ep)
	tx.extraM[ref] = ep
	return ep, nil
}

func (tx *Txn) allocatesBlockOf(ref PageRef) bool {
	g, err := tx.t.geometry(tx.ctx, ref.Extent)
	if err != nil {
		return false
	}
	for _, op := range tx.blocks {
		if op.Kind == OpAllocBlock && op.Ref.Extent == ref.Extent && op.Ref.Page == g.BlockOf(ref.Page) &&
			op.Ref.Generation == ref.Generation && op.Ref.Tenant == ref.Tenant {
			return true
		}
	}
	return false
}

// WritePage writes a page that is not a tree page. A page of a block this
// transaction allocated is written without a read; any other page is read
// first (if the transaction has not), and the write is conditional on it.
// It counts as one value (with its read).
func (tx *Txn) WritePage(ref PageRef, data []byte) error {
	if err := tx.usable(); err != nil {
		return err
	}
	if tx.readOnly {
		return tx.fail(errors.New("btree: WritePage in a read-only transaction"))
	}
	g, err := tx.t.geometry(tx.ctx, ref.Extent)
	if err != nil {
		return tx.fail(err)
	}
	if len(data) > g.PageBytes {
		return tx.fail(fmt.Errorf("%w: page data of %d bytes, the page size is %d", ErrValueTooLarge, len(data), g.PageBytes))
	}
	ep, err := tx.extraPage(ref)
	if err != nil {
		return err
	}
	ep.data, ep.dirty = bytes.Clone(data), true
	return nil
}

// AllocBlock allocates a free block of extent, as near page near as the
// store finds one, for tenant, and returns its tagged pointer (that of its
// first page). It happens only if the transaction commits. It counts as one
// value.
func (tx *Txn) AllocBlock(extent, near, tenant uint64) (PageRef, error) {
	if err := tx.usable(); err != nil {
		return PageRef{}, err
	}
	if tx.readOnly {
		return PageRef{}, tx.fail(errors.New("btree: AllocBlock in a read-only transaction"))
	}
	if err := tx.countValue("block allocation"); err != nil {
		return PageRef{}, err
	}
	free, err := tx.t.store.FreeBlocks(tx.ctx, extent, near, freeBlockCandidates)
	if err != nil {
		return PageRef{}, tx.fail(err)
	}
	for _, fb := range free {
		taken := false
		for _, op := range tx.blocks {
			taken = taken || (op.Ref.Extent == fb.Extent && op.Ref.Page == fb.Page)
		}
		if taken {
			continue
		}
		ref := PageRef{Extent: extent, Page: fb.Page, Generation: fb.Generation + 1, Tenant: tenant}
		tx.blocks = append(tx.blocks, Op{Kind: OpAllocBlock, Ref: ref, Slot: fb.Generation})
		return ref, nil
	}
	return PageRef{}, tx.fail(fmt.Errorf("%w in extent %d", ErrNoSpace, extent))
}

// FreeBlock frees the block whose first page is ref, if the transaction
// commits. It counts as one value.
func (tx *Txn) FreeBlock(ref PageRef) error {
	if err := tx.usable(); err != nil {
		return err
	}
	if tx.readOnly {
		return tx.fail(errors.New("btree: FreeBlock in a read-only transaction"))
	}
	if err := tx.countValue("block free"); err != nil {
		return err
	}
	tx.blocks = append(tx.blocks, Op{Kind: OpFreeBlock, Ref: ref})
	return nil
}

// ops builds the commit: block allocations first (so fresh writes follow
// them), then tree pages, non-tree pages and frees.
func (tx *Txn) ops() []Op {
	var ops []Op
	for _, op := range tx.blocks {
		if op.Kind == OpAllocBlock {
			ops = append(ops, op)
		}
	}
	for _, tp := range tx.pages {
		if tp.dirty {
			q := tp.p.clone()
			q.stamp(tx.id)
			tp.written = q
			ops = append(ops, Op{Kind: OpWrite, Ref: tp.ref, Slot: tp.slot, Data: q.encode()})
		} else {
			ops = append(ops, Op{Kind: OpCheck, Ref: tp.ref, Slot: tp.slot})
		}
	}
	for _, ep := range tx.extra {
		switch {
		case ep.fresh:
			if ep.dirty {
				ops = append(ops, Op{Kind: OpWriteFresh, Ref: ep.ref, Data: ep.data})
			}
		case ep.dirty:
			ops = append(ops, Op{Kind: OpWrite, Ref: ep.ref, Slot: ep.slot, Data: ep.data})
		default:
			ops = append(ops, Op{Kind: OpCheck, Ref: ep.ref, Slot: ep.slot})
		}
	}
	for _, op := range tx.blocks {
		if op.Kind == OpFreeBlock {
			ops = append(ops, op)
		}
	}
	return ops
}

// commit submits the attempt. A read of one page needs no commit: the read
// was linearizable by itself (unless the page came from the leaf cache).
func (tx *Txn) commit() error {
	ops := tx.ops()
	writes := 0
	for _, op := range ops {
		if op.Kind != OpCheck {
			writes++
		}
	}
	cached := false
	for _, tp := range tx.pages {
		cached = cached || tp.cached
	}
	if len(ops) == 0 || (writes == 0 && len(ops) == 1 && !cached) {
		return nil
	}
	if len(ops) > MaxOpsPerCommit {
		// Unreachable while every op is charged as a value.
		return fmt.Errorf("%w: %d pages in one commit", ErrTooManyValues, len(ops))
	}
	tx.t.metrics.commits.Add(1)
	slots, err := tx.t.store.Commit(tx.ctx, ops)
	if err != nil {
		// Whatever went wrong, what this attempt read may be stale.
		for _, tp := range tx.pages {
			tx.t.leaves.drop(tp.ref)
		}
	}
	var pe *PreparedError
	switch {
	case err == nil:
		tx.rememberWritten(ops, slots)
		return nil
	case errors.As(err, &pe):
		if rerr := tx.t.resolve(tx.ctx, pe.Txn); rerr != nil {
			return rerr
		}
		return retry("resolved a prepared transaction", err)
	case errors.Is(err, ErrStale):
		tx.t.metrics.conflicts.Add(1)
		for _, tp := range tx.pages {
			tx.t.cache.dropRef(tp.ref)
		}
		return retry("stale pointer", err)
	case errors.Is(err, ErrConflict):
		tx.t.metrics.conflicts.Add(1)
		return retry("conflict", err)
	case errors.Is(err, ErrAmbiguous):
		if writes == 0 {
			return retry("read-only commit outcome unknown", err)
		}
		return tx.learnOutcome(err)
	}
	return err
}

// validateCached checks that the leaves the transaction took from the leaf
// cache are current, without writing: a retry error (the cached leaves are
// dropped) if one is not.
func (tx *Txn) validateCached() error {
	var ops []Op
	for _, tp := range tx.pages {
		if tp.cached {
			ops = append(ops, Op{Kind: OpCheck, Ref: tp.ref, Slot: tp.slot})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	dropAll := func() {
		for _, tp := range tx.pages {
			tx.t.leaves.drop(tp.ref)
		}
	}
	if len(ops) > MaxOpsPerCommit {
		dropAll()
		return retry("too many cached leaves to check", ErrConflict)
	}
	tx.t.metrics.commits.Add(1)
	if _, err := tx.t.store.Commit(tx.ctx, ops); err != nil {
		dropAll()
		if errors.Is(err, ErrStale) {
			for _, tp := range tx.pages {
				tx.t.cache.dropRef(tp.ref)
			}
		}
		return retry("checking cached leaves", err)
	}
	return nil
}

// rememberWritten puts the leaves a successful commit wrote into the leaf
// cache, at the slots the store reported.
func (tx *Txn) rememberWritten(ops []Op, slots []uint64) {
	if tx.t.leaves == nil {
		return
	}
	written := map[PageRef]uint64{}
	for i, op := range ops {
		if op.Kind == OpWrite && i < len(slots) {
			written[op.Ref] = slots[i]
		}
	}
	for _, tp := range tx.pages {
		if tp.dirty {
			tx.t.leaves.put(tp.ref, tp.written, written[tp.ref])
		}
	}
}

// learnOutcome finds out whether an ambiguous commit was applied, from the
// pages it wrote (see probe). If no page can tell, the outcome is unknown
// and ErrAmbiguous is returned.
func (tx *Txn) learnOutcome(cause error) error {
	for _, tp := range tx.pages {
		if !tp.dirty {
			continue
		}
		switch tx.probe(tp.ref, tp.slot, tp.readWriter) {
		case outcomeApplied:
			return nil
		case outcomeNotApplied:
			return retry("ambiguous commit was not applied", cause)
		}
	}
	for _, ep := range tx.extra {
		if ep.dirty && !ep.fresh {
			if tx.probe(ep.ref, ep.slot, 0) == outcomeNotApplied {
				return retry("ambiguous commit was not applied", cause)
			}
		}
	}
	tx.t.metrics.ambiguous.Add(1)
	return fmt.Errorf("%w: %v", ErrAmbiguous, cause)
}

type outcome int

const (
	outcomeUnknown outcome = iota
	outcomeApplied
	outcomeNotApplied
)

// maxProbeAttempts bounds the reads and fences one probe makes. It backs
// off between them, and keeps trying while the store is unavailable (a
// leader being elected) until the transaction's deadline: giving up early
// would leave the caller with an unknown outcome.
const maxProbeAttempts = 1000

// probe tells, from one page the commit wrote, read at slot when its
// newest writer was readWriter (0 for a page that is not a tree page),
// whether the commit was applied:
//
//   - the page remembers this attempt's id among its last writers:
//     applied;
//   - the page moved past slot and remembers readWriter followed only by
//     other writers: not applied, and never will be (its condition on slot
//     can no longer hold);
//   - the page is still at slot: not applied yet, but a commit whose reply
//     was lost may still be in flight (a Raft entry applied late), so the
//     page is rewritten unchanged, conditional on slot; once that fence
//     commits, the old commit can never apply (FSS §6 uses the same trick
//     to stop a transaction from deciding);
//   - anything else (the page moved on too far to tell): unknown.
func (tx *Txn) probe(ref PageRef, slot uint64, readWriter uint64) outcome {
	tree := readWriter != 0
	for attempt := range maxProbeAttempts {
		if attempt > 0 && tx.t.backoff(tx.ctx, attempt-1) != nil {
			return outcomeUnknown
		}
		data, now, err := tx.t.readRaw(tx.ctx, ref)
		if err != nil {
			if transient(err) && !isRetry(err) {
				continue
			}
			return outcomeUnknown
		}
		var p *page
		if tree {
			if p, err = decodePage(data); err != nil {
				return outcomeUnknown
			}
			if _, applied := p.wroteBy(tx.id); applied {
				return outcomeApplied
			}
			if read, ok := p.wroteBy(readWriter); ok && read > 0 && now != slot {
				return outcomeNotApplied
			}
		}
		if now != slot {
			return outcomeUnknown
		}
		fence := data
		if tree {
			p.stamp(rand.Uint64() | 1)
			fence = p.encode()
		}
		tx.t.metrics.commits.Add(1)
		_, err = tx.t.store.Commit(tx.ctx, []Op{{Kind: OpWrite, Ref: ref, Slot: slot, Data: fence}})
		var pe *PreparedError
		switch {
		case err == nil:
			return outcomeNotApplied
		case errors.As(err, &pe):
			if tx.t.resolve(tx.ctx, pe.Txn) != nil {
				return outcomeUnknown
			}
		case errors.Is(err, ErrConflict), errors.Is(err, ErrAmbiguous), errors.Is(err, ErrUnavailable):
			// Read again: the late commit, or the fence, may be there; the
			// fence remembers readWriter, so it shows as "not applied".
		default:
			return outcomeUnknown
		}
	}
	return outcomeUnknown
}

// afterCommit refreshes the cache with the pages written and queues the
// underfull ones for rebalancing.
func (tx *Txn) afterCommit() {
	for _, tp := range tx.pages {
		if !tp.dirty {
			continue
		}
		tx.t.cache.put(tp.p.height, tp.p, tp.ref)
		tx.t.maybeRebalance(tp.ref, tp.p)
	}
}

// Update runs fn in a read-write transaction and commits it, running fn
// again (bounded attempts, jittered backoff, a deadline) after conflicts,
// stale pointers, pages that do not fit (split first, in their own
// transaction), prepared transactions in the way and an unavailable store.
// fn must therefore have no effects outside the Txn. It returns fn's error
// (without committing) or the commit's: one wrapping ErrAmbiguous means the
// transaction may or may not have been applied.
func (t *Tree) Update(ctx context.Context, fn func(*Txn) error) error {
	return t.run(ctx, false, fn)
}

// UpdatePages is Update for transactions over many keys on few pages (a
// metadata server's batch of operations, DESIGN.md §2.6): values are
// charged per leaf page the transaction reads, not per key, so any number
// of keys fit as long as their leaves (with the other values) stay within
// MaxTxnValues. Past that every call fails with ErrTooManyValues.
func (t *Tree) UpdatePages(ctx context.Context, fn func(*Txn) error) error {
	return t.runMode(ctx, false, true, fn)
}

// View runs fn in a read-only transaction: every page it reads is checked
// unchanged at the end, so what fn saw was a consistent state.
func (t *Tree) View(ctx context.Context, fn func(*Txn) error) error {
	return t.run(ctx, true, fn)
}

func (t *Tree) run(ctx context.Context, readOnly bool, fn func(*Txn) error) error {
	return t.runMode(ctx, readOnly, false, fn)
}

func (t *Tree) runMode(ctx context.Context, readOnly, perPage bool, fn func(*Txn) error) error {
	t.metrics.txns.Add(1)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.TxnTimeout)
		defer cancel()
	}
	var last error
	structural := 0
	for attempt := 0; attempt < t.cfg.MaxAttempts; attempt++ {
		if attempt > 0 {
			t.metrics.retries.Add(1)
		}
		tx := t.newTxn(ctx, readOnly)
		tx.perPage = perPage
		ferr := fn(tx)
		tx.done = true
		err := tx.err
		if err == nil && ferr != nil {
			// fn's error may rest on a cached leaf someone changed: it
			// stands only if what came from the cache is current.
			if err = tx.validateCached(); err == nil {
				return ferr
			}
		}
		if err == nil {
			if err = tx.commit(); err == nil {
				tx.afterCommit()
				if invariants.Enabled && !readOnly {
					t.checkInvariants()
				}
				return nil
			}
		}
		last = err
		var ns *errNeedSplit
		switch {
		case errors.As(err, &ns):
			structural++
			// The full page may be a cached copy someone else has split
			// already: the split writes it at the cached slot, so that
			// fails as a conflict and the split reads it again.
			if serr := t.split(ctx, ns); serr != nil && !transient(serr) {
				return serr
			} else if serr != nil || structural > maxStructuralRetries {
				if berr := t.backoff(ctx, attempt); berr != nil {
					return fmt.Errorf("%w: %w (last: %w)", ErrGaveUp, berr, err)
				}
			}
		case transient(err):
			if berr := t.backoff(ctx, attempt); berr != nil {
				return fmt.Errorf("%w: %w (last: %w)", ErrGaveUp, berr, err)
			}
		default:
			if errors.Is(err, ErrAmbiguous) {
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return fmt.Errorf("%w: %w (last: %w)", ErrGaveUp, cerr, err)
			}
			return err
		}
	}
	return fmt.Errorf("%w after %d attempts: %w", ErrGaveUp, t.cfg.MaxAttempts, last)
}

// transient reports whether running again may succeed.
func transient(err error) bool {
	return isRetry(err) || errors.Is(err, ErrConflict) || errors.Is(err, ErrStale) ||
		errors.Is(err, ErrUnavailable) || errors.Is(err, ErrPrepared)
}

// Get returns k's value and whether k is present (one linearizable page
// read when the cache is right).
func (t *Tree) Get(ctx context.Context, k []byte) (v []byte, ok bool, err error) {
	err = t.View(ctx, func(tx *Txn) error {
		v, ok, err = tx.Get(k)
		return err
	})
	return v, ok, err
}

// Put sets k to v in a transaction of its own.
func (t *Tree) Put(ctx context.Context, k, v []byte) error {
	return t.Update(ctx, func(tx *Txn) error { return tx.Put(k, v) })
}

// Delete removes k in a transaction of its own.
func (t *Tree) Delete(ctx context.Context, k []byte) error {
	return t.Update(ctx, func(tx *Txn) error { return tx.Delete(k) })
}

func (t *Tree) pageBytes(ctx context.Context, extent uint64) (int, error) {
	g, err := t.geometry(ctx, extent)
	if err != nil {
		return 0, err
	}
	return g.PageBytes, nil
}
