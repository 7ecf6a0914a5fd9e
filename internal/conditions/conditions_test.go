/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package conditions

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

func TestError(t *testing.T) {
	cause := errors.New("secret value must not show")
	err := fmt.Errorf("connecting: %w", Errorf("CredentialNotFound", cause, "Secret %s has no key %q", "pds", "password"))
	if got := ReasonOf(err, "Fallback"); got != "CredentialNotFound" {
		t.Fatalf("ReasonOf = %s", got)
	}
	var e *Error
	if !errors.As(err, &e) || e.Error() != `Secret pds has no key "password"` || e.Message != e.Error() {
		t.Fatalf("As: %#v", e)
	}
	if !errors.Is(err, cause) {
		t.Fatal("the cause is not unwrapped")
	}
	if got := ReasonOf(cause, "Fallback"); got != "Fallback" {
		t.Fatalf("ReasonOf(plain error) = %s", got)
	}
	if got := ReasonOf(nil, "Fallback"); got != "Fallback" {
		t.Fatalf("ReasonOf(nil) = %s", got)
	}
}

// The shared reasons have the value every API group gives them.
func TestSharedReasonsMatchTheAPIGroups(t *testing.T) {
	for _, r := range []string{appsv1alpha1.ReasonInvalidSpec, atprotov1alpha1.ReasonInvalidSpec, computev1alpha1.ReasonInvalidSpec} {
		if r != ReasonInvalidSpec {
			t.Errorf("an API group's InvalidSpec is %q, want %q", r, ReasonInvalidSpec)
		}
	}
}

func TestSharedConditionTypesMatchTheAPIGroups(t *testing.T) {
	for _, typ := range []string{appsv1alpha1.ConditionReady, atprotov1alpha1.ConditionReady, computev1alpha1.ConditionReady, marketv1alpha1.ConditionReady} {
		if typ != TypeReady {
			t.Errorf("an API group's Ready is %q, want %q", typ, TypeReady)
		}
	}
}

// Set reports a change only when one of status, reason, message or
// generation changed, and moves LastTransitionTime only with the status.
func TestSet(t *testing.T) {
	var conds []metav1.Condition
	if !SetReady(&conds, 1, metav1.ConditionFalse, "Pending", "waiting") {
		t.Fatal("the first Set reports no change")
	}
	first := meta.FindStatusCondition(conds, TypeReady)
	first.LastTransitionTime = metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	was := first.LastTransitionTime
	if SetReady(&conds, 1, metav1.ConditionFalse, "Pending", "waiting") {
		t.Error("setting the same condition again reports a change")
	}
	for _, step := range []struct {
		gen    int64
		status metav1.ConditionStatus
		reason string
		moves  bool // LastTransitionTime
	}{
		{2, metav1.ConditionFalse, "Pending", false},
		{2, metav1.ConditionFalse, "Failed", false},
		{2, metav1.ConditionTrue, "Ready", true},
	} {
		if !Set(&conds, TypeReady, step.gen, step.status, step.reason, "m") {
			t.Errorf("%+v: no change reported", step)
		}
		c := meta.FindStatusCondition(conds, TypeReady)
		if c.ObservedGeneration != step.gen || c.Status != step.status || c.Reason != step.reason || c.Message != "m" {
			t.Errorf("%+v: condition %+v", step, c)
		}
		if moved := !c.LastTransitionTime.Equal(&was); moved != step.moves {
			t.Errorf("%+v: LastTransitionTime moved %v", step, moved)
		}
	}
	if len(conds) != 1 {
		t.Errorf("%d conditions, want 1", len(conds))
	}
}

func TestQuote(t *testing.T) {
	if got := Quote("short"); got != "short" {
		t.Errorf("Quote(short) = %q", got)
	}
	long := strings.Repeat("€", MaxQuoted) // three bytes a rune
	got := Quote(long)
	if len(got) > MaxQuoted || !strings.HasSuffix(got, " [truncated]") || !utf8.ValidString(got) {
		t.Errorf("Quote: %d bytes, valid UTF-8 %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-20:])
	}
}
