package meta

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Automatic splits (Ursa Minor §3.4, DESIGN.md §2.6: hot or large tables
// split on their own). Every second each server looks at the tables it
// owns; one that holds more than SplitPolicy.Inodes inodes (as cached) or
// served more than SplitPolicy.OpsPerSecond for SplitPolicy.Sustain checks
// in a row is split where its loaded directories' keys halve (splitPoint),
// and the right part is moved to the live metadata server with the fewest
// recent operations, if it has under half of this one's. A table is not
// split again within SplitPolicy.Cooldown, nor when it holds fewer than
// two directories (a single hot directory cannot be cut: its keys share
// one directory id).

// SplitPolicy says when a server splits its tables on its own.
type SplitPolicy struct {
	// Inodes: split a table holding more inodes than this (0: never for
	// size).
	Inodes uint64
	// OpsPerSecond: split a table serving more operations per second than
	// this for Sustain consecutive checks, a second apart (0: never for
	// load).
	OpsPerSecond float64
	Sustain      int
	// Cooldown is the least time between two automatic splits of one
	// table, and between a table's failed split and the next try.
	Cooldown time.Duration
}

// DefaultSplitPolicy splits tables past a million inodes or 2,000
// operations per second sustained for 10 s, at most once a minute each.
var DefaultSplitPolicy = SplitPolicy{Inodes: 1 << 20, OpsPerSecond: 2000, Sustain: 10, Cooldown: time.Minute}

// splitState is what the automatic splits remember per table.
type splitState struct {
	hot       int       // consecutive checks over OpsPerSecond
	notBefore time.Time // cooldown
}

// autoSplit splits the tables served here that are too large or too hot.
func (s *Server) autoSplit(ctx context.Context) {
	p := s.cfg.Split
	if p.Inodes == 0 && p.OpsPerSecond == 0 {
		return
	}
	now := time.Now()
	for _, st := range s.fsStates() {
		for _, t := range st.st.owned() {
			ss := s.splits[t.id]
			if ss == nil {
				ss = &splitState{}
				s.splits[t.id] = ss
			}
			ops, _ := st.stats.rates(t.id)
			if p.OpsPerSecond > 0 && ops > p.OpsPerSecond {
				ss.hot++
			} else {
				ss.hot = 0
			}
			if now.Before(ss.notBefore) {
				continue
			}
			why := ""
			switch {
			case p.OpsPerSecond > 0 && ss.hot >= max(p.Sustain, 1):
				why = fmt.Sprintf("%.0f operations per second for %d s", ops, ss.hot)
			case p.Inodes > 0:
				if inodes, _, _ := st.st.cachedCounts(t.r); inodes > p.Inodes {
					why = fmt.Sprintf("%d inodes", inodes)
				}
			}
			if why == "" {
				continue
			}
			ss.notBefore, ss.hot = now.Add(p.Cooldown), 0
			right, at, err := s.splitTable(ctx, t.id, 0)
			if err != nil {
				lvl := s.log.Warn
				if errors.Is(err, errInvalid) {
					lvl = s.log.Debug // nothing to cut: one hot directory
				}
				lvl("splitting a table on its own", "table", t.id, "fs", st.f, "why", why, "err", err)
				continue
			}
			s.log.Info("split a table on its own", "table", t.id, "fs", st.f, "why", why, "at", fmt.Sprintf("%#x", at), "new_table", right.GetTableId())
			s.splits[right.GetTableId()] = &splitState{notBefore: now.Add(p.Cooldown)}
			if to := s.quietestPeer(); to != 0 {
				if _, err := s.moveTable(ctx, right.GetTableId(), to); err != nil {
					s.log.Warn("moving the new part of a split table", "table", right.GetTableId(), "to", to, "err", err)
				}
			}
		}
	}
	s.leaseMu.Lock()
	for id := range s.splits {
		if _, ok := s.leases[id]; !ok {
			delete(s.splits, id)
		}
	}
	s.leaseMu.Unlock()
}

// quietestPeer returns the live metadata server with the fewest recent
// operations per second, if it has fewer than half of this server's (0:
// none).
func (s *Server) quietestPeer() uint64 {
	s.place.mu.Lock()
	defer s.place.mu.Unlock()
	var self float64
	best, bestLoad := uint64(0), 0.0
	for _, m := range s.place.members {
		if m.node == s.cfg.Node {
			self = m.ops
			continue
		}
		if load := m.ops; best == 0 || load < bestLoad {
			best, bestLoad = m.node, load
		}
	}
	if best == 0 || bestLoad >= self/2 {
		return 0
	}
	return best
}
