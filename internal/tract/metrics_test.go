package tract

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricsString(t *testing.T) {
	m := Metrics{Tracts: 10, Bytes: 4096, TractsWritten: 3, BytesWritten: 300, TractsRead: 4, BytesRead: 400,
		TractsReplicated: 6, BytesReplicated: 600, TractsRecovered: 2, BytesRecovered: 200, RowsCatchingUp: 1, SyncsCompleted: 7,
		BlobOps: 5, DegradedBlobOps: 2, StaleRejections: 8, ChecksumFailures: 1, Repairs: 1, StripesRepaired: 4, StripesQueued: 2, TractsReclaimed: 9, BytesReclaimed: 900}
	want := `stored:     10 tracts, 4096 bytes
written:    3 tracts, 300 bytes
read:       4 tracts, 400 bytes
replicated: 6 tracts, 600 bytes
recovered:  2 tracts, 200 bytes; 1 rows catching up, 7 catch-ups done
blob ops:   5 (2 with row members missing)
stale:      8 rejected
checksums:  1 failed, 1 repaired
stripes:    4 made whole after writes with shards missing, 2 queued
reclaimed:  9 tracts, 900 bytes
`
	if got := m.String(); got != want {
		t.Fatalf("Metrics.String():\n%s\nwant:\n%s", got, want)
	}
}

func TestCollectorExportsEveryFigure(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	putBlob(t, cl, randomTracts(3, 9), 0)
	reg := prometheus.NewRegistry()
	if err := reg.Register(c.nodes[1].svc.Collector()); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue() + f.GetMetric()[0].GetCounter().GetValue()
	}
	if len(got) != len(metricDefs) {
		t.Fatalf("%d metrics exported, %d defined", len(got), len(metricDefs))
	}
	snap := c.nodes[1].svc.Metrics()
	if got["arbor_tract_stored_tracts"] != float64(snap.Tracts) || snap.Tracts == 0 {
		t.Fatalf("stored tracts: exported %v, snapshot %d", got["arbor_tract_stored_tracts"], snap.Tracts)
	}
	for name := range got {
		if !strings.HasPrefix(name, "arbor_tract_") {
			t.Fatalf("metric %s outside the arbor_tract_ namespace", name)
		}
	}
}
