package tract

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are the service's running totals.
type counters struct {
	tractsWritten, bytesWritten       atomic.Uint64
	tractsRead, bytesRead             atomic.Uint64
	tractsReplicated, bytesReplicated atomic.Uint64
	tractsRecovered, bytesRecovered   atomic.Uint64
	blobOps, degradedBlobOps          atomic.Uint64
	staleRejections                   atomic.Uint64
	checksumFailures, repairs         atomic.Uint64
	stripesRepaired                   atomic.Uint64
	tractsReclaimed, bytesReclaimed   atomic.Uint64
	syncsCompleted                    atomic.Uint64
}

// Metrics is a snapshot of a node's tract service.
type Metrics struct {
	// Tracts and bytes stored on all disks (replicas included).
	Tracts, Bytes uint64
	// Client writes and reads served (writes as primary).
	TractsWritten, BytesWritten uint64
	TractsRead, BytesRead       uint64
	// Writes received from primaries.
	TractsReplicated, BytesReplicated uint64
	// Tracts and bytes copied by catch-up (recovery and growth).
	TractsRecovered, BytesRecovered uint64
	// Rows being caught up now, and catch-ups finished.
	RowsCatchingUp int
	SyncsCompleted uint64
	// Blob metadata operations served as primary, and those of them
	// acknowledged with row members missing (declared dead: forwardRecord).
	BlobOps, DegradedBlobOps uint64
	// Requests refused for carrying an old row version.
	StaleRejections uint64
	// Tracts found corrupt, and repaired from another replica.
	ChecksumFailures, Repairs uint64
	// Stripes written with shards missing that were made whole on a
	// writer's request, and those queued now (ec_repair.go).
	StripesRepaired uint64
	StripesQueued   int
	// Garbage reclaimed by the scrubber and row drops.
	TractsReclaimed, BytesReclaimed uint64
}

// Metrics returns a snapshot of the service's figures.
func (s *Service) Metrics() Metrics {
	m := Metrics{
		TractsWritten: s.m.tractsWritten.Load(), BytesWritten: s.m.bytesWritten.Load(),
		TractsRead: s.m.tractsRead.Load(), BytesRead: s.m.bytesRead.Load(),
		TractsReplicated: s.m.tractsReplicated.Load(), BytesReplicated: s.m.bytesReplicated.Load(),
		TractsRecovered: s.m.tractsRecovered.Load(), BytesRecovered: s.m.bytesRecovered.Load(),
		SyncsCompleted: s.m.syncsCompleted.Load(), BlobOps: s.m.blobOps.Load(), DegradedBlobOps: s.m.degradedBlobOps.Load(),
		StaleRejections:  s.m.staleRejections.Load(),
		ChecksumFailures: s.m.checksumFailures.Load(), Repairs: s.m.repairs.Load(), StripesRepaired: s.m.stripesRepaired.Load(),
		TractsReclaimed: s.m.tractsReclaimed.Load(), BytesReclaimed: s.m.bytesReclaimed.Load(),
	}
	for _, d := range s.disks {
		t, b := d.store.Usage()
		m.Tracts += t
		m.Bytes += b
		m.RowsCatchingUp += d.catchingUp()
		m.StripesQueued += d.queuedRepairs()
	}
	return m
}

// String prints the snapshot one figure per line.
func (m Metrics) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stored:     %d tracts, %d bytes\n", m.Tracts, m.Bytes)
	fmt.Fprintf(&b, "written:    %d tracts, %d bytes\n", m.TractsWritten, m.BytesWritten)
	fmt.Fprintf(&b, "read:       %d tracts, %d bytes\n", m.TractsRead, m.BytesRead)
	fmt.Fprintf(&b, "replicated: %d tracts, %d bytes\n", m.TractsReplicated, m.BytesReplicated)
	fmt.Fprintf(&b, "recovered:  %d tracts, %d bytes; %d rows catching up, %d catch-ups done\n",
		m.TractsRecovered, m.BytesRecovered, m.RowsCatchingUp, m.SyncsCompleted)
	fmt.Fprintf(&b, "blob ops:   %d (%d with row members missing)\n", m.BlobOps, m.DegradedBlobOps)
	fmt.Fprintf(&b, "stale:      %d rejected\n", m.StaleRejections)
	fmt.Fprintf(&b, "checksums:  %d failed, %d repaired\n", m.ChecksumFailures, m.Repairs)
	fmt.Fprintf(&b, "stripes:    %d made whole after writes with shards missing, %d queued\n", m.StripesRepaired, m.StripesQueued)
	fmt.Fprintf(&b, "reclaimed:  %d tracts, %d bytes\n", m.TractsReclaimed, m.BytesReclaimed)
	return b.String()
}

