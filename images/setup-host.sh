#!/bin/bash
# Idempotent host setup for building the vrdma images: apt sources
# (bookworm-backports, trixie pinned low), build dependencies, meson.
# A second run changes nothing and only checks.
export LOG_TAG="setup-host"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "must run as root"

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
MIRROR=http://deb.debian.org/debian
SRC_BPO=/etc/apt/sources.list.d/vrdma-bookworm-backports.sources
SRC_TRIXIE=/etc/apt/sources.list.d/vrdma-trixie.sources
PIN_TRIXIE=/etc/apt/preferences.d/vrdma-trixie

changed=0

# write_if_different FILE CONTENT
write_if_different() {
	if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then
		printf '%s\n' "$2" >"$1"
		log "wrote $1"
		changed=1
	fi
}

log "checking apt sources"
write_if_different "$SRC_BPO" "Types: deb deb-src
URIs: $MIRROR
Suites: bookworm-backports
Components: main
Signed-By: $KEYRING"
write_if_different "$SRC_TRIXIE" "Types: deb deb-src
URIs: $MIRROR
Suites: trixie
Components: main
Signed-By: $KEYRING"
# trixie only for what we ask for explicitly (source packages, guest debs);
# never upgrade the host to it.
write_if_different "$PIN_TRIXIE" "Package: *
Pin: release n=trixie
Pin-Priority: 100"

# The stock Debian sources have no deb-src for bookworm; QEMU's source comes
# from bookworm-backports, rdma-core's from trixie, so that is enough.

lists_missing() {
	! ls /var/lib/apt/lists/*bookworm-backports*_Packages* >/dev/null 2>&1 ||
		! ls /var/lib/apt/lists/*trixie*_Sources* >/dev/null 2>&1
}
if [ "$changed" = 1 ] || lists_missing; then
	log "apt-get update"
	run_logged "$VRDMA_CACHE/apt-update.log" apt-get update
else
	log "apt lists present, no update needed"
fi

# need_pkgs PKG... : print the packages that are not installed
need_pkgs() {
	local installed p
	installed=" $(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "$@" 2>/dev/null |
		awk '$2 == "installed" { printf "%s ", $1 }')"
	for p in "$@"; do
		case "$installed" in
		*" $p "*) ;;
		*) echo "$p" ;;
		esac
	done
}

install_missing() { # [apt options --] PKG...
	local opts=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		opts+=("$1")
		shift
	done
	shift
	local missing
	missing=$(need_pkgs "$@")
	if [ -z "$missing" ]; then
		log "present: $*"
		return
	fi
	log "installing: $(echo "$missing" | tr '\n' ' ')"
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive run_logged "$VRDMA_CACHE/apt-install.log" \
		apt-get install -y --no-install-recommends "${opts[@]}" $missing
}

# QEMU build + run
install_missing -- build-essential gcc-12 ninja-build pkg-config libglib2.0-dev \
	flex bison libslirp-dev libfdt-dev zlib1g-dev python3 python3-venv python3-pip \
	seabios qemu-system-data xz-utils dpkg-dev
# guest image
install_missing -- debootstrap cpio kmod iproute2 bridge-utils
# guest kernel module build (headers pull linux-kbuild-6.12.95+deb12)
install_missing -t bookworm-backports -- "linux-headers-$KVER"
# rdma-core provider build
install_missing -- cmake libnl-3-dev libnl-route-3-dev

# meson >= 1.5 for QEMU 10 (bookworm has 1.0), and pycotap for its tests.
# Install into whichever python3 QEMU's configure will use (the first on PATH).
PY=$(command -v python3)
if ! "$PY" - <<'PYEOF' 2>/dev/null; then
import sys
from importlib.metadata import version
v = tuple(int(x) for x in version("meson").split(".")[:2])
version("pycotap")
sys.exit(0 if (1, 5) <= v < (1, 9) else 1)
PYEOF
	log "pip installing meson>=1.5,<1.9 pycotap for $PY"
	extra=()
	if "$PY" -m pip install --help 2>/dev/null | grep break-system-packages >/dev/null; then
		extra=(--break-system-packages)
	fi
	run_logged "$VRDMA_CACHE/pip.log" "$PY" -m pip install "${extra[@]}" 'meson>=1.5,<1.9' pycotap
else
	log "present: meson $("$PY" -c 'from importlib.metadata import version; print(version("meson"))') for $PY"
fi

log "host setup done"
