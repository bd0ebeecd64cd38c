package meta

import (
	"sync"
	"time"
)

// tableStats counts the operations of each table served here and turns
// them into recent rates (what owners publish once a second for placement,
// FlexGroup §3.5, and what `arbor table list` shows).
type tableStats struct {
	mu     sync.Mutex
	counts map[uint64]*tableCount
}

type tableCount struct {
	ops, creates         uint64
	lastOps, lastCreates uint64
	at                   time.Time
	opsRate, createRate  float64
}

func newTableStats() *tableStats { return &tableStats{counts: map[uint64]*tableCount{}} }

// count records one operation on table (a create if create).
func (s *tableStats) count(table uint64, create bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts[table]
	if c == nil {
		c = &tableCount{at: time.Now()}
		s.counts[table] = c
	}
	c.ops++
	if create {
		c.creates++
	}
}

// rates returns the table's operations and creates per second since the
// previous call at least a second ago (the rates of that interval).
func (s *tableStats) rates(table uint64) (ops, creates float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts[table]
	if c == nil {
		return 0, 0
	}
	if el := time.Since(c.at); el >= time.Second {
		c.opsRate = float64(c.ops-c.lastOps) / el.Seconds()
		c.createRate = float64(c.creates-c.lastCreates) / el.Seconds()
		c.lastOps, c.lastCreates, c.at = c.ops, c.creates, time.Now()
	}
	return c.opsRate, c.createRate
}
