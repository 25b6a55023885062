#!/bin/sh
# Makes a Debian root filesystem tarball for a registry-free base image.
# usage: make-rootfs.sh builder|runtime OUT.tar [MIRROR] [SUITE]
# The tarball is imported with `docker import` (harness/base.py does it through the Docker SDK).
set -eu
role="$1"; out="$2"
mirror="${3:-http://deb.debian.org/debian}"; suite="${4:-bookworm}"
case "$role" in
  builder) include="--include=build-essential,cmake,ca-certificates,pkg-config" ;;
  # libgomp1: llama.cpp's CPU backend links OpenMP.
  runtime) include="--include=libgomp1,ca-certificates" ;;
  *) echo "make-rootfs.sh: role must be builder or runtime, got '$role'" >&2; exit 2 ;;
esac
command -v debootstrap >/dev/null || { echo "make-rootfs.sh: debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 2; }
rootfs="$(mktemp -d "${TMPDIR:-/tmp}/specbench-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase $include "$suite" "$rootfs" "$mirror"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
