package tract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/arbor-storage/arbor/internal/retry"

	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// This file rebuilds shards of erasure-coded tracts (FDS §3.2 for stripes):
// a tractserver that catches up a row (a new member, a promoted primary, a
// server back from an absence) makes sure it holds, for every
// erasure-coded tract of the row, the shard of its slot, decoding it from
// Data shards of the row's other members. Every affected row is rebuilt by
// its own new member, so all surviving disks read and all new ones write
// at once.

// errUndecodable says a stripe has fewer than Data shards of any one
// write among the shards listed.
var errUndecodable = errors.New("too few shards to decode")

// shardHolder is one member's shard of a stripe, as listed.
type shardHolder struct {
	server ServerID
	meta   *tpb.TractMeta
}

// bestGroup picks, among the shards held of a stripe, the write reads
// and rebuilds use (chooseWrite); it returns the holder of each index.
func bestGroup(holders []shardHolder, e ECLayout) (stripeWrite, map[int]shardHolder) {
	groups := map[stripeWrite]map[int]shardHolder{}
	for _, h := range holders {
		sh := h.meta.Shard
		if layoutOf(sh.Ec) != e || int(sh.Index) >= e.Width() {
			continue
		}
		g := writeOf(h.meta)
		if groups[g] == nil {
			groups[g] = map[int]shardHolder{}
		}
		if _, dup := groups[g][int(sh.Index)]; !dup {
			groups[g][int(sh.Index)] = h
		}
	}
	return chooseWrite(groups, e.Data)
}

// rowMembers lists a row's servers (slots and pending entries) but self.
func rowMembers(row Row, self ServerID) []ServerID {
	var out []ServerID
	for _, s := range row.Slots {
		if s != self {
			out = append(out, s)
		}
	}
	for _, p := range row.Pending {
		if p.Server != self && !containsServer(out, p.Server) {
			out = append(out, p.Server)
		}
	}
	return out
}

func containsServer(list []ServerID, s ServerID) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// listShards lists the shards member holds in row r, and member's state
// in the row.
func (d *disk) listShards(ctx context.Context, member ServerID, r uint32) ([]*tpb.TractEntry, *tpb.RowStatus, error) {
	c, err := d.svc.peer(ctx, member)
	if err != nil {
		return nil, nil, err
	}
	req := &tpb.ListRowRequest{Disk: member.Disk, Row: r, Shards: true}
	var out []*tpb.TractEntry
	for {
		lctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
		resp, err := c.ListRow(lctx, req)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		out = append(out, resp.Entries...)
		if !resp.More || len(resp.Entries) == 0 {
			return out, resp.Row, nil
		}
		last := resp.Entries[len(resp.Entries)-1]
		req.AfterGuid, req.AfterTract = last.Guid, last.Tract
	}
}

