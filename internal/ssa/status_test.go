/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package ssa

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/clustertest"
)

func ready(status metav1.ConditionStatus, reason, msg string) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, Message: msg}}
}

// An unchanged status is neither written nor announced; a changed one is
// written as the manager and announced once.
func TestWriteStatus(t *testing.T) {
	ctx := context.Background()
	ws := clustertest.New(&atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "uid"}})
	rec := ws.GetEventRecorder("test")
	get := func() *atprotov1alpha1.AtprotoRepo {
		t.Helper()
		repo := &atprotov1alpha1.AtprotoRepo{}
		if err := ws.Client.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "r"}, repo); err != nil {
			t.Fatal(err)
		}
		return repo
	}
	write := func(repo *atprotov1alpha1.AtprotoRepo, st *atprotov1alpha1.AtprotoRepoStatus) {
		t.Helper()
		err := WriteStatus(ctx, ws.Client, repo, &repo.Status, st, StatusOptions{
			Manager: "m", Event: ConditionChanged(repo.Status.Conditions, st.Conditions, "Ready"), Recorder: rec, Action: "Connect",
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	repo := get()
	write(repo, &atprotov1alpha1.AtprotoRepoStatus{DID: "did:plc:a", Conditions: ready(metav1.ConditionTrue, "Ready", "logged in")})
	repo = get()
	if repo.Status.DID != "did:plc:a" {
		t.Fatalf("status %+v", repo.Status)
	}
	want := []clustertest.Event{{Controller: "test", Object: "ns/r", Type: corev1.EventTypeNormal, Reason: "Ready", Action: "Connect", Note: "logged in"}}
	if got := ws.Events.Events(); !slices.Equal(got, want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}

	rv := repo.ResourceVersion
	write(repo, repo.Status.DeepCopy())
	if repo = get(); repo.ResourceVersion != rv || len(ws.Events.Events()) != 1 {
		t.Fatalf("an unchanged status was written (resourceVersion %s, was %s) or announced (%v)", repo.ResourceVersion, rv, ws.Events.Reasons())
	}

	// Same reason, another DID: written, not announced.
	write(repo, &atprotov1alpha1.AtprotoRepoStatus{DID: "did:plc:b", Conditions: repo.Status.Conditions})
	if repo = get(); repo.Status.DID != "did:plc:b" || len(ws.Events.Events()) != 1 {
		t.Fatalf("status %+v, events %v", repo.Status, ws.Events.Reasons())
	}
}

// An object deleted meanwhile is done: no error, no Event.
func TestWriteStatusOfADeletedObject(t *testing.T) {
	ws := clustertest.New()
	repo := &atprotov1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: "uid"}}
	st := &atprotov1alpha1.AtprotoRepoStatus{Conditions: ready(metav1.ConditionFalse, "PDSUnreachable", "down")}
	for _, replace := range []bool{false, true} {
		err := WriteStatus(context.Background(), ws.Client, repo, &repo.Status, st, StatusOptions{
			Manager: "m", Replace: replace, Event: &StatusEvent{Type: corev1.EventTypeWarning, Reason: "PDSUnreachable"}, Recorder: ws.GetEventRecorder("test"),
		})
		if err != nil || len(ws.Events.Events()) != 0 {
			t.Fatalf("replace=%v: %v, events %v", replace, err, ws.Events.Reasons())
		}
	}
}

