#!/usr/bin/env bash
# Builds binaries of a pinned tool module (hack/tools/<module>) into bin/.
#
# Every entry point (make dev, make test, make bench-*, .ci/run,
# hack/kind-e2e.sh) shares one cache: $KNOTLESS_TOOLS_CACHE, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/knotless/tools, outside the checkout so
# that a second clone (CI's) reuses it too. A build lives in a folder keyed
# by the module's go.mod, go.sum and build-tags, so a binary is rebuilt
# only when its pins change; `make clean` leaves the cache, `make clean-tools` removes it.
# How long each build took on this machine is kept beside the cache
# (.timings/) and printed before the next cold build of the same tool.
#
# usage: hack/tool.sh <module> <package>...
#        hack/tool.sh --plan <module>=<package>...   what a build would do
# <module> is a folder name under hack/tools/ (or an absolute path to a
# tool module, which the tests use).
# A tool module's optional file build-tags holds the Go build tags its
# binaries are built with (hack/tools/vault: minimal, the server without
# the plugins and storage backends knotless never uses).
#
# Every tool is built as knotless is (CGO_ENABLED=0, -trimpath): static
# binaries (hack/kind-e2e.sh's kcp image is FROM scratch), and one compile
# of each package for all of them. The standard library and every module
# a tool shares with knotless at the same version (kubectl-ws: about 290
# packages of client-go and apimachinery; controller-gen about 130) come
# from the Go build cache instead of being compiled again with other
# flags.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${KNOTLESS_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/knotless/tools}
timings=$cache_root/.timings
# How a tool is built (the go build below): part of its cache key.
build_flags="CGO_ENABLED=0 -trimpath"

# Cold build times on a 2-core machine, for tools never built here.
typical() {
  case $1 in
    vault) echo "about 7 min" ;;
    kcp) echo "about 4 min" ;;
    kcp-front-proxy) echo "under a minute after kcp" ;;
    golangci-lint) echo "about 3 min" ;;
    *) echo "a minute or two" ;;
  esac
}

moddir() { case $1 in /*) echo "$1" ;; *) echo "$root/hack/tools/$1" ;; esac; }

# cachedir MODULE: the cache folder of MODULE's current pins.
cachedir() {
  local dir key
  dir=$(moddir "$1")
  [ -f "$dir/go.mod" ] || { echo "hack/tool.sh: no tool module $dir" >&2; exit 1; }
  key=$({ cat "$dir/go.mod" "$dir/go.sum" "$dir/build-tags" 2>/dev/null || true; echo "$build_flags"; } | sha256sum | cut -c1-16)
  echo "$cache_root/$(basename "$dir")-$key"
}

last_time() {
  if [ -f "$timings/$1" ]; then echo "$(cat "$timings/$1")s last time on this machine"; else typical "$1"; fi
}

if [ "${1:-}" = "--plan" ]; then
  shift
  todo=()
  for arg in "$@"; do
    module=${arg%%=*} pkg=${arg#*=} name=$(basename "${arg#*=}")
    [ -x "$(cachedir "$module")/$name" ] || todo+=("$name ($(last_time "$name"))")
  done
  if [ ${#todo[@]} -eq 0 ]; then
    echo "tools: all cached in $cache_root"
  else
    echo "tools: will build $(IFS=,; echo "${todo[*]}" | sed 's/,/, /g') into $cache_root (kept for next time)"
  fi
  exit 0
fi

module=$1
shift
dir=$(moddir "$module")
cache=$(cachedir "$module")
tags=
[ ! -f "$dir/build-tags" ] || tags=$(tr -s ' \n' ',' <"$dir/build-tags" | sed 's/^,//; s/,$//')
bindir=$root/bin
mkdir -p "$cache" "$timings" "$bindir"
# One build of a module at a time (two checkouts, or make and .ci/run, may
# ask at once): the second waits and then finds the binary cached.
exec 9>"$cache/.lock"
if command -v flock >/dev/null; then flock 9; fi

ticker=
stop_ticker() { [ -z "$ticker" ] || { kill "$ticker" 2>/dev/null || true; wait "$ticker" 2>/dev/null || true; ticker=; }; }
trap stop_ticker EXIT

for pkg in "$@"; do
  name=$(basename "$pkg")
  if [ ! -x "$cache/$name" ]; then
    echo "building $name from $pkg${tags:+ with tags $tags} (pinned in ${dir#"$root"/}; $(last_time "$name")); cached in $cache for next time" >&2
    start=$(date +%s)
    # Elapsed time every 30 s, so a long build shows it is alive.
    (
      trap 'kill $s 2>/dev/null; exit 0' TERM
      while :; do
        sleep 30 & s=$!
        wait $s
        echo "  ... still building $name: $(( $(date +%s) - start ))s" >&2
      done
    ) &
    ticker=$!
    # The caller's GOFLAGS play no part: a tool builds the same whoever
    # asks first.
    (cd "$dir" && env -u GOFLAGS CGO_ENABLED=0 GONOSUMDB=github.com/kcp-dev go build -trimpath -tags "$tags" -o "$cache/$name.tmp" "$pkg")
    stop_ticker
    mv "$cache/$name.tmp" "$cache/$name"
    took=$(( $(date +%s) - start ))
    echo "$took" >"$timings/$name"
    echo "built $name in ${took}s" >&2
  fi
  ln -sfn "$cache/$name" "$bindir/$name"
done
