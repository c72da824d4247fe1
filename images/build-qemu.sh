#!/bin/bash
# Build QEMU 10.0.2 (Debian's bookworm-backports source) with the
# vhost-user-rdma device patches, x86_64-softmmu only.
#
# Output: $VRDMA_CACHE/qemu-<srcver>-<hash>/qemu-system-x86_64 where <hash>
# covers the patches and the configure flags, plus the stable symlink
# $VRDMA_CACHE/qemu-system-x86_64. A cache hit returns at once.
# Run with firmware from Debian: -L /usr/share/seabios -L /usr/share/qemu
export LOG_TAG="build-qemu"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
lock_step qemu

CONFIGURE_FLAGS=(
	--target-list=x86_64-softmmu --without-default-features
	--enable-kvm --enable-tcg --enable-vhost-user --enable-slirp
	--enable-fdt=system --disable-docs --disable-werror
	--disable-install-blobs
)

PATCHES=("$IMAGES_DIR"/qemu/*.patch)
[ -e "${PATCHES[0]}" ] || die "no patches in $IMAGES_DIR/qemu"

srcver=${QEMU_SRCVER#*:}
srcver=${srcver%%-*} # 10.0.2+ds
key=$( (cat "${PATCHES[@]}"; echo "${CONFIGURE_FLAGS[*]}") | sha256sum | cut -c1-12)
out="$VRDMA_CACHE/qemu-$srcver-$key"
bin="$out/qemu-system-x86_64"

if [ -x "$bin" ] && [ -f "$out/.done" ]; then
	ln -sfn "$bin" "$VRDMA_CACHE/qemu-system-x86_64"
	log "cache hit: $bin"
	exit 0
fi

command -v ninja >/dev/null || die "ninja missing: run images/setup-host.sh"

# 1. source tarball (the .dsc and debian tarball 404 on the mirror, so
#    apt-get source fails; only the orig tarball matters)
dl="$VRDMA_CACHE/src"
tarball="$dl/qemu_$srcver.orig.tar.xz"
mkdir -p "$dl"
if [ ! -s "$tarball" ]; then
	log "downloading qemu=$QEMU_SRCVER source"
	(cd "$dl" && apt-get source --download-only "qemu=$QEMU_SRCVER" \
		>"$dl/qemu-download.log" 2>&1) || true
	[ -s "$tarball" ] || {
		tail -n 20 "$dl/qemu-download.log" >&2
		die "$tarball did not arrive (deb-src for bookworm-backports? run images/setup-host.sh)"
	}
fi

# 2. unpack + patch into a fresh directory
rm -rf "$out"
mkdir -p "$out"
log "unpacking $(basename "$tarball")"
tar -xf "$tarball" -C "$out" --no-same-owner
src="$out/qemu-$QEMU_UPVER"
[ -d "$src" ] || die "unexpected tarball layout: no $src"
for p in "${PATCHES[@]}"; do
	log "applying $(basename "$p")"
	patch -d "$src" -p1 --quiet --forward <"$p" || die "patch $p does not apply"
done
# The +ds tarball has no edk2 firmware blobs: do not try to unpack them.
sed -i 's/^\( *unpack_edk2_blobs = \)bzip2.found()/\1false/' "$src/meson.build"
grep -q 'unpack_edk2_blobs = false' "$src/meson.build" || die "could not disable edk2 blobs"

# 3. configure + build
build="$out/build"
mkdir -p "$build"
log "configuring (${CONFIGURE_FLAGS[*]})"
(cd "$build" && run_logged "$out/configure.log" \
	"$src/configure" --python="$(command -v python3)" "${CONFIGURE_FLAGS[@]}")

log "building with ninja -j${JOBS:-$(nproc)} (several minutes on 2 cores)"
t0=$(date +%s)
# ninja's own [n/N] progress, thinned out to one line every 200 steps
(cd "$build" && ninja -j"${JOBS:-$(nproc)}" qemu-system-x86_64 2>&1) |
	tee "$out/build.log" |
	awk '/^\[[0-9]+\/[0-9]+\]/ { split(substr($1, 2), a, "/"); if (a[1] % 200 == 0 || a[1] == a[2]) { print "  " $1; fflush() } }
	     /error:|FAILED/ { print; fflush() }' >&2
if [ "${PIPESTATUS[0]}" != 0 ] || [ ! -x "$build/qemu-system-x86_64" ]; then
	die "build failed, see $out/build.log"
fi
log "built in $(($(date +%s) - t0)) s"

cp "$build/qemu-system-x86_64" "$bin"
"$bin" -device help 2>/dev/null | grep '"vhost-user-rdma-pci"' >/dev/null ||
	die "built QEMU lacks vhost-user-rdma-pci"
# keep the binary, drop the 1 GB of objects and sources
rm -rf "$build" "$src"
touch "$out/.done"
ln -sfn "$bin" "$VRDMA_CACHE/qemu-system-x86_64"
# remove stale builds of other patch versions
for d in "$VRDMA_CACHE"/qemu-*/; do
	[ "${d%/}" = "$out" ] || { log "removing stale ${d%/}"; rm -rf "${d%/}"; }
done
log "done: $bin"
