/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"context"
	"errors"
	"fmt"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
)

// Kind returns a source of the events of obj's kind in every workspace the
// provider engages. It registers one event handler per shared (wildcard)
// informer and hands each event to h for the object's workspace; a
// workspace that is engaged later gets its objects as initial creates.
//
// multicluster-runtime's own sources engage once per controller, watched
// kind and workspace, and each engagement keeps goroutines, a context and
// an informer registration for as long as the controller runs: about 50
// goroutines and 400 KiB per workspace for knotless's controllers. A Kind
// source costs a workspace nothing.
func (p *Provider) Kind(obj client.Object, h mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request], preds ...predicate.TypedPredicate[client.Object]) source.TypedSource[mcreconcile.Request] {
	return &kindSource{p: p.exportProvider, obj: obj, handler: h, preds: preds}
}

// kindSource is a Kind source; it is started once, by its controller.
type kindSource struct {
	p       *exportProvider
	obj     client.Object
	handler mchandler.TypedEventHandlerFunc[client.Object, mcreconcile.Request]
	preds   []predicate.TypedPredicate[client.Object]

	// Set by Start.
	ctx     context.Context
	queue   workqueue.TypedRateLimitingInterface[mcreconcile.Request]
	newList func() (client.ObjectList, error)
}

func (s *kindSource) String() string { return fmt.Sprintf("engage.Kind[%T]", s.obj) }

// Start implements source.TypedSource.
func (s *kindSource) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) error {
	if s.queue != nil {
		return errors.New("engage: a Kind source is started once")
	}
	gvk, err := apiutil.GVKForObject(s.obj, s.p.opts.Scheme)
	if err != nil {
		return err
	}
	listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
	s.newList = func() (client.ObjectList, error) {
		o, err := s.p.opts.Scheme.New(listGVK)
		if err != nil {
			return nil, err
		}
		l, ok := o.(client.ObjectList)
		if !ok {
			return nil, fmt.Errorf("%s is not a list", listGVK)
		}
		return l, nil
	}
	s.ctx, s.queue = ctx, q
	return s.p.addSource(ctx, s)
}

// watch registers the source's one handler on the informer of its kind in
// a wildcard cache. The informer hands the new handler every object it
// holds; those of engaged workspaces are delivered as initial creates.
func (s *kindSource) watch(ctx context.Context, wildcard cache.Informers) error {
	inf, err := wildcard.GetInformer(ctx, s.obj, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("informer for %T: %w", s.obj, err)
	}
	_, err = inf.AddEventHandler(s)
	return err
}

// replay delivers the objects of a newly engaged workspace as initial
// creates: events that reached the shared informer before the workspace
// was engaged were not delivered.
func (s *kindSource) replay(ctx context.Context, name multicluster.ClusterName, ws *workspace) error {
	list, err := s.newList()
	if err != nil {
		return err
	}
	if err := ws.GetCache().List(ctx, list); err != nil {
		return fmt.Errorf("listing %T in %s: %w", s.obj, name, err)
	}
	h := s.handler(name, ws)
	return meta.EachListItem(list, func(o runtime.Object) error {
		co, ok := o.(client.Object)
		if !ok {
			return fmt.Errorf("%T is not a client.Object", o)
		}
		s.create(h, co, true)
		return nil
	})
}

// handlerFor returns the handler of o's workspace, or nil when the
// workspace is not engaged.
func (s *kindSource) handlerFor(o client.Object) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	name := multicluster.ClusterName(logicalcluster.From(o).String())
	ws := s.p.workspace(name)
	if ws == nil {
		return nil
	}
	return s.handler(name, ws)
}

func (s *kindSource) create(h handler.TypedEventHandler[client.Object, mcreconcile.Request], o client.Object, initial bool) {
	evt := event.TypedCreateEvent[client.Object]{Object: o, IsInInitialList: initial}
	for _, p := range s.preds {
		if !p.Create(evt) {
			return
		}
	}
	h.Create(s.ctx, evt, s.queue)
}

// OnAdd, OnUpdate and OnDelete make the source the shared informer's
// handler, as controller-runtime's Kind source does for one cluster.
func (s *kindSource) OnAdd(obj any, initial bool) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	if h := s.handlerFor(o); h != nil {
		s.create(h, o, initial)
	}
}

func (s *kindSource) OnUpdate(oldObj, newObj any) {
	o, ok := oldObj.(client.Object)
	if !ok {
		return
	}
	n, ok := newObj.(client.Object)
	if !ok {
		return
	}
	h := s.handlerFor(n)
	if h == nil {
		return
	}
	evt := event.TypedUpdateEvent[client.Object]{ObjectOld: o, ObjectNew: n}
	for _, p := range s.preds {
		if !p.Update(evt) {
			return
		}
	}
	h.Update(s.ctx, evt, s.queue)
}

func (s *kindSource) OnDelete(obj any) {
	evt := event.TypedDeleteEvent[client.Object]{}
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		evt.DeleteStateUnknown = true
		obj = tomb.Obj
	}
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	evt.Object = o
	h := s.handlerFor(o)
	if h == nil {
		return
	}
	for _, p := range s.preds {
		if !p.Delete(evt) {
			return
		}
	}
	h.Delete(s.ctx, evt, s.queue)
}
