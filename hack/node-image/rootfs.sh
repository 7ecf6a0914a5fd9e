#!/usr/bin/env bash
# Makes a Debian root filesystem tarball with debootstrap and apt, from
# Debian's package registry only (the mirror apt on this machine uses).
#
# usage: hack/node-image/rootfs.sh OUT.tar SUITE PACKAGE...
#
# debootstrap --variant=minbase SUITE, then `apt-get install
# --no-install-recommends PACKAGE...` in a chroot (with SUITE-updates and
# SUITE-security enabled, as on this machine), then the clean-up kind's
# base image does (apt lists, docs, man pages, logs). The versions that were
# installed are written to /kind/debian-packages.txt inside the tarball and
# beside OUT.tar (OUT.tar.packages), since Debian's suites are pinned by
# name, not by package version. Needs root (debootstrap, chroot, mounts).
set -euo pipefail
out=$1 suite=$2
shift 2
[ "$(id -u)" = 0 ] || { echo "rootfs.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "rootfs.sh: apt-get install -y debootstrap" >&2; exit 1; }

# The mirrors apt uses here (deb822 sources), first URI is Debian's main archive.
sources=/etc/apt/sources.list.d/debian.sources
mirror=$(awk '/^URIs:/ {print $2; exit}' "$sources")
security=$(awk '/^URIs:/ && /security/ {print $2; exit}' "$sources")
[ -n "$mirror" ] || { echo "rootfs.sh: no URIs in $sources" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/knotless-rootfs.XXXXXX")
root=$work/root
cleanup() {
  for m in dev/pts dev proc sys; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

echo "rootfs: debootstrap --variant=minbase $suite from $mirror" >&2
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2; exit 1; }

cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror $suite main
deb $mirror $suite-updates main
${security:+deb $security $suite-security main}
SRC
# No service starts inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
cp /etc/resolv.conf "$root/etc/resolv.conf"

echo "rootfs: apt-get install $*" >&2
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -euc '
  apt-get update -q
  apt-get upgrade -y -q
  apt-get install -y -q --no-install-recommends "$@"
  apt-get clean -y
' rootfs "$@" >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }

mkdir -p "$root/kind"
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$root/kind/debian-packages.txt"
for m in dev/pts dev proc sys; do umount -l "$root/$m"; done
rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/resolv.conf" "$root/etc/hostname"
rm -rf "$root"/var/cache/debconf/*-old "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/tmp/* "$root"/var/tmp/* "$root"/usr/share/doc/* "$root"/usr/share/doc-base/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/cache/apt/*.bin
# Locales other than the C locale are not needed on a node.
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true

tar --numeric-owner --xattrs -C "$root" -cf "$out.tmp" .
cp "$root/kind/debian-packages.txt" "$out.packages"
mv "$out.tmp" "$out"
echo "rootfs: $out ($(du -h "$out" | cut -f1))" >&2
