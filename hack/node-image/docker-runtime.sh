#!/usr/bin/env bash
# Makes privileged containers (kind's nodes) start on a machine whose
# capability bounding set lacks capabilities docker 20.10 grants them (here:
# CAP_SYS_RESOURCE; runc fails with "unable to apply caps: operation not
# permitted"). On a machine that has them all it does nothing and prints
# nothing but "not needed".
#
# It installs hack/node-image/runc-bounded as /usr/local/bin/knotless-runc,
# registers it as the docker runtime "knotless-runc" in
# /etc/docker/daemon.json (added to what is there; docker's default runtime
# is left alone) and reloads dockerd (SIGHUP: runtimes are reloadable, no
# container is restarted). kind is then run with hack/node-image/docker-shim
# first in PATH, whose `docker run` adds --runtime=knotless-runc: only kind's
# containers use it.
#
# usage: hack/node-image/docker-runtime.sh   prints the PATH entry to use,
#                                            or nothing when not needed
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=knotless-runc
pid=$(pgrep -xo dockerd || true)
[ -n "$pid" ] || { echo "docker-runtime.sh: dockerd is not running" >&2; exit 1; }
bnd=$(awk '/^CapBnd:/ {print $2}' "/proc/$pid/status")
last=$(cat /proc/sys/kernel/cap_last_cap)
if [ $(( 0x$bnd & ((1 << (last + 1)) - 1) )) -eq $(( (1 << (last + 1)) - 1 )) ]; then
  echo "docker-runtime.sh: dockerd has every capability; not needed" >&2
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "docker-runtime.sh: dockerd lacks capabilities (CapBnd $bnd); run as root to install $name" >&2; exit 1; }
install -m 755 "$here/runc-bounded" "/usr/local/bin/$name"
conf=/etc/docker/daemon.json
mkdir -p /etc/docker
[ -s "$conf" ] || echo '{}' >"$conf"
if ! jq -e --arg n "$name" '.runtimes[$n].path == "/usr/local/bin/" + $n' "$conf" >/dev/null; then
  jq --arg n "$name" '.runtimes[$n] = {path: ("/usr/local/bin/" + $n)}' "$conf" >"$conf.tmp"
  mv "$conf.tmp" "$conf"
  kill -HUP "$pid"
  for _ in $(seq 1 20); do
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$name\"" && break
    sleep 0.5
  done
  echo "docker-runtime.sh: registered the docker runtime $name in $conf and reloaded dockerd" >&2
fi
docker info --format '{{json .Runtimes}}' | grep -q "\"$name\"" || { echo "docker-runtime.sh: dockerd did not load $name" >&2; exit 1; }
echo "$here/docker-shim"
