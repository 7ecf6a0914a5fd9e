#!/usr/bin/env bash
# make node-image: a kind-compatible node image built here from pinned
# sources only, no registry (what is in it: docs/compute.md, "The node image").
#
#   root filesystem  Debian (bookworm) by debootstrap --variant=minbase from
#                    the mirror apt uses here, then systemd, containerd, runc,
#                    iptables, the CNI plugins, ... with apt in a chroot
#                    (hack/node-image/rootfs.sh)
#   node files       what kind's base image adds, written by us
#                    (hack/node-image/files: entrypoint, containerd config,
#                    kubelet unit and kubeadm drop-in, /kind/...)
#   Kubernetes       kubelet, kubeadm, kubectl on the node; kube-apiserver,
#                    kube-controller-manager, kube-scheduler and kube-proxy as
#                    images, all from k8s.io/kubernetes (hack/tools/kubernetes)
#   images           etcd (hack/tools/etcd), CoreDNS (hack/tools/coredns),
#                    pause (Kubernetes' pause.c, gcc -static) and nodenet (the
#                    default CNI, hack/node-image/nodenet), FROM scratch;
#                    kube-proxy on a minimal Debian root with iptables. Tagged
#                    as kubeadm v1.36 names them (registry.k8s.io/...), saved
#                    as tarballs and imported into the node's containerd
#                    (namespace k8s.io, pinned) while the image is built,
#                    as kind's `build node-image` does.
#
# Every part is cached under $KNOTLESS_TOOLS_CACHE/node-image (by default
# ~/.cache/knotless/tools/node-image, the cache hack/tool.sh uses), keyed by
# a hash of its inputs: go.mod/go.sum of its tool module (and CoreDNS's
# Go files: main.go says its plugins) and the Go version,
# the Debian suite and package list and rootfs.sh, the node files, the
# recipe below. The image's tag carries the key of all of them:
# knotless.dev/node:<kubernetes version>-<key>. A second run with the same
# inputs does nothing (the image is in docker) or `docker load`s the saved
# image from the cache. Cold times are kept in node-image/.timings.
#
# Needs root (debootstrap, chroot), docker, gcc with static glibc, and
# Go. Heavy steps run under nice -n 19.
#
# usage: hack/node-image/build.sh                build (or reuse) the image
#        hack/node-image/build.sh --print-image  the tag the current inputs give
#        hack/node-image/build.sh --plan         what is cached, what would be built
#        hack/node-image/build.sh --kubectl      the pinned kubectl's path (built if missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache_root=${KNOTLESS_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/knotless/tools}
cache=$cache_root/node-image
timings=$cache/.timings
export GONOSUMDB=github.com/kcp-dev GOFLAGS=${GOFLAGS:-}

