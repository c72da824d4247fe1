#!/bin/bash
# Guest kernel + base initramfs (the slow, rarely changing part).
#
#  $VRDMA_CACHE/kernel-$KVER/vmlinuz          bookworm-backports kernel
#  $VRDMA_CACHE/kernel-$KVER/lib/modules/...  its full module tree
#  $VRDMA_CACHE/guest-rootfs-<h>/rootfs/     trixie minbase + rdma-core (guest/mkrootfs.sh)
#  $VRDMA_CACHE/guest-base-<hash>/modules/    the guest's kernel modules (guest/modules.list)
#  $VRDMA_CACHE/guest-base-<hash>/base.cpio   both as one uncompressed cpio
#  $VRDMA_CACHE/guest-base.cpio               stable symlink to it
#
# <h> is the hash of guest/mkrootfs.sh, <hash> also covers this script,
# lib.sh, guest/modules.list and guest/copy-modules.py. The overlay
# (build-guest-overlay.sh) adds /init, the agent and our own module/provider.
export LOG_TAG="guest-base"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
lock_step guest-base

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap)"

kdir="$VRDMA_CACHE/kernel-$KVER"
key=$(hash_of "$0" "$IMAGES_DIR/lib.sh" "$IMAGES_DIR/guest/modules.list" "$IMAGES_DIR/guest/mkrootfs.sh" \
	"$IMAGES_DIR/guest/copy-modules.py")
out="$VRDMA_CACHE/guest-base-$key"

# ---- kernel -------------------------------------------------------------
if [ ! -f "$kdir/.done" ]; then
	log "fetching linux-image-$KVER (bookworm-backports)"
	rm -rf "$kdir"
	mkdir -p "$kdir/deb"
	(cd "$kdir/deb" && run_logged "$kdir/download.log" \
		apt-get download "linux-image-$KVER")
	dpkg-deb -x "$kdir"/deb/linux-image-*.deb "$kdir/x"
	mv "$kdir/x/boot/vmlinuz-$KVER" "$kdir/vmlinuz"
	mv "$kdir/x/boot/config-$KVER" "$kdir/config"
	mkdir -p "$kdir/lib/modules"
	mv "$kdir/x/lib/modules/$KVER" "$kdir/lib/modules/"
	rm -rf "$kdir/x" "$kdir/deb"
	depmod -b "$kdir" "$KVER"
	touch "$kdir/.done"
	log "kernel ready: $kdir/vmlinuz"
else
	log "cache hit: kernel $kdir"
fi
ln -sfn "$kdir/vmlinuz" "$VRDMA_CACHE/vmlinuz"

if [ -f "$out/.done" ]; then
	ln -sfn "$out/base.cpio" "$VRDMA_CACHE/guest-base.cpio"
	log "cache hit: $out/base.cpio"
	exit 0
fi
rm -rf "$out"
mkdir -p "$out"

# ---- root filesystem (cached on its own: modules change more often) -----
rkey=$(hash_of "$IMAGES_DIR/guest/mkrootfs.sh")
rdir="$VRDMA_CACHE/guest-rootfs-$rkey"
root="$rdir/rootfs"
if [ ! -f "$rdir/.done" ]; then
	rm -rf "$rdir"
	mkdir -p "$rdir"
	log "building the root filesystem (debootstrap, 1-3 min)"
	t0=$(date +%s)
	run_logged "$rdir/mkrootfs.log" "$IMAGES_DIR/guest/mkrootfs.sh" "$root"
	log "root filesystem done in $(($(date +%s) - t0)) s ($(du -sh "$root" | cut -f1))"
	(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet --reproducible) >"$rdir/rootfs.cpio"
	touch "$rdir/.done"
	for d in "$VRDMA_CACHE"/guest-rootfs-*/; do
		[ "${d%/}" = "$rdir" ] || { log "removing stale ${d%/}"; rm -rf "${d%/}"; }
	done
else
	log "cache hit: root filesystem $rdir"
fi

# ---- kernel modules -----------------------------------------------------
log "copying kernel modules (with dependencies)"
mods="$kdir/lib/modules/$KVER"
# trixie has a merged /usr (lib -> usr/lib): the archive must put the
# modules under usr/lib, never replace the lib symlink by a directory
mroot="$out/modules"
mkdir -p "$mroot/usr/lib/modules"
ln -sfn usr/lib "$mroot/lib"
python3 "$IMAGES_DIR/guest/copy-modules.py" "$mods" "$mroot/usr/lib/modules/$KVER" \
	"$IMAGES_DIR/guest/modules.list"
depmod -b "$mroot" "$KVER"

# ---- pack ---------------------------------------------------------------
log "packing base.cpio (root filesystem + modules)"
{
	cat "$rdir/rootfs.cpio"
	(cd "$mroot" && find usr | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 --reproducible)
} >"$out/base.cpio.tmp"
mv "$out/base.cpio.tmp" "$out/base.cpio"
touch "$out/.done"
ln -sfn "$out/base.cpio" "$VRDMA_CACHE/guest-base.cpio"
for d in "$VRDMA_CACHE"/guest-base-*/; do
	[ "${d%/}" = "$out" ] || { log "removing stale ${d%/}"; rm -rf "${d%/}"; }
done
log "done: $out/base.cpio ($(du -h "$out/base.cpio" | cut -f1))"
