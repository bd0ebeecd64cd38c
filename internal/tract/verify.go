package tract

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// maxVerifyProblems bounds the problems a report lists (it counts all).
const maxVerifyProblems = 100

// VerifyOptions narrow and observe a verification.
type VerifyOptions struct {
	// Blobs, if set, limits the check to these blobs (each must exist).
	Blobs []GUID
	// Parallelism is how many rows are checked at once (default 4).
	Parallelism int
	// Progress, if set, is called after each row with rows done and total.
	Progress func(done, total int)
}

// VerifyReport is the outcome of Verify. OK reports whether there were no
// problems.
type VerifyReport struct {
	TLTVersion uint64
	Rows       int
	Blobs      int
	// Data tracts checked, and replicas of them read and checksummed.
	Tracts, Replicas int
	// Erasure-coded tracts (stripes) whose parity was checked, and their
	// shards read and checksummed.
	Stripes, Shards int
	// Replicas of deleted blobs (or earlier incarnations) not yet
	// reclaimed by the scrubbers: not a problem.
	Garbage int
	// Unheld counts tracts inside live blobs that no member of their row
	// holds (in rows whose every member answered), and UnheldBlobs the
	// blobs none of whose tracts is held: lost, or never written (reading
	// them gives nothing; a write that failed after its blob was sized,
	// a file system's or a client's, leaves them behind, so the two cannot
	// be told apart). They are problems in a blob named in
	// VerifyOptions.Blobs; elsewhere they are only counted.
	Unheld, UnheldBlobs int
	// Problems found (the first maxVerifyProblems) and how many in all.
	Problems      []string
	ProblemsTotal int
}

// OK reports whether the verification found nothing wrong.
func (r *VerifyReport) OK() bool { return r.ProblemsTotal == 0 }

