/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package buildinfo says which knotless a binary is: its module version
// and the commit it was built from, as the Go toolchain stamps them.
package buildinfo

import "runtime/debug"

// Version and Commit are stamped by the linker (make build, the images,
// the e2e suite: -ldflags "-X .../buildinfo.Version=... -X
// .../buildinfo.Commit=..."); empty when the binary was built otherwise.
var Version, Commit string

// Get returns the version and the commit: the linker's stamps, else the
// module version ("devel" when built from a work tree) and the VCS
// commit Go recorded ("unknown" without VCS information; "-dirty" marks
// uncommitted changes).
func Get() (version, commit string) {
	version, commit = fromBuildInfo(debug.ReadBuildInfo())
	if Version != "" {
		version = Version
	}
	if Commit != "" {
		commit = Commit
	}
	return version, commit
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool) (version, commit string) {
	version, commit = "devel", "unknown"
	if !ok {
		return version, commit
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Version
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && commit != "unknown" {
		commit += "-dirty"
	}
	return version, commit
}
