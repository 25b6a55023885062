#!/bin/sh
# Makes a Debian root filesystem tarball for a registry-free base image, for this machine's architecture.
# usage: make-rootfs.sh OUT.tar MIRROR SUITE PACKAGES   (PACKAGES: comma-separated, as debootstrap --include takes)
# The tarball is imported with `docker import` (harness/bases.py: through the Docker API, or on the host itself).
set -eu
out="$1"; mirror="$2"; suite="$3"; packages="$4"
PATH="$PATH:/usr/sbin:/sbin"
command -v debootstrap >/dev/null || { echo "make-rootfs.sh: debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 2; }
rootfs="$(mktemp -d "${TMPDIR:-/tmp}/specbench-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
