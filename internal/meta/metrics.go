package meta

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// storeMetrics count what a server's stores did (all file systems).
type storeMetrics struct {
	loads, evictions, commits, committedEntries, aborts, pending atomic.Int64
	// earlyEntries counts entries answered before they were durable;
	// hurried, commits started early because someone waited.
	earlyEntries, hurried atomic.Int64
	commitSeconds         prometheus.Histogram
}

func newStoreMetrics() *storeMetrics {
	return &storeMetrics{commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "arbor", Subsystem: "meta", Name: "commit_seconds",
		Help:    "Time of one group commit (a batch of operations in one MPSC).",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
	})}
}

// register exports the metrics to reg as arbor_meta_* series.
func (m *storeMetrics) register(reg prometheus.Registerer) error {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "arbor", Subsystem: "meta", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	for _, c := range []prometheus.Collector{
		counter("unit_loads_total", "Directories loaded into a table cache.", &m.loads),
		counter("unit_evictions_total", "Clean directories forgotten from a table cache.", &m.evictions),
		counter("commits_total", "Group commits.", &m.commits),
		counter("committed_operations_total", "Operations committed by group commits.", &m.committedEntries),
		counter("aborted_operations_total", "Operations aborted by a failed group commit (clients ask again).", &m.aborts),
		counter("early_operations_total", "Operations answered before they were durable (early replies).", &m.earlyEntries),
		counter("hurried_commits_total", "Group commits started before the commit interval because an operation, an fsync or a barrier waited.", &m.hurried),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "arbor", Subsystem: "meta", Name: "pending_operations", Help: "Operations applied to a table cache, not yet durable."},
			func() float64 { return float64(m.pending.Load()) }),
		m.commitSeconds,
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
