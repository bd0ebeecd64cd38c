package extent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// expirySlack is added to a transaction's deadline to make its expiry, so
// that modest clock differences between coordinator and extents do not
// refuse prepares the coordinator still has time for.
const expirySlack = time.Second

// Outcome is what recovery found a transaction's fate to be.
type Outcome int

// Outcomes of Recover.
const (
	// OutcomeUnknown: recovery could not tell (see its error).
	OutcomeUnknown Outcome = iota
	// OutcomeNone: the extent named holds no record of the transaction
	// (it was never prepared there, or was released long ago): nothing
	// there to resolve.
	OutcomeNone
	// OutcomeCommitted: the transaction committed.
	OutcomeCommitted
	// OutcomeAborted: the transaction aborted; it never will commit.
	OutcomeAborted
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNone:
		return "none"
	case OutcomeCommitted:
		return "committed"
	case OutcomeAborted:
		return "aborted"
	}
	return "unknown"
}

func stepName(k pb.StepKind) string {
	switch k {
	case pb.StepKind_STEP_KIND_PREPARE:
		return "prepare"
	case pb.StepKind_STEP_KIND_PREPARE_DECIDE:
		return "prepare-and-decide"
	case pb.StepKind_STEP_KIND_DECIDE_RELEASE:
		return "decide-and-release"
	case pb.StepKind_STEP_KIND_RELEASE:
		return "release"
	case pb.StepKind_STEP_KIND_ABORT:
		return "abort"
	case pb.StepKind_STEP_KIND_FENCE:
		return "fence"
	}
	return k.String()
}

