package mountproxy

import "strings"

// validSegment reports whether s is a DNS label (lower-case letters,
// digits, '-', not at the ends, 1-63 characters): what kcp logical cluster
// names and Kubernetes object names allowed here are.
func validSegment(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ParsePath splits prefix/<logical cluster>/<name>[/rest] into its parts;
// rest is "/" when absent. prefix starts and ends with '/'. A path that is
// not exactly of this form (other prefix, bad segment, "..", "//",
// escaped characters) is refused.
func ParsePath(prefix, path string) (logicalCluster, name, rest string, ok bool) {
	tail, found := strings.CutPrefix(path, prefix)
	if !found {
		return "", "", "", false
	}
	lc, after, _ := strings.Cut(tail, "/")
	name, rest, hasRest := strings.Cut(after, "/")
	if !validSegment(lc) || !validSegment(name) {
		return "", "", "", false
	}
	rest = "/" + rest
	if !hasRest {
		rest = "/"
	}
	for _, seg := range strings.Split(rest[1:], "/") {
		if seg == "." || seg == ".." {
			return "", "", "", false
		}
	}
	if strings.Contains(rest, "//") || strings.ContainsAny(rest, "%\\") {
		return "", "", "", false
	}
	return lc, name, rest, true
}
