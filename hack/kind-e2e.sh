#!/usr/bin/env bash
# The kind path: kcp from kcp's Helm chart (kcp-dev/helm-charts) in a kind
# cluster, knotless's images loaded into it and its chart installed, then
# the e2e suite against that kcp (KNOTLESS_E2E_KUBECONFIG and the mount
# topology of e2e/framework/external.go). For machines that have kind and
# reach the image registries of kind, cert-manager and kcp; it cannot run
# where no registry is reachable (docs/install.md).
#
# Needs: docker, kind, kubectl, openssl, curl; helm, kcp (for the tenants
# the tests start) and the images are built here (make chart-lint tools
# images).
#
# Steps:
#  1. kind cluster $KIND_CLUSTER (default knotless) with kcp-front-proxy's
#     NodePort on localhost:8443;
#  2. cert-manager; certificates for the mount path (the shim's serving
#     certificate and requestheader CA, kcp-front-proxy's client
#     certificate towards the shim, the provider's probe certificate) and
#     random identity header names;
#  3. kcp (chart version $KCP_CHART_VERSION, image tag $KCP_TAG) with
#     WorkspaceMounts=true and a /tenants/ mapping to the shim with those
#     header names;
#  4. knotless's chart with both components (kcp-admin kubeconfigs): the
#     chart smoke test is that both Deployments become Ready;
#  5. the e2e suite: the chart's provider is scaled to 0 (the suite runs
#     its own for root:knotless), and the shim the /tenants/ mapping
#     reaches is a knotless-mountproxy container on this machine (docker
#     run --network host), because the tests start their tenants on
#     127.0.0.1 here. KIND_E2E_RUN selects tests (go test -run).
#
# KIND_KEEP=1 keeps the cluster afterwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cluster=${KIND_CLUSTER:-knotless}
kcp_chart_version=${KCP_CHART_VERSION:-0.16.6}
kcp_tag=${KCP_TAG:-}
work=$root/bin/kind-e2e
mkdir -p "$work"
export KUBECONFIG=$work/kind.kubeconfig

for cmd in docker kind kubectl openssl curl; do
  command -v "$cmd" >/dev/null || { echo "kind-e2e: $cmd is needed" >&2; exit 1; }
done
make chart-lint tools images >/dev/null
helm=$root/bin/helm

shim_port=${KIND_SHIM_PORT:-9443}
shim=knotless-kind-e2e-mountproxy
cleanup() {
  docker rm -f "$shim" >/dev/null 2>&1 || true
  if [ "${KIND_KEEP:-}" != 1 ]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# 1. the cluster
cat >"$work/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraPortMappings:
      - {containerPort: 31443, hostPort: 8443, protocol: TCP}
EOF
kind get clusters 2>/dev/null | grep -qx "$cluster" || kind create cluster --name "$cluster" --config "$work/kind.yaml"
# Pods reach this machine at the gateway of kind's docker network.
gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{if .Gateway}}{{.Gateway}} {{end}}{{end}}' | tr ' ' '\n' | grep -E '^[0-9.]+$' | head -1)
echo "kind-e2e: pods reach this machine at $gateway"

# 2. cert-manager and the mount path's certificates
"$helm" repo add jetstack https://charts.jetstack.io >/dev/null
"$helm" repo add kcp https://kcp-dev.github.io/helm-charts >/dev/null
"$helm" repo update >/dev/null
"$helm" upgrade --install --wait --namespace cert-manager --create-namespace --set crds.enabled=true cert-manager jetstack/cert-manager
kubectl create namespace kcp --dry-run=client -o yaml | kubectl apply -f -
kubectl create namespace knotless --dry-run=client -o yaml | kubectl apply -f -
ca() { # name namespace
  cat <<EOF
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: $1, namespace: $2}
spec:
  isCA: true
  commonName: $1
  secretName: $1
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: knotless-selfsigned, kind: ClusterIssuer}
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: $1, namespace: $2}
spec:
  ca: {secretName: $1}
EOF
}
leaf() { # name namespace issuer commonName usage [ip]
  cat <<EOF
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: $1, namespace: $2}
spec:
  commonName: $4
  secretName: $1
  privateKey: {algorithm: ECDSA, size: 256}
  usages: [digital signature, $5]
  issuerRef: {name: $3, kind: Issuer}
  dnsNames: [knotless-mountproxy.knotless.svc, localhost]
  ipAddresses: [127.0.0.1${6:+, $6}]