// Collector exports the service's Metrics to Prometheus (register it on
// the node's own registry).
func (s *Service) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Service }

type metricDef struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(Metrics) float64
}

var metricDefs = func() []metricDef {
	def := func(name, help string, kind prometheus.ValueType, v func(Metrics) float64) metricDef {
		return metricDef{desc: prometheus.NewDesc("arbor_tract_"+name, help, nil, nil), kind: kind, value: v}
	}
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	return []metricDef{
		def("stored_tracts", "Tracts stored on the node's disks (replicas included).", g, func(m Metrics) float64 { return float64(m.Tracts) }),
		def("stored_bytes", "Bytes of tract data stored on the node's disks.", g, func(m Metrics) float64 { return float64(m.Bytes) }),
		def("written_tracts_total", "Client tract writes served as primary.", c, func(m Metrics) float64 { return float64(m.TractsWritten) }),
		def("written_bytes_total", "Bytes of client tract writes served as primary.", c, func(m Metrics) float64 { return float64(m.BytesWritten) }),
		def("read_tracts_total", "Tract reads served.", c, func(m Metrics) float64 { return float64(m.TractsRead) }),
		def("read_bytes_total", "Bytes of tract reads served.", c, func(m Metrics) float64 { return float64(m.BytesRead) }),
		def("replicated_tracts_total", "Tract versions received from primaries.", c, func(m Metrics) float64 { return float64(m.TractsReplicated) }),
		def("replicated_bytes_total", "Bytes received from primaries.", c, func(m Metrics) float64 { return float64(m.BytesReplicated) }),
		def("recovered_tracts_total", "Tracts copied by catch-up (failure recovery and growth).", c, func(m Metrics) float64 { return float64(m.TractsRecovered) }),
		def("recovered_bytes_total", "Bytes copied by catch-up (failure recovery and growth).", c, func(m Metrics) float64 { return float64(m.BytesRecovered) }),
		def("rows_catching_up", "TLT rows this node is catching up.", g, func(m Metrics) float64 { return float64(m.RowsCatchingUp) }),
		def("syncs_completed_total", "Row catch-ups finished.", c, func(m Metrics) float64 { return float64(m.SyncsCompleted) }),
		def("blob_ops_total", "Blob metadata operations served as primary.", c, func(m Metrics) float64 { return float64(m.BlobOps) }),
		def("degraded_blob_ops_total", "Blob metadata operations acknowledged with row members missing (declared dead).", c, func(m Metrics) float64 { return float64(m.DegradedBlobOps) }),
		def("stale_rejections_total", "Requests refused for an old TLT row version.", c, func(m Metrics) float64 { return float64(m.StaleRejections) }),
		def("checksum_failures_total", "Tracts that failed their checksum.", c, func(m Metrics) float64 { return float64(m.ChecksumFailures) }),
		def("repairs_total", "Corrupt tracts repaired from another replica.", c, func(m Metrics) float64 { return float64(m.Repairs) }),
		def("stripes_repaired_total", "Stripes written with shards missing made whole on their writer's request.", c, func(m Metrics) float64 { return float64(m.StripesRepaired) }),
		def("stripes_queued_for_repair", "Stripes written with shards missing queued for repair.", g, func(m Metrics) float64 { return float64(m.StripesQueued) }),
		def("reclaimed_tracts_total", "Tracts reclaimed (deleted blobs, dropped rows).", c, func(m Metrics) float64 { return float64(m.TractsReclaimed) }),
		def("reclaimed_bytes_total", "Bytes reclaimed (deleted blobs, dropped rows).", c, func(m Metrics) float64 { return float64(m.BytesReclaimed) }),
	}
}()

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range metricDefs {
		ch <- d.desc
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.s.Metrics()
	for _, d := range metricDefs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.kind, d.value(snap))
	}
}
