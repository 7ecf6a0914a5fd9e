/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/client-go/tools/reference"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// eventQueueLength bounds the Events waiting to be written, over all
// workspaces; an Event beyond it is dropped (and counted), as client-go's
// broadcaster drops Events when its queue is full.
const eventQueueLength = 1000

// maxNoteBytes is the longest note the events API accepts.
const maxNoteBytes = 1024

// eventWriter writes the Events of every engaged workspace with one
// goroutine and one bounded queue. client-go's recorders need a
// broadcaster (two goroutines, a 1000-slot queue and a sink) per API
// server; multicluster-provider makes one per workspace, which cost about
// 160 KiB per workspace. Events are written with the workspace's client;
// the writer does not aggregate repeated Events into series (knotless's
// controllers emit an Event per transition, not per reconcile).
type eventWriter struct {
	scheme   *runtime.Scheme
	instance string
	log      logr.Logger
	queue    chan pendingEvent
	dropped  atomic.Int64
	failed   atomic.Int64
}

type pendingEvent struct {
	c  client.Client
	ev *eventsv1.Event
}

func newEventWriter(scheme *runtime.Scheme, log logr.Logger) *eventWriter {
	host, _ := os.Hostname()
	return &eventWriter{scheme: scheme, instance: host, log: log, queue: make(chan pendingEvent, eventQueueLength)}
}

// run writes queued Events until ctx ends.
func (w *eventWriter) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-w.queue:
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := p.c.Create(cctx, p.ev)
			cancel()
			if err != nil {
				w.failed.Add(1)
				w.log.V(1).Info("event not written", "namespace", p.ev.Namespace, "regarding", p.ev.Regarding.Name, "reason", p.ev.Reason, "error", err.Error())
			}
		}
	}
}

// recorder returns the recorder of one controller (component) in the
// workspace that c writes to.
func (w *eventWriter) recorder(c client.Client, component string) *recorder {
	return &recorder{w: w, c: c, component: component}
}

// recorder is an events.EventRecorder of one workspace and controller.
type recorder struct {
	w         *eventWriter
	c         client.Client
	component string
}

var (
	_ events.EventRecorder = &recorder{}
	_ record.EventRecorder = legacyRecorder{}
)

// Eventf queues an Event as client-go's events recorder makes it; it never
// blocks.
func (r *recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if !util.ValidateEventType(eventtype) {
		r.w.log.Error(nil, "unsupported event type", "type", eventtype, "reason", reason)
		return
	}
	ref, err := reference.GetReference(r.w.scheme, regarding)
	if err != nil {
		r.w.log.Error(err, "no reference for an event's object", "reason", reason)
		return
	}
	var relatedRef *corev1.ObjectReference
	if related != nil {
		relatedRef, _ = reference.GetReference(r.w.scheme, related)
	}
	msg := note
	if len(args) > 0 {
		msg = fmt.Sprintf(note, args...)
	}
	if len(msg) > maxNoteBytes {
		msg = msg[:maxNoteBytes-3] + "..."
	}
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := time.Now()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: util.GenerateEventName(ref.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.component,
		ReportingInstance:   r.component + "-" + r.w.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           *ref,
		Related:             relatedRef,
		Note:                msg,
		Type:                eventtype,
	}
	select {
	case r.w.queue <- pendingEvent{c: r.c, ev: ev}:
	default:
		if r.w.dropped.Add(1) == 1 {
			r.w.log.Info("event queue full; events are dropped until it drains", "length", eventQueueLength)
		}
	}
}

// legacyRecorder is the core/v1 EventRecorder API over a recorder; the
// action of its Events is their reason.
type legacyRecorder struct{ r *recorder }

func (l legacyRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	l.r.Eventf(object, nil, eventtype, reason, reason, "%s", message)
}

func (l legacyRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	l.r.Eventf(object, nil, eventtype, reason, reason, messageFmt, args...)
}

func (l legacyRecorder) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...any) {
	l.r.Eventf(object, nil, eventtype, reason, reason, messageFmt, args...)
}
