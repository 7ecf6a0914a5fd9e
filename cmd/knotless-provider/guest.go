/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/knotless-dev/knotless/cmd/knotless-provider/options"
	"github.com/knotless-dev/knotless/controllers/guestidentity"
	"github.com/knotless-dev/knotless/internal/bootstrap"
	"github.com/knotless-dev/knotless/internal/guestadmission"
	"github.com/knotless-dev/knotless/internal/tenantreach"
)

// WebhookConfiguration is the name of the MutatingWebhookConfiguration the
// provider keeps in its workspace: kcp calls it for the GuestIdentityGrants
// of every workspace bound to the export.
const WebhookConfiguration = "knotless-guestidentitygrants"

// setupGuests registers the guestidentity controller and, when guests are
// enabled (--guest-kcp-server), serves the admission webhook and applies
// its configuration in the provider workspace. Without them, grants are
// reported NotEnabled.
func setupGuests(ctx context.Context, mgr mcmanager.Manager, o options.GuestOptions, mounts client.Client, reaches *tenantreach.Registry) error {
	r := &guestidentity.Reconciler{GetCluster: mgr.GetCluster, Reaches: reaches}
	if o.Server != "" {
		cfg := mgr.GetLocalManager().GetConfig()
		base, err := bootstrap.BaseURL(cfg.Host)
		if err != nil {
			return err
		}
		r.Base = rest.CopyConfig(cfg)
		r.Base.Host = base
		if err := bootstrap.EnsureNamespace(ctx, cfg, guestadmission.KeyNamespace); err != nil {
			return fmt.Errorf("the namespace %s of the GuestIdentityGrant admission key: %w", guestadmission.KeyNamespace, err)
		}
		if r.Key, err = guestadmission.LoadKey(ctx, mounts, guestadmission.KeyNamespace); err != nil {
			return fmt.Errorf("the key of the GuestIdentityGrant admission stamps: %w", err)
		}
		r.Guest = guestidentity.KCP{Server: o.Server, TLSServerName: o.TLSServerName}
		if r.Guest.CA, err = os.ReadFile(o.CAFile); err != nil {
			return fmt.Errorf("--guest-kcp-ca-file: %w", err)
		}
		if err := serveAdmission(ctx, mgr, o, r.Base, r.Key); err != nil {
			return err
		}
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the guestidentity controller: %w", err)
	}
	return nil
}

// serveAdmission serves the GuestIdentityGrant webhook on every replica
// and applies its configuration in the provider workspace.
func serveAdmission(ctx context.Context, mgr mcmanager.Manager, o options.GuestOptions, base *rest.Config, key []byte) error {
	host, port, err := net.SplitHostPort(o.WebhookBindAddress)
	if err != nil {
		return fmt.Errorf("--admission-webhook-bind-address: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("--admission-webhook-bind-address: %w", err)
	}
	wo := webhook.Options{Host: host, Port: p, CertDir: o.WebhookCertDir}
	srv := webhook.NewServer(wo)
	// kcp v0.28.1 presents no client certificate to webhooks: the path
	// holds a secret of the deployment (derived from the stamps' key), so
	// that only who reads the webhook's configuration can call it.
	path := guestadmission.PathFor(key)
	srv.Register(path, &webhook.Admission{Handler: &guestadmission.Handler{Key: key, Check: guestadmission.SARChecker(base)}})
	if err := mgr.GetLocalManager().Add(srv); err != nil {
		return err
	}
	ca, err := os.ReadFile(o.WebhookCAFile)
	if err != nil {
		return fmt.Errorf("--admission-webhook-ca-file: %w", err)
	}
	cs, err := kubernetes.NewForConfig(mgr.GetLocalManager().GetConfig())
	if err != nil {
		return err
	}
	want := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: WebhookConfiguration},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "guestidentitygrants.identity.knotless.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(strings.TrimSuffix(o.WebhookURL, "/") + path), CABundle: ca},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"identity.knotless.dev"}, APIVersions: []string{"*"}, Resources: []string{"guestidentitygrants"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](10),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		}},
	}
	api := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
	} else {
		cur.Webhooks = want.Webhooks
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("the MutatingWebhookConfiguration %s in the provider workspace: %w", WebhookConfiguration, err)
	}
	return nil
}
