#!/bin/bash
# build-guest-image.sh NAME...: the other guest images of images/guest_images.py (bookworm,
# trixie-7.3), beside the default one that build-guest-base.sh and build-guest-overlay.sh make.
#
#  $VRDMA_CACHE/kernel-<kver>/vmlinuz, lib/modules/   the guest's Debian kernel (bookworm's
#                    6.1 from the host's sources; trixie-backports' 7.3 through the trixie
#                    build root, build-trixie-buildroot.sh, whose apt has that suite)
#  $VRDMA_CACHE/guests/<name>/rootfs-<h>/rootfs.cpio  its own root filesystem
#                    (guest/<script>, <h> its hash); the trixie guests share the default
#                    image's ($VRDMA_CACHE/guest-rootfs-<h>, made by build-guest-base.sh)
#  $VRDMA_CACHE/guests/<name>/base-<hash>/base.cpio   root filesystem + guest/modules.list
#  $CHECKOUT_DIR/guest-<name>/kmod-<hash>/vrdma.ko    this checkout's module for that kernel
#                    (build-kmod-matrix.sh: gcc-12 on the host or gcc-14 in the build root)
#  $CHECKOUT_DIR/guest-<name>/initrd.cpio             base + the default overlay (init,
#                    agent, libvrdma: one provider binary serves rdma-core 44 and 56, see
#                    guest-driver/provider/README.md) + this kernel's vrdma.ko and module index
#
# Every step is cached like the default image's; a second run takes seconds.
export LOG_TAG="guest-image"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ $# -ge 1 ] || die "usage: $0 NAME... (names: python3 images/guest_images.py --list)"
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"

# build_kernel KVER FROM: $VRDMA_CACHE/kernel-KVER from Debian's linux-image-KVER
build_kernel() {
	local kver=$1 from=$2 kdir="$VRDMA_CACHE/kernel-$1"
	(
		lock_step "kernel-$kver"
		if [ -f "$kdir/.done" ]; then
			log "cache hit: kernel $kdir"
			exit 0
		fi
		rm -rf "$kdir"
		mkdir -p "$kdir/deb"
		log "fetching linux-image-$kver ($from)"
		case "$from" in
		host)
			(cd "$kdir/deb" && run_logged "$kdir/download.log" apt-get download "linux-image-$kver")
			;;
		buildroot)
			"$IMAGES_DIR/build-trixie-buildroot.sh"
			local root
			root=$(realpath "$VRDMA_CACHE/buildroot-trixie")
			# Linux 7.x's linux-image-* is a meta package: the kernel is in linux-binary-*,
			# its modules in linux-modules-*, modules.builtin and config in linux-base-*
			run_logged "$kdir/download.log" chroot "$root" sh -c \
				"cd /tmp && apt-get download -q -t trixie-backports linux-binary-$kver linux-modules-$kver linux-base-$kver"
			mv "$root"/tmp/linux-*-"$kver"_*.deb "$kdir/deb/"
			;;
		*) die "unknown kernel source $from" ;;
		esac
		for deb in "$kdir"/deb/*.deb; do dpkg-deb -x "$deb" "$kdir/x"; done
		# bookworm's kernel is in /boot and its modules in /lib/modules; 7.3's kernel is
		# /usr/lib/modules/<kver>/vmlinuz
		local m
		m=$(find "$kdir/x" -maxdepth 4 -type d -path "*lib/modules/$kver")
		[ -n "$m" ] || die "linux-image-$kver has no modules directory"
		if [ -f "$kdir/x/boot/vmlinuz-$kver" ]; then
			mv "$kdir/x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
		else
			mv "$m/vmlinuz" "$kdir/vmlinuz"
		fi
		mkdir -p "$kdir/lib/modules"
		mv "$m" "$kdir/lib/modules/"
		rm -rf "$kdir/x" "$kdir/deb"
		depmod -b "$kdir" "$kver"
		touch "$kdir/.done"
		log "kernel ready: $kdir/vmlinuz"
	)
}

# rootfs_cpio SCRIPT NAME: prints the path of the root filesystem archive SCRIPT makes
rootfs_cpio() {
	local script=$1 name=$2 rkey rdir
	rkey=$(hash_of "$IMAGES_DIR/guest/$script")
	if [ "$script" = mkrootfs.sh ]; then
		# the default image's, built (and kept current) by build-guest-base.sh
		rdir="$VRDMA_CACHE/guest-rootfs-$rkey"
		[ -f "$rdir/.done" ] || run_logged "$VRDMA_CACHE/guests/$name/guest-base.log" \
			"$IMAGES_DIR/build-guest-base.sh"
		echo "$rdir/rootfs.cpio"
		return
	fi
	rdir="$VRDMA_CACHE/guests/$name/rootfs-$rkey"
	(
		lock_step "guest-rootfs-$name"
		[ -f "$rdir/.done" ] && exit 0
		rm -rf "$rdir"
		mkdir -p "$rdir"
		log "building the $name root filesystem (debootstrap, 2-4 min)"
		local t0
		t0=$(date +%s)
		run_logged "$rdir/mkrootfs.log" "$IMAGES_DIR/guest/$script" "$rdir/rootfs"
		(cd "$rdir/rootfs" && find . -mindepth 1 | LC_ALL=C sort |
			cpio -o -H newc --quiet --reproducible) >"$rdir/rootfs.cpio"
		rm -rf "$rdir/rootfs"
		touch "$rdir/.done"
		log "$name root filesystem done in $(($(date +%s) - t0)) s ($(du -h "$rdir/rootfs.cpio" | cut -f1))"
		for d in "$VRDMA_CACHE/guests/$name"/rootfs-*/; do
			[ "${d%/}" = "$rdir" ] || rm -rf "${d%/}"
		done
	) >&2
	echo "$rdir/rootfs.cpio"
}

