package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// tltRecovering is three tractservers, one row being caught up by a
// replacement and one with a pending entry (growth); node 4 is dead and
// did not answer.
func tltRecovering() TLTView {
	s := func(n uint64) tract.ServerID { return tract.ServerID{Node: n} }
	t := &tract.Table{Version: 9, TractSize: 4 << 20, Replication: 3, Rows: []tract.Row{
		{Version: 1, Slots: []tract.ServerID{s(1), s(2), s(3)}},
		{Version: 9, Slots: []tract.ServerID{s(2), s(3), s(1)}},
		{Version: 8, Slots: []tract.ServerID{s(3), s(1), s(2)}, Pending: []tract.Pending{{Slot: 2, Server: s(4)}}},
	}}
	nodes := map[uint64]*dpb.Node{}
	for i := uint64(1); i <= 4; i++ {
		nodes[i] = &dpb.Node{Id: i, Address: "127.0.0.1:700" + string(rune('0'+i)), FailureDomain: "dev-" + string(rune('0'+i)), State: dpb.NodeState_NODE_STATE_ALIVE}
	}
	nodes[4].State = dpb.NodeState_NODE_STATE_DEAD
	row := func(r, v uint64, role tpb.RowRole, inSync bool, copied uint64) *tpb.RowStatus {
		return &tpb.RowStatus{Row: uint32(r), Version: v, Role: role, InSync: inSync, CopiedTracts: copied, CopiedBytes: copied << 22}
	}
	P, R := tpb.RowRole_ROW_ROLE_PRIMARY, tpb.RowRole_ROW_ROLE_REPLICA
	statuses := map[uint64]*tpb.StatusResponse{
		1: {Disks: []*tpb.DiskStatus{{Tracts: 30, Bytes: 120 << 20, RecoveredBytes: 8 << 20, Rows: []*tpb.RowStatus{row(0, 1, P, true, 0), row(1, 9, R, false, 2), row(2, 8, R, true, 0)}}}},
		2: {Disks: []*tpb.DiskStatus{{Tracts: 31, Bytes: 124 << 20, Rows: []*tpb.RowStatus{row(0, 1, R, true, 0), row(1, 9, P, true, 0), row(2, 8, R, true, 0)}}}},
		3: {Disks: []*tpb.DiskStatus{{Tracts: 29, Bytes: 116 << 20, Rows: []*tpb.RowStatus{row(0, 1, R, true, 0), row(1, 9, R, true, 0), row(2, 8, P, true, 0)}}}},
	}
	return buildTLTView(t, nodes, statuses, map[uint64]error{4: errors.New("connection refused")})
}

func TestTLTGolden(t *testing.T) {
	v := tltRecovering()
	if v.RowsCatchingUp != 2 {
		t.Fatalf("%d rows catching up, want 2 (a replacement copying, a pending entry of a dead node)", v.RowsCatchingUp)
	}
	var text, js bytes.Buffer
	if err := writeTLT(&text, v, true); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "tlt_recovering.txt", text.Bytes())
	if err := writeJSON(&js, v); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "tlt_recovering.json", js.Bytes())
}

