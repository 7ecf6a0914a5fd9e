#!/usr/bin/env bash
# Proves the node image: `kind create cluster --image <ours>` with the pinned
# kind (hack/tools/kind) comes up with a Ready node and CoreDNS running,
# without any registry (every image the cluster runs was preloaded; the
# check fails if the kubelet pulled, or tried to pull, any image).
#
# usage: hack/node-image/check.sh   (KIND_KEEP=1 keeps the cluster
#        knotless-node-check; its kubeconfig is bin/node-check.kubeconfig)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=knotless-node-check
image=$("$here/build.sh" --print-image)
docker image inspect "$image" >/dev/null 2>&1 || { echo "check.sh: $image is not built (make node-image)" >&2; exit 1; }
"$root/hack/tool.sh" kind sigs.k8s.io/kind
shim=$("$here/docker-runtime.sh")
[ -z "$shim" ] || export PATH=$shim:$PATH
kind=$root/bin/kind
kubeconfig=$root/bin/node-check.kubeconfig
"$kind" delete cluster --name "$cluster" >/dev/null 2>&1 || true
[ -n "${KIND_KEEP:-}" ] || trap '"$kind" delete cluster --name "$cluster" >/dev/null 2>&1 || true' EXIT

start=$(date +%s)
"$kind" create cluster --name "$cluster" --image "$image" --kubeconfig "$kubeconfig" --wait 5m
node=$cluster-control-plane
k() { docker exec "$node" kubectl --kubeconfig /etc/kubernetes/admin.conf "$@"; }
k -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=300s
echo "check.sh: cluster Ready with CoreDNS in $(( $(date +%s) - start ))s"
k get nodes -o wide
k get pods -A -o wide
pulls=$(k get events -A -o jsonpath='{range .items[*]}{.reason} {.message}{"\n"}{end}' | grep -E '^(Pulling|Failed|ErrImagePull|ImagePullBackOff)' | grep -i image || true)
if [ -n "$pulls" ]; then
  echo "check.sh: image pulls were attempted:" >&2
  echo "$pulls" >&2
  exit 1
fi
events=$(k get events -A --no-headers 2>/dev/null | wc -l)
echo "check.sh: no image pull in the cluster's $events events; the node's images:"
docker exec "$node" ctr -n k8s.io images list -q | grep -v -e '^sha256:' -e '^import-'
# Whether a registry could have been used at all (it cannot, here).
if docker exec "$node" curl -sS --max-time 5 -o /dev/null https://registry.k8s.io/v2/ 2>/dev/null; then
  echo "check.sh: note: the node reaches registry.k8s.io (images were preloaded all the same)"
else
  echo "check.sh: the node cannot reach registry.k8s.io"
fi
