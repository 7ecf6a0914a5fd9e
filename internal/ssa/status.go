/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package ssa

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/knotless-dev/knotless/internal/suspend"
)

// StatusEvent is the Event that announces a status change.
type StatusEvent struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason and Note are the Event's reason and message.
	Reason, Note string
}

// StatusOptions says how WriteStatus writes and announces a status.
type StatusOptions struct {
	// Manager is the field manager that owns the status (R05).
	Manager string
	// Replace sends the status with ReplaceStatus, a JSON merge patch that
	// replaces its lists whole, instead of applying it with Status. See
	// ReplaceStatus for the status that needs it.
	Replace bool
	// Event, when not nil, is recorded on the object through Recorder
	// (nil: none), with Action, once the status is written. Make it with
	// ConditionChanged or PhaseChanged from the current and the desired
	// status.
	Event    *StatusEvent
	Recorder events.EventRecorder
	Action   string
}

// WriteStatus makes obj's status desired, as o.Manager, and records
// o.Event. current is the status obj was read with: when desired equals
// it (equality.Semantic) nothing is written and no Event recorded. An
// object deleted meanwhile (NotFound) is done: WriteStatus returns nil and
// records nothing. obj itself is not changed.
func WriteStatus[S any](ctx context.Context, c client.Client, obj client.Object, current, desired *S, o StatusOptions) error {
	if apiequality.Semantic.DeepEqual(current, desired) {
		return nil
	}
	var err error
	if o.Replace {
		cp, ok := obj.DeepCopyObject().(client.Object)
		if !ok {
			return fmt.Errorf("%T is not a client.Object", obj)
		}
		err = ReplaceStatus(ctx, c, cp, desired, o.Manager)
	} else {
		err = Status(ctx, c, obj, desired, o.Manager)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	if o.Event != nil && o.Recorder != nil {
		o.Recorder.Eventf(obj, nil, o.Event.Type, o.Event.Reason, o.Action, "%s", o.Event.Note)
	}
	return nil
}

// ConditionChanged is the Event of a change of the condition of type typ
// from the conditions before to those after: when it appears, or its
// status or reason changes. It is Normal when the condition is True and
// a Warning otherwise, with the condition's reason and message; nil when
// nothing of that changed.
func ConditionChanged(before, after []metav1.Condition, typ string) *StatusEvent {
	a := meta.FindStatusCondition(after, typ)
	if a == nil {
		return nil
	}
	if b := meta.FindStatusCondition(before, typ); b != nil && b.Status == a.Status && b.Reason == a.Reason {
		return nil
	}
	ev := &StatusEvent{Type: corev1.EventTypeNormal, Reason: a.Reason, Note: a.Message}
	if a.Status != metav1.ConditionTrue {
		ev.Type = corev1.EventTypeWarning
	}
	return ev
}

// PhaseMoved is PhaseChanged but for the first phase of a new object,
// which is no Event unless it is the failed phase: for the kinds a market
// makes by the hundred (MarketRequester, ComputeContract), where the
// object's creation says as much and every Event is a write to kcp
// (docs/market.md, What bounds the market's speed).
func PhaseMoved[P ~string](before, after, failed, suspended P, note string) *StatusEvent {
	if before == "" && after != failed {
		return nil
	}
	return PhaseChanged(before, after, failed, suspended, note)
}

// PhaseChanged is the Event of a change of phase from before to after,
// for kinds whose phase sums them up (Application, Component): the new
// phase is its reason, or Resumed when before is the suspended phase (""
// for kinds that have none); it
// is a Warning when after is the failed phase. note is its message (the
// Ready condition's). nil when the phase did not change.
func PhaseChanged[P ~string](before, after, failed, suspended P, note string) *StatusEvent {
	if before == after {
		return nil
	}
	ev := &StatusEvent{Type: corev1.EventTypeNormal, Reason: string(after), Note: note}
	switch {
	case after == failed:
		ev.Type = corev1.EventTypeWarning
	case suspended != "" && before == suspended:
		ev.Reason = suspend.ReasonResumed
	}
	return ev
}
