package firehose

import (
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// sourceLabels returns the source label values of every series g has.
func sourceLabels(t *testing.T, g prometheus.Gatherer) map[string]bool {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" {
					out[l.GetValue()] = true
				}
			}
		}
	}
	return out
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Sources the operator did not name share the label "other", whose gauges
// count over all of them; a named source's series go with its last
// subscription.
func TestMetricLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRepo(t, "did:plc:alice")
	dir := identity.NewMockDirectory()
	dir.Insert(r.identity(nil))
	if _, err := NewHub(Options{Directory: dir, MetricSources: []string{"https://bsky.network"}}); err == nil {
		t.Fatal("a URL was accepted as a metric source")
	}
	named := newFakeSource(t, r)
	dir.Insert(r.identityAt(named.srv.URL))
	host := strings.TrimPrefix(named.srv.URL, "http://")
	h, _ := startHub(t, Options{Directory: dir, Metrics: m, MetricSources: []string{host}})
	follow := func(src *fakeSource) *Subscription {
		t.Helper()
		sub, err := h.Subscribe(src.srv.URL, Filter{Collections: []string{testCollection}}, 10, State{})
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, sub, "following", func(_ State, h Health) bool { return h.Connected && !h.Resyncing })
		return sub
	}
	var unnamed []*Subscription
	for range 3 {
		unnamed = append(unnamed, follow(newFakeSource(t, r)))
	}
	n1, n2 := follow(named), follow(named)

	gauges := func(label string) (float64, float64) {
		return gaugeValue(t, m.Subscriptions.WithLabelValues(label)), gaugeValue(t, m.Connected.WithLabelValues(label))
	}
	eventually(t, "3 subscriptions and connections of other, 2 and 1 of the named source", func() bool {
		s, c := gauges(otherSource)
		ns, nc := gauges(host)
		return s == 3 && c == 3 && ns == 2 && nc == 1
	})
	if got := sourceLabels(t, reg); len(got) != 2 || !got[otherSource] || !got[host] {
		t.Fatalf("source labels %v, want only other and %s", got, host)
	}

	h.Unsubscribe(unnamed[0])
	eventually(t, "2 subscriptions and connections of other", func() bool {
		s, c := gauges(otherSource)
		return s == 2 && c == 2
	})
	h.Unsubscribe(n1)
	if !sourceLabels(t, reg)[host] {
		t.Fatal("the named source's series went with a subscription that was not its last")
	}
	h.Unsubscribe(n2)
	eventually(t, "the named source's series to be deleted", func() bool { return !sourceLabels(t, reg)[host] })
	if !sourceLabels(t, reg)[otherSource] {
		t.Fatal("the other series went too")
	}
}
