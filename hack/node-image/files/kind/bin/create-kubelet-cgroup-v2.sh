#!/bin/bash
# cgroup v2: the kubelet needs every controller of the root enabled for
# /kubelet and /kubelet.slice (its cgroupRoot under either cgroup driver).
# Runs after systemd moved every process out of the root cgroup.
set -o errexit -o nounset -o pipefail
if [[ ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
  echo 'create-kubelet-cgroup-v2.sh: not a cgroup v2 host' >&2
  exit 1
fi
if grep -qv '^0$' /sys/fs/cgroup/cgroup.procs; then
  echo 'create-kubelet-cgroup-v2.sh: the root cgroup still has processes' >&2
  exit 1
fi
enable_all() { sed -e 's/ / +/g' -e 's/^/+/' <"/sys/fs/cgroup/$1/cgroup.controllers" >"/sys/fs/cgroup/$1/cgroup.subtree_control"; }
enable_all /
mkdir -p /sys/fs/cgroup/kubelet /sys/fs/cgroup/kubelet.slice
enable_all /kubelet
enable_all /kubelet.slice
