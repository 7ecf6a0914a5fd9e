#!/usr/bin/env bash
# make release VERSION=x.y.z: the versioned artifacts of knotless under
# dist/<VERSION>/ (docs/install.md#releases), built here offline:
#
#   knotless-provider-<V>.image.tar.gz    docker save of the image (tag <V>)
#   knotless-mountproxy-<V>.image.tar.gz  the same for the mount proxy
#   knotless-<V>.tgz                      the chart (helm package; version and
#                                         appVersion <V>, so its images default
#                                         to tag <V>)
#   knotless-agent-<V>-linux-amd64.tar.gz the agent, its pinned kcp (the
#                                         process driver's tenants) and kind
#                                         (the kind driver's), a systemd
#                                         unit and its settings file, its
#                                         identity (rbac.yaml)
#   knotless-node-<V>.image.tar.gz        docker save of the kind driver's node
#                                         image (hack/node-image/build.sh, its
#                                         own tag knotless.dev/node:<k8s>-<key>,
#                                         named in the agent's INSTALL);
#                                         KNOTLESS_RELEASE_NODE_IMAGE=0 leaves
#                                         it out
#   kubectl-knotless-<V>-linux-amd64.tar.gz
#                                         the kubectl plugin (kubectl knotless
#                                         kubeconfig/token: a tenant as your
#                                         ATProto identity)
#   sbom/<binary>.cdx.json                CycloneDX SBOM of each binary's Go
#                                         modules (pinned cyclonedx-gomod)
#   SHA256SUMS                            sha256sum -c checks every file above
#
# The binaries are static (CGO_ENABLED=0, -trimpath) and stamped with the
# version and the commit. KNOTLESS_DIST puts dist/ elsewhere (the tests).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${VERSION:-}
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "hack/release.sh: VERSION must be a semantic version such as 0.3.0 or 0.3.0-rc.1 (got '${version}')" >&2
  exit 1
fi
out=${KNOTLESS_DIST:-$root/dist}/$version
commit=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
# A release is what the commit holds: no uncommitted or untracked file of
# what it packs (helm package takes any file in the chart's folder, go
# build any .go file of a package) may slip in.
if [ -n "$(git status --porcelain --untracked-files=all -- apis cmd controllers deploy exports internal lexicons mountproxy workspacetypes go.mod go.sum)" ]; then
  echo "hack/release.sh: uncommitted or untracked files in what a release packs; commit or remove them:" >&2
  git status --short --untracked-files=all -- apis cmd controllers deploy exports internal lexicons mountproxy workspacetypes go.mod go.sum >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/sbom"
start=$(date +%s)

# Pinned tools: helm (chart), kcp (the agent's tenants), cyclonedx-gomod.
hack/tool.sh helm helm.sh/helm/v3/cmd/helm
hack/tool.sh kcp github.com/kcp-dev/kcp/cmd/kcp github.com/kcp-dev/kcp/cmd/kcp-front-proxy
hack/tool.sh cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod

# Images, tagged <V>, saved.
KNOTLESS_IMAGE_TAG=$version KNOTLESS_VERSION=$version hack/images.sh
for name in knotless-provider knotless-mountproxy; do
  docker save "${KNOTLESS_IMAGE_REPOSITORY:+$KNOTLESS_IMAGE_REPOSITORY/}$name:$version" | gzip -n >"$out/$name-$version.image.tar.gz"
  bin/cyclonedx-gomod bin -json -version "v$version" -output "$out/sbom/$name.cdx.json" "bin/images/$name/$name"
done

# The chart, with the release as its version and default image tag.
bin/helm package deploy/charts/knotless --version "$version" --app-version "$version" -d "$out" >/dev/null

# The kind driver's node image, as built and cached here (cold: a quarter
# of an hour; from the cache: seconds).
node_image=
if [ "${KNOTLESS_RELEASE_NODE_IMAGE:-1}" != 0 ]; then
  node_image=$(hack/node-image/build.sh)
  hack/tool.sh kind sigs.k8s.io/kind
  docker save "$node_image" | gzip -n -1 >"$out/knotless-node-$version.image.tar.gz"
fi

# The agent's tarball.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/knotless-agent-$version
mkdir -p "$pkg/bin" "$pkg/systemd"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath \
  -ldflags "-s -w -X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Version=$version -X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=$commit" \
  -o "$pkg/bin/knotless-agent" ./cmd/knotless-agent
cp -L bin/kcp "$pkg/bin/kcp"
cp deploy/agent/knotless-agent.service deploy/agent/agent.env "$pkg/systemd/"
if [ -n "$node_image" ]; then
  cp -L bin/kind "$pkg/bin/kind"
  bin/cyclonedx-gomod bin -json -output "$out/sbom/kind.cdx.json" "$pkg/bin/kind"
fi
cp deploy/agent/rbac.yaml "$pkg/"
cat >"$pkg/INSTALL" <<TXT
knotless-agent $version ($commit), linux/amd64 — docs/compute.md#knotless-agent

  install -m 0755 bin/knotless-agent /usr/local/bin/
  install -D -m 0755 bin/kcp /usr/local/lib/knotless-agent/kcp
  install -D -m 0600 systemd/agent.env /etc/knotless-agent/agent.env
  install -m 0600 <kubeconfig of rbac.yaml's ServiceAccount in the bidder workspace> /etc/knotless-agent/kubeconfig
  install -m 0644 systemd/knotless-agent.service /etc/systemd/system/
  systemctl daemon-reload && systemctl enable --now knotless-agent
TXT
if [ -n "$node_image" ]; then
  cat >>"$pkg/INSTALL" <<TXT

The kind driver (MarketBidder spec.driver: kind; docker on this machine; docs/compute.md#the-kind-driver):
  install -D -m 0755 bin/kind /usr/local/lib/knotless-agent/kind
  gunzip -c knotless-node-$version.image.tar.gz | docker load   # beside this tarball in the release
  # added to KNOTLESS_AGENT_ARGS in /etc/knotless-agent/agent.env:
  --node-image=$node_image --kind=/usr/local/lib/knotless-agent/kind --kind-root=/var/lib/knotless-agent/kind
TXT
fi
bin/cyclonedx-gomod bin -json -version "v$version" -output "$out/sbom/knotless-agent.cdx.json" "$pkg/bin/knotless-agent"
bin/cyclonedx-gomod bin -json -output "$out/sbom/kcp.cdx.json" "$pkg/bin/kcp"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/knotless-agent-$version-linux-amd64.tar.gz" "knotless-agent-$version"

# The kubectl plugin's tarball.
plugin=$stage/kubectl-knotless-$version
mkdir -p "$plugin"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath \
  -ldflags "-s -w -X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Version=$version -X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=$commit" \
  -o "$plugin/kubectl-knotless" ./cmd/kubectl-knotless
cat >"$plugin/INSTALL" <<EOF
kubectl-knotless $version ($commit), linux/amd64 — docs/market.md (a tenant as your ATProto identity)
  install -m 0755 kubectl-knotless /usr/local/bin/   # any directory on PATH: kubectl runs kubectl-* plugins from there
  kubectl knotless version
  kubectl knotless kubeconfig -h
EOF
bin/cyclonedx-gomod bin -json -version "v$version" -output "$out/sbom/kubectl-knotless.cdx.json" "$plugin/kubectl-knotless"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/kubectl-knotless-$version-linux-amd64.tar.gz" "kubectl-knotless-$version"

(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release $version ($commit) in $out in $(( $(date +%s) - start ))s:"
(cd "$out" && du -h -- * | sed 's/^/  /')
