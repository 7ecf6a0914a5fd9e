#!/usr/bin/env bash
# make e2e-kind: the kind path, offline. Nothing is pulled from a registry:
#
#  1. a kind cluster $KIND_CLUSTER (default knotless-e2e-kind) on a docker
#     network of the same name, from the project's node image (make
#     node-image) with the pinned kind (hack/tools/kind), kcp-front-proxy's
#     NodePort 31443 also on localhost:$KIND_HOST_PORT (default 8443);
#  2. kcp's certificates made here with openssl (serving, the front
#     proxy's client CA for users and kcp-admin, the shard's client and
#     requestheader CAs), kcp-admin's kubeconfig through kcp-front-proxy;
#  3. knotless's images (make images) loaded with kind and its chart
#     installed, the chart making the mount path's Secrets itself (its
#     generated-Secrets mode: no cert-manager);
#  4. kcp: an image FROM scratch of the pinned kcp's static binaries
#     (hack/tool.sh kcp: every tool is static), loaded with kind, and
#     deploy/kind-e2e/kcp.yaml: `kcp start` (WorkspaceMounts=true, embedded
#     etcd in an emptyDir) with kcp-front-proxy in its pod, whose /tenants/
#     mapping uses the chart's kcp-front-proxy client certificate, serving
#     CA and header names; then the chart smoke check: both Deployments
#     become Ready against it;
#  5. the e2e suite against that kcp (KNOTLESS_E2E_KUBECONFIG and the mount
#     topology of e2e/framework/external.go): the chart's provider is scaled
#     to 0 (the suite runs its own for root:knotless), and the shim the
#     /tenants/ mapping reaches is a knotless-mountproxy container on this
#     machine (docker run --network host, with the chart's serving
#     certificate and requestheader CA), because the tests start their
#     tenants on 127.0.0.1 here. KIND_E2E_RUN selects tests (go test -run;
#     default: the mount tests), KIND_E2E_RUN=. runs the whole suite.
#
# Needs docker (dockerd running), kubectl, openssl, curl, go; kind, helm
# and kcp come from the tools cache (hack/tool.sh). Logs of each part are
# in bin/kind-e2e/ (a failure prints their tails). Everything started here
# is removed at exit (the cluster, its network, the shim container) unless
# KIND_KEEP=1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cluster=${KIND_CLUSTER:-knotless-e2e-kind}
host_port=${KIND_HOST_PORT:-8443}
shim_port=${KIND_SHIM_PORT:-19443}
shim_metrics=${KIND_SHIM_METRICS_PORT:-19090}
shim_health=${KIND_SHIM_HEALTH_PORT:-19091}
run=${KIND_E2E_RUN:-TestMount|TestMarketTenantMounted}
work=$root/bin/kind-e2e
logs=$work/logs
certs=$work/certs
rm -rf "$logs" "$certs" "$work/shim"
mkdir -p "$work" "$logs" "$certs"
chmod 700 "$certs" # kcp's CA keys, the shim's key and its requestheader CA's
export KUBECONFIG=$work/kind.kubeconfig
shim=$cluster-mountproxy
started=$(date +%s)

