package pds_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/knotless-dev/knotless/internal/pds"
	"github.com/knotless-dev/knotless/internal/pds/pdstest"
)

// TestWritesAreTimed: every write call is observed once in
// knotless_pds_write_duration_seconds by call and result, a refused one
// as an error.
func TestWritesAreTimed(t *testing.T) {
	ctx := context.Background()
	f := pdstest.New(t)
	hist := pds.NewWriteLatency()
	reg := prometheus.NewRegistry()
	reg.MustRegister(hist)
	c, err := pds.Connect(ctx, f.URL(), pdstest.Handle, pdstest.Password, pds.Options{Policy: local, Store: &pds.MemoryStore{}, WriteLatency: hist})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, coll, "a", json.RawMessage(`{"n":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyWrites(ctx, []pds.Write{{Op: pds.OpCreate, Collection: coll, Rkey: "b", Value: json.RawMessage(`{"n":2}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRecord(ctx, coll, "a", nil); err != nil {
		t.Fatal(err)
	}
	bad := "bafyreigarbage"
	if _, err := c.PutRecord(ctx, coll, "b", json.RawMessage(`{"n":3}`), &bad); err == nil {
		t.Fatal("a put with a wrong swap CID succeeded")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[l["call"]+"/"+l["result"]] = m.GetHistogram().GetSampleCount()
		}
	}
	want := map[string]uint64{"putRecord/ok": 1, "applyWrites/ok": 1, "deleteRecord/ok": 1, "putRecord/error": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d samples, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("samples %v, want %v", got, want)
	}
}
