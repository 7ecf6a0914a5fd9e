/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
)

// Builder builds a controller of the workspaces a Provider engages. It
// reads like multicluster-runtime's builder (Named, For, Owns, Watches,
// WithOptions, Complete), but every watch is a Kind source of the
// provider, and the controller is a runnable of the local manager, not a
// multicluster-aware one: engaging a workspace starts nothing per
// controller. Requests for a workspace that is gone are dropped
// (multicluster-runtime's ClusterNotFoundWrapper).
type Builder struct {
	mgr     mcmanager.Manager
	name    string
	forObj  client.Object
	watches []watch
	raw     []source.TypedSource[mcreconcile.Request]
	opts    controller.TypedOptions[mcreconcile.Request]
}

type watch struct {
	obj   client.Object
	h     mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request]
	preds []predicate.Predicate
}

// ControllerManagedBy starts building a controller of mgr, whose provider
// must be a *Provider.
func ControllerManagedBy(mgr mcmanager.Manager) *Builder {
	return &Builder{mgr: mgr}
}

// Named sets the controller's name (unique; used in metrics and logs).
func (b *Builder) Named(name string) *Builder {
	b.name = name
	return b
}

// For reconciles obj's kind: each event enqueues its object.
func (b *Builder) For(obj client.Object, preds ...predicate.Predicate) *Builder {
	b.forObj = obj
	b.watches = append(b.watches, watch{obj: obj, h: mchandler.TypedEnqueueRequestForObject[client.Object](), preds: preds})
	return b
}

// Owns enqueues the controller owner (of the For kind) of each obj.
func (b *Builder) Owns(obj client.Object, preds ...predicate.Predicate) *Builder {
	b.watches = append(b.watches, watch{obj: obj, preds: preds})
	return b
}

// Watches hands obj's events to h.
func (b *Builder) Watches(obj client.Object, h mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request], preds ...predicate.Predicate) *Builder {
	b.watches = append(b.watches, watch{obj: obj, h: h, preds: preds})
	return b
}

// WatchesRawSource adds a source that is not a kind of the engaged
// workspaces (for example the market feeds, which wake a controller when
// a record on a firehose concerns one of its objects).
func (b *Builder) WatchesRawSource(src source.TypedSource[mcreconcile.Request]) *Builder {
	b.raw = append(b.raw, src)
	return b
}

// WithOptions sets the controller's options.
func (b *Builder) WithOptions(o controller.TypedOptions[mcreconcile.Request]) *Builder {
	b.opts = o
	return b
}

// Complete builds the controller and adds it to the manager.
func (b *Builder) Complete(r mcreconcile.Reconciler) error {
	p, ok := b.mgr.GetProvider().(*Provider)
	if !ok {
		return fmt.Errorf("controller %s: the manager's provider is %T, not an engage.Provider", b.name, b.mgr.GetProvider())
	}
	if b.name == "" {
		return errors.New("engage: a controller needs a name")
	}
	opts := b.opts
	if opts.LogConstructor == nil {
		log := b.mgr.GetLogger().WithValues("controller", b.name)
		opts.LogConstructor = func(req *mcreconcile.Request) logr.Logger {
			if req == nil {
				return log
			}
			return log.WithValues("cluster", req.ClusterName, "namespace", req.Namespace, "name", req.Name)
		}
	}
	bld := builder.TypedControllerManagedBy[mcreconcile.Request](b.mgr.GetLocalManager()).
		Named(b.name).
		WithOptions(opts)
	for _, w := range b.watches {
		h := w.h
		if h == nil {
			if b.forObj == nil {
				return fmt.Errorf("controller %s: Owns needs For", b.name)
			}
			h = mchandler.TypedEnqueueRequestForOwner[client.Object](b.forObj, handler.OnlyControllerOwner())
		}
		bld = bld.WatchesRawSource(p.Kind(w.obj, h, w.preds...))
	}
	for _, src := range b.raw {
		bld = bld.WatchesRawSource(src)
	}
	return bld.Complete(mcreconcile.NewClusterNotFoundWrapper(r))
}
