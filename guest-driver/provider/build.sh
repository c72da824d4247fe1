#!/bin/sh
# Build libvrdma-rdmav34.so inside an rdma-core 56.1 tree outside the repo.
#
#   guest-driver/provider/build.sh [BUILD_DIR]
#
# BUILD_DIR defaults to /var/tmp/vrdma-provider/<hash of this checkout's
# path>, so checkouts (worktrees, CI clones) never share a tree; the
# downloaded tarball is shared in /var/tmp/vrdma-provider.
# Needs trixie deb-src in the apt sources (images/setup-host.sh adds them),
# cmake, ninja-build, pkg-config, libnl-3-dev, libnl-route-3-dev and gcc.
# The last line printed is the path of the built provider. Idempotent.
set -eu

PROVIDER_DIR=$(cd "$(dirname "$0")" && pwd -P)
SPEC_INCLUDE=$(cd "$PROVIDER_DIR/../../device-spec/include" && pwd -P)
CACHE=/var/tmp/vrdma-provider
RDMA_VER=56.1
TARBALL="rdma-core_$RDMA_VER.orig.tar.gz"
BUILD_DIR=${1:-$CACHE/$(printf %s "$PROVIDER_DIR" | md5sum | cut -c1-12)}
TREE="$BUILD_DIR/rdma-core-$RDMA_VER"

mkdir -p "$CACHE" "$BUILD_DIR"
if [ ! -f "$TREE/CMakeLists.txt" ]; then
	if [ ! -f "$CACHE/$TARBALL" ]; then
		# The .dsc 404s on this mirror but the orig tarball arrives,
		# so judge by the tarball, not by apt-get's exit code.
		(cd "$CACHE" &&
		 apt-get source --download-only "rdma-core=$RDMA_VER-1" \
			>/dev/null 2>&1 || true)
	fi
	[ -f "$CACHE/$TARBALL" ] || {
		echo "build.sh: $TARBALL not downloadable (trixie deb-src?)" >&2
		exit 1
	}
	tar -C "$BUILD_DIR" -xzf "$CACHE/$TARBALL"
fi

ln -sfn "$PROVIDER_DIR" "$TREE/providers/vrdma"
if ! grep -q '^add_subdirectory(providers/vrdma)$' "$TREE/CMakeLists.txt"; then
	sed -i 's|^add_subdirectory(providers/vmw_pvrdma)$|&\nadd_subdirectory(providers/vrdma)|' \
		"$TREE/CMakeLists.txt"
	grep -q '^add_subdirectory(providers/vrdma)$' "$TREE/CMakeLists.txt"
fi

mkdir -p "$TREE/build"
cd "$TREE/build"
if [ ! -f build.ninja ] ||
   ! grep -qx "VRDMA_SPEC_INCLUDE:PATH=$SPEC_INCLUDE" CMakeCache.txt; then
	cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 \
		"-DVRDMA_SPEC_INCLUDE=$SPEC_INCLUDE" .. >cmake.log
fi
# rdma-core's flags, and no warning is accepted
out=$(ninja lib/libvrdma-rdmav34.so 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" >&2
if printf '%s\n' "$out" | grep -q 'warning:'; then
	echo "build.sh: the provider must build without warnings" >&2
	exit 1
fi
echo "$TREE/build/lib/libvrdma-rdmav34.so"
