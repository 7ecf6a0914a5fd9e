/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package conditions holds the one error type that carries a condition
// reason from where a failure is understood (resolving a reference,
// walking an owner chain, talking to a PDS) to the controller that writes
// it into a condition, the reasons and condition types more than one API
// group uses, and the setters every controller writes its conditions
// with (Set, SetReady: apimachinery's meta.SetStatusCondition, which
// keeps LastTransitionTime unless the status changes).
//
// An *Error's message goes into a condition and an Event as it is: it must
// name only what the user wrote (a field, an object of their workspace),
// never configuration of knotless or of another tenant (R17).
package conditions

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReasonInvalidSpec is the reason of a spec that the schema accepts but
// knotless cannot use. Every API group declares it with this value
// (appsv1alpha1, atprotov1alpha1, computev1alpha1 ReasonInvalidSpec);
// packages that serve several groups use this one.
const ReasonInvalidSpec = "InvalidSpec"

// TypeReady is the Ready condition's type. Every API group declares it
// with this value (its ConditionReady).
const TypeReady = "Ready"

// Set sets the condition typ of conds to status, reason and msg, observed
// at generation gen, and reports whether that changed conds. The
// condition's LastTransitionTime changes only when its status does
// (meta.SetStatusCondition), so a status written when Set reports no
// change, and nothing else changed, is the one already stored.
func Set(conds *[]metav1.Condition, typ string, gen int64, status metav1.ConditionStatus, reason, msg string) bool {
	return meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// SetReady is Set of the Ready condition.
func SetReady(conds *[]metav1.Condition, gen int64, status metav1.ConditionStatus, reason, msg string) bool {
	return Set(conds, TypeReady, gen, status, reason, msg)
}

// Error is a failure with the condition reason it maps to. Its Error()
// is Message; Err, when set, is the cause (for errors.Is and errors.As),
// not shown.
type Error struct {
	// Reason is a condition reason (CamelCase).
	Reason string
	// Message is the condition's message.
	Message string
	// Err is the cause, or nil.
	Err error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with reason, cause err (may be nil) and the
// message format and args make.
func Errorf(reason string, err error, format string, args ...any) *Error {
	return &Error{Reason: reason, Message: fmt.Sprintf(format, args...), Err: err}
}

// ReasonOf returns the reason of the first *Error in err's chain, or
// fallback when there is none.
func ReasonOf(err error, fallback string) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return fallback
}

// MaxQuoted is how many bytes of text another party wrote (a tenant's
// answer, say) a condition or Event quotes: far below the 32 KiB limit of
// a condition's message, so that no answer makes a status write fail.
const MaxQuoted = 1024

// truncatedMark ends a quote that was cut.
const truncatedMark = " [truncated]"

// Quote returns s cut to at most MaxQuoted bytes on a UTF-8 boundary, the
// cut marked with " [truncated]".
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return s
	}
	cut := MaxQuoted - len(truncatedMark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedMark
}
