package extent

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// maxCommandBytes bounds an encoded command: a part of MaxElements full
// pages plus framing.
const maxCommandBytes = maxTxnRecordBytes + 4096

// EncodeCommand encodes a command deterministically.
func EncodeCommand(cmd *pb.Command) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	if len(b) > maxCommandBytes {
		return nil, fmt.Errorf("%w: command of %d bytes, limit %d", ErrInvalid, len(b), maxCommandBytes)
	}
	return b, nil
}

// Apply applies one command (the raftengine contract): it returns a
// *extentpb.CommandResult; a refused command (bad input, failed condition)
// writes nothing. A non-nil error means the replica's storage failed.
func (sm *StateMachine) Apply(w raftengine.Writer, index uint64, data []byte) (any, error) {
	res, err := sm.apply(w, index, data)
	if err != nil {
		return nil, fmt.Errorf("extent %d: apply entry %d: %w", sm.id, index, err)
	}
	if res.Index == 0 {
		res.Index = index // a remembered reply keeps its first index
	}
	if res.Code != pb.Code_CODE_OK {
		sm.stats.refused.Add(1)
	}
	return res, nil
}

func (sm *StateMachine) apply(w raftengine.Writer, index uint64, data []byte) (*pb.CommandResult, error) {
	if len(data) > maxCommandBytes {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "command of %d bytes, limit %d", len(data), maxCommandBytes), nil
	}
	var cmd pb.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "decode command: %v", err), nil
	}
	meta, err := loadMeta(w)
	if err != nil {
		return nil, err
	}
	a := &applier{sm: sm, geo: sm.geo, w: w, index: index, meta: meta, clock: max(meta.ClockUnixMs, cmd.NowUnixMs)}
	if id := cmd.RequestId; id != 0 {
		prev, ok, err := a.rememberedReply(id)
		if err != nil {
			return nil, err
		}
		if ok {
			sm.stats.repeats.Add(1)
			return prev, nil // already applied: writes nothing
		}
	}
	var res *pb.CommandResult
	switch op := cmd.Op.(type) {
	case *pb.Command_Commit:
		res, err = a.commit(op.Commit)
	case *pb.Command_Prepare:
		res, err = a.prepare(op.Prepare)
	case *pb.Command_DecideRelease:
		res, err = a.decideRelease(op.DecideRelease)
	case *pb.Command_Release:
		res, err = a.release(op.Release)
	case *pb.Command_Abort:
		res, err = a.abort(op.Abort, false)
	case *pb.Command_Fence:
		res, err = a.abort(op.Fence, true)
	default:
		res = refusal(pb.Code_CODE_INVALID_ARGUMENT, "command without an operation")
	}
	if err != nil {
		return nil, err
	}
	if cmd.RequestId != 0 {
		// Refusals too: a repeat must not succeed where the first run,
		// whose reply the client may have seen, was refused.
		res.Index = index
		if err := a.rememberReply(cmd.RequestId, res); err != nil {
			return nil, err
		}
	}
	if a.dirty {
		if res.Code == pb.Code_CODE_OK {
			if err := a.gc(); err != nil {
				return nil, err
			}
		}
		if err := a.collectReplies(maxGCPerCommand, false); err != nil {
			return nil, err
		}
		a.meta.AppliedIndex, a.meta.ClockUnixMs = index, a.clock
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(a.meta)
		if err != nil {
			return nil, err
		}
		if err := w.Set(keyMeta, v); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// applier applies one command. Every handler validates and checks
// everything first (plan) and writes only once the command is sure to
// succeed, so a refused command changes nothing.
type applier struct {
	sm    *StateMachine
	geo   Geometry
	w     raftengine.Writer
	index uint64
	meta  *pb.Meta
	clock int64
	dirty bool
}

// step is one element, checked and resolved (which block an allocation
// takes).
type step struct {
	kind     ElementKind
	page     uint64 // write, check
	data     []byte
	block    uint64   // allocate, free
	newBlock blockRec // allocate: the new ownership
}

// validate checks elements against the extent's geometry: count, shape,
// ranges, sizes, and that no page or block is named twice.
func (a *applier) validate(elems []*pb.Element) *pb.CommandResult {
	sm := a.sm
	if len(elems) == 0 {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "an MPSC needs at least one element")
	}
	if len(elems) > MaxElements {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "%d elements: an MPSC has at most %d (MaxElements)", len(elems), MaxElements)
	}
	pages, blocks := map[uint64]bool{}, map[uint64]bool{}
	blockPointer := func(i int, p Pointer, what string) *pb.CommandResult {
		if res := sm.checkPagePointer(p); res != nil {
			return refusal(res.Code, "element %d: %s", i, res.Message)
		}
		if p.Page%a.geo.PagesPerBlock() != 0 {
			return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: %s page %d is not the first page of a block (%d pages each)", i, what, p.Page, a.geo.PagesPerBlock())
		}
		b := a.geo.BlockOf(p.Page)
		if blocks[b] {
			return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: block %d is named twice", i, b)
		}
		blocks[b] = true
		return nil
	}
	for i, e := range elems {
		if err := checkElementShape(e); err != nil {
			return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: %v", i, err)
		}
		switch op := e.Op.(type) {
		case *pb.Element_Write, *pb.Element_WriteDelta, *pb.Element_Check:
			var p Pointer
			switch w := op.(type) {
			case *pb.Element_Write:
				p = pointerFromProto(w.Write.Page)
				if n := len(w.Write.Data); n > int(a.geo.PageSizeBytes) {
					return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: %d bytes exceed the page size %d", i, n, a.geo.PageSizeBytes)
				}
			case *pb.Element_WriteDelta:
				p = pointerFromProto(w.WriteDelta.Page)
				// A script longer than the page it builds is never worth
				// sending (EncodeDelta sends at most half a page).
				if n := max(uint64(w.WriteDelta.Length), uint64(len(w.WriteDelta.Script))); n > uint64(a.geo.PageSizeBytes) {
					return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: page delta of %d bytes building %d exceeds the page size %d",
						i, len(w.WriteDelta.Script), w.WriteDelta.Length, a.geo.PageSizeBytes)
				}
			case *pb.Element_Check:
				p = pointerFromProto(w.Check.Page)
			}
			if _, isCheck := op.(*pb.Element_Check); !isCheck && p.ReadOnly {
				return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: cannot write through read-only pointer %v", i, p)
			}
			if res := sm.checkPagePointer(p); res != nil {
				return refusal(res.Code, "element %d: %s", i, res.Message)
			}
			if pages[p.Page] {
				return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: page %d is named twice", i, p.Page)
			}
			pages[p.Page] = true
		case *pb.Element_Allocate:
			if op.Allocate.ExtentId != sm.id {
				return refusal(pb.Code_CODE_INVALID_ARGUMENT, "element %d: allocation in extent %d sent to extent %d", i, op.Allocate.ExtentId, sm.id)
			}
			if !op.Allocate.AnyBlock {
				if res := blockPointer(i, pointerFromProto(op.Allocate.Block), "allocated block"); res != nil {
					return res
				}
			}
		case *pb.Element_Free:
			if res := blockPointer(i, pointerFromProto(op.Free.Block), "freed block"); res != nil {
				return res
			}
		}
	}
	return nil
}