# --- versions: each read from where it is pinned ---------------------------
modversion() { awk -v m="$2" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$root/hack/tools/$1/go.mod" | head -n1; }
K8S_VERSION=$(modversion kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(modversion etcd go.etcd.io/etcd/server/v3)
COREDNS_VERSION=$(modversion coredns github.com/coredns/coredns)
DEBIAN_SUITE=bookworm
# Kubernetes' source (pause.c and its version), downloaded first when this
# machine's module cache lacks it (a fresh machine, before any build).
find_k8s_src() { (cd "$root/hack/tools/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes 2>/dev/null) || true; }
k8s_src=$(find_k8s_src)
if [ -z "$k8s_src" ]; then
  (cd "$root/hack/tools/kubernetes" && go mod download k8s.io/kubernetes) >&2 || true
  k8s_src=$(find_k8s_src)
fi
PAUSE_VERSION=${k8s_src:+$(awk '/^TAG \?=/ {print $3}' "$k8s_src/build/pause/Makefile")}
# Image tags as kubeadm names them (kubeadm config images list).
ETCD_TAG=${ETCD_VERSION#v}-0
COREDNS_TAG=$COREDNS_VERSION
# Packages of the node (kind's base image list, minus nfs/iscsi/fuse, plus
# Debian's containerd, runc and CNI plugins, which kind builds itself).
NODE_PACKAGES="systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod
  libseccomp2 pigz e2fsprogs bash ca-certificates curl jq procps containerd runc
  containernetworking-plugins"
PROXY_PACKAGES="iptables nftables conntrack"

# --- keys -------------------------------------------------------------------
gover=$(go version)
hash() { sha256sum | cut -c1-16; }
treekey() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . -type f -perm -u+x | sort) | hash; }

k8s_ldflags="-s -w"
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$(cut -d. -f1 <<<"${K8S_VERSION#v}")"
  k8s_ldflags+=" -X $p.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $p.gitTreeState=clean"
done
K8S_BINS="kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy"
gccver=$(gcc --version 2>/dev/null | head -n1 || echo none)
# A part's recipe is the text of the functions below that build it.
recipe() { declare -f "$@"; }
# gosrc DIR: the non-test Go files under DIR, in a stable order.
gosrc() { find "$1" -name "*.go" ! -name "*_test.go" -print0 | sort -z | xargs -0 cat; }

# --- helpers ------------------------------------------------------------------
say() { echo "node-image: $*" >&2; }
last_time() { [ -f "$timings/$1" ] && echo "$(cat "$timings/$1")s last time here" || echo "never built here"; }
# timed PART COMMAND...: runs COMMAND, records its time as PART's.
timed() {
  local part=$1 start took
  shift
  say "building $part ($(last_time "$part"))"
  start=$(date +%s)
  "$@"
  took=$(( $(date +%s) - start ))
  mkdir -p "$timings"
  echo "$took" >"$timings/$part"
  say "built $part in ${took}s"
}

gobuild() { # DIR OUT LDFLAGS PACKAGE...
  local dir=$1 out=$2 ldflags=$3
  shift 3
  (cd "$dir" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$out" "$@")
}

build_k8s() {
  local d=$cache/kubernetes-$key_k8s pkgs=() b
  for b in $K8S_BINS; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  mkdir -p "$d.tmp"
  gobuild "$root/hack/tools/kubernetes" "$d.tmp/" "$k8s_ldflags" "${pkgs[@]}"
  mv "$d.tmp" "$d"
}
build_etcd() {
  local d=$cache/etcd-$key_etcd
  mkdir -p "$d.tmp"
  gobuild "$root/hack/tools/etcd" "$d.tmp/etcd" "-s -w" go.etcd.io/etcd/server/v3
  mv "$d.tmp" "$d"
}
build_coredns() {
  local d=$cache/coredns-$key_coredns
  mkdir -p "$d.tmp"
  gobuild "$root/hack/tools/coredns" "$d.tmp/coredns" "-s -w" .
  mv "$d.tmp" "$d"
}
build_nodenet() {
  local d=$cache/nodenet-$key_nodenet
  mkdir -p "$d.tmp"
  gobuild "$root" "$d.tmp/nodenet" "-s -w" ./hack/node-image/nodenet
  mv "$d.tmp" "$d"
}
build_pause() {
  local d=$cache/pause-$key_pause
  mkdir -p "$d.tmp"
  nice -n 19 gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-knotless" \
    -o "$d.tmp/pause" "$k8s_src/build/pause/linux/pause.c"
  strip "$d.tmp/pause"
  mv "$d.tmp" "$d"
}
build_rootfs() { # node|proxy
  local out=$cache/rootfs-$1-$2.tar
  shift 2
  nice -n 19 "$here/rootfs.sh" "$out" "$DEBIAN_SUITE" "$@"
}

# docker_image_from_rootfs TARBALL TAG: docker import, unless TAG exists.
docker_image_from_rootfs() {
  docker image inspect "$2" >/dev/null 2>&1 || docker import "$1" "$2" >/dev/null
}

# dockerbuild CONTEXT TAG: docker build of CONTEXT/Dockerfile, quietly.
dockerbuild() {
  docker build -q -t "$2" "$1" >"$1.log" 2>&1 || { cat "$1.log" >&2; return 1; }
}

# build_images: the tarballs of every image the node preloads.
build_images() {
  local out=$cache/images-$key_images work name bin tag
  work=$(mktemp -d "${TMPDIR:-/tmp}/knotless-images.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  mkdir -p "$out.tmp"
  docker_image_from_rootfs "$cache/rootfs-proxy-$key_rootfs_proxy.tar" "knotless.dev/kube-proxy-base:$key_rootfs_proxy"
  # Control plane: FROM scratch, the binary where kubeadm's manifests call it.
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    mkdir -p "$work/$name"
    cp "$cache/kubernetes-$key_k8s/$name" "$work/$name/"
    printf 'FROM scratch\nCOPY %s /usr/local/bin/%s\nENV PATH=/usr/local/bin\nENTRYPOINT ["/usr/local/bin/%s"]\n' \
      "$name" "$name" "$name" >"$work/$name/Dockerfile"
    dockerbuild "$work/$name" "registry.k8s.io/$name:$K8S_VERSION"
  done
  # kube-proxy runs iptables, nft and conntrack: a Debian root with them.
  mkdir -p "$work/kube-proxy"
  cp "$cache/kubernetes-$key_k8s/kube-proxy" "$here/images/iptables-wrapper" "$work/kube-proxy/"
  cat >"$work/kube-proxy/Dockerfile" <<DOCKERFILE
FROM knotless.dev/kube-proxy-base:$key_rootfs_proxy
COPY kube-proxy /usr/local/bin/kube-proxy
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
      ln -sf /usr/sbin/iptables-wrapper /usr/sbin/\$c; done
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
DOCKERFILE
  dockerbuild "$work/kube-proxy" "registry.k8s.io/kube-proxy:$K8S_VERSION"
  mkdir -p "$work/etcd" "$work/coredns" "$work/pause" "$work/nodenet"
  cp "$cache/etcd-$key_etcd/etcd" "$work/etcd/"
  printf 'FROM scratch\nCOPY etcd /usr/local/bin/etcd\nENV PATH=/usr/local/bin\nENTRYPOINT ["/usr/local/bin/etcd"]\n' >"$work/etcd/Dockerfile"
  dockerbuild "$work/etcd" "registry.k8s.io/etcd:$ETCD_TAG"
  cp "$cache/coredns-$key_coredns/coredns" "$work/coredns/"
  printf 'FROM scratch\nCOPY coredns /coredns\nEXPOSE 53 53/udp\nENTRYPOINT ["/coredns"]\n' >"$work/coredns/Dockerfile"
  dockerbuild "$work/coredns" "registry.k8s.io/coredns/coredns:$COREDNS_TAG"
  cp "$cache/pause-$key_pause/pause" "$work/pause/"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$work/pause/Dockerfile"
  dockerbuild "$work/pause" "registry.k8s.io/pause:$PAUSE_VERSION"
  cp "$cache/nodenet-$key_nodenet/nodenet" "$work/nodenet/"
  printf 'FROM scratch\nCOPY nodenet /nodenet\nENTRYPOINT ["/nodenet"]\n' >"$work/nodenet/Dockerfile"
  dockerbuild "$work/nodenet" "$NODENET_IMAGE"
  for tag in "${PRELOAD[@]}"; do
    name=$(basename "${tag%:*}")
    docker save -o "$out.tmp/$name.tar" "$tag"
    # The tarball is the cache; the host's docker keeps no registry.k8s.io tags.
    docker rmi "$tag" >/dev/null
  done
  rm -rf "$work"
  mv "$out.tmp" "$out"
}

# build_node: the node image, as kind's `build node-image` makes it: a build
# container from the base, the binaries and files in, containerd started in
# it to import the image tarballs, then docker commit.
build_node() {
  local work base build c tar missing
  work=$(mktemp -d "${TMPDIR:-/tmp}/knotless-node.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  base=knotless.dev/node-base:$key_rootfs_node
  build=knotless.dev/node-build:$key_node
  docker_image_from_rootfs "$cache/rootfs-node-$key_rootfs_node.tar" "$base"
  cp -a "$here/files" "$work/rootfs"
  mkdir -p "$work/rootfs/kind" "$work/bin"
  printf '%s' "$K8S_VERSION" >"$work/rootfs/kind/version"
  sed -i "s|@PAUSE_TAG@|$PAUSE_VERSION|" "$work/rootfs/etc/containerd/config.toml"
  sed -i "s|@NODENET_IMAGE@|$NODENET_IMAGE|" "$work/rootfs/kind/manifests/default-cni.yaml"
  find "$work/rootfs" -type d -exec chmod 755 {} +
  find "$work/rootfs" -type f ! -perm -u+x -exec chmod 644 {} +
  cp "$cache/kubernetes-$key_k8s/"{kubelet,kubeadm,kubectl} "$work/bin/"
  cat >"$work/Dockerfile" <<DOCKERFILE
FROM $base
COPY rootfs/ /
COPY bin/ /usr/bin/
RUN set -e; \
    echo "ReadKMsg=no" >>/etc/systemd/journald.conf; \
    ln -sf /usr/lib/systemd/systemd /sbin/init; \
    find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete; \
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*; \
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service; \
    systemctl mask systemd-binfmt.service; \
    mkdir -p /etc/kubernetes/manifests /etc/cni/net.d /opt/cni/bin; \
    for p in /usr/lib/cni/*; do ln -sf "\$p" /opt/cni/bin/; done; \
    ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer|length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json; \
    kubelet --version; kubeadm version -o short; containerd --version; runc --version | head -n1
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
DOCKERFILE
  docker build -t "$build" "$work" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; return 1; }
  c=knotless-node-build-$$
  docker rm -f "$c" >/dev/null 2>&1 || true
  docker run -d --name "$c" --entrypoint=sleep --security-opt seccomp=unconfined "$build" infinity >/dev/null
  # shellcheck disable=SC2064
  trap "docker rm -f $c >/dev/null 2>&1 || true; rm -rf '$work'" EXIT
  docker exec "$c" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
  docker exec "$c" bash -c 'for i in $(seq 1 30); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; cat /tmp/containerd.log; exit 1'
  for tar in "$cache/images-$key_images"/*.tar; do
    docker exec -i "$c" ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests - <"$tar" >/dev/null
  done
  # Pinned: the kubelet's image garbage collection leaves them alone.
  docker exec "$c" bash -c 'for i in $(ctr -n k8s.io images list -q); do ctr -n k8s.io images label "$i" io.cri-containerd.pinned=pinned >/dev/null; done'
  # Every image kubeadm would pull must be there.
  missing=$(docker exec "$c" bash -c "comm -23 <(kubeadm config images list --kubernetes-version $K8S_VERSION 2>/dev/null | sort) <(ctr -n k8s.io images list -q | sort)")
  if [ -n "$missing" ]; then
    say "images kubeadm $K8S_VERSION needs but the node does not have: $missing"
    return 1
  fi
  docker exec "$c" ctr -n k8s.io images list -q | grep -v -e '^sha256:' -e '^import-' | sed 's/^/  preloaded /' >&2
  docker exec "$c" bash -c 'pkill containerd; for i in $(seq 1 30); do pgrep containerd >/dev/null || break; sleep 1; done; rm -f /tmp/containerd.log'
  docker commit \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --change 'CMD []' \
    --change "LABEL dev.knotless.node-image.key=$key_node dev.knotless.kubernetes-version=$K8S_VERSION" \
    "$c" "$IMAGE" >/dev/null
  docker rm -f "$c" >/dev/null
  docker rmi "$build" >/dev/null
  docker save -o "$cache/node-$key_node.tar.tmp" "$IMAGE"
  mv "$cache/node-$key_node.tar.tmp" "$cache/node-$key_node.tar"
  # One saved node image is kept (about 1 GB each); its parts stay cached.
  find "$cache" -maxdepth 1 -name 'node-*.tar' ! -name "node-$key_node.tar" -delete
  rm -rf "$work"
}

key_k8s=$( (cat "$root"/hack/tools/kubernetes/go.{mod,sum}; echo "$gover $k8s_ldflags $K8S_BINS"; recipe gobuild build_k8s) | hash)
key_etcd=$( (cat "$root"/hack/tools/etcd/go.{mod,sum}; echo "$gover"; recipe gobuild build_etcd) | hash)
key_coredns=$( (cat "$root"/hack/tools/coredns/go.{mod,sum}; gosrc "$root/hack/tools/coredns"; echo "$gover"; recipe gobuild build_coredns) | hash)
key_nodenet=$( (gosrc "$here/nodenet"; echo "$gover"; recipe gobuild build_nodenet) | hash)
key_pause=$( ( [ -n "$k8s_src" ] && cat "$k8s_src/build/pause/linux/pause.c"; echo "$gccver $PAUSE_VERSION"; recipe build_pause) | hash)
key_rootfs_node=$( (cat "$here/rootfs.sh"; echo "$DEBIAN_SUITE" $NODE_PACKAGES) | hash)
key_rootfs_proxy=$( (cat "$here/rootfs.sh"; echo "$DEBIAN_SUITE" $PROXY_PACKAGES) | hash)
NODENET_IMAGE=knotless.dev/nodenet:$key_nodenet
PRELOAD=(
  "registry.k8s.io/kube-apiserver:$K8S_VERSION" "registry.k8s.io/kube-controller-manager:$K8S_VERSION"
  "registry.k8s.io/kube-scheduler:$K8S_VERSION" "registry.k8s.io/kube-proxy:$K8S_VERSION"
  "registry.k8s.io/etcd:$ETCD_TAG" "registry.k8s.io/coredns/coredns:$COREDNS_TAG"
  "registry.k8s.io/pause:$PAUSE_VERSION" "$NODENET_IMAGE"
)
key_images=$( (echo "$key_k8s $key_etcd $key_coredns $key_pause $key_nodenet $key_rootfs_proxy ${PRELOAD[*]}"
  cat "$here/images/iptables-wrapper"; recipe build_images) | hash)
key_node=$( (echo "$key_images $key_k8s $key_rootfs_node $(treekey "$here/files")"; recipe build_node) | hash)
IMAGE=knotless.dev/node:$K8S_VERSION-$key_node

if [ "${1:-}" = --print-image ]; then
  echo "$IMAGE"
  exit 0
fi
# --plan: each part, its cache entry, and whether it would be built.
if [ "${1:-}" = --plan ]; then
  echo "versions: kubernetes $K8S_VERSION, etcd $ETCD_VERSION, coredns $COREDNS_VERSION, pause $PAUSE_VERSION, debian $DEBIAN_SUITE"
  for part in kubernetes:kubernetes-$key_k8s etcd:etcd-$key_etcd coredns:coredns-$key_coredns \
    pause:pause-$key_pause nodenet:nodenet-$key_nodenet rootfs-node:rootfs-node-$key_rootfs_node.tar \
    rootfs-proxy:rootfs-proxy-$key_rootfs_proxy.tar images:images-$key_images node:node-$key_node.tar; do
    name=${part%%:*} entry=$cache/${part#*:}
    if [ -e "$entry" ]; then echo "$name: cached ($entry)"; else echo "$name: will build ($(last_time "$name")) into $entry"; fi
  done
  echo "image: $IMAGE"
  exit 0
fi

# --- build ------------------------------------------------------------------
[ -n "$k8s_src" ] || { say "k8s.io/kubernetes $K8S_VERSION is not in the module cache and could not be listed"; exit 1; }
# --kubectl: the path of the node's pinned kubectl, built with the node's
# Kubernetes binaries when they are not cached (e2e TestBidderGuide runs
# the guide's kubectl commands with it). Needs no docker.
if [ "${1:-}" = --kubectl ]; then
  if [ ! -x "$cache/kubernetes-$key_k8s/kubectl" ]; then
    mkdir -p "$cache"
    exec 9>"$cache/.node-image.lock"
    if command -v flock >/dev/null; then flock 9; fi
    [ -x "$cache/kubernetes-$key_k8s/kubectl" ] || timed kubernetes build_k8s
  fi
  echo "$cache/kubernetes-$key_k8s/kubectl"
  exit 0
fi
command -v docker >/dev/null && docker info >/dev/null 2>&1 || { say "docker does not answer (start dockerd)"; exit 1; }
mkdir -p "$cache"
# One build at a time per cache (make node-image beside a test that needs
# the image): a second caller waits, then finds the parts cached.
exec 9>"$cache/.node-image.lock"
if command -v flock >/dev/null && ! flock -n 9; then
  say "another build of the node image is running; waiting for it"
  flock 9
fi
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "$IMAGE is up to date"
  echo "$IMAGE"
  exit 0
fi
mkdir -p "$cache"
if [ -f "$cache/node-$key_node.tar" ]; then
  say "loading $IMAGE from $cache/node-$key_node.tar"
  docker load -i "$cache/node-$key_node.tar" >/dev/null
  echo "$IMAGE"
  exit 0
fi
[ "$(id -u)" = 0 ] || { say "building the root filesystems needs root (debootstrap, chroot)"; exit 1; }
command -v gcc >/dev/null || { say "gcc is needed for pause"; exit 1; }

# debootstrap, from Debian's packages, once and before the two root
# filesystems are built at once (two apt-get runs would race for dpkg's
# lock): a fresh machine has none.
if { [ ! -f "$cache/rootfs-node-$key_rootfs_node.tar" ] || [ ! -f "$cache/rootfs-proxy-$key_rootfs_proxy.tar" ]; } &&
  ! command -v debootstrap >/dev/null; then
  say "installing debootstrap (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
    { say "could not install debootstrap with apt-get"; exit 1; }
fi

total_start=$(date +%s)
pids=()
# The root filesystems wait on the network; build them while Go compiles.
[ -f "$cache/rootfs-node-$key_rootfs_node.tar" ] ||
  { timed rootfs-node build_rootfs node "$key_rootfs_node" $NODE_PACKAGES & pids+=($!); }
[ -f "$cache/rootfs-proxy-$key_rootfs_proxy.tar" ] ||
  { timed rootfs-proxy build_rootfs proxy "$key_rootfs_proxy" $PROXY_PACKAGES & pids+=($!); }
[ -d "$cache/pause-$key_pause" ] || timed pause build_pause
[ -d "$cache/nodenet-$key_nodenet" ] || timed nodenet build_nodenet
[ -d "$cache/etcd-$key_etcd" ] || timed etcd build_etcd
[ -d "$cache/coredns-$key_coredns" ] || timed coredns build_coredns
[ -d "$cache/kubernetes-$key_k8s" ] || timed kubernetes build_k8s
for p in "${pids[@]}"; do wait "$p"; done
[ -d "$cache/images-$key_images" ] || timed images build_images
timed node build_node
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
say "$IMAGE: $(( size / 1024 / 1024 )) MiB, built in $(( $(date +%s) - total_start ))s"
echo "$IMAGE"
