#!/usr/bin/env bash
# Builds binaries of a pinned tool module (hack/tools/<module>) into bin/.
# Builds are cached under $KNOTLESS_TOOLS_CACHE (default bin/.tools, which is
# gitignored) in a folder keyed by the module's go.mod and go.sum, so a
# binary is rebuilt only when its pins change.
#
# usage: hack/tool.sh <module> <package>...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
module=$1
shift
dir=$root/hack/tools/$module
[ -f "$dir/go.mod" ] || { echo "hack/tool.sh: no tool module $dir" >&2; exit 1; }
key=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-16)
cache=${KNOTLESS_TOOLS_CACHE:-$root/bin/.tools}/$module-$key
mkdir -p "$cache" "$root/bin"
for pkg in "$@"; do
  name=$(basename "$pkg")
  if [ ! -x "$cache/$name" ]; then
    echo "building $name from $pkg (pinned in hack/tools/$module; cached in $cache)" >&2
    start=$(date +%s)
    (cd "$dir" && GONOSUMDB=github.com/kcp-dev go build -o "$cache/$name.tmp" "$pkg")
    mv "$cache/$name.tmp" "$cache/$name"
    echo "built $name in $(( $(date +%s) - start ))s" >&2
  fi
  ln -sfn "$cache/$name" "$root/bin/$name"
done