// plan checks every element against the state as the elements before it
// leave it (so a write may follow the allocation of its block): ownership,
// locks held by prepared transactions, slots, free blocks. It writes
// nothing. It returns the steps, the per-element results known so far
// (allocated pointers), and the new free hint; or a refusal.
func (a *applier) plan(elems []*pb.Element) ([]step, []*pb.ElementResult, uint64, *pb.CommandResult, error) {
	blocks := map[uint64]blockRec{} // ownership as earlier elements leave it
	cleared := map[uint64]bool{}    // blocks whose pages an earlier element empties
	block := func(b uint64) (blockRec, error) {
		if r, ok := blocks[b]; ok {
			return r, nil
		}
		return getBlock(a.w, b)
	}
	held := func(b uint64, page uint64, what string) (*pb.CommandResult, error) {
		keys := [][]byte{blockLockKey(b)}
		if page != ^uint64(0) {
			keys = append(keys, pageLockKey(page))
		}
		for _, k := range keys {
			id, err := getHolder(a.w, k)
			if err != nil || id == 0 {
				if err != nil {
					return nil, err
				}
				continue
			}
			return a.sm.holderResult(a.w, id, what)
		}
		return nil, nil
	}
	hint := a.meta.FreeHint
	steps := make([]step, len(elems))
	results := make([]*pb.ElementResult, len(elems))
	for i, e := range elems {
		results[i] = &pb.ElementResult{}
		switch op := e.Op.(type) {
		case *pb.Element_Write, *pb.Element_WriteDelta, *pb.Element_Check:
			var p Pointer
			var expected uint64
			var delta *pb.DeltaWriteOp
			s := step{kind: KindCheck}
			switch w := op.(type) {
			case *pb.Element_Write:
				p, expected = pointerFromProto(w.Write.Page), w.Write.ExpectedSlot
				s.kind, s.data = KindWrite, w.Write.Data
			case *pb.Element_WriteDelta:
				delta = w.WriteDelta
				p, expected = pointerFromProto(delta.Page), delta.ExpectedSlot
				s.kind = KindWrite // s.data: rebuilt below, once the slot is checked
			case *pb.Element_Check:
				p, expected = pointerFromProto(w.Check.Page), w.Check.ExpectedSlot
			}
			s.page = p.Page
			b := a.geo.BlockOf(p.Page)
			blk, err := block(b)
			if err != nil {
				return nil, nil, 0, nil, err
			}
			if !blk.owns(p) {
				res := staleResult(p, blk)
				res.Message = fmt.Sprintf("element %d: %s", i, res.Message)
				return nil, nil, 0, res, nil
			}
			if res, err := held(b, p.Page, fmt.Sprintf("page %d", p.Page)); res != nil || err != nil {
				return nil, nil, 0, res, err
			}
			var slot uint64
			var base []byte // the page's bytes at slot (an emptied block's: none)
			if !cleared[b] {
				v, err := getOptional(a.w, pageKey(p.Page))
				if err != nil {
					return nil, nil, 0, nil, err
				}
				if v != nil {
					if slot, base, err = decodePage(v); err != nil {
						return nil, nil, 0, nil, err
					}
				}
			}
			if slot != expected {
				return nil, nil, 0, refusal(pb.Code_CODE_CONFLICT, "element %d: page %d is at slot %d, not %d", i, p.Page, slot, expected), nil
			}
			if delta != nil {
				// The slot is the writer's: base is the one page content
				// it names (delta.go), so the script rebuilds what the
				// writer meant, or the check below says it did not.
				data, err := ApplyDelta(base, PageDelta{Script: delta.Script, Length: delta.Length, CRC: delta.Crc32C}, int(a.geo.PageSizeBytes))
				if err != nil {
					a.sm.stats.deltaMismatches.Add(1)
					return nil, nil, 0, refusal(pb.Code_CODE_DELTA_MISMATCH, "element %d: page %d at slot %d: %v", i, p.Page, slot, err), nil
				}
				s.data = data
			}
			steps[i] = s
		case *pb.Element_Allocate:
			var b uint64
			var blk blockRec
			if op.Allocate.AnyBlock {
				found := false
				for b = hint; b < a.geo.Blocks(); b++ {
					var err error
					if blk, err = block(b); err != nil {
						return nil, nil, 0, nil, err
					}
					if blk.allocated {
						continue
					}
					id, err := getHolder(a.w, blockLockKey(b))
					if err != nil {
						return nil, nil, 0, nil, err
					}
					if id == 0 {
						found = true
						break
					}
				}
				if !found {
					return nil, nil, 0, refusal(pb.Code_CODE_NO_SPACE, "element %d: extent %d has no free block", i, a.sm.id), nil
				}
				hint = b + 1
			} else {
				want := pointerFromProto(op.Allocate.Block)
				b = a.geo.BlockOf(want.Page)
				var err error
				if blk, err = block(b); err != nil {
					return nil, nil, 0, nil, err
				}
				if blk.allocated || blk.generation != want.Generation {
					return nil, nil, 0, refusal(pb.Code_CODE_CONFLICT, "element %d: block %d is not free at generation %d (allocated %v, generation %d)",
						i, b, want.Generation, blk.allocated, blk.generation), nil
				}
				if res, err := held(b, ^uint64(0), fmt.Sprintf("block %d", b)); res != nil || err != nil {
					return nil, nil, 0, res, err
				}
				if b == hint {
					hint = b + 1
				}
			}
			nb := blockRec{generation: blk.generation + 1, tenant: op.Allocate.Tenant, allocated: true}
			blocks[b] = nb
			steps[i] = step{kind: KindAllocate, block: b, newBlock: nb}
			results[i].Block = Pointer{Extent: a.sm.id, Page: a.geo.FirstPage(b), Generation: nb.generation, Tenant: nb.tenant}.toProto()
		case *pb.Element_Free:
			p := pointerFromProto(op.Free.Block)
			b := a.geo.BlockOf(p.Page)
			blk, err := block(b)
			if err != nil {
				return nil, nil, 0, nil, err
			}
			if !blk.owns(p) {
				res := staleResult(p, blk)
				res.Message = fmt.Sprintf("element %d: %s", i, res.Message)
				return nil, nil, 0, res, nil
			}
			if res, err := held(b, ^uint64(0), fmt.Sprintf("block %d", b)); res != nil || err != nil {
				return nil, nil, 0, res, err
			}
			if id, err := a.sm.firstHeldPage(a.w, b); err != nil || id != 0 {
				if err != nil {
					return nil, nil, 0, nil, err
				}
				res, err := a.sm.holderResult(a.w, id, fmt.Sprintf("a page of block %d", b))
				return nil, nil, 0, res, err
			}
			blocks[b] = blockRec{generation: blk.generation + 1}
			cleared[b] = true
			hint = min(hint, b)
			steps[i] = step{kind: KindFree, block: b}
		}
	}
	return steps, results, hint, nil, nil
}

