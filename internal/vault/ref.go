package vault

import (
	"fmt"
	"strconv"
	"strings"
)

// KVRef names one key of a KV v2 secret: the secret at <Mount>/data/<Path>,
// key Key of its data.
type KVRef struct {
	// Mount of the KV v2 engine, e.g. "secret" (one segment, no "/").
	Mount string
	// Path of the secret below the mount, without "data/", e.g.
	// "knotless/<logical cluster>/<namespace>/pds".
	Path string
	// Key in the secret's data.
	Key string
}

// String names the reference without any value: mount=secret path=a/b key="k".
func (r KVRef) String() string {
	return fmt.Sprintf("mount=%s path=%s key=%s", strconv.Quote(r.Mount), strconv.Quote(r.Path), strconv.Quote(r.Key))
}

// NamespacePrefix returns the path prefix (with a trailing "/") below which
// the references of a namespace of a workspace must lie:
// <prefix>/<workspace>/<namespace>/.
func NamespacePrefix(prefix, workspace, namespace string) string {
	return strings.Trim(prefix, "/") + "/" + workspace + "/" + namespace + "/"
}

// CheckRef checks that ref may be read on behalf of namespace in workspace
// (its logical cluster name) under the tenancy prefix: its path must lie
// below <prefix>/<workspace>/<namespace>/, with no "..", "." or empty
// segments, no leading "/", only the characters [A-Za-z0-9._@+=,~-], a
// one-segment mount and a non-empty key. It returns a *ForbiddenPathError
// otherwise.
func CheckRef(prefix, workspace, namespace string, ref KVRef) error {
	fail := func(format string, args ...any) error {
		return &ForbiddenPathError{Workspace: workspace, Namespace: namespace, Ref: ref, Reason: fmt.Sprintf(format, args...)}
	}
	prefix = strings.Trim(prefix, "/")
	if err := checkSegment(workspace); err != nil {
		return fail("workspace name: %v", err)
	}
	if err := checkSegment(namespace); err != nil {
		return fail("namespace: %v", err)
	}
	if ref.Mount == "" {
		return fail("mount is empty")
	}
	if strings.Contains(ref.Mount, "/") {
		return fail("mount must be a single segment without %q", "/")
	}
	if err := checkSegment(ref.Mount); err != nil {
		return fail("mount: %v", err)
	}
	if ref.Key == "" {
		return fail("key is empty")
	}
	want := NamespacePrefix(prefix, workspace, namespace)
	switch {
	case ref.Path == "":
		return fail("path is empty")
	case strings.HasPrefix(ref.Path, "/"):
		return fail("path must be relative to the mount (no leading %q) and start with %q", "/", want)
	}
	segs := strings.Split(ref.Path, "/")
	for _, s := range segs {
		if err := checkSegment(s); err != nil {
			return fail("path: %v", err)
		}
	}
	pre := strings.Split(prefix, "/")
	if len(segs) < len(pre)+3 {
		return fail("path must name a secret below %q", want)
	}
	for i, p := range pre {
		if segs[i] != p {
			return fail("path must start with %q", want)
		}
	}
	if segs[len(pre)] != workspace {
		return fail("path belongs to workspace %q, not %q; it must start with %q", segs[len(pre)], workspace, want)
	}
	if segs[len(pre)+1] != namespace {
		return fail("path belongs to namespace %q, not %q; it must start with %q", segs[len(pre)+1], namespace, want)
	}
	return nil
}

// checkSegment accepts one path segment: non-empty, not "." or "..", and
// made of [A-Za-z0-9._@+=,~-] only, so that nothing in it can change the
// request URL (no "%", "?", "#", "\", spaces or control characters).
func checkSegment(s string) error {
	switch s {
	case "":
		return fmt.Errorf("empty segment")
	case ".", "..":
		return fmt.Errorf("segment %q is not allowed", s)
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("._@+=,~-", r):
		default:
			return fmt.Errorf("character %q is not allowed", r)
		}
	}
	return nil
}

// checkMountPath accepts a mount path of one or more segments.
func checkMountPath(p string) error {
	for _, s := range strings.Split(p, "/") {
		if err := checkSegment(s); err != nil {
			return err
		}
	}
	return nil
}
