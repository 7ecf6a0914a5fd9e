/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
)

// workspace is an engaged workspace as controllers get it from the
// manager: multicluster-provider's scoped cluster (its cache reads the
// shared informers), with the client and REST mapper shared by every
// workspace of its virtual workspace URL, and Events written by the
// provider's one event writer.
type workspace struct {
	cluster.Cluster
	client *workspaceClient
	mapper meta.RESTMapper
	events *eventWriter
}

func newWorkspace(name logicalcluster.Name, cl cluster.Cluster, sh *shared, events *eventWriter) *workspace {
	return &workspace{
		Cluster: cl,
		client:  &workspaceClient{shared: sh.client, scope: &scope{cluster: name, cache: cl.GetCache()}},
		mapper:  sh.mapper,
		events:  events,
	}
}

// GetClient returns the workspace's client: cached reads from its cache,
// everything else to its path of the virtual workspace.
func (w *workspace) GetClient() client.Client { return w.client }

// GetRESTMapper returns the mapper shared by the virtual workspace.
func (w *workspace) GetRESTMapper() meta.RESTMapper { return w.mapper }

// GetEventRecorder returns the recorder of the named controller.
func (w *workspace) GetEventRecorder(name string) events.EventRecorder {
	return w.events.recorder(w.GetClient(), name)
}

// GetEventRecorderFor returns the core/v1 recorder of the named controller.
//
// Deprecated: use GetEventRecorder.
func (w *workspace) GetEventRecorderFor(name string) record.EventRecorder {
	return legacyRecorder{r: w.events.recorder(w.GetClient(), name)}
}