// execute carries out checked steps in order; results get the written
// slots. Allocations already reserved by a prepare do not move the hint
// again.
func (a *applier) execute(steps []step, results []*pb.ElementResult) error {
	ppb := a.geo.PagesPerBlock()
	for i, s := range steps {
		switch s.kind {
		case KindWrite:
			old, err := getOptional(a.w, pageKey(s.page))
			if err != nil {
				return err
			}
			if old == nil {
				a.meta.PagesUsed++
			}
			if err := a.w.Set(pageKey(s.page), encodePage(a.index, s.data)); err != nil {
				return err
			}
			results[i].Slot = a.index
		case KindAllocate:
			if err := a.w.Set(blockKey(s.block), s.newBlock.encode()); err != nil {
				return err
			}
			a.meta.BlocksAllocated++
		case KindFree:
			blk, err := getBlock(a.w, s.block)
			if err != nil {
				return err
			}
			first := a.geo.FirstPage(s.block)
			var n uint64
			if err := a.w.Scan(pageKey(first), pageKey(first+ppb), func(_, _ []byte) error { n++; return nil }); err != nil {
				return err
			}
			if err := a.w.DeleteRange(pageKey(first), pageKey(first+ppb)); err != nil {
				return err
			}
			a.meta.PagesUsed -= min(n, a.meta.PagesUsed)
			if err := a.w.Set(blockKey(s.block), blockRec{generation: blk.generation + 1}.encode()); err != nil {
				return err
			}
			a.meta.BlocksAllocated -= min(1, a.meta.BlocksAllocated)
			a.meta.FreeHint = min(a.meta.FreeHint, s.block)
		}
	}
	a.dirty = true
	return nil
}

