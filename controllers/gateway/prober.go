/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package gateway

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	gatewayv1alpha1 "github.com/knotless-dev/knotless/apis/gateway/v1alpha1"
)

// Bounds and waits of the probes.
const (
	// maxProbes run at once in all; maxProbesPerWorkspace of one
	// workspace. A probe runs beside the reconciles, never in one: a
	// bidder's gateway that stalls holds a probe slot, not a worker.
	maxProbes             = 16
	maxProbesPerWorkspace = 4
	// firstWait is the wait after a probe that did not find the Service
	// serving; it doubles with each such probe of one claim, up to
	// lastWait. A claim that is served is probed every servingWait.
	firstWait = time.Second
	lastWait  = 5 * time.Minute
)

// prober runs the Gateways' probes aside, one at a time per Gateway,
// and wakes a Gateway when its probe is done.
type prober struct {
	probe func(ctx context.Context, address, hostname string) Probed
	now   func() time.Time
	wake  chan event.TypedGenericEvent[mcreconcile.Request]

	mu      sync.Mutex
	base    context.Context
	byUID   map[types.UID]*probing
	running map[string]int // by workspace
	wg      sync.WaitGroup
}

// probing is what is known of one Gateway's probes, for one claim (its
// address and hostname).
type probing struct {
	key     string
	got     *Probed
	next    time.Time // when it is probed again
	wait    time.Duration
	running bool
}

func newProber(probe func(ctx context.Context, address, hostname string) Probed, now func() time.Time) *prober {
	return &prober{probe: probe, now: now, wake: make(chan event.TypedGenericEvent[mcreconcile.Request], 256),
		byUID: map[types.UID]*probing{}, running: map[string]int{}}
}

// Start implements manager.Runnable: probes end with ctx, and Start
// returns once they have.
func (p *prober) Start(ctx context.Context) error {
	p.mu.Lock()
	p.base = ctx
	p.mu.Unlock()
	<-ctx.Done()
	p.wg.Wait()
	return nil
}

// source wakes the Gateways whose probes are done.
func (p *prober) source() source.TypedSource[mcreconcile.Request] {
	return source.TypedChannel[mcreconcile.Request, mcreconcile.Request](p.wake, handler.TypedFuncs[mcreconcile.Request, mcreconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[mcreconcile.Request], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
			q.Add(e.Object)
		},
	})
}

// result is the last probe of req's Gateway (uid) for hostname through
// address, if any, and when to look again; a probe is started when one
// is due and a slot is free. It runs under the manager's context once
// the prober started, else (no manager: tests) under ctx.
func (p *prober) result(ctx context.Context, req mcreconcile.Request, uid types.UID, address, hostname string) (*Probed, time.Duration) {
	key := address + " " + hostname
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.byUID[uid]
	if st == nil || st.key != key {
		st = &probing{key: key}
		p.byUID[uid] = st
	}
	now := p.now()
	if st.running {
		return st.got, probeTimeout + time.Second // the probe's end wakes it sooner
	}
	if st.got != nil && now.Before(st.next) {
		return st.got, st.next.Sub(now)
	}
	ws := string(req.ClusterName)
	if p.running[ws] >= maxProbesPerWorkspace || p.total() >= maxProbes {
		return st.got, firstWait
	}
	base := p.base
	if base == nil {
		base = ctx
	}
	st.running = true
	p.running[ws]++
	p.wg.Add(1)
	go p.run(base, req, st, ws, address, hostname)
	return st.got, probeTimeout + time.Second
}

func (p *prober) total() int {
	n := 0
	for _, c := range p.running {
		n += c
	}
	return n
}

// run probes once and wakes the Gateway.
func (p *prober) run(base context.Context, req mcreconcile.Request, st *probing, ws, address, hostname string) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(base, probeTimeout)
	got := p.probe(ctx, address, hostname)
	cancel()
	p.mu.Lock()
	st.running, st.got = false, &got
	if got.Reason == gatewayv1alpha1.ReasonServing {
		st.wait = 0
		st.next = p.now().Add(servingWait)
	} else {
		st.wait = min(max(2*st.wait, firstWait), lastWait)
		st.next = p.now().Add(st.wait)
	}
	if p.running[ws]--; p.running[ws] <= 0 {
		delete(p.running, ws)
	}
	p.mu.Unlock()
	select {
	case p.wake <- event.TypedGenericEvent[mcreconcile.Request]{Object: req}:
	default: // full: the Gateway looks again after probeTimeout anyway
	}
}

// forget drops what is known of uid's probes (its claim changed, or it
// is gone): the next look probes again at once.
func (p *prober) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.byUID[uid]; st != nil && !st.running {
		delete(p.byUID, uid)
	}
}

// wait waits for the probes that run (tests).
func (p *prober) wait() { p.wg.Wait() }
