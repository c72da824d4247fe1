#!/bin/bash
# The overlay initramfs: our own pieces on top of the base image, rebuilt
# in seconds. Concatenated after base.cpio it forms the guest initrd.
#
#   /init                                    images/guest/init
#   /usr/local/sbin/vrdma-agent              images/guest/vrdma-agent
#   /usr/lib/modules/$KVER/extra/*.ko        built from guest-driver/kernel
#   /usr/lib/modules/$KVER/modules.*         depmod of base + extra
#   /usr/lib/x86_64-linux-gnu/libibverbs/libvrdma-rdmav34.so
#   /etc/libibverbs.d/vrdma.driver           "driver vrdma"
#
# Outputs, per checkout (CHECKOUT_DIR = $VRDMA_CACHE/checkout-<hash of the
# checkout's path>): guest-overlay.cpio and guest-initrd.cpio (base + overlay,
# what QEMU's -initrd gets), kmod-<hash>/ and provider-build/. The symlink
# $VRDMA_CACHE/guest-initrd.cpio points to the last one built.
#
# Sources (override for experiments, default the repo's):
#   VRDMA_KMOD_SRC      kernel module dir with a Kbuild (guest-driver/kernel)
#   VRDMA_PROVIDER_SRC  provider dir with a CMakeLists.txt (guest-driver/provider)
#   VRDMA_NO_DRIVER=1   build the overlay without module and provider (rxe
#                       guests only); otherwise their absence is an error.
export LOG_TAG="guest-overlay"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

KMOD_SRC=${VRDMA_KMOD_SRC:-$REPO_DIR/guest-driver/kernel}
PROV_SRC=${VRDMA_PROVIDER_SRC:-$REPO_DIR/guest-driver/provider}
KHEADERS=/usr/src/linux-headers-$KVER
LIBDIR=usr/lib/x86_64-linux-gnu

base=$(readlink -f "$VRDMA_CACHE/guest-base.cpio" 2>/dev/null) || true
[ -f "$base" ] || die "no base image: run images/build-guest-base.sh first"
baseroot="$(dirname "$base")/modules/usr"
[ -d "$baseroot/lib/modules/$KVER" ] || die "base rootfs $baseroot is missing"

with_driver=1
if [ "${VRDMA_NO_DRIVER:-0}" = 1 ]; then
	with_driver=0
	log "WARNING: VRDMA_NO_DRIVER=1: overlay WITHOUT vrdma.ko and libvrdma (rxe guests only)"
