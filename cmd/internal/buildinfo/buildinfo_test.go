package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name            string
		bi              *debug.BuildInfo
		ok              bool
		version, commit string
	}{
		{"no build info", nil, false, "devel", "unknown"},
		{"work tree", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}}, true, "devel", "abc123"},
		{"dirty work tree", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}, true, "devel", "abc123-dirty"},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, true, "v0.1.0", "unknown"},
	} {
		if v, c := fromBuildInfo(tc.bi, tc.ok); v != tc.version || c != tc.commit {
			t.Errorf("%s: %s %s, want %s %s", tc.name, v, c, tc.version, tc.commit)
		}
	}
}