EOF
}
{
  echo 'apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: knotless-selfsigned}
spec: {selfSigned: {}}'
  echo ---; ca knotless-mountproxy-serving-ca knotless
  echo ---; ca knotless-mountproxy-requestheader-ca knotless
  echo ---; leaf knotless-mountproxy-serving knotless knotless-mountproxy-serving-ca knotless-mountproxy "server auth" "$gateway"
  echo ---; leaf knotless-probe-cert knotless knotless-mountproxy-requestheader-ca knotless-probe "client auth"
  echo ---; leaf knotless-front-proxy-to-shim knotless knotless-mountproxy-requestheader-ca kcp-front-proxy "client auth"
} >"$work/certs.yaml"
kubectl apply -f "$work/certs.yaml"
kubectl -n knotless wait --for=condition=Ready --timeout=2m certificate --all
# kcp-front-proxy's side: its client certificate towards the shim and the
# CA of the shim's serving certificate, as plain Secrets in kcp's namespace.
secret() { kubectl -n "$1" get secret "$2" -o "jsonpath={.data.${3//./\\.}}" | base64 -d; }
secret knotless knotless-front-proxy-to-shim tls.crt >"$work/to-shim.crt"
secret knotless knotless-front-proxy-to-shim tls.key >"$work/to-shim.key"
secret knotless knotless-mountproxy-serving-ca ca.crt >"$work/shim-ca.crt"
kubectl -n kcp create secret tls knotless-front-proxy-to-shim --cert "$work/to-shim.crt" --key "$work/to-shim.key" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n kcp create secret generic knotless-mountproxy-serving-ca --from-file=ca.crt="$work/shim-ca.crt" --dry-run=client -o yaml | kubectl apply -f -
hex() { openssl rand -hex 8; }
user_header=X-Knotless-$(hex)-User group_header=X-Knotless-$(hex)-Group extra_prefix=X-Knotless-$(hex)-Extra-
kubectl -n knotless create secret generic knotless-identity-headers --dry-run=client -o yaml \
  --from-literal=user-header="$user_header" --from-literal=group-header="$group_header" --from-literal=extra-header-prefix="$extra_prefix" | kubectl apply -f -

# 3. kcp with mounts and the /tenants/ mapping (the header names are in
# kcp's chart's mapping ConfigMap: keep that namespace to kcp's operators)
cat >"$work/kcp-values.yaml" <<EOF
externalHostname: kcp.dev.test
externalPort: "8443"
certificates:
  dnsNames: [localhost, kcp.dev.test]
etcd:
  resources: {requests: {memory: 256Mi}}
kcp:
  volumeClassName: standard
  extraFlags: [--feature-gates=WorkspaceMounts=true]
  hostAliases: {enabled: true, values: [{ip: 10.96.0.100, hostnames: [kcp.dev.test]}]}
kcpFrontProxy:
  service: {type: NodePort, nodePort: 31443, clusterIP: 10.96.0.100}
  additionalPathMappings:
    - path: /tenants/
      backend: https://$gateway:$shim_port
      backend_server_ca: /etc/knotless/shim-ca/ca.crt
      proxy_client_cert: /etc/knotless/to-shim/tls.crt
      proxy_client_key: /etc/knotless/to-shim/tls.key
      user_header: $user_header
      group_header: $group_header
      extra_header_prefix: $extra_prefix
  extraVolumes:
    - {name: knotless-shim-ca, secret: {secretName: knotless-mountproxy-serving-ca, items: [{key: ca.crt, path: ca.crt}]}}
    - {name: knotless-to-shim, secret: {secretName: knotless-front-proxy-to-shim}}
  extraVolumeMounts:
    - {name: knotless-shim-ca, mountPath: /etc/knotless/shim-ca}
    - {name: knotless-to-shim, mountPath: /etc/knotless/to-shim}
EOF
"$helm" upgrade --install --wait --timeout 10m --namespace kcp --version "$kcp_chart_version" \
  ${kcp_tag:+--set kcp.tag=$kcp_tag --set kcpFrontProxy.tag=$kcp_tag} -f "$work/kcp-values.yaml" kcp kcp/kcp

# kcp-admin through kcp-front-proxy (client certificate of its client CA)
cat <<EOF | kubectl apply -f -
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: knotless-kcp-admin, namespace: kcp}
spec:
  commonName: kcp-admin
  subject: {organizations: [system:kcp:admin]}
  secretName: knotless-kcp-admin
  usages: [client auth]
  issuerRef: {name: kcp-front-proxy-client-issuer}
EOF
kubectl -n kcp wait --for=condition=Ready --timeout=2m certificate/knotless-kcp-admin
get() { secret "$1" "$2" "$3" >"$4"; chmod 644 "$4"; }
get kcp kcp-front-proxy-cert ca.crt "$work/front-proxy-ca.crt"
get kcp knotless-kcp-admin tls.crt "$work/admin.crt"
get kcp knotless-kcp-admin tls.key "$work/admin.key"
get kcp kcp-front-proxy-client-ca tls.crt "$work/client-ca.crt"
get kcp kcp-front-proxy-client-ca tls.key "$work/client-ca.key"
for f in serving-ca requestheader-ca; do
  get knotless knotless-mountproxy-$f tls.crt "$work/$f.crt"
  get knotless knotless-mountproxy-$f tls.key "$work/$f.key"
