/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package sshgateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// Targets are the tenants sessions may reach, by tenant (VM UID): the
// namespaces their requesters list in dev.knotless.gateway.ssh records.
type Targets struct {
	mu sync.Mutex
	m  map[string][]string
}

// Set replaces tenant's namespaces (none: it is not reached).
func (t *Targets) Set(tenant string, namespaces []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(namespaces) == 0 {
		delete(t.m, tenant)
		return
	}
	if t.m == nil {
		t.m = map[string][]string{}
	}
	t.m[tenant] = slices.Clone(namespaces)
}

// With are the tenants that let sessions into namespace ns, sorted.
func (t *Targets) With(ns string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for tenant, nss := range t.m {
		if slices.Contains(nss, ns) {
			out = append(out, tenant)
		}
	}
	sort.Strings(out)
	return out
}

// Executor runs sessions in the tenants of Targets: the one tenant whose
// namespace holds the pod, if the tenant's RBAC lets the session's DID
// create pods/exec on it (a SubjectAccessReview as the tenant's admin);
// the exec is then made as the DID (impersonated), so the tenant's API
// server checks it again.
type Executor struct {
	Targets *Targets
	// Admin is a tenant's admin configuration.
	Admin func(ctx context.Context, tenant string) (*rest.Config, error)
}

// Exec implements Server.Exec.
func (e *Executor) Exec(ctx context.Context, s Session) (int, error) {
	var found *rest.Config
	for _, tenant := range e.Targets.With(s.Namespace) {
		cfg, err := e.Admin(ctx, tenant)
		if err != nil {
			continue
		}
		ok, err := allowed(ctx, cfg, s)
		if err != nil || !ok {
			continue
		}
		if found != nil {
			// The pod's name is in two tenants the DID may enter.
			return 0, fmt.Errorf("%w: the pod is in more than one tenant", ErrRefused)
		}
		found = cfg
	}
	if found == nil {
		return 0, ErrRefused
	}
	return exec(ctx, found, s)
}

// allowed: the pod exists in the tenant of cfg, and its RBAC lets s.DID
// create pods/exec on it.
func allowed(ctx context.Context, cfg *rest.Config, s Session) (bool, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	if _, err := cs.CoreV1().Pods(s.Namespace).Get(ctx, s.Pod, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: s.DID, Groups: []string{"system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: s.Namespace, Verb: "create", Resource: "pods", Subresource: "exec", Name: s.Pod}}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return got.Status.Allowed, nil
}

// exec runs s in its pod as s.DID and returns the command's exit status.
func exec(ctx context.Context, admin *rest.Config, s Session) (int, error) {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: s.DID, Groups: []string{"system:authenticated"}}
	cfg.Timeout = 0 // a session lasts as long as it lasts
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	cmd := s.Command
	if len(cmd) == 0 {
		cmd = []string{"/bin/sh"}
	}
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(s.Namespace).Name(s.Pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: cmd, Stdin: s.Stdin != nil, Stdout: true, Stderr: !s.TTY, TTY: s.TTY}, clientgoscheme.ParameterCodec).URL()
	exe, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
	if err != nil {
		return 0, err
	}
	opts := remotecommand.StreamOptions{Stdin: s.Stdin, Stdout: s.Stdout, Tty: s.TTY}
	if !s.TTY {
		opts.Stderr = s.Stderr
	}
	if s.TTY && s.Resize != nil {
		opts.TerminalSizeQueue = sizes{ctx: ctx, ch: s.Resize}
	}
	err = exe.StreamWithContext(ctx, opts)
	var exit utilexec.CodeExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		return exit.Code, nil
	case apierrors.IsForbidden(err):
		return 0, ErrRefused
	}
	return 0, err
}

// sizes is a TerminalSizeQueue of a session's window sizes.
type sizes struct {
	ctx context.Context
	ch  <-chan Size
}

func (q sizes) Next() *remotecommand.TerminalSize {
	select {
	case sz, ok := <-q.ch:
		if !ok {
			return nil
		}
		return &remotecommand.TerminalSize{Width: sz.Width, Height: sz.Height}
	case <-q.ctx.Done():
		return nil
	}
}
