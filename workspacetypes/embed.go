// Package workspacetypes holds the WorkspaceTypes knotless serves and the
// RBAC that lets ordinary users create workspaces of those types and bind
// the exports. The provider applies them to its workspace.
package workspacetypes

import "embed"

// FS holds the WorkspaceTypes and their RBAC.
//
//go:embed *.yaml
var FS embed.FS
