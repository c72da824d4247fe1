#!/bin/bash
# Everything the VM tests need, from a fresh Debian 12 machine:
#   1. host setup (apt sources, build deps)      images/setup-host.sh
#   2. QEMU with vhost-user-rdma                 images/build-qemu.sh
#   3. guest kernel + base initramfs             images/build-guest-base.sh
#   4. overlay: init, agent, vrdma.ko, libvrdma  images/build-guest-overlay.sh
# Every step is cached in $VRDMA_CACHE (default /var/cache/vrdma): a second
# run takes seconds. Extra arguments are ignored; VRDMA_NO_DRIVER=1 builds
# an overlay without the vrdma module/provider (rxe guests only).
export LOG_TAG="build-all"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

t_all=$(date +%s)
step() {
	local t0
	t0=$(date +%s)
	log "== $1"
	"$IMAGES_DIR/$1"
	log "== $1: $(($(date +%s) - t0)) s"
}
step setup-host.sh
step build-qemu.sh
step build-guest-base.sh
step build-guest-overlay.sh
log "all images ready in $(($(date +%s) - t_all)) s:"
for f in qemu-system-x86_64 vmlinuz; do
	log "  $VRDMA_CACHE/$f -> $(readlink -f "$VRDMA_CACHE/$f")"
done
log "  $CHECKOUT_DIR/guest-initrd.cpio (this checkout's; $VRDMA_CACHE/guest-initrd.cpio links to the last one built)"