done
get knotless knotless-mountproxy-serving tls.crt "$work/serving.crt"
get knotless knotless-mountproxy-serving tls.key "$work/serving.key"
kubeconfig() { # file server
  kubectl --kubeconfig "$1" config set-cluster kcp --server "$2/clusters/root" --certificate-authority "$work/front-proxy-ca.crt" --embed-certs --tls-server-name kcp.dev.test >/dev/null
  kubectl --kubeconfig "$1" config set-credentials kcp-admin --client-certificate "$work/admin.crt" --client-key "$work/admin.key" --embed-certs >/dev/null
  kubectl --kubeconfig "$1" config set-context root --cluster kcp --user kcp-admin >/dev/null
  kubectl --kubeconfig "$1" config use-context root >/dev/null
  chmod 644 "$1"
}
kubeconfig "$work/admin.kubeconfig" https://localhost:8443
kubeconfig "$work/in-cluster.kubeconfig" https://kcp.dev.test:8443
for c in provider mountproxy; do
  kubectl -n knotless create secret generic knotless-$c-kubeconfig --dry-run=client -o yaml --from-file=kubeconfig="$work/in-cluster.kubeconfig" | kubectl apply -f -
done

# 4. knotless's images and chart
kind load docker-image --name "$cluster" knotless-provider:dev knotless-mountproxy:dev
"$helm" upgrade --install --wait --timeout 5m --namespace knotless knotless deploy/charts/knotless \
  --set identityHeaders.secretName=knotless-identity-headers \
  --set provider.kubeconfigSecret.name=knotless-provider-kubeconfig \
  --set provider.mount.url=https://kcp.dev.test:8443 \
  --set provider.mount.caSecret.name=knotless-mountproxy-serving-ca \
  --set provider.mount.probeCertSecret.name=knotless-probe-cert \
  --set mountproxy.kubeconfigSecret.name=knotless-mountproxy-kubeconfig \
  --set mountproxy.servingCertSecret.name=knotless-mountproxy-serving \
  --set mountproxy.requestHeaderCASecret.name=knotless-mountproxy-requestheader-ca \
  --set 'mountproxy.reservedAddresses={https://kcp.dev.test:8443}' \
  --set 'hostAliases[0].ip=10.96.0.100' --set 'hostAliases[0].hostnames={kcp.dev.test}'
for d in knotless-provider knotless-mountproxy; do kubectl -n knotless rollout status "deploy/$d" --timeout 5m; done
echo "kind-e2e: the chart's provider and mount proxy are Ready"

# 5. the e2e suite: its own provider for root:knotless, the shim on this
# machine (the tenants the tests start listen on 127.0.0.1 here)
kubectl -n knotless scale deploy/knotless-provider --replicas 0
mkdir -p "$work/shim"
cp "$work/admin.kubeconfig" "$work/shim/kubeconfig"
cp "$work/serving.crt" "$work/serving.key" "$work/requestheader-ca.crt" "$work/shim/"
chmod 644 "$work/shim/"*
docker rm -f "$shim" >/dev/null 2>&1 || true
docker run -d --name "$shim" --network host --read-only --cap-drop ALL --user 65532:65532 \
  -v "$work/shim:/etc/knotless:ro" knotless-mountproxy:dev \
  --kubeconfig=/etc/knotless/kubeconfig --workspace=root:knotless --bind-address=":$shim_port" \
  --tls-cert-file=/etc/knotless/serving.crt --tls-private-key-file=/etc/knotless/serving.key \
  --requestheader-client-ca-file=/etc/knotless/requestheader-ca.crt \
  --requestheader-username-headers="$user_header" --requestheader-group-headers="$group_header" \
  --requestheader-extra-headers-prefix="$extra_prefix" \
  --allow-private-networks=127.0.0.1/32 --reserved-addresses=https://localhost:8443 \
  --metrics-bind-address=127.0.0.1:9090 --health-probe-bind-address=127.0.0.1:9091 >/dev/null
for _ in $(seq 1 60); do curl -fsS http://127.0.0.1:9091/readyz >/dev/null 2>&1 && break; sleep 2; done

export KNOTLESS_E2E_KUBECONFIG=$work/admin.kubeconfig
export KNOTLESS_E2E_PROVIDER_WORKSPACE=root:knotless
export KNOTLESS_E2E_FRONT_PROXY_URL=https://localhost:8443
export KNOTLESS_E2E_FRONT_PROXY_CA_FILE=$work/front-proxy-ca.crt
export KNOTLESS_E2E_CLIENT_CA_FILE=$work/client-ca.crt KNOTLESS_E2E_CLIENT_CA_KEY_FILE=$work/client-ca.key
export KNOTLESS_E2E_SHIM_URL=https://127.0.0.1:$shim_port
export KNOTLESS_E2E_SHIM_CA_FILE=$work/serving-ca.crt
export KNOTLESS_E2E_SHIM_CLIENT_CA_FILE=$work/requestheader-ca.crt KNOTLESS_E2E_SHIM_CLIENT_CA_KEY_FILE=$work/requestheader-ca.key
export KNOTLESS_E2E_SHIM_USER_HEADER=$user_header KNOTLESS_E2E_SHIM_GROUP_HEADER=$group_header KNOTLESS_E2E_SHIM_EXTRA_HEADER_PREFIX=$extra_prefix
export KNOTLESS_E2E_SHIM_METRICS_URL=http://127.0.0.1:9090
make stack-deps >/dev/null
KCP_BIN=$root/bin/kcp go test -p 1 -count=1 -timeout 60m -v -run "${KIND_E2E_RUN:-.}" ./e2e/
