#!/usr/bin/env bash
# Install the Debian packages given as arguments when any of them is missing (as root, or with
# sudo when it is available); otherwise say exactly which command would.
#   hack/host-packages.sh prometheus wrk
set -euo pipefail
missing=()
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
((${#missing[@]})) || exit 0
command -v apt-get >/dev/null || { echo "missing packages: ${missing[*]} (install them; no apt-get here)" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "missing packages: run as root: apt-get install ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "Installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# Debian's prometheus package starts a system service where there is an init system; the tests
# run their own servers.
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi
