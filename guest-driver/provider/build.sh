#!/bin/sh
# Build libvrdma-rdmav34.so inside an rdma-core 56.1 tree outside the repo.
#
#   guest-driver/provider/build.sh [BUILD_DIR]   (default /var/tmp/provider-build)
#
# Needs: trixie deb-src in apt sources (images/setup-host.sh adds them),
# cmake, ninja-build, pkg-config, libnl-3-dev, libnl-route-3-dev, gcc.
# Prints the path of the built provider on the last line. Idempotent.
set -eu

PROVIDER_DIR=$(cd "$(dirname "$0")" && pwd -P)
SPEC_INCLUDE=$(cd "$PROVIDER_DIR/../../device-spec/include" && pwd -P)
BUILD_DIR=${1:-/var/tmp/provider-build}
RDMA_VER=56.1
TREE="$BUILD_DIR/rdma-core-$RDMA_VER"

mkdir -p "$BUILD_DIR"
if [ ! -f "$TREE/CMakeLists.txt" ]; then
	if [ ! -f "$BUILD_DIR/rdma-core_$RDMA_VER.orig.tar.gz" ]; then
		# The .dsc 404s on this mirror but the orig tarball arrives,
		# so judge by the tarball, not by apt-get's exit code.
		(cd "$BUILD_DIR" &&
		 apt-get source --download-only "rdma-core=$RDMA_VER-1" \
			>/dev/null 2>&1 || true)
	fi
	[ -f "$BUILD_DIR/rdma-core_$RDMA_VER.orig.tar.gz" ] || {
		echo "rdma-core_$RDMA_VER.orig.tar.gz not downloadable" >&2
		exit 1
	}
	tar -C "$BUILD_DIR" -xzf "$BUILD_DIR/rdma-core_$RDMA_VER.orig.tar.gz"
fi

ln -sfn "$PROVIDER_DIR" "$TREE/providers/vrdma"
if ! grep -q '^add_subdirectory(providers/vrdma)$' "$TREE/CMakeLists.txt"; then
	sed -i 's|^add_subdirectory(providers/vmw_pvrdma)$|&\nadd_subdirectory(providers/vrdma)|' \
		"$TREE/CMakeLists.txt"
	grep -q '^add_subdirectory(providers/vrdma)$' "$TREE/CMakeLists.txt"
fi

mkdir -p "$TREE/build"
cd "$TREE/build"
if [ ! -f build.ninja ]; then
	cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 \
		"-DVRDMA_SPEC_INCLUDE=$SPEC_INCLUDE" .. >cmake.log
fi
ninja lib/libvrdma-rdmav34.so >&2
echo "$TREE/build/lib/libvrdma-rdmav34.so"