# build_base NAME KVER ROOTFS_CPIO: prints the path of base.cpio (root filesystem + modules)
build_base() {
	local name=$1 kver=$2 rootfs=$3 key out mroot
	key=$(printf '%s %s\n' "$kver" "$rootfs" | cat - "$0" "$IMAGES_DIR/lib.sh" \
		"$IMAGES_DIR/guest/modules.list" "$IMAGES_DIR/guest/modules-virtio.list" \
		"$IMAGES_DIR/guest/copy-modules.py" | sha256sum | cut -c1-12)
	out="$VRDMA_CACHE/guests/$name/base-$key"
	(
		lock_step "guest-base-$name"
		[ -f "$out/.done" ] && exit 0
		rm -rf "$out"
		mroot="$out/modules"
		mkdir -p "$mroot/usr/lib/modules"
		ln -sfn usr/lib "$mroot/lib"
		log "copying kernel $kver's modules (with dependencies)"
		python3 "$IMAGES_DIR/guest/copy-modules.py" --skip-unmatched \
			"$VRDMA_CACHE/kernel-$kver/lib/modules/$kver" "$mroot/usr/lib/modules/$kver" \
			"$IMAGES_DIR/guest/modules.list" "$IMAGES_DIR/guest/modules-virtio.list" >&2
		depmod -b "$mroot" "$kver"
		{
			cat "$rootfs"
			(cd "$mroot" && find usr | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 --reproducible)
		} >"$out/base.cpio.tmp"
		mv "$out/base.cpio.tmp" "$out/base.cpio"
		touch "$out/.done"
		for d in "$VRDMA_CACHE/guests/$name"/base-*/; do
			[ "${d%/}" = "$out" ] || rm -rf "${d%/}"
		done
		log "$name base: $out/base.cpio ($(du -h "$out/base.cpio" | cut -f1))"
	) >&2
	echo "$out/base.cpio"
}

