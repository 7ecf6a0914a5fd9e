#!/bin/bash
# containerd createContainer hook (in /etc/containerd/cri-base.json): gives
# each container its own copy of the node's product_name and product_uuid
# instead of one bind mount shared by all of them.
set -o errexit -o nounset -o pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
bundle=$(jq -r .bundle)
cp /kind/product_* "${bundle:?}/rootfs/"
for f in /sys/class/dmi/id/product_name:product_name /sys/class/dmi/id/product_uuid:product_uuid \
  /sys/devices/virtual/dmi/id/product_uuid:product_uuid; do
  target=${f%%:*} copy=${f#*:}
  if [[ -f "$target" && -f "$bundle/rootfs/$copy" ]]; then
    mount -o ro,bind "$bundle/rootfs/$copy" "$bundle/rootfs$target"
  fi
done
