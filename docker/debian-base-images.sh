#!/usr/bin/env bash
# Stand-ins for docker.io/library/debian:bookworm-slim and python:3.11-slim, made from Debian's
# packages, for a machine that reaches Debian's repositories and PyPI but no container registry
# (CI here). With them docker/Dockerfile builds unchanged. An image of either name that is
# already there is kept, so the images made once are reused by every later build.
#
#   docker/debian-base-images.sh [podman|docker]      (as root: debootstrap needs it)
#
# debian:bookworm-slim is debootstrap's minbase. python:3.11-slim is that plus Debian's
# python3 (3.11 in bookworm), venv, pip and CA certificates, with what the real image has and
# the Dockerfile relies on: python and pip on PATH, pip installing system-wide (Debian's
# EXTERNALLY-MANAGED marker removed). The host's CA bundle goes in, so pip inside a build
# trusts what the host trusts (a proxy's certificate authority included).
set -euo pipefail

ENGINE=${1:-podman}
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
PYTHON_IMAGE=docker.io/library/python:3.11-slim
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
PATH_ENV='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# Two test sessions at once make them once.
exec 9>"${TMPDIR:-/tmp}/hare-debian-base-images.lock"
flock 9
missing() { ! "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
if ! missing "$DEBIAN_IMAGE" && ! missing "$PYTHON_IMAGE"; then
    echo "$DEBIAN_IMAGE, $PYTHON_IMAGE: already there"
    exit 0
fi

root=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$root" "$log"' EXIT
# What the slim images leave out: package caches and lists, documentation, translations.
slim() {
    find "$root/var/cache/apt" -type f -delete
    rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
}
import_root() {  # IMAGE CMD
    tar -C "$root" --exclude='./var/lib/apt/lists/*' -c . | "$ENGINE" import \
        --change "$PATH_ENV" --change "CMD $2" - "$1" >"$log" 2>&1 || { cat "$log"; exit 1; }
    echo "$1: imported ($("$ENGINE" image inspect --format '{{.Size}}' "$1") bytes)"
}

echo "debootstrap --variant=minbase $SUITE from $MIRROR into $root"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$log" 2>&1 \
    || { tail -20 "$log"; exit 1; }
slim
if missing "$DEBIAN_IMAGE"; then
    import_root "$DEBIAN_IMAGE" '["bash"]'
fi

if missing "$PYTHON_IMAGE"; then
    # debootstrap left the package lists: no apt-get update needed
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python3-pip ca-certificates >"$log" 2>&1 \
        || { tail -20 "$log"; exit 1; }
    rm -f "$root/etc/resolv.conf" "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
    ln -sf python3 "$root/usr/bin/python"
    ln -sf pip3 "$root/usr/bin/pip"
    if [ -r "$HOST_CA_BUNDLE" ]; then
        cp "$HOST_CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
    fi
    slim
    import_root "$PYTHON_IMAGE" '["python3"]'
fi