// rebuildShards rebuilds every shard of its slot this server lacks in row
// r (or holds of an older write, or of another index after a promotion).
// It fails if a stripe has fewer than Data shards of one write among the
// reachable members (it is retried); the row is not in sync until it
// succeeds.
//
// Most rows hold no erasure-coded tract, and a catch-up must not wait on
// every member to learn that (a member that does not answer costs an RPC
// timeout). A server that is not the row's primary therefore asks the
// primary first, and the other members only if the primary or this server
// holds a shard of the row, or the primary is not in sync. Every
// acknowledged stripe has at least D+1 of its D+P shards, so with P = 2 (or
// less) one of the two holds a shard of every stripe of the row, and a row
// where both hold none has no stripe to rebuild. With P >= 3 a stripe
// acknowledged while both were unreachable lacks both shards; if every
// stripe of the row is such a one, this catch-up skips them, and the
// shard is rewritten by the scrubber of the row's primary once that has
// rebuilt its own (it does so when it restarts, recheckShards): the
// stripe keeps D+1 shards meanwhile.
func (d *disk) rebuildShards(ctx context.Context, r uint32, row Row, slot int) (uint64, uint64, error) {
	holders := map[tractKey][]shardHolder{}
	own := 0
	for _, k := range d.store.RowTracts(r) {
		if m, ok := d.store.Get(k); ok && m.Shard != nil {
			holders[k] = append(holders[k], shardHolder{server: d.id, meta: m})
			own++
		}
	}
	var mu sync.Mutex
	unreachable := 0
	add := func(m ServerID, entries []*tpb.TractEntry, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			unreachable++
			d.log.Debug("list shards of a row member", "row", r, "member", m, "err", err)
			return
		}
		for _, e := range entries {
			k, err := checkTract(e.Guid, e.Tract, false)
			if err != nil || e.Meta.GetShard() == nil {
				continue
			}
			holders[k] = append(holders[k], shardHolder{server: m, meta: e.Meta})
		}
	}
	members := rowMembers(row, d.id)
	if primary := row.Slots[0]; primary != d.id {
		entries, st, err := d.listShards(ctx, primary, r)
		add(primary, entries, err)
		if err == nil && len(entries) == 0 && own == 0 && st.GetInSync() && st.GetVersion() == row.Version {
			return 0, 0, nil
		}
		members = slices.DeleteFunc(members, func(m ServerID) bool { return m == primary })
	}
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entries, _, err := d.listShards(ctx, m, r)
			add(m, entries, err)
		}()
	}
	wg.Wait()
	keys := make([]tractKey, 0, len(holders))
	for k := range holders {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	var (
		rebuilt, size uint64
		lost          int
		errs          []error
	)
	sem := make(chan struct{}, d.svc.cfg.FetchParallelism)
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := d.rebuildShard(ctx, k, r, row, slot, holders[k])
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, errShardChanged):
			case errors.Is(err, errUndecodable) && unreachable == 0:
				// Every member answered: the stripe cannot be decoded
				// (more than P shards lost, or a writer died between its
				// shard writes). It is reported, not retried, so that it
				// does not hold the row's catch-up back.
				lost++
				d.log.Error("erasure-coded tract cannot be rebuilt: too few shards of one write survive", "tract", k, "row", r, "err", err)
			case err != nil:
				errs = append(errs, fmt.Errorf("tract %s: %w", k, err))
			case n >= 0:
				rebuilt++
				size += uint64(n)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return rebuilt, size, ctx.Err()
	}
	if len(errs) > 0 {
		return rebuilt, size, fmt.Errorf("row %d: %d of %d stripes not rebuilt (%d members unreachable): %w", r, len(errs), len(keys), unreachable, errors.Join(errs[:min(len(errs), 3)]...))
	}
	if rebuilt > 0 || lost > 0 {
		d.log.Info("rebuilt shards of erasure-coded tracts", "row", r, "version", row.Version, "slot", slot, "shards", rebuilt, "bytes", size, "undecodable", lost)
	}
	return rebuilt, size, nil
}

