#!/usr/bin/env bash
# `make image`: the sloscope images, built with Debian's own tools and no registry. The base is a debootstrap of
# Debian bookworm from deb.debian.org, cached as var/image/bookworm-base.tar (made once, minutes) and imported
# into podman as localhost/sloscope-base:bookworm; the Containerfile then runs scripts/setup.sh on it, once with
# --agent-container for the node agent's image, localhost/sloscope-agent:VERSION, and once with --container for
# the server's, localhost/sloscope:VERSION (VERSION from pyproject.toml). With --print-run-options it
# prints the options `podman run` needs on this kind of host, one a line, and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${SLOSCOPE_IMAGE_CACHE:-var/image}
BASE=localhost/sloscope-base:bookworm
MIRROR=http://deb.debian.org/debian
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=localhost/sloscope:$VERSION
AGENT_IMAGE=localhost/sloscope-agent:$VERSION
HOST_CA=${SLOSCOPE_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}

# runc, not Debian podman's default crun, which refuses this kind of host ("cgroups in hybrid mode not
# supported"); and limits a container may set where podman's defaults (nofile 1048576) are refused
# ("setrlimit RLIMIT_NOFILE: Operation not permitted"). tests/deploy/test_image.py runs the image with the same options.
PODMAN_RUN_OPTS=(--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

say() { printf 'image: %s\n' "$*"; }

make_base_tar() {
    [ -s "$CACHE/bookworm-base.tar" ] && { say "base cached in $CACHE/bookworm-base.tar"; return; }
    local root="$CACHE/rootfs"
    say "debootstrap of bookworm into $root (a few minutes, once)"
    rm -rf "$root" && mkdir -p "$root"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar --numeric-owner -C "$root" -cf "$CACHE/bookworm-base.tar.part" .
    mv "$CACHE/bookworm-base.tar.part" "$CACHE/bookworm-base.tar"
    rm -rf "$root"
}

import_base() {
    podman image exists "$BASE" && { say "base image $BASE present"; return; }
    podman import --change 'CMD ["/bin/bash"]' "$CACHE/bookworm-base.tar" "$BASE" >/dev/null
    say "imported $BASE"
}

build() {  # IMAGE SETUP-SWITCH TITLE
    say "building $1"
    # The build reaches deb.debian.org and PyPI with this machine's trust (a proxy may sign for them): its CA
    # bundle is lent to the build's steps, and none of it lands in the image.
    podman build "${PODMAN_RUN_OPTS[@]}" --network host --volume "$HOST_CA:/etc/ssl/build-ca.pem:ro" \
        --build-arg PIP_CERT=/etc/ssl/build-ca.pem --build-arg BASE="$BASE" --build-arg VERSION="$VERSION" \
        --build-arg SETUP="$2" --build-arg TITLE="$3" -t "$1" -f Containerfile .
    say "built $1 ($(podman image inspect --format '{{.Size}}' "$1" | numfmt --to=iec-i --suffix=B))"
}

if [ "${1:-}" = --print-run-options ]; then printf '%s\n' "${PODMAN_RUN_OPTS[@]}"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "image: debootstrap and podman's storage need root" >&2; exit 1; }
mkdir -p "$CACHE"
bash scripts/setup.sh --image-tools >/dev/null
make_base_tar
import_base
build "$AGENT_IMAGE" --agent-container sloscope-agent
build "$IMAGE" --container sloscope
