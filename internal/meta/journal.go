package meta

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
)

// The client's side of early replies (doc.go, Early replies). A session
// keeps every operation answered early in its journal until the store
// that answered it says it is durable; it replays, in the store's order,
// the ones the store lost (an abort, a crash, a restart); and before a
// mutation goes to one server it waits for what other servers answered
// early before (barrier), so that what survives a crash of servers and
// client together is a prefix of the session's operations.

// unsafeOp is one operation answered early, not yet known durable.
type unsafeOp struct {
	// Where it is now: the store (and its node) that answered it last, as
	// entry seq applied while the store had gen aborts.
	store, node, seq, gen uint64
	// lost: its store lost it (or cannot say): it waits for replay.
	lost bool
	safe bool // durable (or given up): gone from the journal
	// What to send again: routed by d, with header hdr (the first run's
	// request id) marked as a replay at now.
	d     uint64
	hdr   *pb.Header
	now   int64
	again func(ctx context.Context, cl pb.MetaClient, h *pb.Header) (*pb.Error, *pb.Ack, error)
	// failed is why its replay could not be applied.
	failed error
}

// journalStore is what the journal knows of one store.
type journalStore struct {
	id, node     uint64
	durable, gen uint64
	ops          []*unsafeOp // in seq order
	// genSeen is the largest abort count an answer of the store showed.
	genSeen  uint64
	polling  bool
	failures int
}

// journal is a session's unsafe operations.
type journal struct {
	m      *FSClient
	mu     sync.Mutex
	cond   *sync.Cond
	stores map[uint64]*journalStore
	count  int
	// lostOps wait for the replayer, in order (each store's lost ops in
	// its order; stores lost apart hold ops that were concurrent); failed counts replays that
	// could not be applied, not yet reported by a Sync.
	lostOps   []*unsafeOp
	replaying bool
	failed    int
	failure   error
	stats     JournalStats
	// waiters are barriers and syncs waiting: the pollers ask urgently.
	waiters int
}

// JournalStats counts what a session's journal did (fields only grow).
type JournalStats struct {
	// Early: operations answered early; Replayed: sent again after their
	// store lost them (or could not say); Failed: replays that could not
	// be applied.
	Early, Replayed, Failed int64
}

// maxJournal bounds a session's unsafe operations: past it, mutations
// wait for some to become durable.
const maxJournal = 1 << 14

// Journal timings: a store that does not answer safePollFailures
// WaitSafe calls in a row is taken for lost (its operations are replayed:
// harmless if it had them, since replays apply once); each call waits at
// most safePollWait; a replay is tried for up to replayTimeout.
const (
	safePollFailures = 2
	safePollWait     = 2 * time.Second
	replayTimeout    = 2 * time.Minute
)

// safePollPace is how long a poller waits between WaitSafe calls while
// nobody waits for durability: every answer to the session's requests
// carries its store's durable entry, so while the session is busy the
// polls mostly repeat what the answers said (a WaitSafe per group commit,
// a third of an untar's Meta calls per file). A barrier or sync (waiters),
// a journal half full, or an answer that shows an abort (gen) ends the
// wait at once; otherwise the journal only keeps its ops that much longer.
const safePollPace = 100 * time.Millisecond

func newJournal(m *FSClient) *journal {
	j := &journal{m: m, stores: map[uint64]*journalStore{}}
	j.cond = sync.NewCond(&j.mu)
	return j
}

// note records ack, the answer to op sent to node: a durable answer
// drops op, an early one keeps it; either way the store's durable news
// settles what it answered before.
func (j *journal) note(op *unsafeOp, node uint64, ack *pb.Ack) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.noteLocked(op, node, ack)
}

// noteLocked is note with j.mu held.
func (j *journal) noteLocked(op *unsafeOp, node uint64, ack *pb.Ack) {
	defer j.cond.Broadcast()
	if op != nil {
		j.dropLocked(op) // a replay leaves its old place
	}
	if ack == nil || ack.GetStore() == 0 {
		if op != nil {
			op.safe, op.lost = true, false
		}
		return
	}
	st := j.stores[ack.GetStore()]
	if op != nil {
		if ack.GetSeq() == 0 || (ack.GetDurable() >= ack.GetSeq() && ack.GetStoreGen() == ack.GetGen()) {
			op.safe, op.lost = true, false
		} else {
			if st == nil {
				st = &journalStore{id: ack.GetStore(), node: node, durable: ack.GetDurable(), gen: ack.GetStoreGen()}
				j.stores[st.id] = st
			}
			if !op.hdr.GetReplay() && op.store == 0 && op.seq == 0 {
				j.stats.Early++
			}
			op.store, op.node, op.seq, op.gen, op.lost, op.safe = st.id, node, ack.GetSeq(), ack.GetGen(), false, false
			insertBySeq(st, op)
			j.count++
			if op.gen < st.gen {
				// The store aborted entries after it applied op, and the
				// poller has already settled those aborts (or the answer
				// itself says so): whether op was among the lost is no
				// longer asked. Replay it (a replay applies once).
				op.lost = true
				j.collectLostLocked(st)
			}
			j.startPollLocked(st)
		}
	}
	if st != nil && ack.GetStoreGen() == st.gen && ack.GetDurable() > st.durable {
		st.durable = ack.GetDurable()
		j.settleLocked(st, nil)
	}
	if st != nil {
		st.genSeen = max(st.genSeen, ack.GetStoreGen()) // past gen: the poller asks what was lost
	}
}

