#!/usr/bin/env bash
# Runs a local kcp and knotless-provider (called by `make dev`). Data lives
# in .dev/ and is reused by the next run. Ctrl-C stops what this started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dev=$root/.dev
mkdir -p "$dev"
kcp_port=${KCP_PORT:-6443}
metrics_port=${KNOTLESS_METRICS_PORT:-8080}
probe_port=${KNOTLESS_PROBE_PORT:-8081}
kubeconfig=$dev/kcp/admin.kubeconfig

pids=()
stop() {
  trap - EXIT INT TERM
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  echo "stopped (data kept in $dev)"
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$kcp_port" "$metrics_port" "$probe_port"; do
  if port_busy "$p"; then
    echo "port $p on 127.0.0.1 is in use (another make dev?); set KCP_PORT, KNOTLESS_METRICS_PORT or KNOTLESS_PROBE_PORT" >&2
    exit 1
  fi
done

echo "starting kcp on https://127.0.0.1:$kcp_port (log: $dev/kcp.log)"
bin/kcp start --root-directory "$dev/kcp" --bind-address 127.0.0.1 --secure-port "$kcp_port" \
  --feature-gates WorkspaceMounts=true >>"$dev/kcp.log" 2>&1 &
pids+=($!)

for i in $(seq 1 180); do
  if [ -f "$kubeconfig" ] && kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; then break; fi
  kill -0 "${pids[0]}" 2>/dev/null || { echo "kcp exited; last lines of $dev/kcp.log:" >&2; tail -20 "$dev/kcp.log" >&2; exit 1; }
  [ "$i" = 180 ] && { echo "kcp not ready after 180s; see $dev/kcp.log" >&2; exit 1; }
  sleep 1
done
echo "kcp is ready"

echo "starting knotless-provider (log: $dev/provider.log)"
bin/knotless-provider --kubeconfig "$kubeconfig" --workspace "${KNOTLESS_WORKSPACE:-root:knotless}" \
  --metrics-bind-address "127.0.0.1:$metrics_port" --health-probe-bind-address "127.0.0.1:$probe_port" \
  >>"$dev/provider.log" 2>&1 &
pids+=($!)
for i in $(seq 1 120); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$probe_port") 2>/dev/null; then break; fi
  kill -0 "${pids[1]}" 2>/dev/null || { echo "knotless-provider exited; last lines of $dev/provider.log:" >&2; tail -20 "$dev/provider.log" >&2; exit 1; }
  sleep 1
done

ws=${KNOTLESS_WORKSPACE:-root:knotless}
cat <<TRY

knotless is running. Try this in another shell:

  export KUBECONFIG=$kubeconfig PATH=$root/bin:\$PATH
  kubectl ws use :root
  kubectl ws create shop --type $ws:socialweb-application --enter
  kubectl api-resources | grep knotless
  kubectl apply -f $root/docs/examples/application.yaml
  kubectl get applications        # PHASE Ready, READY True

Metrics: http://127.0.0.1:$metrics_port/metrics   Logs: $dev/*.log
Press Ctrl-C to stop kcp and the provider.
TRY

wait -n "${pids[@]}" || true
echo "a process exited; see the logs in $dev" >&2
exit 1