for cmd in docker kubectl openssl curl go; do
  command -v "$cmd" >/dev/null || { echo "kind-e2e: $cmd is needed" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: the docker daemon does not answer (start dockerd)" >&2; exit 1; }

step() { echo "kind-e2e: [$(( $(date +%s) - started ))s] $*"; }
# quiet LOG CMD...: CMD's output goes to $logs/LOG.log.
quiet() { local log=$logs/$1.log; shift; "$@" >>"$log" 2>&1; }

kind=
cleanup() {
  rc=$?
  set +e
  if [ "$rc" != 0 ]; then
    echo "kind-e2e: FAILED (exit $rc); the tails of the logs in ${logs#"$root"/}:" >&2
    if [ -n "$kind" ] && [ -s "$KUBECONFIG" ]; then
      kubectl get pods -A -o wide >"$logs/pods.log" 2>&1
      kubectl -n kcp describe pods >"$logs/pod-kcp-describe.log" 2>&1
      for c in kcp front-proxy; do
        kubectl -n kcp logs deploy/kcp -c "$c" --tail=-1 >"$logs/pod-$c.log" 2>&1
        kubectl -n kcp logs deploy/kcp -c "$c" --previous --tail=200 >"$logs/pod-$c-previous.log" 2>/dev/null
      done
      for d in knotless-provider knotless-mountproxy; do kubectl -n knotless logs "deploy/$d" --tail=-1 >"$logs/pod-$d.log" 2>&1; done
    fi
    docker logs "$shim" >"$logs/shim.log" 2>&1
    for f in "$logs"/*.log; do
      [ -s "$f" ] || continue
      echo "----- ${f#"$root"/}" >&2
      tail -n 25 "$f" >&2
    done
  else
    docker logs "$shim" >"$logs/shim.log" 2>&1
  fi
  docker rm -f "$shim" >/dev/null 2>&1
  if [ "${KIND_KEEP:-}" != 1 ] && [ -n "$kind" ]; then
    "$kind" delete cluster --name "$cluster" >/dev/null 2>&1
    docker network rm "$cluster" >/dev/null 2>&1
  elif [ -n "$kind" ]; then
    echo "kind-e2e: KIND_KEEP=1: the cluster $cluster stays (KUBECONFIG=$KUBECONFIG; the shim container was removed)"
  fi
  echo "kind-e2e: $(( $(date +%s) - started ))s in all; logs in ${logs#"$root"/}"
  exit "$rc"
}
trap cleanup EXIT

# 0. the parts: node image, kind, helm, static kcp, knotless's images
step "tools, node image and images (logs/build.log)"
node_image=$(hack/node-image/build.sh 2>>"$logs/build.log" | tail -1)
quiet build hack/tool.sh kind sigs.k8s.io/kind
quiet build hack/tool.sh helm helm.sh/helm/v3/cmd/helm
quiet build hack/tool.sh kcp github.com/kcp-dev/kcp/cmd/kcp github.com/kcp-dev/kcp/cmd/kcp-front-proxy
kind=$root/bin/kind
helm=$root/bin/helm
# Privileged containers need a docker runtime of the project's on a machine
# whose dockerd lacks capabilities (prints its PATH entry, or nothing).
shim_path=$(hack/node-image/docker-runtime.sh 2>>"$logs/build.log")
[ -z "$shim_path" ] || export PATH=$shim_path:$PATH
quiet build make images
# The suite's parts: kcp for its tenants (bin/kcp), the PDS stack, Vault.
quiet build make tools stack-deps
kcp_dir=$work/kcp-image
mkdir -p "$kcp_dir"
for b in kcp kcp-front-proxy; do
  cmp -s "bin/$b" "$kcp_dir/$b" || cp "bin/$b" "$kcp_dir/$b"
done
kcp_image=$cluster-kcp:$(cat deploy/kind-e2e/Dockerfile.kcp "$kcp_dir/kcp" "$kcp_dir/kcp-front-proxy" | sha256sum | cut -c1-16)
docker image inspect "$kcp_image" >/dev/null 2>&1 || quiet build docker build -t "$kcp_image" -f deploy/kind-e2e/Dockerfile.kcp "$kcp_dir"
step "node image $node_image, kcp image $kcp_image"

# 1. the cluster, on a docker network of its own
step "kind cluster $cluster (logs/kind.log)"
cat >"$work/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraPortMappings:
      - {containerPort: 31443, hostPort: $host_port, listenAddress: 127.0.0.1, protocol: TCP}
EOF
# A cluster left by KIND_KEEP=1 is made anew: its kcp would keep the
# certificates of the last run.
if "$kind" get clusters 2>/dev/null | grep -qx "$cluster"; then
  quiet kind "$kind" delete cluster --name "$cluster"
fi
KIND_EXPERIMENTAL_DOCKER_NETWORK=$cluster quiet kind "$kind" create cluster --name "$cluster" --image "$node_image" \
  --config "$work/kind.yaml" --kubeconfig "$KUBECONFIG" --wait 3m
node=$cluster-control-plane
node_ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$cluster\").IPAddress}}" "$node")
gateway=$(docker network inspect "$cluster" -f '{{range .IPAM.Config}}{{if .Gateway}}{{.Gateway}} {{end}}{{end}}' | tr ' ' '\n' | grep -E '^[0-9.]+$' | head -1)
[ -n "$node_ip" ] && [ -n "$gateway" ] || { echo "kind-e2e: no IPv4 address of $node or gateway of the network $cluster" >&2; exit 1; }
fp_url=https://$node_ip:31443
step "kcp-front-proxy will be $fp_url (and https://localhost:$host_port); pods reach this machine at $gateway"
quiet kind "$kind" load docker-image --name "$cluster" "$kcp_image" knotless-provider:dev knotless-mountproxy:dev

# 2. kcp's certificates (openssl; EC P-256)
step "kcp's certificates (bin/kind-e2e/certs)"
mkca() { # name
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=knotless-e2e-$1" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$certs/$1.key" -out "$certs/$1.crt" 2>>"$logs/certs.log"
}
leaf() { # name ca subject usage [subjectAltName]
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$3" \
    -keyout "$certs/$1.key" -out "$certs/$1.csr" 2>>"$logs/certs.log"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$4"
    [ -z "${5:-}" ] || echo "subjectAltName=$5"
  } >"$certs/$1.ext"
  openssl x509 -req -in "$certs/$1.csr" -CA "$certs/$2.crt" -CAkey "$certs/$2.key" -CAcreateserial -days 30 \
    -extfile "$certs/$1.ext" -out "$certs/$1.crt" 2>>"$logs/certs.log"
}
for ca in serving-ca user-ca shard-client-ca shard-requestheader-ca; do mkca "$ca"; done
leaf serving serving-ca /CN=kcp serverAuth "IP:127.0.0.1,DNS:localhost"
leaf front-proxy serving-ca /CN=kcp-front-proxy serverAuth "IP:$node_ip,IP:127.0.0.1,DNS:localhost,DNS:kcp-front-proxy.kcp.svc"
leaf shard-admin shard-client-ca "/O=system:masters/CN=shard-admin" clientAuth
leaf to-shard shard-requestheader-ca /CN=kcp-front-proxy clientAuth
leaf kcp-admin user-ca "/O=system:kcp:admin/CN=kcp-admin" clientAuth
kubeconfig() { # file server ca user
  kubectl --kubeconfig "$1" config set-cluster kcp --server "$2" --certificate-authority "$3" --embed-certs >/dev/null
  kubectl --kubeconfig "$1" config set-credentials "$4" --client-certificate "$certs/$4.crt" --client-key "$certs/$4.key" --embed-certs >/dev/null
  kubectl --kubeconfig "$1" config set-context default --cluster kcp --user "$4" >/dev/null
  kubectl --kubeconfig "$1" config use-context default >/dev/null
}
rm -f "$certs/shards.kubeconfig" "$work/admin.kubeconfig"
kubeconfig "$certs/shards.kubeconfig" https://127.0.0.1:6443 "$certs/serving-ca.crt" shard-admin
kubeconfig "$work/admin.kubeconfig" "$fp_url/clusters/root" "$certs/serving-ca.crt" kcp-admin
for ns in kcp knotless; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >>"$logs/kubectl.log"
done
args=()
for f in serving.crt serving.key front-proxy.crt front-proxy.key serving-ca.crt user-ca.crt shard-client-ca.crt \
  shard-requestheader-ca.crt to-shard.crt to-shard.key shards.kubeconfig; do args+=(--from-file="$f=$certs/$f"); done
kubectl -n kcp create secret generic kcp-certs "${args[@]}" --dry-run=client -o yaml | kubectl apply -f - >>"$logs/kubectl.log"
kubectl -n knotless create secret generic knotless-kcp-admin --from-file=kubeconfig="$work/admin.kubeconfig" \
  --dry-run=client -o yaml | kubectl apply -f - >>"$logs/kubectl.log"

# 3. knotless's chart; it makes the mount path's Secrets (kept on upgrade)
step "knotless's chart (logs/helm.log)"
quiet helm "$helm" upgrade --install --namespace knotless knotless deploy/charts/knotless \
  --set provider.replicas=1 --set mountproxy.replicas=1 \
  --set provider.kubeconfigSecret.name=knotless-kcp-admin \
  --set mountproxy.kubeconfigSecret.name=knotless-kcp-admin \
  --set provider.mount.url="$fp_url" \
  --set "mountproxy.reservedAddresses={$fp_url,https://localhost:$host_port}" \
  --set 'mountPathSecrets.extraDNSNames={localhost,knotless-e2e-shim.test}'
secret() { # name key file
  kubectl -n knotless get secret "$1" -o "jsonpath={.data.${2//./\\.}}" | base64 -d >"$3"
  [ -s "$3" ] || { echo "kind-e2e: the chart's Secret $1 has no $2" >&2; exit 1; }
}
secret knotless-mountproxy-serving ca.crt "$certs/shim-serving-ca.crt"
secret knotless-mountproxy-serving tls.crt "$certs/shim-serving.crt"
secret knotless-mountproxy-serving tls.key "$certs/shim-serving.key"
secret knotless-requestheader-ca tls.crt "$certs/shim-requestheader-ca.crt"
secret knotless-requestheader-ca tls.key "$certs/shim-requestheader-ca.key"
secret knotless-front-proxy-client tls.crt "$certs/to-shim.crt"
secret knotless-front-proxy-client tls.key "$certs/to-shim.key"
secret knotless-identity-headers user-header "$certs/user-header"
secret knotless-identity-headers group-header "$certs/group-header"
secret knotless-identity-headers extra-header-prefix "$certs/extra-header-prefix"
user_header=$(cat "$certs/user-header") group_header=$(cat "$certs/group-header") extra_prefix=$(cat "$certs/extra-header-prefix")

# 4. kcp and kcp-front-proxy, then the chart's Deployments against it
step "kcp (deploy/kind-e2e/kcp.yaml; logs/kcp.log)"
kubectl -n kcp create secret generic kcp-to-shim --from-file=tls.crt="$certs/to-shim.crt" --from-file=tls.key="$certs/to-shim.key" \
  --from-file=ca.crt="$certs/shim-serving-ca.crt" --dry-run=client -o yaml | kubectl apply -f - >>"$logs/kubectl.log"
cat >"$work/mapping.yaml" <<EOF
- path: /clusters/
  backend: https://127.0.0.1:6443
  backend_server_ca: /etc/kcp/serving-ca.crt
  proxy_client_cert: /etc/kcp/to-shard.crt
  proxy_client_key: /etc/kcp/to-shard.key
- path: /tenants/
  backend: https://knotless-e2e-shim.test:$shim_port
  backend_server_ca: /etc/knotless/to-shim/ca.crt
  proxy_client_cert: /etc/knotless/to-shim/tls.crt
  proxy_client_key: /etc/knotless/to-shim/tls.key
  user_header: $user_header
  group_header: $group_header
  extra_header_prefix: $extra_prefix
- path: /
  backend: https://127.0.0.1:6443
  backend_server_ca: /etc/kcp/serving-ca.crt
  proxy_client_cert: /etc/kcp/to-shard.crt
  proxy_client_key: /etc/kcp/to-shard.key
EOF
kubectl -n kcp create configmap kcp-front-proxy-mapping --from-file=mapping.yaml="$work/mapping.yaml" \
  --dry-run=client -o yaml | kubectl apply -f - >>"$logs/kubectl.log"
sed -e "s|@IMAGE@|$kcp_image|g" -e "s|@NODE_IP@|$node_ip|g" -e "s|@GATEWAY@|$gateway|g" deploy/kind-e2e/kcp.yaml \
  | kubectl apply -f - >>"$logs/kubectl.log"
quiet kcp kubectl -n kcp rollout status deploy/kcp --timeout 5m
ready=
for _ in $(seq 1 90); do
  if kubectl --kubeconfig "$work/admin.kubeconfig" get workspaces.tenancy.kcp.io >>"$logs/kcp.log" 2>&1; then ready=1; break; fi
  sleep 2
done
[ -n "$ready" ] || { echo "kind-e2e: kcp-admin gets no answer through kcp-front-proxy at $fp_url" >&2; exit 1; }
step "kcp answers kcp-admin through kcp-front-proxy"
# The chart's pods waited for kcp (back-off): start them again, then the
# smoke check.
quiet helm kubectl -n knotless rollout restart deploy/knotless-provider deploy/knotless-mountproxy
for d in knotless-provider knotless-mountproxy; do quiet helm kubectl -n knotless rollout status "deploy/$d" --timeout 5m; done
step "chart smoke check passed: knotless-provider and knotless-mountproxy are Ready"

# 5. the e2e suite: its own provider for root:knotless, the shim on this
# machine (the tenants the tests start listen on 127.0.0.1 here)
step "the e2e suite (-run '$run'; logs/e2e.log)"
quiet helm kubectl -n knotless scale deploy/knotless-provider --replicas 0
mkdir -p -m 700 "$work/shim"
kubeconfig "$work/shim/kubeconfig" "$fp_url/clusters/root" "$certs/serving-ca.crt" kcp-admin
cp "$certs/shim-serving.crt" "$certs/shim-serving.key" "$certs/shim-requestheader-ca.crt" "$work/shim/"
# kcp-admin's key and the shim's: readable by the shim's user alone (its
# image's 65532 when this runs as root, else this user).
chmod 600 "$work/shim/"*
shim_user=$(id -u):$(id -g)
if [ "$(id -u)" = 0 ]; then chown -R 65532:65532 "$work/shim" && shim_user=65532:65532; fi
docker rm -f "$shim" >/dev/null 2>&1 || true
docker run -d --name "$shim" --network host --read-only --cap-drop ALL --user "$shim_user" \
  -v "$work/shim:/etc/knotless:ro" knotless-mountproxy:dev \
  --kubeconfig=/etc/knotless/kubeconfig --workspace=root:knotless --bind-address=":$shim_port" \
  --tls-cert-file=/etc/knotless/shim-serving.crt --tls-private-key-file=/etc/knotless/shim-serving.key \
  --requestheader-client-ca-file=/etc/knotless/shim-requestheader-ca.crt \
  --requestheader-username-headers="$user_header" --requestheader-group-headers="$group_header" \
  --requestheader-extra-headers-prefix="$extra_prefix" \
  --allow-private-networks=127.0.0.1/32 --reserved-addresses="$fp_url,https://localhost:$host_port" \
  --metrics-bind-address="127.0.0.1:$shim_metrics" --health-probe-bind-address="127.0.0.1:$shim_health" >/dev/null
ready=
for _ in $(seq 1 60); do curl -fsS "http://127.0.0.1:$shim_health/readyz" >/dev/null 2>&1 && { ready=1; break; }; sleep 2; done
[ -n "$ready" ] || { echo "kind-e2e: the shim container $shim is not ready" >&2; exit 1; }

export KNOTLESS_E2E_KUBECONFIG=$work/admin.kubeconfig
export KNOTLESS_E2E_PROVIDER_WORKSPACE=root:knotless
export KNOTLESS_E2E_FRONT_PROXY_URL=$fp_url
export KNOTLESS_E2E_FRONT_PROXY_CA_FILE=$certs/serving-ca.crt
export KNOTLESS_E2E_CLIENT_CA_FILE=$certs/user-ca.crt KNOTLESS_E2E_CLIENT_CA_KEY_FILE=$certs/user-ca.key
export KNOTLESS_E2E_SHIM_URL=https://localhost:$shim_port
export KNOTLESS_E2E_SHIM_CA_FILE=$certs/shim-serving-ca.crt
export KNOTLESS_E2E_SHIM_CLIENT_CA_FILE=$certs/shim-requestheader-ca.crt KNOTLESS_E2E_SHIM_CLIENT_CA_KEY_FILE=$certs/shim-requestheader-ca.key
export KNOTLESS_E2E_SHIM_USER_HEADER=$user_header KNOTLESS_E2E_SHIM_GROUP_HEADER=$group_header KNOTLESS_E2E_SHIM_EXTRA_HEADER_PREFIX=$extra_prefix
export KNOTLESS_E2E_SHIM_METRICS_URL=http://127.0.0.1:$shim_metrics
export KNOTLESS_E2E_ARTIFACTS=$work/e2e-artifacts
rm -rf "$KNOTLESS_E2E_ARTIFACTS"
if ! KCP_BIN=$root/bin/kcp go test -p 1 -count=1 -timeout 60m -v -run "$run" ./e2e/ >"$logs/e2e.log" 2>&1; then
  grep -E '^(=== RUN|--- |\s+--- |ok|FAIL|PASS)' "$logs/e2e.log" | tail -n 60 >&2 || true
  exit 1
fi
grep -E '^(--- |\s+--- |ok|PASS)' "$logs/e2e.log" || true
step "the e2e suite passed"
