/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/netpolicy"
)

// probeTimeout bounds one request through a gateway.
const probeTimeout = 5 * time.Second

// Probed is what a request for a hostname through a gateway found.
type Probed struct {
	// Reason is the Ready reason: Serving when the Service answered (any
	// status of its own), else why not (gatewayv1alpha1 reasons).
	Reason string
	// Message says it for the condition.
	Message string
}

// refusal is the Ready reason of one of the gateway's own refusals (its
// ReasonHeader); false: a value the gateway does not send.
func refusal(header string) (string, bool) {
	switch header {
	case gateway.ReasonServiceNotFound:
		return gatewayv1alpha1.ReasonServiceNotFound, true
	case gateway.ReasonPortNotFound:
		return gatewayv1alpha1.ReasonPortNotFound, true
	case gateway.ReasonNoReadyEndpoint:
		return gatewayv1alpha1.ReasonNoReadyEndpoint, true
	case gateway.ReasonTenantUnreachable:
		return gatewayv1alpha1.ReasonTenantUnreachable, true
	case gateway.ReasonUpstreamFailed:
		return gatewayv1alpha1.ReasonUpstreamFailed, true
	case gateway.ReasonNoRoute:
		return gatewayv1alpha1.ReasonWaiting, true
	}
	return "", false
}

// probe sets Ready from the last probe of the hostname through the
// gateway at address (the prober runs them aside) and says when to look
// again.
func (s *syncer) probe(req mcreconcile.Request, address string) reconcile.Result {
	got, wait := s.r.prober().result(s.ctx, req, s.g.UID, address, s.g.Spec.Hostname)
	switch {
	case got == nil:
		s.set(gatewayv1alpha1.ConditionReady, metav1.ConditionFalse, gatewayv1alpha1.ReasonWaiting, "the hostname is being probed through the gateway at "+address)
	case got.Reason == gatewayv1alpha1.ReasonServing:
		s.set(gatewayv1alpha1.ConditionReady, metav1.ConditionTrue, got.Reason, got.Message)
	default:
		s.set(gatewayv1alpha1.ConditionReady, metav1.ConditionFalse, got.Reason, got.Message)
	}
	return reconcile.Result{RequeueAfter: wait}
}

// Probe sends GET / for hostname to the gateway at address (whatever
// the hostname's DNS says, like curl --resolve), over TLS checked for
// hostname against roots (nil: the system's), dialing through policy and
// following no redirect; nothing of the answer but its status and the
// gateway's reason header is read.
func Probe(ctx context.Context, policy *netpolicy.Policy, roots *x509.CertPool, address, hostname string) Probed {
	dialer := policy.Dialer(5 * time.Second)
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, address)
		},
		TLSClientConfig:        &tls.Config{ServerName: hostname, RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    5 * time.Second,
		ResponseHeaderTimeout:  probeTimeout,
		MaxResponseHeaderBytes: 64 << 10,
		DisableKeepAlives:      true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, CheckRedirect: netpolicy.NoRedirects, Timeout: probeTimeout}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, URL(hostname, address), nil)
	if err != nil {
		return Probed{Reason: gatewayv1alpha1.ReasonGatewayUnreachable, Message: "no request can be made for the hostname"}
	}
	req.Header.Set("User-Agent", "knotless-gateway-probe")
	var private atomic.Bool
	resp, err := hc.Do(req.WithContext(netpolicy.TracePrivate(ctx, &private)))
	if err != nil {
		if private.Load() {
			// What failed at an address the operator allowed is the
			// operator's to know, not the lease's author's (R17).
			return Probed{Reason: gatewayv1alpha1.ReasonGatewayUnreachable, Message: fmt.Sprintf("the gateway at %s did not answer for %s", address, hostname)}
		}
		return Probed{Reason: gatewayv1alpha1.ReasonGatewayUnreachable, Message: unreachable(address, hostname, err)}
	}
	_ = resp.Body.Close()
	why := resp.Header.Get(gateway.ReasonHeader)
	if why == "" {
		return Probed{Reason: gatewayv1alpha1.ReasonServing, Message: fmt.Sprintf("a request for %s through the gateway at %s was answered by the Service", hostname, address)}
	}
	reason, known := refusal(why)
	if !known {
		return Probed{Reason: gatewayv1alpha1.ReasonWaiting, Message: fmt.Sprintf("the gateway at %s refused the request for %s", address, hostname)}
	}
	if reason == gatewayv1alpha1.ReasonWaiting {
		return Probed{Reason: reason, Message: fmt.Sprintf("the gateway at %s does not serve %s yet (it has not read the association record, or its certificate does not cover the hostname)", address, hostname)}
	}
	return Probed{Reason: reason, Message: fmt.Sprintf("the gateway at %s serves %s but reached no ready endpoint of the Service: %s", address, hostname, reason)}
}

// unreachable says why the gateway was not reached, without quoting what
// it sent.
func unreachable(address, hostname string, err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.HostnameError
	var denied *netpolicy.DeniedError
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("the gateway at %s presents a certificate this provider does not trust", address)
	case errors.As(err, &invalid):
		return fmt.Sprintf("the gateway at %s presents a certificate that does not cover %s", address, hostname)
	case errors.As(err, &denied):
		return fmt.Sprintf("the gateway's address %s is not one this provider may dial", address)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("the gateway at %s did not answer within %s", address, probeTimeout)
	}
	return fmt.Sprintf("the gateway at %s did not answer", address)
}
