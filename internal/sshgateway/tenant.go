/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package sshgateway

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

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

// checkTimeout bounds each request to a tenant before the exec (the
// pod read, the review).
const checkTimeout = 10 * time.Second

// Targets are the tenants sessions may reach, by tenant (VM UID): the
// record key of the tenant's lease, which a session names, and the
// namespaces its requester lists in dev.knotless.gateway.ssh records.
type Targets struct {
	mu sync.Mutex
	m  map[string]target
}

type target struct {
	lease      string
	namespaces []string
}

// Set replaces tenant's lease key and namespaces (none: it is not
// reached).
func (t *Targets) Set(tenant, lease string, namespaces []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(namespaces) == 0 || lease == "" {
		delete(t.m, tenant)
		return
	}
	if t.m == nil {
		t.m = map[string]target{}
	}
	t.m[tenant] = target{lease: lease, namespaces: slices.Clone(namespaces)}
}

// Find is the tenant whose lease's record key is lease, if it lets
// sessions into namespace ns.
func (t *Targets) Find(lease, ns string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for tenant, tg := range t.m {
		if tg.lease == lease && slices.Contains(tg.namespaces, ns) {
			return tenant, true
		}
	}
	return "", false
}

// Executor runs sessions in the tenants of Targets: the tenant the
// session names, if it lets sessions into the namespace, the pod exists
// and the tenant's RBAC lets the session's DID create pods/exec on it (a
// SubjectAccessReview as the tenant's admin); the exec is then made as
// the DID (impersonated), so the tenant's API server checks it again.
// No other tenant is asked anything.
type Executor struct {
	Targets *Targets
	// Admin is a tenant's admin configuration.
	Admin func(ctx context.Context, tenant string) (*rest.Config, error)
}

// Exec implements Server.Exec.
func (e *Executor) Exec(ctx context.Context, s Session) (int, error) {
	tenant, ok := e.Targets.Find(s.Tenant, s.Namespace)
	if !ok {
		return 0, ErrRefused
	}
	cfg, err := e.Admin(ctx, tenant)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	ok, err = allowed(cctx, cfg, s)
	cancel()
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrRefused
	}
	return exec(ctx, cfg, s)
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
