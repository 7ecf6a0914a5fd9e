// Package designrules holds tests that check rules of docs/design-rules.md
// over the source tree itself (R06, R11, R12): they fail when a change
// adds an unregistered or untested controller, a controller that runs in
// another binary than docs/controllers.md says, an import that runs up
// the layers (a controller importing another, internal/ importing a
// controller, a command or the mount shim), a helper copied between
// controller packages, package-level mutable state or an init function,
// or a controller that reads annotations.
package designrules
