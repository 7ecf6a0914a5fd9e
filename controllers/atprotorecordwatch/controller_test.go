package atprotorecordwatch

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	"github.com/knotless-dev/knotless/internal/firehose"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

func TestValidateNamesTheField(t *testing.T) {
	good := atprotov1alpha1.AtprotoRecordWatchSpec{
		Source:      atprotov1alpha1.WatchSource{URL: "https://pds.example"},
		Collections: []string{"dev.knotless.note"},
		DIDs:        []string{"did:plc:abc"},
	}
	if err := Validate(&good); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*atprotov1alpha1.AtprotoRecordWatchSpec)
		want string
	}{
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.Source.URL = "wss://pds.example" }, "spec.source.url"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.Source.URL = "https://pds.example/xrpc" }, "spec.source.url"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) {
			s.Collections = []string{"ok.nsid.here", "not an nsid"}
		}, "spec.collections[1]"},
		{func(s *atprotov1alpha1.AtprotoRecordWatchSpec) { s.DIDs = []string{"alice.test"} }, "spec.dids[0]"},
	} {
		s := good
		s.Collections = append([]string(nil), good.Collections...)
		tc.edit(&s)
		err := Validate(&s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("got %v, want an error naming %s", err, tc.want)
		}
	}
}

// A status written from a state reads back as the same state, so a
// restarted provider resumes exactly where the status says.
func TestStatusRoundTrip(t *testing.T) {
	obj := &atprotov1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	obj.Spec.Source.URL = "http://pds"
	big := `{"text":"` + strings.Repeat("x", ValueLimit) + `"}`
	st := firehose.State{
		Cursor: 42, Seen: 7, Matched: 9, Errors: 1, Evicted: 2,
		LastEventTime: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Records: firehose.LoadRecords([]firehose.Record{
			{URI: "at://did:plc:a/c.n/2", CID: "b2", Rev: "r2", Value: []byte(`{"text":"two"}`)},
			{URI: "at://did:plc:a/c.n/1", CID: "b1", Rev: "r1", Value: []byte(big)},
		}),
		Repos:      map[string]firehose.Repo{"did:plc:a": {Rev: "r2", Data: "d2"}},
		LastResync: &firehose.Resync{Reason: firehose.ResyncInitial, Time: time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)},
	}
	status := buildStatus(obj, &obj.Status, st, firehose.Health{Connected: true})
	if status.Records[0].URI != "at://did:plc:a/c.n/2" || status.Records[1].Value != nil || status.Records[1].ValueBytes != int32(len(big)) {
		t.Fatalf("records %+v: want newest first, the big value left out with its size", status.Records)
	}
	if c := status.Conditions[0]; c.Reason != atprotov1alpha1.ReasonFollowing || c.Status != metav1.ConditionTrue {
		t.Fatalf("condition %+v", c)
	}
	again := buildStatus(obj, status, stateFromStatus(status), firehose.Health{Connected: true})
	if !apiequality.Semantic.DeepEqual(status, again) {
		t.Fatalf("round trip changed the status:\n%+v\n%+v", status, again)
	}
	down := buildStatus(obj, status, st, firehose.Health{Err: errors.New("dial tcp: connection refused")})
	if c := down.Conditions[0]; c.Reason != atprotov1alpha1.ReasonSourceUnreachable || !strings.Contains(c.Message, "connection refused") {
		t.Fatalf("condition while down %+v", c)
	}
}

// An address the policy refuses, for the connection or for a listing, is
// named as such on Ready; other listing failures stay Resyncing with the
// error.
func TestRefusedAddressesShowOnReady(t *testing.T) {
	obj := &atprotov1alpha1.AtprotoRecordWatch{}
	obj.Spec.Source.URL = "http://pds"
	denied := fmt.Errorf("connecting to http://pds: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &netpolicy.DeniedError{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Reason: "private"}})
	for _, tc := range []struct {
		health firehose.Health
		reason string
	}{
		{firehose.Health{Err: denied}, atprotov1alpha1.ReasonAddressNotAllowed},
		{firehose.Health{Connected: true, Resyncing: true, ResyncErr: denied}, atprotov1alpha1.ReasonAddressNotAllowed},
		{firehose.Health{Connected: true, Resyncing: true, ResyncErr: errors.New("API request failed (HTTP 302)")}, atprotov1alpha1.ReasonResyncing},
	} {
		c := buildStatus(obj, &obj.Status, firehose.State{}, tc.health).Conditions[0]
		if c.Status != metav1.ConditionFalse || c.Reason != tc.reason || c.Message == "" {
			t.Fatalf("health %+v: condition %+v, want %s", tc.health, c, tc.reason)
		}
		if !strings.Contains(c.Message, "not allowed") && !strings.Contains(c.Message, "302") {
			t.Fatalf("message %q does not name the failure", c.Message)
		}
	}
}
