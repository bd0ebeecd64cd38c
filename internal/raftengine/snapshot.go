package raftengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
)

// Snapshots.
//
// Raft asks for a snapshot (MsgSnap in a Ready) when a replica needs entries
// the leader has truncated, or when a new, empty replica joins. The engine
// never sends the snapshot raft built; it intercepts the MsgSnap and streams
// the group's state-machine key span as of the leader's current applied
// index A, captured with a pebble snapshot on the group's worker, so the
// data and A agree. A is at or past the truncation point raft asked for.
//
// The receiver:
//
//  1. asks its worker whether the snapshot is useful (the offer): it must be
//     newer than the replica's commit index, not already in its log, name
//     the replica in its configuration, and come from a current term;
//  2. writes the pairs, prefixed, plus the applied state (A, term, conf
//     state) into sstables in Store.Dir/snapshots;
//  3. on its worker, checks the offer conditions again (raft state may have
//     moved), then ingests the files with IngestAndExcise over the group's
//     whole 's' span. The old state-machine data and applied state vanish
//     and the new ones appear in one atomic step;
//  4. steps a MsgSnap carrying (A, term, conf state) into raft, which resets
//     its log to start after A, and persists that reset.
//
// The raft log is never wiped before the new state is in place. Wiping it
// first would be unsafe: the replica may hold entries it acknowledged and
// that a quorum counted on. A crash between steps 3 and 4 leaves the applied
// state ahead of the log; loadLogStore finishes step 4 on restart.

var errSnapshotDeclined = errors.New("raftengine: snapshot declined")

// snapshotSSTBytes bounds each staged sstable.
const snapshotSSTBytes = 64 << 20