# build_kmod NAME KVER HOW: prints the path of this checkout's vrdma.ko for KVER
build_kmod() {
	local name=$1 kver=$2 how=$3 h kb
	h=$(echo "$kver $(hash_tree "$REPO_DIR/guest-driver/kernel") $(hash_tree "$REPO_DIR/device-spec/include")" |
		sha256sum | cut -c1-12)
	kb="$CHECKOUT_DIR/guest-$name/kmod-$h"
	if [ ! -f "$kb/.done" ]; then
		rm -rf "$kb"
		mkdir -p "$kb"
		log "building vrdma.ko for $kver ($how)"
		if [ "$how" = host ]; then
			KMOD_HOST_KVERS=$kver KMOD_TRIXIE_KVERS='' "$IMAGES_DIR/build-kmod-matrix.sh" "$kb" >&2
		else
			KMOD_HOST_KVERS='' KMOD_TRIXIE_KVERS=$kver "$IMAGES_DIR/build-kmod-matrix.sh" "$kb" >&2
		fi
		touch "$kb/.done"
		for d in "$CHECKOUT_DIR/guest-$name"/kmod-*/; do
			[ "${d%/}" = "$kb" ] || rm -rf "${d%/}"
		done
	else
		log "cache hit: vrdma.ko $kb/$kver/vrdma.ko"
	fi
	echo "$kb/$kver/vrdma.ko"
}

# build_initrd NAME KVER BASE KO: base + the default overlay + KVER's vrdma.ko and index
build_initrd() {
	local name=$1 kver=$2 base=$3 ko=$4 dir="$CHECKOUT_DIR/guest-$1" stage mtree
	local overlay="$CHECKOUT_DIR/guest-overlay.cpio"
	# the default overlay, current with this checkout's init, agent and provider
	run_logged "$dir/guest-overlay.log" "$IMAGES_DIR/build-guest-overlay.sh"
	stage=$(mktemp -d "$dir/stage.XXXXXX")
	mtree=$(mktemp -d "$dir/mtree.XXXXXX")
	install -D -m 644 "$ko" "$stage/usr/lib/modules/$kver/extra/vrdma.ko"
	strip --strip-debug "$stage/usr/lib/modules/$kver/extra/vrdma.ko"
	mkdir -p "$mtree/lib/modules"
	cp -a "$(dirname "$base")/modules/usr/lib/modules/$kver" "$mtree/lib/modules/"
	cp -a "$stage/usr/lib/modules/$kver/extra" "$mtree/lib/modules/$kver/"
	depmod -b "$mtree" "$kver"
	cp "$mtree/lib/modules/$kver"/modules.* "$stage/usr/lib/modules/$kver/"
	find "$stage" -mindepth 1 -exec touch -h -d @0 {} +
	{
		cat "$base" "$overlay"
		(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 --reproducible)
	} >"$dir/initrd.cpio.tmp"
	mv "$dir/initrd.cpio.tmp" "$dir/initrd.cpio"
	rm -rf "$stage" "$mtree"
	log "done: $dir/initrd.cpio ($(du -h "$dir/initrd.cpio" | cut -f1)) with $(basename "$ko") for $kver"
}

for name in "$@"; do
	t0=$(date +%s)
	# GUEST_* from the catalogue; an unknown name fails here
	vars=$(python3 "$IMAGES_DIR/guest_images.py" --shell "$name") || die "no guest image $name"
	eval "$vars"
	if [ "$GUEST_NAME" = trixie ]; then
		log "trixie is the default image: build-guest-base.sh + build-guest-overlay.sh"
		"$IMAGES_DIR/build-guest-base.sh"
		"$IMAGES_DIR/build-guest-overlay.sh"
		continue
	fi
	mkdir -p "$VRDMA_CACHE/guests/$name" "$CHECKOUT_DIR/guest-$name"
	lock_step "guest-image-$(basename "$CHECKOUT_DIR")-$name"
	build_kernel "$GUEST_KVER" "$GUEST_KERNEL_FROM"
	rootfs=$(rootfs_cpio "$GUEST_ROOTFS_SCRIPT" "$name")
	base=$(build_base "$name" "$GUEST_KVER" "$rootfs")
	ko=$(build_kmod "$name" "$GUEST_KVER" "$GUEST_KMOD")
	build_initrd "$name" "$GUEST_KVER" "$base" "$ko"
	[ "$GUEST_INITRD" = "$CHECKOUT_DIR/guest-$name/initrd.cpio" ] ||
		die "guest_images.py and this script disagree on the initrd path ($GUEST_INITRD)"
	log "$name ready in $(($(date +%s) - t0)) s: $GUEST_KERNEL $GUEST_INITRD"
done
