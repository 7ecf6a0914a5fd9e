#!/usr/bin/env bash
# Builds the test image the kind driver's e2e test runs in a tenant's pods:
# hack/testimage/main.go, static, FROM scratch. Its tag is a hash of its
# inputs (the source, the Dockerfile, this script, the Go version), so a
# second run with the same inputs builds nothing.
#
# usage: hack/testimage/build.sh   prints the image's tag
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
key=$( (cat "$here/main.go" "$here/Dockerfile" "$here/build.sh"; go version) | sha256sum | cut -c1-16)
image=knotless.dev/testimage:$key
if ! docker image inspect "$image" >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags=-s -o "$work/testimage" ./hack/testimage)
  cp "$here/Dockerfile" "$work/"
  docker build -q -t "$image" "$work" >&2
fi
echo "$image"
