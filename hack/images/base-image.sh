#!/usr/bin/env bash
# A Python base image made from Debian packages, for machines with no registry to pull
# python:3.11-slim-bookworm from: debootstrap (minbase + python3, venv, CA certificates, and
# libgomp1, the OpenMP runtime that llama-server in modelroll-llama links), then `docker import`.
# The image trusts the CA bundle of the machine that builds it, so that pip inside `docker build`
# reaches PyPI through the same TLS-intercepting proxies the host goes through.
#
#   hack/images/base-image.sh IMAGE:TAG [ROOTFS_CACHE_DIR]
#
# Needs root (debootstrap), debootstrap and a running Docker engine. The rootfs is kept in
# ROOTFS_CACHE_DIR (default /var/lib/modelroll/base-rootfs: outside the checkout, which is Docker's
# build context) and reused while its package list is unchanged; so is the image, which carries
# the list in its label modelroll.base.
set -euo pipefail
image=${1:?usage: $0 IMAGE:TAG [ROOTFS_CACHE_DIR]}
root=${2:-/var/lib/modelroll/base-rootfs}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-venv,ca-certificates,libgomp1
stamp="$root.stamp"
want="$suite $packages $mirror"

docker=${DOCKER:-docker}
label='{{index .Config.Labels "modelroll.base"}}'
if [ "$("$docker" image inspect --format "$label" "$image" 2>/dev/null || true)" = "$want" ]; then
  echo "$image"
  exit 0
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$root" "$stamp"
  mkdir -p "$(dirname "$root")"
  echo "debootstrap $suite ($packages) into $root"
  debootstrap --variant=minbase --include="$packages" "$suite" "$root.tmp" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -rf "$root.tmp"; exit 1; }
  # What an image does not need: package lists, docs, caches.
  rm -rf "$root.tmp"/var/lib/apt/lists/* "$root.tmp"/var/cache/apt/*.bin \
    "$root.tmp"/usr/share/doc/* "$root.tmp"/usr/share/man/* "$root.tmp"/usr/share/locale/*
  mv "$root.tmp" "$root"
  echo "$want" > "$stamp"
fi
# The host's CAs (a proxy's among them) for pip during builds.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
tar -C "$root" --numeric-owner -c . | "$docker" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change "LABEL modelroll.base=\"$want\"" \
  --change 'CMD ["python3"]' - "$image" >/dev/null
echo "$image"
