#!/bin/bash
# build-kmod-matrix.sh OUTDIR: build vrdma.ko (guest-driver/kernel) with W=1 against every
# Debian guest kernel we support and fail on any compiler or modpost warning:
#
#   KMOD_HOST_KVERS    kernels built with the host's gcc-12 from /usr/src/linux-headers-<kver>
#                      (default: bookworm's 6.1 and bookworm-backports' 6.12)
#   KMOD_TRIXIE_KVERS  kernels built with gcc-14 inside the trixie build root
#                      (build-trixie-buildroot.sh; default: trixie-backports' 7.3)
#
# Each kernel builds in its own copy of the sources, OUTDIR/<kver>/, laid out like the
# vrdma-dkms tree (ABI headers in include/), so OUTDIR/<kver>/vrdma.ko is that kernel's
# module. Prints one line per kernel: "kmod <kver>: ok (<gcc>, <seconds> s)".
export LOG_TAG="kmod-matrix"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
out=$(realpath -m "$1")
KMOD_HOST_KVERS=${KMOD_HOST_KVERS-6.1.0-57-amd64 $KVER}
KMOD_TRIXIE_KVERS=${KMOD_TRIXIE_KVERS-7.3.4+deb13-amd64}
src=$REPO_DIR/guest-driver/kernel
spec=$REPO_DIR/device-spec/include
buildroot=$VRDMA_CACHE/buildroot-trixie

# stage KVER: a fresh copy of the sources in $out/KVER
stage() {
	local d=$out/$1
	rm -rf "$d"
	mkdir -p "$d/include"
	cp "$src"/*.c "$src"/*.h "$src/Kbuild" "$src/Makefile" "$d/"
	cp "$spec/vrdma_abi.h" "$spec/vrdma_uapi.h" "$d/include/"
}

# check KVER LOG START HEADERS: the module exists, is for KVER, and the build printed no
# warning; says which compiler the kernel was configured with
check() {
	local kver=$1 logf=$2 start=$3 hdr=$4 cc
	if grep -E 'warning:|WARNING:|error:' "$logf" >&2; then
		die "$kver: the W=1 build warned (log: $logf)"
	fi
	[ -f "$out/$kver/vrdma.ko" ] || die "$kver: no vrdma.ko (log: $logf)"
	[ "$(modinfo -F vermagic "$out/$kver/vrdma.ko" | cut -d' ' -f1)" = "$kver" ] ||
		die "$kver: vrdma.ko has the wrong vermagic"
	cc=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' "$hdr/.config")
	echo "kmod $kver: ok, W=1 clean (${cc:-unknown compiler}, $(($(date +%s) - start)) s)"
}

for kver in $KMOD_HOST_KVERS; do
	hdr=/usr/src/linux-headers-$kver
	[ -d "$hdr" ] || die "no $hdr: run make host-deps"
	start=$(date +%s)
	stage "$kver"
	logf=$out/$kver.log
	if ! make -C "$hdr" M="$out/$kver" W=1 -j"$(nproc)" modules >"$logf" 2>&1; then
		tail -n 40 "$logf" >&2
		die "$kver: build failed (log: $logf)"
	fi
	check "$kver" "$logf" "$start" "$hdr"
done

if [ -n "$KMOD_TRIXIE_KVERS" ]; then
	"$IMAGES_DIR/build-trixie-buildroot.sh"
	root=$(realpath "$buildroot")
	for kver in $KMOD_TRIXIE_KVERS; do
		[ -d "$root/usr/src/linux-headers-$kver" ] ||
			die "no linux-headers-$kver in the trixie build root $root"
		start=$(date +%s)
		stage "$kver"
		logf=$out/$kver.log
		# A private mount namespace: /proc (objtool reads it) and the sources appear
		# in the root for this command only and vanish with it.
		# (the inner shell expands its own arguments)
		# shellcheck disable=SC2016
		if ! unshare -m --propagation private sh -c '
			mount -t proc proc "$1/proc" && mount --bind "$2" "$1/mnt" &&
			chroot "$1" make -C "/usr/src/linux-headers-$3" M=/mnt W=1 -j"$4" modules' \
			_ "$root" "$out/$kver" "$kver" "$(nproc)" >"$logf" 2>&1; then
			tail -n 40 "$logf" >&2
			die "$kver: build in $root failed (log: $logf)"
		fi
		check "$kver" "$logf" "$start" "$root/usr/src/linux-headers-$kver"
	done
fi