func insertBySeq(st *journalStore, op *unsafeOp) {
	i := len(st.ops)
	for i > 0 && st.ops[i-1].seq > op.seq {
		i--
	}
	st.ops = append(st.ops, nil)
	copy(st.ops[i+1:], st.ops[i:])
	st.ops[i] = op
}

// dropLocked removes op from its store's list (it is safe, or moves).
func (j *journal) dropLocked(op *unsafeOp) {
	st := j.stores[op.store]
	if st == nil {
		return
	}
	for i, x := range st.ops {
		if x == op {
			st.ops = append(st.ops[:i], st.ops[i+1:]...)
			j.count--
			break
		}
	}
	if len(st.ops) == 0 && !st.polling {
		delete(j.stores, st.id)
	}
	op.store = 0
}

// settleLocked marks safe the ops of st that are durable: seq at most its
// durable entry and not lost by an abort since they were applied (lost
// lists the ranges the aborts after some op's gen lost, as WaitSafe said;
// nil: only ops applied at st's current gen are settled).
func (j *journal) settleLocked(st *journalStore, lost []*pb.SeqRange) {
	keep := st.ops[:0]
	for _, op := range st.ops {
		switch {
		case op.seq > st.durable:
			keep = append(keep, op)
		case op.gen == st.gen:
			op.safe = true
			j.count--
		case lost == nil:
			keep = append(keep, op) // an abort since: WaitSafe says which it lost
		case inRanges(op.seq, lost):
			keep = append(keep, op)
		default:
			op.safe = true
			j.count--
		}
	}
	clear(st.ops[len(keep):])
	st.ops = keep
}

func inRanges(seq uint64, rs []*pb.SeqRange) bool {
	for _, r := range rs {
		if seq >= r.GetFrom() && seq <= r.GetTo() {
			return true
		}
	}
	return false
}

// startPollLocked starts st's poller unless it runs.
func (j *journal) startPollLocked(st *journalStore) {
	if st.polling {
		return
	}
	st.polling = true
	j.m.wg.Add(1)
	go j.poll(st)
}

// poll asks st, while it has unsafe ops, how durable they are (WaitSafe),
// settles them, and hands the lost ones to the replayer.
func (j *journal) poll(st *journalStore) {
	defer j.m.wg.Done()
	for {
		j.mu.Lock()
		if len(st.ops) == 0 || j.m.stopped() {
			st.polling = false
			if len(st.ops) == 0 && j.stores[st.id] == st {
				delete(j.stores, st.id)
			}
			j.mu.Unlock()
			return
		}
		req := &pb.WaitSafeRequest{Fs: j.m.f, Store: st.id, After: st.durable, Gen: st.gen, Urgent: j.waiters > 0}
		node := st.node
		j.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), safePollWait)
		var resp *pb.WaitSafeResponse
		cl, err := j.m.c.peers.client(ctx, node)
		if err == nil {
			resp, err = cl.WaitSafe(ctx, req)
			if err == nil && resp.GetError() != nil {
				err = errorFromPB(resp.GetError())
			}
		}
		cancel()
		j.mu.Lock()
		switch {
		case err == nil && resp.GetUnknown():
			j.loseLocked(st, nil)
		case err == nil:
			st.failures = 0
			if resp.GetGen() > st.gen {
				for _, op := range st.ops {
					if op.gen < resp.GetGen() && inRanges(op.seq, resp.GetLost()) {
						op.lost = true
					}
				}
				st.gen = resp.GetGen()
			}
			st.durable = max(st.durable, resp.GetDurable())
			j.settleLocked(st, resp.GetLost())
			j.collectLostLocked(st)
			j.paceLocked(st)
		default:
			st.failures++
			if st.failures >= safePollFailures {
				j.m.c.log.Info("a metadata server that answered early does not say whether it made it durable; replaying", "node", node, "ops", len(st.ops), "err", err)
				j.loseLocked(st, nil)
			} else {
				j.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				j.mu.Lock()
			}
		}
		j.cond.Broadcast()
		j.mu.Unlock()
	}
}

// paceLocked waits up to safePollPace before st's next poll, unless
// someone waits for durability, the journal is half full, or an answer
// showed that st aborted entries (st.genSeen). It waits even when the
// answers settled all of st's ops: the poller then stays for the next
// ones instead of a new poller asking at once.
func (j *journal) paceLocked(st *journalStore) {
	deadline := time.Now().Add(safePollPace)
	for j.waiters == 0 && j.count < maxJournal/2 && st.genSeen <= st.gen && !j.m.stopped() {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		waitCond(context.Background(), j.cond, left)
	}
}

