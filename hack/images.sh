#!/usr/bin/env bash
# Builds the container images of knotless-provider and knotless-mountproxy
# with docker, offline: each is FROM scratch with one static binary
# (CGO_ENABLED=0, -trimpath, version and commit stamped as make build
# stamps them) and the build machine's CA bundle, run as 65532:65532
# (deploy/images/Dockerfile.<name>). No base image is pulled.
#
# Tags: <name>:$KNOTLESS_IMAGE_TAG (default dev, the chart's appVersion)
# and <name>:<commit>; with KNOTLESS_IMAGE_REPOSITORY=registry/path the
# names are registry/path/<name>.
#
# usage: hack/images.sh [name...]   (default: both)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(knotless-provider knotless-mountproxy)
tag=${KNOTLESS_IMAGE_TAG:-dev}
repo=${KNOTLESS_IMAGE_REPOSITORY:-}
commit=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
version=${KNOTLESS_VERSION:-$tag}
bundle=/etc/ssl/certs/ca-certificates.crt

command -v docker >/dev/null || { echo "hack/images.sh: docker is not installed" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "hack/images.sh: the docker daemon does not answer (start dockerd)" >&2; exit 1; }
if [ ! -s "$bundle" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates
  fi
  [ -s "$bundle" ] || { echo "hack/images.sh: no CA bundle at $bundle (install ca-certificates)" >&2; exit 1; }
fi

pkg=github.com/knotless-dev/knotless/cmd/internal/buildinfo
ldflags="-s -w -X $pkg.Version=$version -X $pkg.Commit=$commit"
for name in "${names[@]}"; do
  dockerfile=deploy/images/Dockerfile.$name
  [ -f "$dockerfile" ] || { echo "hack/images.sh: no $dockerfile" >&2; exit 1; }
  ctx=$root/bin/images/$name
  rm -rf "$ctx"
  mkdir -p "$ctx"
  start=$(date +%s)
  CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "$ldflags" -o "$ctx/$name" "./cmd/$name"
  cp "$bundle" "$ctx/ca-certificates.crt"
  image=${repo:+$repo/}$name
  docker build -q -f "$dockerfile" \
    --label org.opencontainers.image.revision="$commit" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.source=https://github.com/knotless-dev/knotless \
    -t "$image:$tag" -t "$image:$commit" "$ctx" >"$ctx.log" 2>&1 || { cat "$ctx.log" >&2; exit 1; }
  size=$(docker image inspect -f '{{.Size}}' "$image:$tag")
  echo "built $image:$tag ($image:$commit), $((size / 1024 / 1024)) MiB, in $(( $(date +%s) - start ))s"
done