func (a *applier) commit(c *pb.CommitCmd) (*pb.CommandResult, error) {
	if res := a.validate(c.Elements); res != nil {
		return res, nil
	}
	steps, results, hint, res, err := a.plan(c.Elements)
	if res != nil || err != nil {
		return res, err
	}
	a.meta.FreeHint = hint
	if err := a.execute(steps, results); err != nil {
		return nil, err
	}
	a.sm.stats.commits.Add(1)
	return &pb.CommandResult{Code: pb.Code_CODE_OK, Results: results}, nil
}

func (a *applier) checkExpiry(expiry int64) *pb.CommandResult {
	if limit := a.clock + (maxTxnLifetime + maxClockSkew).Milliseconds(); expiry > limit {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "expiry %s lies more than %v ahead of the extent's clock %s",
			fmtMs(expiry), maxTxnLifetime+maxClockSkew, fmtMs(a.clock))
	}
	if expiry <= 0 {
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "no expiry")
	}
	return nil
}

func fmtMs(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05.000") }

// prepare is P(data) of FSS §6 (or, with decide, the last extent's
// prepare-and-decide, which commits the transaction).
func (a *applier) prepare(c *pb.PrepareCmd) (*pb.CommandResult, error) {
	id := a.sm.id
	switch {
	case c.TxnId == 0:
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "no transaction id"), nil
	case c.PrevExtent == id || c.NextExtent == id || (c.PrevExtent != 0 && c.PrevExtent == c.NextExtent):
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "bad list pointers prev %d next %d at extent %d", c.PrevExtent, c.NextExtent, id), nil
	case c.Decide && (c.NextExtent != 0 || c.PrevExtent == 0):
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "prepare-and-decide is for the last extent of a list of two or more"), nil
	case !c.Decide && c.NextExtent == 0:
		return refusal(pb.Code_CODE_INVALID_ARGUMENT, "prepare needs a next extent"), nil
	}
	for _, e := range []uint64{c.PrevExtent, c.NextExtent} {
		if e != 0 && checkExtentID(e) != nil {
			return refusal(pb.Code_CODE_INVALID_ARGUMENT, "list pointer: %v", checkExtentID(e)), nil
		}
	}
	if res := a.checkExpiry(c.ExpiryUnixMs); res != nil {
		return res, nil
	}
	if res := a.validate(c.Elements); res != nil {
		return res, nil
	}
	rec, err := getRecord(a.w, c.TxnId)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		// A repeat of this step changes nothing; anything else is too late.
		// A prepare-and-decide repeated after recovery released the
		// decision (a COMMITTED tombstone: only this transaction's own
		// prepare-and-decide can have decided it here) is a repeat too:
		// refusing it told a coordinator whose first reply was lost that
		// a committed transaction had aborted.
		decided := rec.State == pb.TxnState_TXN_STATE_DECIDED || rec.State == pb.TxnState_TXN_STATE_COMMITTED
		if (rec.State == pb.TxnState_TXN_STATE_PREPARED && !c.Decide) || (decided && c.Decide) {
			return &pb.CommandResult{Code: pb.Code_CODE_OK, Record: summary(rec), Results: rec.Reserved}, nil
		}
		return &pb.CommandResult{Code: pb.Code_CODE_ABORTED, Message: fmt.Sprintf("transaction %016x is already %v here", c.TxnId, rec.State), Record: summary(rec)}, nil
	}
	if c.ExpiryUnixMs < a.clock {
		return refusal(pb.Code_CODE_ABORTED, "transaction %016x expired at %s (extent clock %s)", c.TxnId, fmtMs(c.ExpiryUnixMs), fmtMs(a.clock)), nil
	}
	steps, results, hint, res, err := a.plan(c.Elements)
	if res != nil || err != nil {
		return res, err
	}
	a.meta.FreeHint = hint
	rec = &pb.TxnRecord{
		TxnId: c.TxnId, ExtentId: id, PrevExtent: c.PrevExtent, NextExtent: c.NextExtent,
		ExpiryUnixMs: c.ExpiryUnixMs,
	}
	if c.Decide {
		if err := a.execute(steps, results); err != nil {
			return nil, err
		}
		rec.State = pb.TxnState_TXN_STATE_DECIDED
		a.sm.stats.prepareDecides.Add(1)
	} else {
		lock := binary.BigEndian.AppendUint64(nil, c.TxnId)
		for _, s := range steps {
			key := pageLockKey(s.page)
			if s.kind == KindAllocate || s.kind == KindFree {
				key = blockLockKey(s.block)
			}
			if err := a.w.Set(key, lock); err != nil {
				return nil, err
			}
		}
		rec.State = pb.TxnState_TXN_STATE_PREPARED
		rec.Elements, rec.Reserved = resolvedElements(c.Elements, steps), results
		a.sm.stats.prepares.Add(1)
	}
	if err := a.putRecord(rec); err != nil {
		return nil, err
	}
	a.meta.PendingTxns++
	a.dirty = true
	return &pb.CommandResult{Code: pb.Code_CODE_OK, Record: summary(rec), Results: results}, nil
}

