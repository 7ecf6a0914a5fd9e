package firehose

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/promutil"
)

// Metrics of a Hub, labelled by source URL. A nil *Metrics records nothing.
type Metrics struct {
	Events     *prometheus.CounterVec
	Lag        *prometheus.GaugeVec
	Reconnects *prometheus.CounterVec
	Resyncs    *prometheus.CounterVec
	Rejected   *prometheus.CounterVec
	// Subscriptions and Connected show the sharing: one connection per
	// source whatever the number of subscriptions.
	Subscriptions *prometheus.GaugeVec
	Connected     *prometheus.GaugeVec
}

// NewMetrics creates the collectors and registers them with reg (when not
// nil); collectors already registered are reused.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	name := func(n string) string { return "knotless_firehose_" + n }
	m := &Metrics{
		Events:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("events_total"), Help: "Firehose events read, by source."}, []string{"source"}),
		Lag:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("lag_seconds"), Help: "Now minus the time of the last event read, by source."}, []string{"source"}),
		Reconnects:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("reconnects_total"), Help: "Connections to a source after the first, by source and cause."}, []string{"source", "cause"}),
		Resyncs:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("resyncs_total"), Help: "Record listings instead of following the stream, by source and reason."}, []string{"source", "reason"}),
		Rejected:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("rejected_total"), Help: "Events that failed verification, by source."}, []string{"source"}),
		Subscriptions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("subscriptions"), Help: "Subscriptions (watches) on a source."}, []string{"source"}),
		Connected:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name("connected"), Help: "Open connections to a source (0 or 1)."}, []string{"source"}),
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

func (m *Metrics) event(source string, t time.Time) {
	if m == nil {
		return
	}
	m.Events.WithLabelValues(source).Inc()
	if !t.IsZero() {
		m.Lag.WithLabelValues(source).Set(time.Since(t).Seconds())
	}
}

func (m *Metrics) reconnect(source, cause string) {
	if m != nil {
		m.Reconnects.WithLabelValues(source, cause).Inc()
	}
}

func (m *Metrics) resync(source, reason string) {
	if m != nil {
		m.Resyncs.WithLabelValues(source, reason).Inc()
	}
}

func (m *Metrics) rejected(source string) {
	if m != nil {
		m.Rejected.WithLabelValues(source).Inc()
	}
}

func (m *Metrics) subscriptions(source string, n int) {
	if m != nil {
		m.Subscriptions.WithLabelValues(source).Set(float64(n))
	}
}

func (m *Metrics) connected(source string, up bool) {
	if m != nil {
		v := 0.0
		if up {
			v = 1
		}
		m.Connected.WithLabelValues(source).Set(v)
	}
}
