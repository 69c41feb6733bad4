#!/usr/bin/env bash
# The Debian packages the tests need, installed when this runs as root on a
# machine with apt-get (CI); otherwise it says what is missing and exits 0,
# so `make test` works for a user without root (the tests that need a
# missing package skip and say why).
#
#   chromium-headless-shell  tests/test_report.py renders report.html in it
#   nftables                 the real target's network faults (rules inside host namespaces)
#   etcd-server              the keeper's store (keeper.store: etcd): real/etcd.py starts a loopback cluster of /usr/bin/etcd
#
# Idempotent: a package dpkg reports installed is skipped, and nothing is
# fetched when all are there.
set -euo pipefail

PACKAGES=(chromium-headless-shell nftables etcd-server)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    if command -v dpkg-query >/dev/null 2>&1 && installed "$pkg"; then
        continue
    fi
    missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "debian-packages: not installed: ${missing[*]} (as root: apt-get install -y" \
         "--no-install-recommends ${missing[*]}); the tests that need them skip" >&2
    exit 0
fi
echo "debian-packages: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# a mirror that cannot be reached must not stop the tests: those that need
# the package skip and name it
if ! { apt-get update -qq && apt-get install -y --no-install-recommends "${missing[@]}"; }; then
    echo "debian-packages: could not install ${missing[*]}; the tests that need them skip" >&2
fi
# etcd-server's package enables a system etcd (etcd.service: no auth, on
# 127.0.0.1:2379). The runs start their own clusters, so one we installed
# just now is stopped and disabled where systemd runs (not in containers).
if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ] \
        && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
