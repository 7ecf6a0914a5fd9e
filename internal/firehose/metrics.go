package firehose

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/promutil"
)

// Metrics of a Hub, labelled by source: the host of a source named in
// Options.MetricSources, or "other" for all the others together (the set
// of label values is the operator's, not the tenants'). The series of a
// named source are deleted when its last subscription ends. A nil
// *Metrics records nothing.
type Metrics struct {
	Events     *prometheus.CounterVec
	Lag        *prometheus.GaugeVec
	Reconnects *prometheus.CounterVec
	Resyncs    *prometheus.CounterVec
	Rejected   *prometheus.CounterVec
	// Subscriptions and Connected show the sharing: one connection per
	// source whatever the number of subscriptions. Both count over the
	// sources of a label.
	Subscriptions *prometheus.GaugeVec
	Connected     *prometheus.GaugeVec
}

// NewMetrics creates the collectors and registers them with reg (when not
// nil); collectors already registered are reused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	name := func(n string) string { return "knotless_firehose_" + n }
	m := &Metrics{
		Events:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("events_total"), Help: "Firehose events read, by source."}, []string{"source"}),
		Lag:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("lag_seconds"), Help: "Now minus the time of the last event read, by named source (not for other)."}, []string{"source"}),
		Reconnects:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("reconnects_total"), Help: "Connections to a source after the first, by source and cause."}, []string{"source", "cause"}),
		Resyncs:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("resyncs_total"), Help: "Record listings instead of following the stream, by source and reason."}, []string{"source", "reason"}),
		Rejected:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("rejected_total"), Help: "Events that failed verification, by source."}, []string{"source"}),
		Subscriptions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("subscriptions"), Help: "Subscriptions (watches) on the sources of a label."}, []string{"source"}),
		Connected:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("connected"), Help: "Open connections to the sources of a label (at most one per source)."}, []string{"source"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Events = promutil.Register(reg, m.Events, &err)
	m.Lag = promutil.Register(reg, m.Lag, &err)
	m.Reconnects = promutil.Register(reg, m.Reconnects, &err)
	m.Resyncs = promutil.Register(reg, m.Resyncs, &err)
	m.Rejected = promutil.Register(reg, m.Rejected, &err)
	m.Subscriptions = promutil.Register(reg, m.Subscriptions, &err)
	m.Connected = promutil.Register(reg, m.Connected, &err)
	return m, err
}

// event counts an event; the lag of "other" is not recorded, since the
// last event of any of its sources says nothing about the others.
func (m *Metrics) event(label string, t time.Time) {
	if m == nil {
		return
	}
	m.Events.WithLabelValues(label).Inc()
	if !t.IsZero() && label != otherSource {
		m.Lag.WithLabelValues(label).Set(time.Since(t).Seconds())
	}
}

func (m *Metrics) reconnect(label, cause string) {
	if m != nil {
		m.Reconnects.WithLabelValues(label, cause).Inc()
	}
}

func (m *Metrics) resync(label, reason string) {
	if m != nil {
		m.Resyncs.WithLabelValues(label, reason).Inc()
	}
}

func (m *Metrics) rejected(label string) {
	if m != nil {
		m.Rejected.WithLabelValues(label).Inc()
	}
}

// subscriptions adds delta subscriptions to label's.
func (m *Metrics) subscriptions(label string, delta int) {
	if m != nil {
		m.Subscriptions.WithLabelValues(label).Add(float64(delta))
	}
}

// connected counts a connection of label's opening (up) or closing.
func (m *Metrics) connected(label string, up bool) {
	if m == nil {
		return
	}
	if up {
		m.Connected.WithLabelValues(label).Inc()
	} else {
		m.Connected.WithLabelValues(label).Dec()
	}
}

// forget deletes every series of label.
func (m *Metrics) forget(label string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"source": label}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.Events, m.Lag, m.Reconnects, m.Resyncs, m.Rejected, m.Subscriptions, m.Connected,
	} {
		v.DeletePartialMatch(l)
	}
}