// recheckShards rebuilds, after a restart, the shards of rows this server
// leads and trusted as complete (their catch-up is skipped): an
// erasure-coded write may have been acknowledged without this server's
// shard while it was down (the rows of the other members are caught up
// at start anyway). It retries a row until it succeeds or the row
// changes (a new version is caught up the usual way).
func (d *disk) recheckShards(ctx context.Context, t *Table, rows []uint32) {
	sem := make(chan struct{}, max(1, d.svc.cfg.FetchParallelism/4))
	var wg sync.WaitGroup
	for _, r := range rows {
		row := t.Rows[r]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempt := 0; ; attempt++ {
				sem <- struct{}{}
				_, _, err := d.rebuildShards(ctx, r, row, 0)
				<-sem
				if err == nil || ctx.Err() != nil {
					return
				}
				if cur, err := d.svc.currentTable(); err == nil && cur.Rows[r].Version != row.Version {
					return
				}
				d.log.Debug("recheck the shards of a row after a restart; retrying", "row", r, "err", err)
				if retry.Sleep(ctx, retry.Failover.Delay(attempt)) != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// rebuildShard makes this server hold shard slot of the stripe k, given
// the shards its members hold. It returns the bytes written, or -1 if the
// shard was already there.
func (d *disk) rebuildShard(ctx context.Context, k tractKey, r uint32, row Row, slot int, holders []shardHolder) (int, error) {
	var own *tpb.TractMeta
	var e ECLayout
	for _, h := range holders {
		if h.server == d.id {
			own = h.meta
		}
		if e.Data == 0 {
			e = layoutOf(h.meta.Shard.Ec)
		}
	}
	if slot >= e.Width() {
		return -1, nil // this slot is past the stripe's width
	}
	g, m := bestGroup(holders, e)
	if own != nil && own.Shard.WriteId == g.writeID && own.Incarnation == g.incarnation && int(own.Shard.Index) == slot {
		return -1, nil
	}
	if own != nil && int(own.Shard.Index) == slot && (own.Incarnation == g.incarnation && own.Shard.Generation > g.generation ||
		own.Incarnation != g.incarnation && d.svc.cfg.Now().Sub(time.UnixMilli(own.WrittenUnixMs)) < d.svc.cfg.TornStripeGrace) {
		// A client write newer than the stripe's decodable one (or a
		// recent one of a new incarnation): it is being written to all
		// the others. A shard that missed writes while its server was
		// away has an older generation and is rebuilt.
		return -1, nil
	}
	if len(m) < e.Data {
		return -1, fmt.Errorf("%w: %s stripe has %d shards of one write, needs %d", errUndecodable, e, len(m), e.Data)
	}
	data, desc, err := d.decodeShard(ctx, k, row, e, m, slot)
	if err != nil {
		return -1, err
	}
	var expect = &tpb.Stamp{}
	if own != nil {
		expect = own.Stamp
	}
	if _, err := d.putShard(k, int(r), row.Version, g.incarnation, desc, data, expect, nil); err != nil {
		return -1, err
	}
	d.svc.m.tractsRecovered.Add(1)
	d.svc.m.bytesRecovered.Add(uint64(len(data)))
	d.mu.Lock()
	if st := d.rows[r]; st != nil {
		st.copiedTracts++
		st.copiedBytes += uint64(len(data))
	}
	d.mu.Unlock()
	return len(data), nil
}

// decodeShard reads Data shards of one write (from their holders, this
// server's own locally) and computes shard `want`; it returns the shard
// and its description.
func (d *disk) decodeShard(ctx context.Context, k tractKey, row Row, e ECLayout, m map[int]shardHolder, want int) ([]byte, *tpb.Shard, error) {
	enc, err := d.svc.coders.get(e)
	if err != nil {
		return nil, nil, err
	}
	idx := make([]int, 0, len(m))
	for i := range m {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	shards := make([][]byte, e.Width())
	var desc *tpb.Shard
	got := 0
	var errs []error
	for _, i := range idx {
		if got == e.Data {
			break
		}
		h := m[i]
		data, err := d.fetchShard(ctx, k, row, h)
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %d from %s: %w", i, h.server, err))
			continue
		}
		if data == nil {
			data = []byte{} // a shard of an empty tract: present, not missing
		}
		shards[i] = data
		desc = h.meta.Shard
		got++
	}
	if got < e.Data {
		return nil, nil, fmt.Errorf("read %d of %d shards needed: %w", got, e.Data, errors.Join(errs...))
	}
	if shards[want] == nil {
		required := make([]bool, e.Width())
		required[want] = true
		if err := reconstructSome(enc, shards, required); err != nil {
			return nil, nil, err
		}
	}
	out := proto.Clone(desc).(*tpb.Shard)
	out.Index = uint32(want)
	return shards[want], out, nil
}

// reconstructSome fills the required shards; zero-length stripes (an
// empty tract) need no decoding.
func reconstructSome(enc reedsolomon.Encoder, shards [][]byte, required []bool) error {
	size := -1
	for _, s := range shards {
		if s != nil {
			size = len(s)
		}
	}
	if size == 0 {
		for i, r := range required {
			if r {
				shards[i] = []byte{}
			}
		}
		return nil
	}
	if err := enc.ReconstructSome(shards, required); err != nil {
		return fmt.Errorf("reconstruct: %w", err)
	}
	return nil
}

// fetchShard reads a holder's shard data, checking it against its record.
func (d *disk) fetchShard(ctx context.Context, k tractKey, row Row, h shardHolder) ([]byte, error) {
	if h.server == d.id {
		unlock := d.locks.lock(k)
		cur, ok := d.store.Get(k)
		unlock()
		if !ok || !stampEqual(cur.Stamp, h.meta.Stamp) {
			return nil, errShardChanged
		}
		return d.store.ReadData(k, cur)
	}
	resp, err := d.readPeerShard(ctx, h.server, k, row, h.meta.Incarnation, false)
	if err != nil {
		return nil, err
	}
	if !resp.Found || !stampEqual(resp.Meta.GetStamp(), h.meta.Stamp) {
		return nil, errShardChanged
	}
	return resp.Data, nil
}

// readPeerShard reads srv's shard of tract k (askShard), with the error
// mapped from the wire. It is the one remote shard read of the rebuild,
// the repair and the scrubber.
func (d *disk) readPeerShard(ctx context.Context, srv ServerID, k tractKey, row Row, incarnation uint64, metaOnly bool) (*tpb.ReadTractResponse, error) {
	c, err := d.svc.peer(ctx, srv)
	if err != nil {
		return nil, err
	}
	resp, err := askShard(ctx, c, d.svc.cfg.RPCTimeout, srv, k.guid, k.tract, row.Version, incarnation, metaOnly)
	if err != nil {
		return nil, fromWire(err)
	}
	return resp, nil
}

// askShard is the one ReadShard call of clients and servers: srv's shard
// of a tract (only its record, with metaOnly), its data checked against
// the record (CORRUPT if it does not match: damaged in transit). Found is
// false when srv holds no shard of the tract. A call's error is returned
// as the wire gave it.
func askShard(ctx context.Context, c tpb.TractServerClient, timeout time.Duration, srv ServerID, g GUID, tract int64, rowVersion, incarnation uint64, metaOnly bool) (*tpb.ReadTractResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.ReadShard(rctx, &tpb.ReadShardRequest{Disk: srv.Disk, Guid: g[:], Tract: tract, RowVersion: rowVersion,
		Incarnation: incarnation, MetaOnly: metaOnly})
	if err != nil {
		return nil, err
	}
	if !resp.Found || resp.Meta.GetShard() == nil {
		return &tpb.ReadTractResponse{}, nil
	}
	if !metaOnly && (len(resp.Data) != int(resp.Meta.Length) || Checksum(resp.Data) != resp.Meta.Crc32C) {
		return nil, errorf(tpb.ErrorCode_CORRUPT, "shard from %s does not match its record (in transit)", srv)
	}
	return resp, nil
}

// repairShard replaces this server's corrupt shard of tract k by decoding
// it from the row's other members.
func (d *disk) repairShard(ctx context.Context, k tractKey, own *tpb.TractMeta) (bool, error) {
	t, err := d.svc.currentTable()
	if err != nil {
		return false, err
	}
	ri := t.Locate(k.guid, k.tract)
	row := t.Rows[ri]
	slot, _, ok := row.RoleOf(d.id)
	if !ok {
		return false, fmt.Errorf("tractserver %s is not in row %d any more", d.id, ri)
	}
	var holders []shardHolder
	for _, m := range rowMembers(row, d.id) {
		if resp, err := d.readPeerShard(ctx, m, k, row, 0, true); err == nil && resp.Found {
			holders = append(holders, shardHolder{server: m, meta: resp.Meta})
		}
	}
	// Our own shard is corrupt: it is the one rebuilt, never a source.
	e := layoutOf(own.Shard.Ec)
	g, m := bestGroup(holders, e)
	if len(m) < e.Data {
		return false, fmt.Errorf("tract %s: %d good shards of one write, %s needs %d", k, len(m), e, e.Data)
	}
	data, desc, err := d.decodeShard(ctx, k, row, e, m, slot)
	if err != nil {
		return false, err
	}
	if _, err := d.putShard(k, ri, row.Version, g.incarnation, desc, data, own.Stamp, nil); err != nil {
		if errors.Is(err, errShardChanged) {
			return false, nil // rewritten meanwhile
		}
		return false, err
	}
	d.svc.m.repairs.Add(1)
	d.log.Info("repaired corrupt shard", "tract", k, "shard", slot, "write_id", g.writeID)
	return true, nil
}

// scrubStripes checks, for every erasure-coded tract whose row this server
// leads (slot 0), that every slot holds its shard of one write and that
// the parity matches the data; a slot that lacks its shard (or holds one
// of another write or index) gets it decoded and rewritten, conditional on
// the record read, so a concurrent client write is never undone.
func (d *disk) scrubStripes(ctx context.Context, res *tpb.ScrubResponse) {
	t, err := d.svc.currentTable()
	if err != nil {
		return
	}
	for _, k := range d.store.Keys() {
		if ctx.Err() != nil {
			return
		}
		own, ok := d.store.Get(k)
		if !ok || own.Shard == nil {
			continue
		}
		ri := t.Locate(k.guid, k.tract)
		row := t.Rows[ri]
		if row.Slots[0] != d.id {
			continue
		}
		if _, err := d.scrubStripe(ctx, k, row, layoutOf(own.Shard.Ec), res); err != nil {
			d.log.Warn("stripe parity check", "tract", k, "err", err)
		}
	}
}

// scrubStripe checks one stripe of row and rewrites its missing or
// stale shards (scrubStripes); whole reports that every slot then holds
// its shard of the stripe's write (false when a shard was left for later:
// a corrupt one its own server rebuilds, or one of a write that may be in
// progress).
func (d *disk) scrubStripe(ctx context.Context, k tractKey, row Row, e ECLayout, res *tpb.ScrubResponse) (whole bool, err error) {
	if len(row.Slots) < e.Width() {
		return false, fmt.Errorf("%s stripe in a row of %d slots", e, len(row.Slots))
	}
	enc, err := d.svc.coders.get(e)
	if err != nil {
		return false, err
	}
	reads := make([]shardRead, e.Width())
	var wg sync.WaitGroup
	for j := range e.Width() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reads[j] = d.readSlotShard(ctx, k, row, j)
		}()
	}
	wg.Wait()
	var holders []shardHolder
	for _, r := range reads {
		if r.err == nil && r.found {
			holders = append(holders, shardHolder{server: r.from, meta: r.meta})
		}
	}
	g, m := bestGroup(holders, e)
	if len(m) < e.Data {
		return false, fmt.Errorf("%d shards of one write readable, %s needs %d", len(m), e, e.Data)
	}
	res.CheckedStripes++
	// A shard of another write is rewritten only once every shard of the
	// stripe is older than the grace: a write in progress is left alone.
	settled := true
	for _, h := range holders {
		if d.svc.cfg.Now().Sub(time.UnixMilli(h.meta.WrittenUnixMs)) < d.svc.cfg.TornStripeGrace {
			settled = false
		}
	}
	shards := make([][]byte, e.Width())
	var bad []int
	left := false
	for j, r := range reads {
		switch {
		case r.err != nil && CodeOf(r.err) != tpb.ErrorCode_CORRUPT:
			return false, fmt.Errorf("slot %d: %w", j, r.err) // unreachable: judged next pass
		case r.err != nil:
			// A corrupt shard is rebuilt by its own server (the read
			// started it).
			left = true
		case r.found && int(r.meta.Shard.Index) == j && r.meta.Shard.WriteId == g.writeID && r.meta.Incarnation == g.incarnation:
			shards[j] = r.data
		case r.found && int(r.meta.Shard.Index) == j && r.meta.Incarnation == g.incarnation && !settled:
			// Another write, maybe in progress: judged next pass.
			left = true
		default:
			bad = append(bad, j)
		}
	}
	complete := true
	for _, s := range shards {
		if s == nil {
			complete = false
		}
	}
	var desc *tpb.Shard
	for _, h := range m {
		desc = h.meta.Shard
	}
	if complete && e.ShardSize(int(desc.TractLength)) > 0 {
		if ok, err := enc.Verify(shards); err != nil || !ok {
			res.ParityMismatches++
			d.log.Error("stripe parity does not match its data", "tract", k, "write_id", g.writeID, "err", err)
		}
		return true, nil
	}
	for _, j := range bad {
		data, sh, err := d.decodeShard(ctx, k, row, e, m, j)
		if err != nil {
			return false, err
		}
		target := row.Slots[j]
		c, err := d.svc.peer(ctx, target)
		if err != nil {
			return false, err
		}
		req := &tpb.WriteShardRequest{Disk: target.Disk, Guid: k.guid[:], Tract: k.tract, RowVersion: row.Version,
			Incarnation: g.incarnation, Shard: sh, Data: data, Crc32C: Checksum(data), Conditional: true}
		if reads[j].found {
			req.Expect = reads[j].meta.Stamp
		}
		wctx, cancel := context.WithTimeout(ctx, d.svc.cfg.RPCTimeout)
		_, err = c.WriteShard(wctx, req)
		cancel()
		if err != nil {
			return false, fmt.Errorf("rewrite shard %d on %s: %w", j, target, err)
		}
		res.RewrittenShards++
		d.log.Info("scrubber rewrote a stripe's shard", "tract", k, "shard", j, "on", target)
	}
	return !left, nil
}

// readSlotShard reads the shard slot j of row holds (this server's own
// locally).
func (d *disk) readSlotShard(ctx context.Context, k tractKey, row Row, j int) shardRead {
	srv := row.Slots[j]
	r := shardRead{from: srv, slot: j}
	if srv == d.id {
		m, ok := d.store.Get(k)
		if !ok || m.Shard == nil {
			return r
		}
		data, err := d.store.ReadData(k, m)
		if err != nil {
			r.err = errorf(tpb.ErrorCode_CORRUPT, "%v", err)
			if errors.Is(err, ErrCorrupt) {
				d.corrupt(k, err)
			}
			return r
		}
		r.found, r.meta, r.data = true, m, data
		return r
	}
	resp, err := d.readPeerShard(ctx, srv, k, row, 0, false)
	if err != nil {
		r.err = err
		return r
	}
	r.found, r.meta, r.data = resp.Found, resp.Meta, resp.Data
	return r
}
