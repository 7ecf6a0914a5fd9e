package tenantcluster

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/mountproxy"
)

func TestClassify(t *testing.T) {
	status := func(reason string) []byte {
		return []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"` + reason + `","message":"m"}`)
	}
	for _, tt := range []struct {
		name       string
		shimReason string
		code       int
		body       []byte
		want       string
	}{
		{"tenant answered its version", "", 200, []byte(`{"gitVersion":"v1.32.0"}`), computev1alpha1.ReasonReady},
		{"200 that is not a version", "", 200, []byte(`<html>`), computev1alpha1.ReasonTenantError},
		{"tenant rejects the credential", "", 401, status("Unauthorized"), computev1alpha1.ReasonCredentialRejected},
		{"credential may not impersonate", "", 403, status("Forbidden"), computev1alpha1.ReasonCredentialRejected},
		{"tenant's own 502 is the tenant's answer", "", 502, []byte("bad gateway"), computev1alpha1.ReasonTenantError},
		{"shim: connection failed", mountproxy.ReasonTenantUnreachable, 502, status("TenantUnreachable"), computev1alpha1.ReasonTenantUnreachable},
		{"shim: certificate did not verify", mountproxy.ReasonTenantCertificate, 502, status("TenantCertificateInvalid"), computev1alpha1.ReasonTenantCertificateInvalid},
		{"shim: not registered yet", mountproxy.ReasonUnknownTenant, 404, nil, computev1alpha1.ReasonRegistering},
		{"shim: revoked", mountproxy.ReasonRevoked, 403, nil, computev1alpha1.ReasonRevoked},
		{"shim refuses the probe's certificate", mountproxy.ReasonUntrustedClient, 401, status("x"), computev1alpha1.ReasonMountProxyUnavailable},
	} {
		if got := classify(tt.shimReason, tt.code, tt.body); got.Reason != tt.want {
			t.Errorf("%s: %s (%s), want %s", tt.name, got.Reason, got.Message, tt.want)
		}
	}
}

func TestPhaseOf(t *testing.T) {
	for _, tt := range []struct{ reason, previous, want string }{
		{computev1alpha1.ReasonReady, "", computev1alpha1.PhaseReady},
		{computev1alpha1.ReasonTenantUnreachable, "", computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonTenantUnreachable, computev1alpha1.PhaseConnecting, computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonTenantUnreachable, computev1alpha1.PhaseReady, computev1alpha1.PhaseUnknown},
		{computev1alpha1.ReasonCredentialRejected, computev1alpha1.PhaseUnknown, computev1alpha1.PhaseUnknown},
		{computev1alpha1.ReasonRegistering, computev1alpha1.PhaseReady, computev1alpha1.PhaseConnecting},
		{computev1alpha1.ReasonMountProxyUnavailable, "", computev1alpha1.PhaseUnknown},
	} {
		if got := phaseOf(tt.reason, tt.previous); got != tt.want {
			t.Errorf("phaseOf(%s, %q) = %s, want %s", tt.reason, tt.previous, got, tt.want)
		}
	}
}

func TestRevokedStaysRevoked(t *testing.T) {
	revoked := computev1alpha1.TenantClusterStatus{Phase: computev1alpha1.PhaseInitializing, Conditions: []metav1.Condition{{Type: computev1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: computev1alpha1.ReasonRevoked}}}
	for _, tt := range []struct {
		name string
		st   computev1alpha1.TenantClusterStatus
		want bool
	}{
		{"new", computev1alpha1.TenantClusterStatus{}, false},
		{"never resolved", computev1alpha1.TenantClusterStatus{Phase: computev1alpha1.PhaseInitializing}, false},
		{"was ready", computev1alpha1.TenantClusterStatus{Phase: computev1alpha1.PhaseReady}, true},
		{"was connecting", computev1alpha1.TenantClusterStatus{Phase: computev1alpha1.PhaseConnecting}, true},
		{"already revoked (phase Initializing since)", revoked, true},
	} {
		if got := wasUsable(tt.st); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestTenantTextIsQuotedInPart (issue 27 item 6): a tenant's Status
// message and gitVersion of 60 KiB reach the condition and status cut to
// conditions.MaxQuoted bytes with a marker, far below the 32 KiB limit of
// a condition's message (a longer one would make every status write
// fail).
func TestTenantTextIsQuotedInPart(t *testing.T) {
	long := strings.Repeat("é", 30<<10) // 60 KiB, two bytes a rune
	status, _ := json.Marshal(metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonUnauthorized, Message: long})
	version, _ := json.Marshal(map[string]string{"gitVersion": long})
	for _, tt := range []struct {
		name       string
		shimReason string
		code       int
		body       []byte
		text       func(Result) string
	}{
		{"tenant's Unauthorized", "", 401, status, func(r Result) string { return r.Message }},
		{"tenant's 500", "", 500, status, func(r Result) string { return r.Message }},
		{"a Status under the shim's reason", mountproxy.ReasonTenantError, 502, status, func(r Result) string { return r.Message }},
		{"tenant's version", "", 200, version, func(r Result) string { return r.Version }},
	} {
		got := tt.text(classify(tt.shimReason, tt.code, tt.body))
		if len(got) > conditions.MaxQuoted+100 || !strings.HasSuffix(got, " [truncated]") || !utf8.ValidString(got) {
			t.Errorf("%s: %d bytes, ends %q", tt.name, len(got), got[max(0, len(got)-20):])
		}
	}
}
