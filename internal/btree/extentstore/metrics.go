package extentstore

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/extent"
)

// counters are the Store's live counters.
type counters struct {
	writes, writeBytes, pageBytes atomic.Int64
	deltas, deltaSavedBytes       atomic.Int64
	fallbacks                     atomic.Int64
	noBase, notWorth              atomic.Int64
}

// Metrics is a snapshot of what a Store sent since it was made.
type Metrics struct {
	// PageWrites counts page writes sent (full images and deltas; a
	// commit sent twice counts twice); PageWriteBytes the bytes they
	// carried (images, or scripts); PageBytes the bytes of the pages they
	// wrote, had every one gone as a full image.
	PageWrites, PageWriteBytes, PageBytes int64
	// DeltaWrites counts the page writes sent as deltas, and
	// DeltaSavedBytes what they saved (page bytes minus script bytes).
	DeltaWrites, DeltaSavedBytes int64
	// DeltaFallbacks counts commits refused while they carried deltas
	// (ErrDeltaMismatch, or an extent that predates deltas) and sent
	// again with full images.
	DeltaFallbacks int64
	// DeltaNoBase counts page writes at a slot (OpWrite) that went as
	// full images because no base was cached at that slot; DeltaNotWorth
	// those whose script would have been more than half the page. Writes
	// of fresh or empty pages (OpWriteFresh, or an OpWrite at slot 0, as
	// a split's into a never-written page of its block) have no base and
	// count in neither.
	DeltaNoBase, DeltaNotWorth int64
	// CachedBases and CachedBaseBytes are the delta bases held (pages,
	// and bytes counted against Config.DeltaCacheBytes).
	CachedBases     int
	CachedBaseBytes int64
}

// Metrics returns a snapshot of the counters.
func (s *Store) Metrics() Metrics {
	c := &s.metrics
	n, b := s.bases.stats()
	return Metrics{
		PageWrites: c.writes.Load(), PageWriteBytes: c.writeBytes.Load(), PageBytes: c.pageBytes.Load(),
		DeltaWrites: c.deltas.Load(), DeltaSavedBytes: c.deltaSavedBytes.Load(),
		DeltaFallbacks: c.fallbacks.Load(), DeltaNoBase: c.noBase.Load(), DeltaNotWorth: c.notWorth.Load(),
		CachedBases: n, CachedBaseBytes: b,
	}
}

// countSent counts the page writes of elems (built from ops) as sent.
func (s *Store) countSent(elems []extent.Element, ops []btree.Op) {
	c := &s.metrics
	for i, e := range elems {
		if e.Kind != extent.KindWrite {
			continue
		}
		page := int64(len(ops[i].Data))
		c.writes.Add(1)
		c.pageBytes.Add(page)
		if e.Delta != nil {
			c.deltas.Add(1)
			c.writeBytes.Add(int64(len(e.Delta.Script)))
			c.deltaSavedBytes.Add(page - int64(len(e.Delta.Script)))
		} else {
			c.writeBytes.Add(page)
		}
	}
}

// RegisterMetrics exports the counters to reg (never the global registry)
// as arbor_btree_page_write*_total and arbor_btree_delta_* series, beside
// the tree's own (btree.Tree.RegisterMetrics calls it for its store).
func (s *Store) RegisterMetrics(reg prometheus.Registerer) error {
	c := &s.metrics
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "arbor", Subsystem: "btree", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	cs := []prometheus.Collector{
		counter("page_writes_total", "Page writes sent to the extent store (images and deltas).", &c.writes),
		counter("page_write_bytes_total", "Bytes of page writes sent (images, or delta scripts).", &c.writeBytes),
		counter("page_bytes_total", "Bytes of the pages written, as full images.", &c.pageBytes),
		counter("delta_writes_total", "Page writes sent as deltas.", &c.deltas),
		counter("delta_saved_bytes_total", "Page bytes not sent thanks to deltas.", &c.deltaSavedBytes),
		counter("delta_fallbacks_total", "Commits refused with deltas and sent again with full images.", &c.fallbacks),
		counter("delta_no_base_total", "Page writes at a slot sent as images: no base cached at that slot.", &c.noBase),
		counter("delta_not_worth_total", "Page writes at a slot sent as images: the delta would exceed half the page.", &c.notWorth),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "arbor", Subsystem: "btree", Name: "delta_base_bytes", Help: "Bytes of delta bases held."},
			func() float64 { _, b := s.bases.stats(); return float64(b) }),
	}
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}