// Replace drops the list entries the writer leaves out, and leaves the
// object it was given alone.
func TestWriteStatusReplace(t *testing.T) {
	ctx := context.Background()
	w := &atprotov1alpha1.AtprotoRecordWatch{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "uid"},
		Spec:       atprotov1alpha1.AtprotoRecordWatchSpec{Source: atprotov1alpha1.WatchSource{URL: "https://pds.example"}, Collections: []string{"a.b.c"}},
		Status:     atprotov1alpha1.AtprotoRecordWatchStatus{Records: []atprotov1alpha1.WatchedRecord{{URI: "at://a"}, {URI: "at://b"}}},
	}
	ws := clustertest.New(w)
	if err := ws.Client.Get(ctx, client.ObjectKeyFromObject(w), w); err != nil {
		t.Fatal(err)
	}
	rv := w.ResourceVersion
	st := &atprotov1alpha1.AtprotoRecordWatchStatus{Records: []atprotov1alpha1.WatchedRecord{{URI: "at://b"}}}
	if err := WriteStatus(ctx, ws.Client, w, &w.Status, st, StatusOptions{Manager: "m", Replace: true}); err != nil {
		t.Fatal(err)
	}
	if w.ResourceVersion != rv || len(w.Status.Records) != 2 {
		t.Fatal("WriteStatus changed the object it was given")
	}
	got := &atprotov1alpha1.AtprotoRecordWatch{}
	if err := ws.Client.Get(ctx, client.ObjectKeyFromObject(w), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Records) != 1 || got.Status.Records[0].URI != "at://b" || got.Spec.Source.URL != "https://pds.example" {
		t.Fatalf("stored %+v", got)
	}
}

func TestConditionChanged(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []metav1.Condition
		want          *StatusEvent
	}{
		{"appears True", nil, ready(metav1.ConditionTrue, "Ready", "ok"), &StatusEvent{corev1.EventTypeNormal, "Ready", "ok"}},
		{"appears False", nil, ready(metav1.ConditionFalse, "Down", "no"), &StatusEvent{corev1.EventTypeWarning, "Down", "no"}},
		{"reason changes", ready(metav1.ConditionFalse, "Down", "no"), ready(metav1.ConditionFalse, "Refused", "no!"), &StatusEvent{corev1.EventTypeWarning, "Refused", "no!"}},
		{"status changes", ready(metav1.ConditionFalse, "Ready", "no"), ready(metav1.ConditionTrue, "Ready", "ok"), &StatusEvent{corev1.EventTypeNormal, "Ready", "ok"}},
		{"only the message changes", ready(metav1.ConditionFalse, "Down", "no"), ready(metav1.ConditionFalse, "Down", "still no"), nil},
		{"no such condition", ready(metav1.ConditionFalse, "Down", "no"), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ConditionChanged(tc.before, tc.after, "Ready")
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPhaseChanged(t *testing.T) {
	const (
		failed    = appsv1alpha1.ApplicationFailed
		suspended = appsv1alpha1.ApplicationSuspended
		ready     = appsv1alpha1.ApplicationReady
	)
	for _, tc := range []struct {
		before, after appsv1alpha1.ApplicationPhase
		want          *StatusEvent
	}{
		{"", appsv1alpha1.ApplicationProgressing, &StatusEvent{corev1.EventTypeNormal, "Progressing", "msg"}},
		{ready, failed, &StatusEvent{corev1.EventTypeWarning, "Failed", "msg"}},
		{ready, suspended, &StatusEvent{corev1.EventTypeNormal, "Suspended", "msg"}},
		{suspended, ready, &StatusEvent{corev1.EventTypeNormal, "Resumed", "msg"}},
		{suspended, failed, &StatusEvent{corev1.EventTypeWarning, "Failed", "msg"}},
		{ready, ready, nil},
	} {
		got := PhaseChanged(tc.before, tc.after, failed, suspended, "msg")
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("%s -> %s: got %+v, want %+v", tc.before, tc.after, got, tc.want)
		}
	}
}

func TestPhaseMoved(t *testing.T) {
	const (
		pending = marketv1alpha1.PhasePending
		failed  = marketv1alpha1.PhaseFailed
	)
	for _, tc := range []struct {
		before, after marketv1alpha1.Phase
		want          *StatusEvent
	}{
		{"", pending, nil},
		{"", failed, &StatusEvent{corev1.EventTypeWarning, "Failed", "msg"}},
		{pending, marketv1alpha1.PhaseReady, &StatusEvent{corev1.EventTypeNormal, "Ready", "msg"}},
		{pending, pending, nil},
	} {
		got := PhaseMoved(tc.before, tc.after, failed, marketv1alpha1.PhaseSuspended, "msg")
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("%s -> %s: got %+v, want %+v", tc.before, tc.after, got, tc.want)
		}
	}
}
