/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package engage

import (
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
)

// Key names a request's object among every engaged workspace's, as
// "<logical cluster>|<namespace>/<name>": the key of what a controller
// keeps per object (watches, inventories) across workspaces.
func Key(req mcreconcile.Request) string {
	return string(req.ClusterName) + "|" + req.Namespace + "/" + req.Name
}