// resolvedElements is a prepared part as its record keeps it: each page
// delta replaced by the write of the page plan rebuilt from it. Decide
// then applies what prepare checked, whatever happens to the base (which
// cannot change anyway: prepare locks the page, and no write, free or
// other transaction's prepare touches a locked page until the record is
// decided or aborted; invariant 4). The raft entry carried the delta; the
// record, a local write on each replica, carries the page.
func resolvedElements(elems []*pb.Element, steps []step) []*pb.Element {
	out, cloned := elems, false
	for i, e := range elems {
		d, ok := e.Op.(*pb.Element_WriteDelta)
		if !ok {
			continue
		}
		if !cloned {
			out, cloned = slices.Clone(elems), true
		}
		out[i] = &pb.Element{Op: &pb.Element_Write{Write: &pb.WriteOp{
			Page: d.WriteDelta.Page, ExpectedSlot: d.WriteDelta.ExpectedSlot, Data: steps[i].data}}}
	}
	return out
}

// recordSteps rebuilds the steps of a prepared part; its checks passed at
// prepare and its locks have kept them true since. A record holds no page
// deltas (resolvedElements).
func (a *applier) recordSteps(rec *pb.TxnRecord) []step {
	steps := make([]step, len(rec.Elements))
	for i, e := range rec.Elements {
		switch op := e.Op.(type) {
		case *pb.Element_Write:
			steps[i] = step{kind: KindWrite, page: op.Write.Page.Page, data: op.Write.Data}
		case *pb.Element_Check:
			steps[i] = step{kind: KindCheck, page: op.Check.Page.Page}
		case *pb.Element_Allocate:
			p := pointerFromProto(rec.Reserved[i].Block)
			steps[i] = step{kind: KindAllocate, block: a.geo.BlockOf(p.Page),
				newBlock: blockRec{generation: p.Generation, tenant: p.Tenant, allocated: true}}
		case *pb.Element_Free:
			steps[i] = step{kind: KindFree, block: a.geo.BlockOf(op.Free.Block.Page)}
		}
	}
	return steps
}