else
	missing=()
	[ -f "$KMOD_SRC/Kbuild" ] || [ -f "$KMOD_SRC/Makefile" ] ||
		missing+=("kernel module: $KMOD_SRC/Kbuild")
	[ -f "$PROV_SRC/CMakeLists.txt" ] ||
		missing+=("rdma-core provider: $PROV_SRC/CMakeLists.txt")
	if [ ${#missing[@]} -gt 0 ]; then
		for m in "${missing[@]}"; do log "MISSING $m"; done
		die "cannot build the guest overlay: ${missing[*]} (VRDMA_NO_DRIVER=1 builds one for rxe guests only)"
	fi
fi

lock_step "overlay-$(basename "$CHECKOUT_DIR")"
mkdir -p "$CHECKOUT_DIR"
stage=$(mktemp -d "$CHECKOUT_DIR/overlay-stage.XXXXXX")
trap 'rm -rf "$stage" "${mtree:-}"' EXIT

install -D -m 755 "$IMAGES_DIR/guest/init" "$stage/init"
install -D -m 755 "$IMAGES_DIR/guest/vrdma-agent" "$stage/usr/local/sbin/vrdma-agent"

# ---- kernel module --------------------------------------------------------
build_kmod() {
	[ -d "$KHEADERS" ] || die "$KHEADERS missing: run images/setup-host.sh"
	local h kb
	# the module includes the spec headers: they are part of the key
	h=$(hash_tree "$KMOD_SRC")
	if [ -d "$REPO_DIR/device-spec/include" ] && [ -z "${VRDMA_KMOD_SRC:-}" ]; then
		h=$(echo "$h $(hash_tree "$REPO_DIR/device-spec/include")" | sha256sum | cut -c1-12)
	fi
	kb="$CHECKOUT_DIR/kmod-$h"
	if [ ! -f "$kb/.done" ]; then
		log "building kernel module from $KMOD_SRC (copy in $kb)"
		rm -rf "$kb"
		mkdir -p "$kb"
		# the module may include the spec headers: keep the repo layout
		cp -a "$KMOD_SRC" "$kb/kernel"
		if [ -d "$REPO_DIR/device-spec" ] && [ -z "${VRDMA_KMOD_SRC:-}" ]; then
			mkdir -p "$kb/guest-driver"
			mv "$kb/kernel" "$kb/guest-driver/kernel"
			cp -a "$REPO_DIR/device-spec" "$kb/device-spec"
			ln -s guest-driver/kernel "$kb/kernel"
		fi
		run_logged "$kb/build.log" make -C "$KHEADERS" M="$(readlink -f "$kb/kernel")" W=1 modules
		if grep -q 'warning:' "$kb/build.log"; then
			grep 'warning:' "$kb/build.log" | head -20 >&2
			log "WARNING: the kernel module builds with warnings"
		fi
		touch "$kb/.done"
		for d in "$CHECKOUT_DIR"/kmod-*/; do
			[ "${d%/}" = "$kb" ] || rm -rf "${d%/}"
		done
	else
		log "cache hit: kernel module $kb"
	fi
	local kos
	mapfile -t kos < <(find -L "$kb/kernel" -name '*.ko')
	[ ${#kos[@]} -gt 0 ] || die "the module build produced no .ko"
	mkdir -p "$stage/usr/lib/modules/$KVER/extra"
	cp "${kos[@]}" "$stage/usr/lib/modules/$KVER/extra/"
	# debug info stays in the cache copy ($kb); the guest gets a small module
	strip --strip-debug "$stage/usr/lib/modules/$KVER/extra/"*.ko
	log "modules: $(cd "$stage/usr/lib/modules/$KVER/extra" && echo *.ko)"
}

# ---- rdma-core provider ---------------------------------------------------
# The provider engineer's build.sh (prints the .so path last) when present,
# else a plain build inside rdma-core 56.1 from trixie's source.
build_provider() {
	local so
	if [ -x "$PROV_SRC/build.sh" ]; then
		log "building provider with $PROV_SRC/build.sh"
		so=$("$PROV_SRC/build.sh" "$CHECKOUT_DIR/provider-build" 2>"$CHECKOUT_DIR/provider-build.log" | tail -n 1) || {
			tail -n 30 "$CHECKOUT_DIR/provider-build.log" >&2
			die "provider build failed"
		}
	else
		local dl="$VRDMA_CACHE/src" tarball tree
		tarball="$dl/rdma-core_$RDMA_CORE_UPVER.orig.tar.gz"
		mkdir -p "$dl"
		if [ ! -s "$tarball" ]; then
			log "downloading rdma-core=$RDMA_CORE_VER source (trixie)"
			(cd "$dl" && apt-get source --download-only "rdma-core=$RDMA_CORE_VER" \
				>"$dl/rdma-core-download.log" 2>&1) || true
			[ -s "$tarball" ] || die "$tarball did not arrive (trixie deb-src? run images/setup-host.sh)"
		fi
		tree="$CHECKOUT_DIR/rdma-core-$RDMA_CORE_UPVER"
		if [ ! -f "$tree/CMakeLists.txt" ]; then
			tar -xzf "$tarball" -C "$CHECKOUT_DIR" --no-same-owner
		fi
		ln -sfn "$PROV_SRC" "$tree/providers/vrdma"
		grep -q '^add_subdirectory(providers/vrdma)$' "$tree/CMakeLists.txt" ||
			sed -i 's|^add_subdirectory(providers/rxe)$|&\nadd_subdirectory(providers/vrdma)|' "$tree/CMakeLists.txt"
		grep -q '^add_subdirectory(providers/vrdma)$' "$tree/CMakeLists.txt" ||
			die "could not add providers/vrdma to $tree/CMakeLists.txt"
		mkdir -p "$tree/build"
		if [ ! -f "$tree/build/build.ninja" ]; then
			log "cmake rdma-core $RDMA_CORE_UPVER"
			(cd "$tree/build" && run_logged "$tree/build/cmake.log" \
				cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 ..)
		fi
		log "building lib/libvrdma-rdmav34.so"
		(cd "$tree/build" && run_logged "$tree/build/ninja.log" ninja lib/libvrdma-rdmav34.so)
		so="$tree/build/lib/libvrdma-rdmav34.so"
	fi
	[ -f "$so" ] || die "provider build gave no library ($so)"
	install -D -m 644 "$(readlink -f "$so")" "$stage/$LIBDIR/libibverbs/libvrdma-rdmav34.so"
	mkdir -p "$stage/etc/libibverbs.d"
	echo "driver vrdma" >"$stage/etc/libibverbs.d/vrdma.driver"
	log "provider: $so"
}

if [ "$with_driver" = 1 ]; then
	build_kmod
	build_provider
fi

# ---- module index: depmod over base + extra ------------------------------
mtree=$(mktemp -d "$CHECKOUT_DIR/overlay-mtree.XXXXXX")
mkdir -p "$mtree/lib/modules"
cp -al "$baseroot/lib/modules/$KVER" "$mtree/lib/modules/$KVER" 2>/dev/null ||
	cp -a "$baseroot/lib/modules/$KVER" "$mtree/lib/modules/$KVER"
if [ -d "$stage/usr/lib/modules/$KVER/extra" ]; then
	cp -a "$stage/usr/lib/modules/$KVER/extra" "$mtree/lib/modules/$KVER/"
fi
depmod -b "$mtree" "$KVER"
mkdir -p "$stage/usr/lib/modules/$KVER"
cp "$mtree/lib/modules/$KVER"/modules.* "$stage/usr/lib/modules/$KVER/"
rm -rf "$mtree"

# ---- pack -----------------------------------------------------------------
# fixed timestamps: the same inputs give the same archive
find "$stage" -mindepth 1 -exec touch -h -d @0 {} +
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 --reproducible) \
	>"$CHECKOUT_DIR/guest-overlay.cpio.tmp"
initrd="$CHECKOUT_DIR/guest-initrd.cpio"
stamp="$base $(sha256sum <"$CHECKOUT_DIR/guest-overlay.cpio.tmp" | cut -c1-16)"
if [ -f "$initrd" ] && [ "$(cat "$initrd.src" 2>/dev/null)" = "$stamp" ]; then
	rm -f "$CHECKOUT_DIR/guest-overlay.cpio.tmp"
	ln -sfn "$initrd" "$VRDMA_CACHE/guest-initrd.cpio"
	log "unchanged: $initrd"
	exit 0
fi
mv "$CHECKOUT_DIR/guest-overlay.cpio.tmp" "$CHECKOUT_DIR/guest-overlay.cpio"
# QEMU takes one -initrd: concatenated cpio archives are one initramfs
cat "$base" "$CHECKOUT_DIR/guest-overlay.cpio" >"$initrd.tmp"
mv "$initrd.tmp" "$initrd"
echo "$stamp" >"$initrd.src"
ln -sfn "$initrd" "$VRDMA_CACHE/guest-initrd.cpio"
log "done: $initrd ($(du -h "$initrd" | cut -f1))"
