package tenantcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/bodylimit"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/mount"
	"github.com/knotless-dev/knotless/internal/netpolicy"
	"github.com/knotless-dev/knotless/mountproxy"
)

// Prober asks a tenant for its version through the shim, exactly as kcp's
// requests go: the shim's requestheader authentication, its registry
// lookup, the tenant's TLS and credential, impersonation.
type Prober struct {
	// ShimURL is the shim's own address (https://host:port), reached with
	// TLS's client certificate, which the shim's requestheader CA issued.
	ShimURL string
	TLS     *mountproxy.ClientTLS
	// PathPrefix of the shim (default /tenants/).
	PathPrefix string
	// UserHeader and GroupHeader are the shim's identity header names
	// (required).
	UserHeader, GroupHeader string
	Timeout                 time.Duration
}

// maxProbeBody bounds what the probe reads of an answer to /version: the
// tenant's version (a few hundred bytes) or a Status (R21). A longer answer
// is a TenantError, not a cut document read as if it were whole.
const maxProbeBody = 64 << 10

// noMountProxy is the result when the provider has no mount proxy.
func noMountProxy() Result {
	return Result{Reason: computev1alpha1.ReasonMountProxyUnavailable, Message: "the provider has no mount proxy configured (--mountproxy-url)"}
}

// Result is what a probe found: a phase-independent reason, its message,
// and the tenant's version on success.
type Result struct {
	Reason, Message, Version string
}

// Probe requests <shim>/<prefix>/<lc>/<name>/version. The reason comes
// from the shim's reason header when the shim answered itself (it names
// the forwarding error's type), or from the tenant's own Status answer;
// an HTTP status alone never decides it (R16).
// A nil *Prober (no mount proxy configured) reports MountProxyUnavailable.
func (p *Prober) Probe(ctx context.Context, lc, name string) Result {
	if p == nil {
		return noMountProxy()
	}
	prefix := p.PathPrefix
	if prefix == "" {
		prefix = "/tenants/"
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.ShimURL+prefix+lc+"/"+name+"/version", nil)
	if err != nil {
		return Result{Reason: computev1alpha1.ReasonMountProxyUnavailable, Message: err.Error()}
	}
	req.Header.Set(p.UserHeader, mount.ProbeUser)
	req.Header.Set(p.GroupHeader, "system:authenticated")
	// No redirect is followed (R18): a 3xx from the shim would carry the
	// identity headers and the probe's certificate elsewhere.
	resp, err := (&http.Client{Transport: p.TLS.Transport(), CheckRedirect: netpolicy.NoRedirects}).Do(req)
	if err != nil {
		return Result{Reason: computev1alpha1.ReasonMountProxyUnavailable, Message: "the mount proxy did not answer the probe: " + err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(bodylimit.Reader(resp.Body, maxProbeBody))
	if errors.Is(err, bodylimit.ErrTooLarge) {
		return Result{Reason: computev1alpha1.ReasonTenantError, Message: fmt.Sprintf("the answer to /version is larger than %d KiB", maxProbeBody>>10)}
	}
	return classify(resp.Header.Get(mountproxy.ReasonHeader), resp.StatusCode, body)
}

// classify turns the shim's reason header, or the tenant's answer, into a
// TenantCluster reason.
func classify(shimReason string, code int, body []byte) Result {
	var st metav1.Status
	_ = json.Unmarshal(body, &st)
	// Whatever answered wrote the message and the version: they are
	// quoted into the condition and status only in part (MaxQuoted).
	st.Message = conditions.Quote(st.Message)
	switch shimReason {
	case "":
		// The tenant answered.
	case mountproxy.ReasonTenantUnreachable:
		return Result{Reason: computev1alpha1.ReasonTenantUnreachable, Message: st.Message}
	case mountproxy.ReasonTenantCertificate:
		return Result{Reason: computev1alpha1.ReasonTenantCertificateInvalid, Message: st.Message}
	case mountproxy.ReasonUnknownTenant:
		return Result{Reason: computev1alpha1.ReasonRegistering, Message: "the mount proxy has not registered the tenant yet"}
	case mountproxy.ReasonRevoked:
		return Result{Reason: computev1alpha1.ReasonRevoked, Message: "the mount proxy refuses the tenant: it is revoked there"}
	case mountproxy.ReasonTenantError:
		return Result{Reason: computev1alpha1.ReasonTenantError, Message: st.Message}
	case mountproxy.ReasonTenantRedirect:
		return Result{Reason: computev1alpha1.ReasonTenantRedirect, Message: st.Message}
	case mountproxy.ReasonAddressNotAllowed:
		return Result{Reason: computev1alpha1.ReasonAddressNotAllowed, Message: st.Message}
	default:
		return Result{Reason: computev1alpha1.ReasonMountProxyUnavailable, Message: fmt.Sprintf("the mount proxy refused the probe (%s): %s", shimReason, st.Message)}
	}
	if code >= 300 && code < 400 {
		// Not from the shim, which turns a tenant's redirect into its own
		// refusal: whatever answered is not the shim.
		return Result{Reason: computev1alpha1.ReasonMountProxyUnavailable, Message: "the mount proxy's address answered with a redirect, which the probe does not follow"}
	}
	if code == http.StatusOK {
		var v version.Info
		if err := json.Unmarshal(body, &v); err != nil || v.GitVersion == "" {
			return Result{Reason: computev1alpha1.ReasonTenantError, Message: "the tenant's /version answer is not a version"}
		}
		return Result{Reason: computev1alpha1.ReasonReady, Message: "the tenant answered through the mount proxy", Version: conditions.Quote(v.GitVersion)}
	}
	switch st.Reason {
	case metav1.StatusReasonUnauthorized:
		return Result{Reason: computev1alpha1.ReasonCredentialRejected, Message: "the tenant rejected the credential: " + st.Message}
	case metav1.StatusReasonForbidden:
		return Result{Reason: computev1alpha1.ReasonCredentialRejected, Message: "the credential may not impersonate the probe user on the tenant: " + st.Message}
	}
	return Result{Reason: computev1alpha1.ReasonTenantError, Message: fmt.Sprintf("the tenant answered %d to /version: %s", code, st.Message)}
}