// loseLocked takes every op of st for lost.
func (j *journal) loseLocked(st *journalStore, _ error) {
	for _, op := range st.ops {
		op.lost = true
	}
	j.collectLostLocked(st)
}

// collectLostLocked moves st's lost ops to the replayer's queue (in
// order) and starts it.
func (j *journal) collectLostLocked(st *journalStore) {
	keep := st.ops[:0]
	for _, op := range st.ops {
		if op.lost {
			j.lostOps = append(j.lostOps, op)
			j.count--
			op.store = 0
		} else {
			keep = append(keep, op)
		}
	}
	clear(st.ops[len(keep):])
	st.ops = keep
	if len(j.lostOps) > 0 && !j.replaying {
		j.replaying = true
		j.m.wg.Add(1)
		go j.replay()
	}
}

// replay sends the lost ops again, oldest first, each to its table's
// owner now; then it tells each table it replayed to that it is done
// (SyncOpens), which lifts the table's gate for this session.
func (j *journal) replay() {
	defer j.m.wg.Done()
	touched := map[uint64]route{}
	for {
		j.mu.Lock()
		if len(j.lostOps) == 0 {
			j.replaying = false
			j.mu.Unlock()
			break
		}
		// The op stays in lostOps while it is replayed, so that a barrier
		// or sync that starts meanwhile waits for it (it is in no
		// store's list until note puts it in its new one).
		op := j.lostOps[0]
		j.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), replayTimeout)
		node, ack, err := j.m.replayOne(ctx, op, touched)
		cancel()
		j.mu.Lock()
		j.lostOps = j.lostOps[1:]
		j.stats.Replayed++
		if err != nil {
			op.safe = true
			op.failed = err
			j.stats.Failed++
			j.failed++
			j.failure = err
			j.m.c.log.Error("an operation answered early was lost by its metadata server and could not be applied again", "fs", j.m.f, "session", j.m.session, "err", err)
			j.cond.Broadcast()
			j.mu.Unlock()
			continue
		}
		j.noteLocked(op, node, ack)
		j.mu.Unlock()
	}
	for _, rt := range touched {
		ctx, cancel := context.WithTimeout(context.Background(), safePollWait)
		if cl, err := j.m.c.peers.client(ctx, rt.owner); err == nil {
			j.m.sendSyncOpens(ctx, rt, cl)
		}
		cancel()
	}
	j.mu.Lock()
	j.cond.Broadcast()
	j.mu.Unlock()
}

// awaitReplay waits while op, just answered, waits for a replay (note
// found its store had lost it already), and reports a replay that failed.
func (j *journal) awaitReplay(ctx context.Context, op *unsafeOp) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for op.lost && !op.safe {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: waiting for the replay of an operation its metadata server lost: %w", syscall.EIO, err)
		}
		waitCond(ctx, j.cond, 100*time.Millisecond)
	}
	if op.failed != nil {
		return op.failed
	}
	return nil
}

// barrier waits until every op answered before the call is durable or
// was applied (not lost) at node (0: durable, whatever its node): a
// mutation sent to node afterwards then cannot outlive them. The
// replayer leaves out the lost ops (withLost false): they wait for it.
func (j *journal) barrier(ctx context.Context, node uint64, withLost bool) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	waiting := false
	defer func() {
		if waiting {
			j.waiters--
		}
	}()
	var targets []*unsafeOp
	for _, st := range j.stores {
		// A store lives on one server (its id is drawn at random when it
		// opens), so its ops are all on node or all elsewhere: taken or
		// skipped whole, without a walk, as this runs before every request.
		if node == 0 || st.node != node {
			targets = append(targets, st.ops...)
		}
	}
	if withLost {
		targets = append(targets, j.lostOps...)
	}
	for {
		pending := 0
		for _, op := range targets {
			if op.safe || (op.lost && !withLost) {
				continue
			}
			if node == 0 || op.lost || op.store == 0 || op.node != node {
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		if !waiting {
			waiting = true
			j.waiters++
			j.cond.Broadcast() // pollers pacing themselves ask now
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: waiting for %d operations answered early to be durable: %w", syscall.EIO, pending, err)
		}
		waitCond(ctx, j.cond, 100*time.Millisecond)
	}
}

// full waits while the journal is at its bound.
func (j *journal) full(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.count >= maxJournal {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: %d operations answered early wait to be durable: %w", syscall.EIO, j.count, err)
		}
		waitCond(ctx, j.cond, 100*time.Millisecond)
	}
	return nil
}

// sync waits until every op answered so far is durable and reports (once)
// the replays that failed since the last sync.
func (j *journal) sync(ctx context.Context) error {
	if err := j.barrier(ctx, 0, true); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed > 0 {
		n, err := j.failed, j.failure
		j.failed, j.failure = 0, nil
		return fmt.Errorf("%w: %d operations answered earlier were lost in a metadata server failure (last: %w)", syscall.EIO, n, err)
	}
	return nil
}

// Stats returns the journal's counters.
func (j *journal) Stats() JournalStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stats
}

// pending returns how many ops the journal holds.
func (j *journal) pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.count + len(j.lostOps)
}
