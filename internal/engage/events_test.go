/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/knotless-dev/knotless/apis"
	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
)

func TestEventsAreWrittenToTheirWorkspace(t *testing.T) {
	scheme := apis.NewScheme()
	w := newEventWriter(scheme, logr.Discard())
	a := fake.NewClientBuilder().WithScheme(scheme).Build()
	b := fake.NewClientBuilder().WithScheme(scheme).Build()
	app := &appsv1alpha1.Application{}
	app.Name, app.Namespace, app.UID = "shop", "team", "u1"
	ns := &corev1.Namespace{}
	ns.Name = "cluster-scoped"

	w.recorder(a, "application").Eventf(app, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "all %d components ready", 3)
	(&workspace{events: w}).events.recorder(b, "component").Eventf(ns, app, corev1.EventTypeWarning, "Invalid", "Reconcile", "%s", strings.Repeat("x", 5000))
	w.recorder(a, "application").Eventf(app, nil, "Bogus", "Ready", "Reconcile", "dropped: not Normal or Warning")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()
	list := func(c client.Client) []eventsv1.Event {
		var l eventsv1.EventList
		if err := c.List(t.Context(), &l); err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	waitFor(t, func() bool { return len(list(a)) == 1 && len(list(b)) == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	ev := list(a)[0]
	if ev.Namespace != "team" || !strings.HasPrefix(ev.Name, "shop.") || ev.Regarding.Name != "shop" || ev.Regarding.Kind != "Application" ||
		ev.Reason != "Ready" || ev.Action != "Reconcile" || ev.Note != "all 3 components ready" || ev.Type != corev1.EventTypeNormal ||
		ev.ReportingController != "application" || !strings.HasPrefix(ev.ReportingInstance, "application-") || ev.EventTime.IsZero() {
		t.Errorf("event in workspace a: %+v", ev)
	}
	ev = list(b)[0]
	if ev.Namespace != "default" || ev.Related == nil || ev.Related.Name != "shop" || len(ev.Note) != maxNoteBytes || ev.ReportingController != "component" {
		t.Errorf("event of a cluster-scoped object in workspace b: namespace %q, related %v, note %d bytes, controller %q", ev.Namespace, ev.Related, len(ev.Note), ev.ReportingController)
	}
}

func TestEventQueueNeverBlocks(t *testing.T) {
	scheme := apis.NewScheme()
	w := newEventWriter(scheme, logr.Discard())
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	app := &appsv1alpha1.Application{}
	app.Name, app.Namespace = "shop", "team"
	r := w.recorder(c, "application")
	done := make(chan struct{})
	go func() {
		for range eventQueueLength + 10 {
			r.Eventf(app, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "ready")
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Eventf blocked on a full queue")
	}
	if got := w.dropped.Load(); got != 10 {
		t.Fatalf("dropped %d events, want 10", got)
	}
}

func TestEventWriteFailuresAreCountedNotRetried(t *testing.T) {
	scheme := apis.NewScheme()
	w := newEventWriter(scheme, logr.Discard())
	var calls int
	c := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			calls++
			return context.DeadlineExceeded
		},
	}).Build()
	app := &appsv1alpha1.Application{}
	app.Name, app.Namespace = "shop", "team"
	w.recorder(c, "application").Eventf(app, nil, corev1.EventTypeNormal, "Ready", "Reconcile", "ready")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()
	waitFor(t, func() bool { return w.failed.Load() == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("%d writes of one event, want 1", calls)
	}
}