// step sends one transaction step to an extent: one raft entry there.
func (c *Client) step(ctx context.Context, kind pb.StepKind, extent, id, prev, next uint64, expiry int64, elems []*pb.Element) (*pb.TxnStepResponse, error) {
	c.steps.byKind[kind].Add(1)
	req := &pb.TxnStepRequest{
		ExtentId: extent, Kind: kind, TxnId: id, PrevExtent: prev, NextExtent: next,
		ExpiryUnixMs: expiry, Elements: elems, RequestId: randomID(),
	}
	resp, err := invoke(ctx, c, stepName(kind), extent, true, true, func(ctx context.Context, cl pb.ExtentClient) (*pb.TxnStepResponse, error) {
		return cl.TxnStep(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	if resp.Record == nil {
		return nil, newError(ErrAmbiguous, stepName(kind), extent, "reply carries no transaction record")
	}
	return resp, nil
}

func (c *Client) query(ctx context.Context, extent, id uint64) (*pb.TxnRecord, error) {
	resp, err := invoke(ctx, c, "query transaction", extent, false, false, func(ctx context.Context, cl pb.ExtentClient) (*pb.QueryTxnResponse, error) {
		return cl.QueryTxn(ctx, &pb.QueryTxnRequest{ExtentId: extent, TxnId: id})
	})
	if err != nil {
		return nil, err
	}
	if resp.Record == nil {
		return nil, newError(ErrUnavailable, "query transaction", extent, "reply carries no record")
	}
	return resp.Record, nil
}

// expiry is when a transaction started now with ctx's deadline expires.
func (c *Client) expiry(ctx context.Context) int64 {
	exp := c.cfg.Now().Add(defaultTxnLifetime)
	if dl, ok := ctx.Deadline(); ok && dl.Before(exp) {
		exp = dl
	}
	return exp.Add(expirySlack).UnixMilli()
}

// commitAcross is the coordinator of FSS §6's two-phase commit over the
// extents of parts (in list order), in 2n state transitions:
//
//  1. prepare at every extent but the last, all at once: each records its
//     part and its list pointers and locks what its part touches;
//  2. prepare-and-decide at the last, once every prepare succeeded: the
//     commit point, where the last part is written;
//  3. decide-and-release at every other extent, head first;
//  4. release at the last, after the caller has its answer (the last
//     extent holds no lock once decided, only its record): 2n-1 steps on
//     the critical path, n+1 rounds of them.
//
// Before the commit point any set of the prepares may have landed, but
// nothing can commit without the last extent, so whoever meets a prepared
// record and fences the list forward learns the transaction aborted; a
// prepare that lands after the fence or abort of its extent finds the
// tombstone and is refused. After the commit point what is not released
// forms a suffix, so anyone who meets a prepared record can tell the
// transaction committed (Recover). A failure before the commit point
// aborts every part that may have prepared, last first; a failure after
// it leaves the rest to recovery, in the background or by the next reader.
func (c *Client) commitAcross(ctx context.Context, parts []part, nElems int) ([]Result, error) {
	id := randomID()
	expiry := c.expiry(ctx)
	n := len(parts)
	results := make([]Result, nElems)
	put := func(p part, rs []*pb.ElementResult) {
		for i, r := range rs {
			if i >= len(p.pos) {
				break
			}
			res := &results[p.pos[i]]
			if r.GetSlot() != 0 {
				res.Slot = r.Slot
			}
			if r.GetBlock() != nil {
				res.Block = pointerFromProto(r.Block)
			}
		}
	}
	stepNo := 0
	crashed := func(kind pb.StepKind) bool {
		stepNo++
		return c.hooks.beforeStep != nil && c.hooks.beforeStep(stepNo, kind)
	}
	link := func(k int) (prev, next uint64) {
		if k > 0 {
			prev = parts[k-1].extent
		}
		if k < n-1 {
			next = parts[k+1].extent
		}
		return prev, next
	}

	// The prepares go out together (FSS §6's pipelining): they do not
	// depend on each other, only the commit point depends on them all.
	type prepared struct {
		resp *pb.TxnStepResponse
		err  error
	}
	outs := make([]prepared, n-1)
	var wg sync.WaitGroup
	for k := 0; k < n-1; k++ {
		if crashed(pb.StepKind_STEP_KIND_PREPARE) {
			// The prepares already sent may land or not: as after a
			// real crash.
			return nil, errCoordinatorCrashed
		}
		prev, next := link(k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.step(ctx, pb.StepKind_STEP_KIND_PREPARE, parts[k].extent, id, prev, next, expiry, parts[k].elems)
			outs[k] = prepared{resp, err}
		}()
	}
	wg.Wait()
	failed := -1
	for k, o := range outs {
		switch {
		case o.err == nil:
			put(parts[k], o.resp.Results)
		case failed < 0 || errors.Is(o.err, ErrAmbiguous) && !errors.Is(outs[failed].err, ErrAmbiguous):
			// An unknown outcome is the one to report: the caller must
			// know nothing changed only because the coordinator made sure.
			failed = k
		}
	}
	if failed >= 0 {
		return nil, c.abandon(ctx, id, expiry, parts, failed, outs[failed].err)
	}

	if crashed(pb.StepKind_STEP_KIND_PREPARE_DECIDE) {
		return nil, errCoordinatorCrashed
	}
	last := parts[n-1]
	prev, _ := link(n - 1)
	resp, err := c.step(ctx, pb.StepKind_STEP_KIND_PREPARE_DECIDE, last.extent, id, prev, 0, expiry, last.elems)
	switch {
	case err == nil:
		put(last, resp.Results)
	case !errors.Is(err, ErrAmbiguous):
		return nil, c.abandon(ctx, id, expiry, parts, n-1, err)
	default:
		// The commit point's outcome is unknown: fence the last extent,
		// which either shows the decision or promises there will be none.
		f, ferr := c.step(ctx, pb.StepKind_STEP_KIND_FENCE, last.extent, id, 0, 0, expiry, nil)
		if ferr != nil {
			c.background("recover after an unknown commit point", func(ctx context.Context) error {
				_, err := c.Recover(ctx, TxnRef{ID: id, Extent: parts[0].extent})
				return err
			})
			return nil, err
		}
		if s := f.Record.State; s != pb.TxnState_TXN_STATE_DECIDED && s != pb.TxnState_TXN_STATE_COMMITTED {
			return nil, c.abandon(ctx, id, expiry, parts, n-1,
				newError(ErrAborted, "commit", last.extent, "prepare-and-decide had an unknown outcome and the extent is now fenced: %v", err))
		}
	}

	for k := 0; k < n-1; k++ {
		if crashed(pb.StepKind_STEP_KIND_DECIDE_RELEASE) {
			return nil, errCoordinatorCrashed
		}
		resp, err := c.step(ctx, pb.StepKind_STEP_KIND_DECIDE_RELEASE, parts[k].extent, id, 0, 0, expiry, nil)
		if err != nil {
			// Committed: the rest of the clean-up is recovery's.
			from := parts[k].extent
			c.background("finish a committed transaction", func(ctx context.Context) error {
				_, err := c.Recover(ctx, TxnRef{ID: id, Extent: from})
				return err
			})
			return results, nil
		}
		put(parts[k], resp.Results)
	}
	if crashed(pb.StepKind_STEP_KIND_RELEASE) {
		return nil, errCoordinatorCrashed
	}
	c.background("release", func(ctx context.Context) error {
		if _, err := c.step(ctx, pb.StepKind_STEP_KIND_RELEASE, last.extent, id, 0, 0, expiry, nil); err != nil {
			_, err = c.Recover(ctx, TxnRef{ID: id, Extent: last.extent})
			return err
		}
		return nil
	})
	return results, nil
}

// abandon handles the failure err of the step at parts[k] before the
// commit point: it aborts every part that may have prepared, last first,
// and returns the error to report: those before k, and k itself if its
// step's outcome is unknown; with prepares running together (k < the
// last), every part but the last. The transaction can no longer commit
// (no prepare-and-decide was or will be sent), so even an ambiguous step
// leaves a definite outcome: nothing changed.
func (c *Client) abandon(ctx context.Context, id uint64, expiry int64, parts []part, k int, err error) error {
	ambiguous := errors.Is(err, ErrAmbiguous)
	upTo := k // parts[:upTo] may have prepared
	switch {
	case k < len(parts)-1:
		upTo = len(parts) - 1
	default:
		// The commit point itself failed: the walk starts there. Its
		// abort either leaves a tombstone (it can never decide, so the
		// prepared parts may go) or finds it decided (a refusal that
		// was not one) before any prepared part is unlocked.
		upTo = k + 1
	}
	if upTo > 0 {
		committed, aerr := c.abortBackward(ctx, id, expiry, parts[:upTo])
		if aerr != nil {
			// Prepares ran together: any of the parts may hold one, and a
			// walk from a part that never prepared finds nothing.
			c.background("abort", func(ctx context.Context) error {
				var errs []error
				for _, p := range parts[:upTo] {
					if _, err := c.Recover(ctx, TxnRef{ID: id, Extent: p.extent}); err != nil {
						errs = append(errs, err)
					}
				}
				return errors.Join(errs...)
			})
		}
		if committed {
			// An extent says the transaction is decided: the failed step
			// was not what it seemed. Only an unknown outcome is true to
			// the caller (the results are not known).
			return newError(ErrAmbiguous, "commit", parts[k].extent, "abandoned after %v, but %v", err, aerr)
		}
	}
	if ambiguous {
		return &Error{Kind: ErrAborted, Op: "commit", Extent: parts[k].extent,
			Msg: fmt.Sprintf("a step before the commit point had an unknown outcome, so the transaction was abandoned: %v", err)}
	}
	return err
}

// abortBackward aborts parts, last first. committed reports that an
// extent holds the transaction decided: it cannot be aborted.
func (c *Client) abortBackward(ctx context.Context, id uint64, expiry int64, parts []part) (committed bool, err error) {
	for k := len(parts) - 1; k >= 0; k-- {
		resp, err := c.step(ctx, pb.StepKind_STEP_KIND_ABORT, parts[k].extent, id, 0, 0, expiry, nil)
		if err != nil {
			return false, err
		}
		if s := resp.Record.State; s == pb.TxnState_TXN_STATE_DECIDED || s == pb.TxnState_TXN_STATE_COMMITTED {
			return true, newError(ErrAmbiguous, "abort", parts[k].extent, "transaction %016x is %v there", id, s)
		}
	}
	return false, nil
}

// Recover finishes or aborts the cross-extent transaction ref names, from
// the record at ref.Extent, by FSS §6's prefix/suffix rule:
//
//   - from a PREPARED record, walk the list forward, fencing each next
//     extent (one raft entry: a record there is reported, no record becomes
//     an ABORTED tombstone, the promise never to prepare or decide);
//   - reaching a DECIDED or COMMITTED extent means the transaction
//     committed and what is left is a suffix: walk back to its head and
//     decide-and-release forward from there, then release the last;
//   - reaching a fenced (ABORTED) extent means it never committed and what
//     is left is a prefix: abort backward from the last prepared extent.
//
// It is safe to run concurrently with the coordinator and with other
// recoveries: every step is idempotent and the walks keep the prefix or
// suffix intact. Readers that meet ErrPrepared call it, and every extent
// leader runs it in the background for transactions past their expiry.
// It returns the outcome it established; an error with a known outcome
// means part of the clean-up is left for later.
func (c *Client) Recover(ctx context.Context, ref TxnRef) (Outcome, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	rec, err := c.query(ctx, ref.Extent, ref.ID)
	if err != nil {
		return OutcomeUnknown, err
	}
	switch rec.State {
	case pb.TxnState_TXN_STATE_NONE:
		return OutcomeNone, nil
	case pb.TxnState_TXN_STATE_ABORTED:
		return OutcomeAborted, nil
	case pb.TxnState_TXN_STATE_COMMITTED, pb.TxnState_TXN_STATE_DECIDED:
		return c.finishCommit(ctx, rec)
	}
	cur := rec
	for range MaxElements {
		resp, err := c.step(ctx, pb.StepKind_STEP_KIND_FENCE, cur.NextExtent, ref.ID, 0, 0, cur.ExpiryUnixMs, nil)
		if err != nil {
			return OutcomeUnknown, err
		}
		switch next := resp.Record; next.State {
		case pb.TxnState_TXN_STATE_PREPARED:
			cur = next
		case pb.TxnState_TXN_STATE_DECIDED, pb.TxnState_TXN_STATE_COMMITTED:
			return c.finishCommit(ctx, rec)
		default:
			return c.abortFrom(ctx, cur)
		}
	}
	return OutcomeUnknown, newError(ErrInvalid, "recover", ref.Extent, "transaction %016x: list longer than %d extents", ref.ID, MaxElements)
}

// finishCommit moves a committed transaction's remaining suffix to
// released: back from start to the first extent still PREPARED, then
// decide-and-release forward (the last extent's DECIDED becomes released).
func (c *Client) finishCommit(ctx context.Context, start *pb.TxnRecord) (Outcome, error) {
	id := start.TxnId
	head := start
	for range MaxElements {
		if head.PrevExtent == 0 {
			break
		}
		prev, err := c.query(ctx, head.PrevExtent, id)
		if err != nil {
			return OutcomeCommitted, err
		}
		if prev.State != pb.TxnState_TXN_STATE_PREPARED {
			break
		}
		head = prev
	}
	ext := head.ExtentId
	for range MaxElements + 1 {
		if ext == 0 {
			return OutcomeCommitted, nil
		}
		resp, err := c.step(ctx, pb.StepKind_STEP_KIND_DECIDE_RELEASE, ext, id, 0, 0, head.ExpiryUnixMs, nil)
		if err != nil {
			return OutcomeCommitted, err
		}
		ext = resp.Record.NextExtent
	}
	return OutcomeCommitted, nil
}

// abortFrom aborts from the last prepared extent back to the head.
func (c *Client) abortFrom(ctx context.Context, last *pb.TxnRecord) (Outcome, error) {
	ext := last.ExtentId
	for range MaxElements + 1 {
		if ext == 0 {
			return OutcomeAborted, nil
		}
		resp, err := c.step(ctx, pb.StepKind_STEP_KIND_ABORT, ext, last.TxnId, 0, 0, last.ExpiryUnixMs, nil)
		if err != nil {
			return OutcomeAborted, err
		}
		if s := resp.Record.State; s == pb.TxnState_TXN_STATE_DECIDED || s == pb.TxnState_TXN_STATE_COMMITTED {
			return OutcomeUnknown, newError(ErrAmbiguous, "recover", ext, "transaction %016x is %v there after a fence: protocol violated", last.TxnId, s)
		}
		ext = resp.Record.PrevExtent
	}
	return OutcomeAborted, nil
}
