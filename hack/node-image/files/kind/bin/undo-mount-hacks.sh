#!/bin/bash
# On cgroup v1 the entrypoint hides the misc controller from systemd with a
# bind mount over /proc/cgroups; systemd is up now, so remove it.
set -o errexit -o nounset -o pipefail
[[ -f /sys/fs/cgroup/cgroup.controllers ]] && exit 0
umount /proc/cgroups || true