// startSnapshot begins streaming a snapshot to the replica raft named in m.
func (g *group) startSnapshot(m *raftpb.Message) {
	to := m.GetTo()
	if _, busy := g.snapshotsOut[to]; busy {
		return
	}
	snap := g.e.db.NewSnapshot()
	var ap enginepb.AppliedState
	if err := getProto(snap, appliedKey(g.id), &ap); err != nil {
		_ = snap.Close()
		g.e.log.Error("snapshot: read applied state", "group", g.id, "err", err)
		g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	cs := &raftpb.ConfState{}
	if err := proto.Unmarshal(ap.GetConfState(), cs); err != nil {
		_ = snap.Close()
		g.e.log.Error("snapshot: decode conf state", "group", g.id, "err", err)
		g.rn.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	out := &outgoingSnapshot{
		header: SnapshotHeader{
			GroupID: g.id, From: g.e.cfg.NodeID, To: to,
			Index: ap.GetIndex(), Term: ap.GetTerm(), MessageTerm: g.term,
			ConfState: cs, Descriptor: g.desc,
		},
		snap:       snap,
		prefix:     dataPrefix(g.id),
		chunkBytes: g.e.cfg.SnapshotChunkBytes,
	}
	g.snapshotsOut[to] = ap.GetIndex()
	g.e.wg.Add(1)
	go func() {
		defer g.e.wg.Done()
		applied, err := g.e.sendSnapshot(out)
		g.enqueue(func(in *inbox) {
			in.snapReports = append(in.snapReports, snapshotReport{to: to, failed: err != nil || !applied})
		})
	}()
}

func (e *Engine) sendSnapshot(out *outgoingSnapshot) (bool, error) {
	defer out.Close()
	select {
	case e.snapshotSlots <- struct{}{}:
		defer func() { <-e.snapshotSlots }()
	case <-e.ctx.Done():
		return false, ErrStopped
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.SnapshotTimeout)
	defer cancel()
	start := time.Now()
	h := out.header
	applied, err := e.cfg.Transport.SendSnapshot(ctx, h.To, out)
	e.metrics.snapshotsSent.Add(1)
	e.metrics.snapshotBytesSent.Add(out.bytes)
	if err != nil {
		e.log.Warn("snapshot send failed", "group", h.GroupID, "to", h.To, "index", h.Index, "err", err)
		return false, err
	}
	e.log.Info("snapshot sent", "group", h.GroupID, "to", h.To, "index", h.Index,
		"bytes", out.bytes, "applied", applied, "took", time.Since(start).Round(time.Millisecond))
	return applied, nil
}

type outgoingSnapshot struct {
	header     SnapshotHeader
	snap       *pebble.Snapshot
	prefix     []byte
	chunkBytes int
	iter       *pebble.Iterator
	done       bool
	bytes      uint64
}

func (o *outgoingSnapshot) Header() SnapshotHeader { return o.header }

func (o *outgoingSnapshot) Next() ([]KV, error) {
	if o.done {
		return nil, io.EOF
	}
	if o.iter == nil {
		iter, err := o.snap.NewIter(&pebble.IterOptions{LowerBound: o.prefix, UpperBound: prefixEnd(o.prefix)})
		if err != nil {
			return nil, err
		}
		o.iter = iter
		iter.First()
	}
	var out []KV
	size := 0
	for ; o.iter.Valid() && size < o.chunkBytes; o.iter.Next() {
		kv := KV{
			Key:   append([]byte(nil), o.iter.Key()[len(o.prefix):]...),
			Value: append([]byte(nil), o.iter.Value()...),
		}
		size += len(kv.Key) + len(kv.Value)
		out = append(out, kv)
	}
	if err := o.iter.Error(); err != nil {
		return nil, err
	}
	o.bytes += uint64(size)
	if !o.iter.Valid() {
		o.done = true
		if len(out) == 0 {
			return nil, io.EOF
		}
	}
	return out, nil
}

func (o *outgoingSnapshot) Close() error {
	var err error
	if o.iter != nil {
		err = o.iter.Close()
		o.iter = nil
	}
	if o.snap != nil {
		err = errors.Join(err, o.snap.Close())
		o.snap = nil
	}
	return err
}

// snapshotAcceptable mirrors the conditions under which raft installs a
// snapshot (raft.restore), so that data is only ingested when raft will
// accept it in the same worker step.
func (g *group) snapshotAcceptable(h SnapshotHeader) bool {
	st := g.rn.BasicStatus()
	if st.RaftState == raft.StateLeader || h.MessageTerm < st.HardState.GetTerm() {
		return false
	}
	if h.Index <= st.HardState.GetCommit() {
		return false
	}
	if t, err := g.store.Term(h.Index); err == nil && t == h.Term {
		return false // the log has it: raft only advances its commit index
	}
	for _, set := range [][]uint64{h.ConfState.GetVoters(), h.ConfState.GetLearners(), h.ConfState.GetVotersOutgoing()} {
		for _, id := range set {
			if id == g.e.cfg.NodeID {
				return true
			}
		}
	}
	return false
}

// installSnapshot runs on the group's worker: steps 3 and 4 above.
func (g *group) installSnapshot(inst *snapshotInstall) error {
	h := inst.header
	if !g.snapshotAcceptable(h) {
		return errSnapshotDeclined
	}
	start, end := stateSpan(g.id)
	if _, err := g.e.db.IngestAndExcise(g.e.ctx, inst.paths, nil, nil, pebble.KeyRange{Start: start, End: end}); err != nil {
		// The ingest is atomic: on error nothing changed.
		g.e.log.Error("snapshot ingest failed", "group", g.id, "err", err)
		return fmt.Errorf("ingest snapshot: %w: %w", errSnapshotDeclined, err)
	}
	g.applied, g.appliedTerm = h.Index, h.Term
	g.confState = proto.CloneOf(h.ConfState)
	g.store.confState = g.confState
	if err := g.sm.Load(prefixReader{r: g.e.db, prefix: dataPrefix(g.id)}); err != nil {
		return fmt.Errorf("load state machine from snapshot: %w", err)
	}
	// Counted as soon as the state machine shows the snapshot, so that
	// nobody sees the state without the count.
	g.e.metrics.snapshotsApplied.Add(1)
	g.unquiesce()
	if err := g.rn.Step(&raftpb.Message{
		Type: raftpb.MessageType_MsgSnap.Enum(),
		From: proto.Uint64(h.From),
		To:   proto.Uint64(g.e.cfg.NodeID),
		Term: proto.Uint64(h.MessageTerm),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
			Index: proto.Uint64(h.Index), Term: proto.Uint64(h.Term), ConfState: proto.CloneOf(h.ConfState),
		}},
	}); err != nil {
		return fmt.Errorf("step snapshot: %w", err)
	}
	for g.rn.HasReady() {
		if err := g.handleReadyNow(); err != nil {
			return err
		}
	}
	g.e.log.Info("snapshot installed", "group", g.id, "index", h.Index, "from", h.From)
	return nil
}

