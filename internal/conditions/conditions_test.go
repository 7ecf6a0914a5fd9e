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
	"unicode/utf8"

	appsv1alpha1 "github.com/knotless-dev/knotless/apis/apps/v1alpha1"
	atprotov1alpha1 "github.com/knotless-dev/knotless/apis/atproto/v1alpha1"
	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
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
