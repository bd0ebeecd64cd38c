package overview

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ComputeRecovery derives re-replication progress from o's TLT and extent
// sections.
func ComputeRecovery(o Overview) Recovery {
	r := Recovery{Rows: len(o.TLT.Rows), RowsCatchingUp: o.TLT.RowsCatchingUp, RecoveredBytes: o.TLT.RecoveredBytes}
	down := downServers(o.TLT)
	for _, row := range o.TLT.Rows {
		if slices.ContainsFunc(row.Behind, func(b string) bool { return !down[behindServer(b)] }) {
			r.RowsRecovering++
		}
	}
	r.InProgress = r.RowsRecovering > 0
	states := nodeStates(o.Nodes)
	for _, e := range o.Extents.Extents {
		if liveReplicas(e, states) < int(e.Replication) {
			r.ExtentsUnderReplicated++
		}
	}
	return r
}

// ComputeDegraded lists what in o needs attention, in a stable order:
// unreadable sections, the directory, nodes, the TLT, extents, tables.
// It reads only o, so callers (and tests) can build o by hand.
func ComputeDegraded(o Overview) []Problem {
	out := []Problem{}
	add := func(kind, subject, format string, args ...any) {
		out = append(out, Problem{Kind: kind, Subject: subject, Message: fmt.Sprintf(format, args...)})
	}
	for _, s := range []struct{ name, err string }{
		{"directory", o.Directory.Error}, {"capacity", o.Capacity.Error}, {"tlt", o.TLT.Error},
		{"extents", o.Extents.Error}, {"tables", o.Tables.Error}, {"file_systems", o.FileSystems.Error},
	} {
		if s.err != "" {
			add(KindSectionUnavailable, s.name, "could not be read: %s", s.err)
		}
	}
	if o.Directory.Error == "" && o.Directory.Leader == 0 {
		msg := "no leader (no quorum?): failure detection, placement and metadata changes wait for one"
		if o.Directory.Stale && o.Directory.AnsweredBy != 0 {
			msg += fmt.Sprintf("; this is node %d's possibly stale view", o.Directory.AnsweredBy)
		}
		add(KindNoDirectoryLeader, "directory", "%s", msg)
	}
	for _, n := range o.Nodes {
		since := ""
		if n.StateChangedUnixMs > 0 {
			since = " since " + time.UnixMilli(n.StateChangedUnixMs).UTC().Format(time.RFC3339)
		}
		switch n.State {
		case StateDead:
			add(KindNodeDead, nodeName(n.ID), "dead%s (%s); its data is re-replicated elsewhere", since, dash(n.Address))
		case StateSuspect:
			add(KindNodeSuspect, nodeName(n.ID), "suspect%s (%s): its heartbeats are late", since, dash(n.Address))
		}
	}
	states := nodeStates(o.Nodes)
	if len(o.TLT.Rows) > 0 {
		// A row is short of a replica while one of its slots is on a server
		// the failure detector has given up on.
		down := downServers(o.TLT)
		var downNames []string
		for _, s := range o.TLT.Servers {
			if down[s.Server] {
				downNames = append(downNames, s.Server)
			}
		}
		short := 0
		for _, r := range o.TLT.Rows {
			if slices.ContainsFunc(r.Slots, func(s string) bool { return down[s] }) {
				short++
			}
		}
		if short > 0 {
			add(KindTractsUnderReplicated, "tlt", "%d of %d rows keep a replica on a server that is down (%s): their tracts have fewer copies until it is replaced",
				short, len(o.TLT.Rows), strings.Join(downNames, ", "))
		}
		if r := ComputeRecovery(o); r.RowsRecovering > 0 {
			add(KindRecovery, "tlt", "%d of %d rows catching up, %s copied by catch-ups so far", r.RowsRecovering, len(o.TLT.Rows), HumanBytes(int64(o.TLT.RecoveredBytes)))
		}
	}
	for _, e := range o.Extents.Extents {
		subject := "extent " + strconv.FormatUint(e.ID, 10)
		if live := liveReplicas(e, states); live < int(e.Replication) {
			add(KindExtentUnderReplicated, subject, "%d of %d replicas live (replicas %s)", live, e.Replication, idList(e.Replicas))
		}
		if e.Leader == 0 {
			add(KindExtentNoLeader, subject, "no replica reports a leader (replicas %s)", idList(e.Replicas))
		}
	}
	for _, t := range o.Tables.Tables {
		subject := "table " + strconv.FormatUint(t.Table, 10)
		switch st, known := states[t.Owner]; {
		case t.Owner == 0:
			add(KindTableNoOwner, subject, "no metadata server serves it (file system %d, range [%s, %s))", t.FileSystem, t.Lo, t.Hi)
		case known && (st == StateDead || st == StateDecommissioned):
			add(KindTableNoOwner, subject, "its owner, node %d, is %s (file system %d, range [%s, %s))", t.Owner, st, t.FileSystem, t.Lo, t.Hi)
		}
	}
	return out
}

// downServers are the TLT's servers on nodes the failure detector has
// given up on (or that it does not know).
func downServers(t TLTSection) map[string]bool {
	down := map[string]bool{}
	for _, s := range t.Servers {
		if s.State == StateDead || s.State == StateDecommissioned || s.State == "unknown" {
			down[s.Server] = true
		}
	}
	return down
}

// behindServer is the server a RowView.Behind entry names ("3/0 (at
// version 4)").
func behindServer(b string) string {
	s, _, _ := strings.Cut(b, " ")
	return s
}

// nodeStates maps node ids to states.
func nodeStates(nodes []Node) map[uint64]string {
	m := make(map[uint64]string, len(nodes))
	for _, n := range nodes {
		m[n.ID] = n.State
	}
	return m
}

// liveReplicas counts e's distinct replicas on nodes not known to be dead
// or decommissioned (with no node table, every replica counts).
func liveReplicas(e ExtentView, states map[uint64]string) int {
	seen := map[uint64]bool{}
	for _, r := range e.Replicas {
		if st := states[r]; st == StateDead || st == StateDecommissioned {
			continue
		}
		seen[r] = true
	}
	return len(seen)
}

func nodeName(id uint64) string { return "node " + strconv.FormatUint(id, 10) }

func idList(ids []uint64) string {
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