// HandleSnapshot implements Handler: steps 1 to 3 above.
func (e *Engine) HandleSnapshot(ctx context.Context, h SnapshotHeader, next func() ([]KV, error)) (bool, error) {
	if h.To != e.cfg.NodeID {
		return false, fmt.Errorf("raftengine: snapshot for node %d delivered to node %d", h.To, e.cfg.NodeID)
	}
	g := e.group(h.GroupID)
	if g == nil {
		return false, fmt.Errorf("group %d: %w", h.GroupID, ErrGroupNotFound)
	}
	if e.store.Full() {
		return false, fmt.Errorf("snapshot of group %d: %w", h.GroupID, ErrDiskFull)
	}
	offer := &snapshotOffer{header: h, reply: make(chan bool, 1)}
	if !g.enqueue(func(in *inbox) { in.offers = append(in.offers, offer) }) {
		return false, ErrStopped
	}
	select {
	case ok := <-offer.reply:
		if !ok {
			return false, nil
		}
	case <-ctx.Done():
		return false, ctx.Err()
	}

	paths, err := e.stageSnapshot(h, next)
	defer func() {
		for _, p := range paths {
			_ = e.store.Options.FS.Remove(p)
		}
	}()
	if err != nil {
		return false, fmt.Errorf("receive snapshot: %w", err)
	}
	inst := &snapshotInstall{header: h, paths: paths, reply: make(chan error, 1)}
	if !g.enqueue(func(in *inbox) { in.installs = append(in.installs, inst) }) {
		return false, ErrStopped
	}
	select {
	case err := <-inst.reply:
		if errors.Is(err, errSnapshotDeclined) {
			return false, nil
		}
		return err == nil, err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// stageSnapshot writes the received pairs into sstables ready to ingest.
func (e *Engine) stageSnapshot(h SnapshotHeader, next func() ([]KV, error)) (paths []string, err error) {
	fs := e.store.Options.FS
	prefix := dataPrefix(h.GroupID)
	seq := e.snapshotSeq.Add(1)
	var w *sstable.Writer
	var size int
	open := func() error {
		p := filepath.Join(e.store.snapshotDir(), fmt.Sprintf("g%d-%d-%d.sst", h.GroupID, seq, len(paths)))
		f, err := fs.Create(p, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		paths = append(paths, p)
		w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), e.store.Options.MakeWriterOptions(0, e.db.TableFormat()))
		size = 0
		return nil
	}
	defer func() {
		if w != nil {
			err = errors.Join(err, w.Close())
		}
	}()
	if err := open(); err != nil {
		return paths, err
	}
	cs, err := proto.Marshal(h.ConfState)
	if err != nil {
		return paths, err
	}
	ap, err := proto.Marshal(&enginepb.AppliedState{Index: h.Index, Term: h.Term, ConfState: cs})
	if err != nil {
		return paths, err
	}
	if err := w.Set(appliedKey(h.GroupID), ap); err != nil {
		return paths, err
	}
	key := make([]byte, 0, 64)
	for {
		kvs, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return paths, err
		}
		for _, kv := range kvs {
			if size >= snapshotSSTBytes {
				if err := w.Close(); err != nil {
					w = nil
					return paths, err
				}
				w = nil
				if err := open(); err != nil {
					return paths, err
				}
			}
			key = append(append(key[:0], prefix...), kv.Key...)
			if err := w.Set(key, kv.Value); err != nil {
				return paths, fmt.Errorf("snapshot pairs out of order or malformed: %w", err)
			}
			size += len(key) + len(kv.Value)
		}
	}
	err = w.Close()
	w = nil
	return paths, err
}
