package faults

import "github.com/prometheus/client_golang/prometheus"

// collector exports an injector's Counts and blocked set.
type collector struct {
	in       *Injector
	injected *prometheus.Desc
	blocked  *prometheus.Desc
	enabled  *prometheus.Desc
}

// Collector returns a Prometheus collector of the injector's counts:
// arbor_faults_injected_total{kind}, arbor_faults_blocked_peers and
// arbor_faults_enabled. Register it on the node's own registry.
func (in *Injector) Collector() prometheus.Collector {
	return &collector{
		in: in,
		injected: prometheus.NewDesc("arbor_faults_injected_total",
			"Faults injected by the fault-injection switch, by kind.", []string{"kind"}, nil),
		blocked: prometheus.NewDesc("arbor_faults_blocked_peers",
			"Peers whose calls this node rejects (injected partitions).", nil, nil),
		enabled: prometheus.NewDesc("arbor_faults_enabled",
			"1 while random faults are being injected.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.injected
	ch <- c.blocked
	ch <- c.enabled
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	n := c.in.Counts()
	for _, k := range []struct {
		kind  string
		value uint64
	}{
		{"request_lost", n.RequestsLost},
		{"reply_lost", n.RepliesLost},
		{"call_delayed", n.CallsDelayed},
		{"call_duplicated", n.CallsDuplicated},
		{"message_dropped", n.MessagesDropped},
		{"message_delayed", n.MessagesDelayed},
		{"message_duplicated", n.MessagesDuplicated},
		{"partition_rejected", n.PartitionRejections},
	} {
		ch <- prometheus.MustNewConstMetric(c.injected, prometheus.CounterValue, float64(k.value), k.kind)
	}
	ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, float64(len(c.in.Blocked())))
	enabled := 0.0
	if c.in.Config().Enabled() {
		enabled = 1
	}
	ch <- prometheus.MustNewConstMetric(c.enabled, prometheus.GaugeValue, enabled)
}
