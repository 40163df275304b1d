#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test`: Debian packages (when root), kernel header links and
# tracefs for eBPF, a venv with the project installed, and Debian's bcc made importable from that venv.
# Each step checks whether it is already done and skips if so.
#   (no switch)        what `make test` needs: the server and every extra, the test tools (Prometheus, Chromium, ...)
#   --demo             what `make demo` needs: the server install and the live demo's tools (stress-ng, fio, nft)
#   --image-tools      also the tools `make image` builds with (debootstrap, podman, runc)
#   --container        the server image (Containerfile, SETUP=--container): the server install, no test extras;
#                      kernel headers and tracefs come from the node at run time
#   --agent-container  the node agent's image (SETUP=--agent-container): `pip install sloscope` alone, with
#                      Debian's bcc
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
MODE=${1:-host}
BUILD=(gcc libc6-dev python3-dev)  # the receiver's C fast path
DEMO_PACKAGES=("${BUILD[@]}" python3-bpfcc linux-headers-amd64 nftables stress-ng fio iproute2)
APT_PACKAGES=("${DEMO_PACKAGES[@]}" bpfcc-tools prometheus prometheus-alertmanager chromium)
EXTRAS="[server,clickhouse,test]"
FAST_PATH=yes  # whether the install is up to date only once the C fast path is built
case "$MODE" in
    host) ;;
    --demo) APT_PACKAGES=("${DEMO_PACKAGES[@]}"); EXTRAS="[server]" ;;
    --image-tools) APT_PACKAGES+=(debootstrap podman runc) ;;
    --container) APT_PACKAGES=("${BUILD[@]}" python3-venv python3-bpfcc); EXTRAS="[server]" ;;
    --agent-container) APT_PACKAGES=(python3-venv python3-bpfcc); EXTRAS=""; FAST_PATH=no ;;
    *) echo "usage: $0 [--demo | --image-tools | --container | --agent-container]" >&2; exit 2 ;;
esac

say() { printf 'setup: %s\n' "$*"; }

install_apt_packages() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && { say "Debian packages present"; return; }
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [[ "$MODE" != *container ]] || { apt-get clean; rm -rf /var/lib/apt/lists/*; }  # smaller image layers
}

link_kernel_headers() {
    # bcc compiles against /lib/modules/$(uname -r)/build; Debian's headers may be for another kernel
    # version than the one running (a VM kernel), which is fine for tracepoint programs with BTF.
    local mod="/lib/modules/$(uname -r)"
    [ -e "$mod/build/Makefile" ] && { say "kernel headers linked"; return; }
    local arch common
    arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
    [ -n "$arch" ] && [ -n "$common" ] || { say "no kernel headers under /usr/src: eBPF probes will be unavailable"; return; }
    mkdir -p "$mod"
    ln -sfn "$arch" "$mod/build"
    ln -sfn "$common" "$mod/source"
    say "linked $mod/build -> $arch"
}

mount_tracefs() {
    mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
    mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
}

fast_path_built() {
    "$VENV/bin/python" -c 'import sloscope.receiver._otlp_spans' 2>/dev/null
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating $VENV"
        "$PYTHON" -m venv "$VENV" 2>/dev/null || {
            [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            "$PYTHON" -m venv "$VENV"
        }
    fi
    local stamp="$VENV/.installed" want
    # The C extension is built at install, and an editable install maps the packages it found then: a new
    # package (or the image's first, dependencies-only layer, which has none) needs another install.
    want=$({ cat pyproject.toml setup.py receiver/otlp_spans.c receiver/arrow_c_data.h; printf '%s\n' */__init__.py; } | sha256sum | cut -d' ' -f1)
    # The stamp is the hash and the extras installed with it; an install with more extras serves one with fewer
    # (make test, then make demo, installs nothing again).
    if ! installed_for "$stamp" "$want" || { [ "$FAST_PATH" = yes ] && ! fast_path_built; }; then
        say "installing sloscope and its dependencies into $VENV"
        # setuptools and wheel in the venv too: the packaging tests build the wheel without fetching them
        "$VENV/bin/python" -m pip install -q --upgrade pip "setuptools>=68" wheel >/dev/null
        "$VENV/bin/python" -m pip install -q -e ".$EXTRAS"
        # Not up to date until the fast path is built: the next run tries again (say, once gcc is there).
        if [ "$FAST_PATH" = no ] || fast_path_built; then echo "$want $EXTRAS" > "$stamp"; else rm -f "$stamp"
            say "the trace fast path was not compiled (needs gcc, libc6-dev, python3-dev): every trace request takes the general decoder"
        fi
    else
        say "venv up to date"
    fi
}

installed_for() {  # STAMP HASH: whether the venv holds this tree's install with at least $EXTRAS
    local hash extras wanted
    { read -r hash extras < "$1"; } 2>/dev/null || return 1
    [ "$hash" = "$2" ] || return 1
    for wanted in $(tr '[],' '   ' <<< "$EXTRAS"); do
        grep -q "[[,]$wanted[],]" <<< "$extras" || return 1
    done
}

expose_bcc() {
    # Debian ships bcc for the system Python only; its package is pure Python over libbcc.so, so a link
    # into the venv's site-packages is enough (and keeps the rest of dist-packages out of the venv).
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    [ -d /usr/lib/python3/dist-packages/bcc ] || { say "bcc not installed: eBPF probes will be unavailable"; return; }
    [ -e "$site/bcc" ] || ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
}

if [ "$(id -u)" -eq 0 ] && [[ "$MODE" = *container ]]; then
    install_apt_packages
elif [ "$(id -u)" -eq 0 ]; then
    install_apt_packages
    link_kernel_headers
    mount_tracefs
else
    say "not root: skipping Debian packages, kernel header links and tracefs (eBPF probes need root)"
fi
make_venv
expose_bcc