// unlock releases what a prepared part holds.
func (a *applier) unlock(steps []step) error {
	for _, s := range steps {
		key := pageLockKey(s.page)
		if s.kind == KindAllocate || s.kind == KindFree {
			key = blockLockKey(s.block)
		}
		if err := a.w.Set(key, freeLock); err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) txnRecord(c *pb.TxnCmd) (*pb.TxnRecord, *pb.CommandResult, error) {
	if c.TxnId == 0 {
		return nil, refusal(pb.Code_CODE_INVALID_ARGUMENT, "no transaction id"), nil
	}
	rec, err := getRecord(a.w, c.TxnId)
	if err != nil {
		return nil, nil, err
	}
	if rec == nil {
		rec = &pb.TxnRecord{TxnId: c.TxnId, ExtentId: a.sm.id, State: pb.TxnState_TXN_STATE_NONE}
	}
	return rec, nil, nil
}

func okRecord(rec *pb.TxnRecord, results []*pb.ElementResult) *pb.CommandResult {
	return &pb.CommandResult{Code: pb.Code_CODE_OK, Record: summary(rec), Results: results}
}

// decideRelease is FSS §6's decide-and-release of a prepared extent: apply
// the part, release the locks, leave a COMMITTED tombstone. On the last
// extent's DECIDED record it is a release (recovery walks the list sending
// it to every extent). Repeats and already released extents change
// nothing.
func (a *applier) decideRelease(c *pb.TxnCmd) (*pb.CommandResult, error) {
	rec, res, err := a.txnRecord(c)
	if res != nil || err != nil {
		return res, err
	}
	switch rec.State {
	case pb.TxnState_TXN_STATE_PREPARED:
		steps := a.recordSteps(rec)
		results := make([]*pb.ElementResult, len(steps))
		for i, r := range rec.Reserved {
			results[i] = &pb.ElementResult{Block: r.Block}
		}
		if err := a.execute(steps, results); err != nil {
			return nil, err
		}
		if err := a.unlock(steps); err != nil {
			return nil, err
		}
		t, err := a.tombstone(rec, pb.TxnState_TXN_STATE_COMMITTED)
		if err != nil {
			return nil, err
		}
		a.sm.stats.decideReleases.Add(1)
		return okRecord(t, results), nil
	case pb.TxnState_TXN_STATE_DECIDED:
		t, err := a.tombstone(rec, pb.TxnState_TXN_STATE_COMMITTED)
		if err != nil {
			return nil, err
		}
		a.sm.stats.releases.Add(1)
		return okRecord(t, nil), nil
	case pb.TxnState_TXN_STATE_ABORTED:
		return &pb.CommandResult{Code: pb.Code_CODE_ABORTED, Message: fmt.Sprintf("transaction %016x was aborted here", c.TxnId), Record: summary(rec)}, nil
	}
	return okRecord(rec, nil), nil
}

// release is the last step: the last extent forgets its DECIDED record.
func (a *applier) release(c *pb.TxnCmd) (*pb.CommandResult, error) {
	rec, res, err := a.txnRecord(c)
	if res != nil || err != nil {
		return res, err
	}
	if rec.State != pb.TxnState_TXN_STATE_DECIDED {
		return okRecord(rec, nil), nil
	}
	t, err := a.tombstone(rec, pb.TxnState_TXN_STATE_COMMITTED)
	if err != nil {
		return nil, err
	}
	a.sm.stats.releases.Add(1)
	return okRecord(t, nil), nil
}

// abort aborts a prepared part (releasing its locks and reservations), or,
// where the transaction has no record, leaves an ABORTED tombstone: the
// promise never to prepare or decide it (FSS §6). A fence does only the
// latter; a PREPARED, DECIDED or COMMITTED record is reported unchanged
// (the caller reads the state). A transaction past its expiry needs no
// tombstone: no extent prepares it any more.
func (a *applier) abort(c *pb.TxnCmd, fenceOnly bool) (*pb.CommandResult, error) {
	rec, res, err := a.txnRecord(c)
	if res != nil || err != nil {
		return res, err
	}
	switch rec.State {
	case pb.TxnState_TXN_STATE_NONE:
		if res := a.checkExpiry(c.ExpiryUnixMs); res != nil {
			return res, nil
		}
		rec.ExpiryUnixMs = c.ExpiryUnixMs
		if c.ExpiryUnixMs < a.clock {
			// Persisting the clock is the promise: from now on every
			// prepare of the transaction finds it expired, whatever the
			// clock of a later leader.
			rec.State = pb.TxnState_TXN_STATE_ABORTED
			a.dirty = true
			return okRecord(rec, nil), nil
		}
		t, err := a.tombstone(rec, pb.TxnState_TXN_STATE_ABORTED)
		if err != nil {
			return nil, err
		}
		a.sm.stats.fences.Add(1)
		return okRecord(t, nil), nil
	case pb.TxnState_TXN_STATE_PREPARED:
		if fenceOnly {
			return okRecord(rec, nil), nil
		}
		steps := a.recordSteps(rec)
		if err := a.unlock(steps); err != nil {
			return nil, err
		}
		for _, s := range steps {
			if s.kind == KindAllocate {
				a.meta.FreeHint = min(a.meta.FreeHint, s.block)
			}
		}
		t, err := a.tombstone(rec, pb.TxnState_TXN_STATE_ABORTED)
		if err != nil {
			return nil, err
		}
		a.sm.stats.aborts.Add(1)
		return okRecord(t, nil), nil
	}
	return okRecord(rec, nil), nil
}

func (a *applier) putRecord(rec *pb.TxnRecord) error {
	v, err := encodeTxnRecord(rec)
	if err != nil {
		return err
	}
	return a.w.Set(txnKey(rec.TxnId), v)
}

// tombstone replaces rec with a tombstone in state, collected
// tombstoneRetention after the transaction's expiry.
func (a *applier) tombstone(rec *pb.TxnRecord, state pb.TxnState) (*pb.TxnRecord, error) {
	if rec.State == pb.TxnState_TXN_STATE_PREPARED || rec.State == pb.TxnState_TXN_STATE_DECIDED {
		a.meta.PendingTxns -= min(1, a.meta.PendingTxns)
	}
	t := summary(rec)
	t.State = state
	if err := a.putRecord(t); err != nil {
		return nil, err
	}
	at := t.ExpiryUnixMs + tombstoneRetention.Milliseconds()
	if err := a.w.Set(gcKey(at, t.TxnId), nil); err != nil {
		return nil, err
	}
	if due := a.meta.GcDueUnixMs; due == 0 || at < due {
		a.meta.GcDueUnixMs = at
	}
	a.dirty = true
	return t, nil
}

// gc deletes up to maxGCPerCommand tombstones whose time has come, and
// notes when the next one is due (so most commands skip it).
// Deterministic: it depends only on the applied clock and the state.
func (a *applier) gc() error {
	if due := a.meta.GcDueUnixMs; due == 0 || a.clock < due {
		return nil
	}
	var keys [][]byte
	errEnough := fmt.Errorf("enough")
	err := a.w.Scan([]byte{prefixGC}, []byte{prefixGC + 1}, func(k, _ []byte) error {
		keys = append(keys, append([]byte(nil), k...))
		if len(keys) > maxGCPerCommand {
			return errEnough
		}
		return nil
	})
	if err != nil && err != errEnough {
		return err
	}
	a.meta.GcDueUnixMs = 0
	for i, k := range keys {
		if len(k) != 17 {
			return fmt.Errorf("%w: gc key of %d bytes", errCorrupt, len(k))
		}
		at := int64(binary.BigEndian.Uint64(k[1:]))
		if at > a.clock || i == maxGCPerCommand {
			a.meta.GcDueUnixMs = at
			break
		}
		id := binary.BigEndian.Uint64(k[9:])
		rec, err := getRecord(a.w, id)
		if err != nil {
			return err
		}
		if rec != nil && (rec.State == pb.TxnState_TXN_STATE_COMMITTED || rec.State == pb.TxnState_TXN_STATE_ABORTED) {
			if err := a.w.Delete(txnKey(id)); err != nil {
				return err
			}
		}
		if err := a.w.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