func (r *VerifyReport) problem(format string, args ...any) {
	r.ProblemsTotal++
	if len(r.Problems) < maxVerifyProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

type memberList struct {
	server  ServerID
	status  *tpb.RowStatus
	entries map[tractKey]*tpb.TractEntry
	err     error
}

// Verify checks that every tract of every live blob has its full replica
// count: each of the first r members of its row (r the blob's replication)
// is in sync at the row's current version, holds the tract at the same
// version as the primary, and its data matches its checksum (each replica
// is re-read); that each erasure-coded tract has all D+P shards of one
// write, shard i on slot i, each matching its checksum, and that the
// parity matches the data (every shard is read and the stripe's parity
// recomputed); and that each blob's metadata is identical on every member
// of its row. It reads every stored tract, so it takes as long as reading
// the cluster's data once.
func (c *Client) Verify(ctx context.Context, opts VerifyOptions) (*VerifyReport, error) {
	t, err := c.refresh(ctx, true)
	if err != nil {
		return nil, err
	}
	if opts.Parallelism <= 0 {
		opts.Parallelism = 4
	}
	rows := make([][]memberList, len(t.Rows))
	sem := make(chan struct{}, opts.Parallelism)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for ri := range t.Rows {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			lists := make([]memberList, len(t.Rows[ri].Slots))
			for j, s := range t.Rows[ri].Slots {
				lists[j] = c.listMember(ctx, s, ri)
			}
			mu.Lock()
			rows[ri] = lists
			done++
			if opts.Progress != nil {
				opts.Progress(done, len(t.Rows))
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep := &VerifyReport{TLTVersion: t.Version, Rows: len(t.Rows)}
	// Blob records, from the primary of each blob's metadata row.
	blobs := map[GUID]*tpb.BlobMeta{}
	for ri := range t.Rows {
		for k, e := range rows[ri][0].entries {
			if k.tract == MetadataTract && e.Meta.GetBlob() != nil {
				blobs[k.guid] = e.Meta.Blob
			}
		}
	}
	want := map[GUID]bool{}
	for _, g := range opts.Blobs {
		want[g] = true
		if b, ok := blobs[g]; !ok || b.Deleted {
			rep.problem("blob %s: no record on the primary of its metadata row", g)
		}
	}
	for g, b := range blobs {
		if !b.Deleted && (len(want) == 0 || want[g]) {
			rep.Blobs++
		}
	}
	var stripes []stripeCheck
	held := map[tractKey]bool{} // data tracts of this incarnation some member holds
	for ri, row := range t.Rows {
		lists := rows[ri]
		for _, l := range lists {
			switch {
			case l.err != nil:
				rep.problem("row %d: %s: %v", ri, l.server, l.err)
			case l.status.GetVersion() != row.Version || l.status.GetRole() == tpb.RowRole_ROW_ROLE_NONE:
				rep.problem("row %d: %s is at row version %d, not %d", ri, l.server, l.status.GetVersion(), row.Version)
			case !l.status.GetInSync():
				rep.problem("row %d: %s is still catching up", ri, l.server)
			}
		}
		keys := map[tractKey]bool{}
		for _, l := range lists {
			for k := range l.entries {
				keys[k] = true
			}
		}
		sorted := make([]tractKey, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].less(sorted[j]) })
		for _, k := range sorted {
			if len(want) > 0 && !want[k.guid] {
				continue
			}
			if k.tract == MetadataTract {
				ref := lists[0].entries[k]
				for _, l := range lists {
					e := l.entries[k]
					if l.err == nil && (e == nil || ref == nil || !stampEqual(e.Meta.GetStamp(), ref.Meta.GetStamp())) {
						rep.problem("blob %s: metadata on %s differs from the primary's", k.guid, l.server)
					}
				}
				continue
			}
			b := blobs[k.guid]
			if b == nil || b.Deleted || uint64(k.tract) >= b.LengthTracts {
				rep.Garbage++
				continue
			}
			for _, l := range lists {
				if e := l.entries[k]; e != nil && e.Meta.GetIncarnation() == b.Incarnation {
					held[k] = true
				}
			}
			if b.Ec != nil {
				if checkStripeRecords(rep, k, b, lists) {
					stripes = append(stripes, stripeCheck{k: k, row: row, b: b})
				}
				continue
			}
			ref := lists[0].entries[k]
			if ref != nil && ref.Meta.GetIncarnation() != b.Incarnation {
				rep.Garbage++
				continue
			}
			if ref == nil {
				// The primary lacks it; does anyone hold this incarnation?
				for _, l := range lists[1:] {
					if e := l.entries[k]; e != nil && e.Meta.GetIncarnation() == b.Incarnation {
						rep.problem("tract %s: missing on the primary %s, present on %s", k, lists[0].server, l.server)
						break
					}
				}
				continue
			}
			rep.Tracts++
			for j := 0; j < int(b.Replication) && j < len(lists); j++ {
				l := lists[j]
				if l.err != nil {
					continue // reported for the row
				}
				e := l.entries[k]
				switch {
				case e == nil:
					rep.problem("tract %s: replica %d on %s is missing", k, j, l.server)
				case !stampEqual(e.Meta.GetStamp(), ref.Meta.GetStamp()) || e.Meta.GetCrc32C() != ref.Meta.GetCrc32C() || e.Meta.GetLength() != ref.Meta.GetLength():
					rep.problem("tract %s: replica %d on %s is version %s (crc %08x), the primary's %s (crc %08x)", k, j, l.server,
						stampString(e.Meta.GetStamp()), e.Meta.GetCrc32C(), stampString(ref.Meta.GetStamp()), ref.Meta.GetCrc32C())
				case !e.Verified:
					rep.problem("tract %s: replica %d on %s fails its checksum", k, j, l.server)
				default:
					rep.Replicas++
				}
			}
		}
	}
	checkHeld(rep, t, rows, blobs, want, held)
	c.verifyStripes(ctx, rep, stripes, opts.Parallelism)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return rep, nil
}

// checkHeld reports the tracts inside live blobs that no member of their
// row holds (see VerifyReport.Unheld). A tract whose row had a member that
// could not be listed is not judged (the row is reported already).
func checkHeld(rep *VerifyReport, t *Table, rows [][]memberList, blobs map[GUID]*tpb.BlobMeta, want map[GUID]bool, held map[tractKey]bool) {
	guids := make([]GUID, 0, len(blobs))
	for g, b := range blobs {
		if !b.Deleted && (len(want) == 0 || want[g]) {
			guids = append(guids, g)
		}
	}
	sort.Slice(guids, func(i, j int) bool { return tractKey{guid: guids[i]}.less(tractKey{guid: guids[j]}) })
	for _, g := range guids {
		b := blobs[g]
		var unheld []int64
		judged := 0
		for i := int64(0); uint64(i) < b.LengthTracts; i++ {
			if slices.ContainsFunc(rows[t.Locate(g, i)], func(l memberList) bool { return l.err != nil }) {
				continue
			}
			judged++
			if !held[tractKey{g, i}] {
				unheld = append(unheld, i)
			}
		}
		switch {
		case len(unheld) == 0:
		case want[g]:
			for _, i := range unheld {
				rep.problem("tract %s: no replica holds it (lost, or never written)", tractKey{g, i})
			}
		default:
			rep.Unheld += len(unheld)
			if len(unheld) == judged && uint64(judged) == b.LengthTracts {
				rep.UnheldBlobs++
			}
		}
	}
}

// listMember lists everything a member holds in a row, verifying data.
func (c *Client) listMember(ctx context.Context, s ServerID, row int) memberList {
	l := memberList{server: s, entries: map[tractKey]*tpb.TractEntry{}}
	srv, err := c.peers.client(ctx, s.Node)
	if err != nil {
		l.err = err
		return l
	}
	// Replicas and metadata first, then shards of erasure-coded tracts (a
	// member holds one or the other under a tract's key).
	for _, shards := range []bool{false, true} {
		if !c.listMemberPart(ctx, srv, &l, row, shards) {
			return l
		}
	}
	return l
}

// listMemberPart adds one listing of a member to l; false on an error.
func (c *Client) listMemberPart(ctx context.Context, srv tpb.TractServerClient, l *memberList, row int, shards bool) bool {
	s := l.server
	req := &tpb.ListRowRequest{Disk: s.Disk, Row: uint32(row), Verify: true, Shards: shards}
	for {
		actx, cancel := context.WithTimeout(ctx, 4*c.cfg.AttemptTimeout)
		resp, err := srv.ListRow(actx, req)
		cancel()
		if err != nil {
			l.err = err
			return false
		}
		l.status = resp.Row
		for _, e := range resp.Entries {
			k, err := checkTract(e.Guid, e.Tract, true)
			if err != nil {
				l.err = err
				return false
			}
			l.entries[k] = e
		}
		if !resp.More || len(resp.Entries) == 0 {
			return true
		}
		last := resp.Entries[len(resp.Entries)-1]
		req.AfterGuid, req.AfterTract = last.Guid, last.Tract
	}
}