// TestTLTWaiting: a row whose dead member holds the only complete copy
// (its live members still catching up) says so, and is counted.
func TestTLTWaiting(t *testing.T) {
	s := func(n uint64) tract.ServerID { return tract.ServerID{Node: n} }
	tab := &tract.Table{Version: 9, TractSize: 4 << 20, Replication: 3, Rows: []tract.Row{
		{Version: 9, Slots: []tract.ServerID{s(3), s(1), s(2)}},
		{Version: 9, Slots: []tract.ServerID{s(1), s(2), s(3)}},
	}}
	nodes := map[uint64]*dpb.Node{}
	for i := uint64(1); i <= 3; i++ {
		nodes[i] = &dpb.Node{Id: i, Address: "127.0.0.1:700" + string(rune('0'+i)), FailureDomain: "dev-" + string(rune('0'+i)), State: dpb.NodeState_NODE_STATE_ALIVE}
	}
	nodes[3].State = dpb.NodeState_NODE_STATE_DEAD
	R, P := tpb.RowRole_ROW_ROLE_REPLICA, tpb.RowRole_ROW_ROLE_PRIMARY
	statuses := map[uint64]*tpb.StatusResponse{
		1: {Disks: []*tpb.DiskStatus{{Rows: []*tpb.RowStatus{{Row: 0, Version: 9, Role: R, Slot: 1}, {Row: 1, Version: 9, Role: P, InSync: true, Readable: true}}}}},
		2: {Disks: []*tpb.DiskStatus{{Rows: []*tpb.RowStatus{{Row: 0, Version: 9, Role: R, Slot: 2}, {Row: 1, Version: 9, Role: R, Slot: 1, InSync: true, Readable: true}}}}},
	}
	v := buildTLTView(tab, nodes, statuses, map[uint64]error{3: errors.New("connection refused")})
	if v.RowsWaiting != 1 || len(v.Rows[0].WaitingFor) != 1 || v.Rows[0].WaitingFor[0] != "3/0" || len(v.Rows[1].WaitingFor) != 0 {
		t.Fatalf("waiting: %d rows, %+v", v.RowsWaiting, v.Rows)
	}
	var text bytes.Buffer
	if err := writeTLT(&text, v, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1 rows wait for a dead member", "waiting for 3/0: the only complete copy"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("arbor tlt says\n%s\nwithout %q", text.String(), want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, "always", "put", 100<<20, true)
	p.Add(25 << 20)
	line := p.line()
	if !strings.HasPrefix(line, "put      [=======>") || !strings.Contains(line, " 25%  25.0 MiB / 100.0 MiB") {
		t.Fatalf("progress line %q", line)
	}
	p.Finish()
	if !strings.Contains(out.String(), "25.0 MiB / 100.0 MiB") || !strings.HasSuffix(out.String(), "\n") {
		t.Fatalf("drawn: %q", out.String())
	}
	var quiet bytes.Buffer
	q := newProgress(&quiet, "auto", "get", 10, false) // not a terminal
	q.Add(5)
	q.Finish()
	if quiet.Len() != 0 {
		t.Fatalf("a progress bar drew on a non-terminal: %q", quiet.String())
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 30: "3.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestForEachTract(t *testing.T) {
	var seen atomic.Int64
	if err := forEachTract(context.Background(), 100, 7, func(_ context.Context, i uint64) error {
		seen.Add(int64(i) + 1)
		return nil
	}); err != nil || seen.Load() != 5050 {
		t.Fatalf("visited sum %d, err %v; want every tract once", seen.Load(), err)
	}
	boom := errors.New("boom")
	err := forEachTract(context.Background(), 1000, 4, func(_ context.Context, i uint64) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("forEachTract returned %v, want the first error", err)
	}
}

// TestForEachTractSlowStart: a transfer starts with transferWindowStart
// tracts in flight and admits one more per completion, up to the limit,
// so its first answer never waits for the whole limit to move.
func TestForEachTractSlowStart(t *testing.T) {
	const n, limit = 100, 16
	var (
		mu                               sync.Mutex
		inflight, completed, most, worst int
	)
	gate := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- forEachTract(context.Background(), n, limit, func(context.Context, uint64) error {
			mu.Lock()
			inflight++
			most = max(most, inflight)
			if over := inflight - min(limit, transferWindowStart+completed); over > worst {
				worst = over
			}
			mu.Unlock()
			<-gate
			mu.Lock()
			inflight--
			completed++
			mu.Unlock()
			return nil
		})
	}()
	// Release one tract at a time once every worker the window allows is
	// busy, so that the window can be seen to grow to the limit.
	for released := 0; released < n; released++ {
		want := min(limit, transferWindowStart+released, n-released)
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			now := inflight
			mu.Unlock()
			if now >= want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %d completions %d tracts in flight, want %d", released, now, want)
			}
			time.Sleep(time.Millisecond)
		}
		gate <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if worst > 0 {
		t.Errorf("up to %d tracts more in flight than the window allows", worst)
	}
	if most != limit {
		t.Errorf("at most %d tracts in flight, want the limit %d", most, limit)
	}
}

// TestWaitingLine: a step without progress reports shows its label and
// its time while it runs, only when asked for or on a terminal.
func TestWaitingLine(t *testing.T) {
	var buf syncBuffer
	stop := startWaiting(&buf, "always", "fsck")
	time.Sleep(waitingRedraw + 200*time.Millisecond)
	stop()
	out := buf.String()
	if !strings.Contains(out, "\rfsck     waiting for the cluster  1s") || !strings.HasSuffix(out, "\n") {
		t.Fatalf("waiting line %q", out)
	}
	var none bytes.Buffer
	startWaiting(&none, "auto", "fsck")()
	if none.Len() != 0 {
		t.Fatalf("drawn on a buffer with auto: %q", none.String())
	}
}
