// Package designrules holds tests that check rules of docs/design-rules.md
// over the source tree itself (R06, R11, R12): they fail when a change
// adds an unregistered or untested controller, package-level mutable
// state or an init function, or a controller that reads annotations.
package designrules
