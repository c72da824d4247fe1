#!/bin/bash
# build-deb-libvrdma.sh PROVIDER_SO OUTDIR: build libvrdma_<version>_<arch>.deb with dpkg-deb
# from the provider guest-driver/provider/build.sh built (the last line it prints): the
# rdma-core provider module where Debian's libibverbs1 (rdma-core 56.1) loads providers from,
# /usr/lib/<multiarch>/libibverbs/libvrdma-rdmav34.so, and its /etc/libibverbs.d/vrdma.driver.
# Prints the .deb's path last.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
so=$(realpath "$1")
out=$(realpath -m "$2")
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$top/Cargo.toml")
[ -n "$version" ] || { echo "build-deb-libvrdma: no version in Cargo.toml" >&2; exit 1; }
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
name=libvrdma
pkg=$out/${name}_${version}_${arch}.deb

# The provider in the build tree carries a RUNPATH into that tree. rdma-core's own install
# rule for it (cmake_install.cmake of providers/vrdma) drops the RUNPATH and writes the
# .driver file, so install through it into the stage, then move both to Debian's paths
# (the tree is configured for /usr/local).
build=${so%/lib/*}
inst=$build/providers/vrdma/cmake_install.cmake
[ -f "$inst" ] || { echo "build-deb-libvrdma: $inst missing (not an rdma-core build?)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR=$stage/cmake cmake -P "$inst" >/dev/null
built_so=$(find "$stage/cmake" -name libvrdma-rdmav34.so)
built_driver=$(find "$stage/cmake" -name vrdma.driver)
if [ ! -f "$built_so" ] || [ ! -f "$built_driver" ]; then
	echo "build-deb-libvrdma: rdma-core's install rule gave no provider/driver file" >&2
	exit 1
fi

root=$stage/root
libdir=$root/usr/lib/$multiarch/libibverbs
install -d "$root/DEBIAN" "$libdir" "$root/etc/libibverbs.d" "$root/usr/share/doc/$name"
install -m 0644 "$built_so" "$libdir/"
# debug info off, the symbol table kept (check-symbols.sh looks for verbs_provider_vrdma)
strip --strip-debug "$libdir/libvrdma-rdmav34.so"
install -m 0644 "$built_driver" "$root/etc/libibverbs.d/vrdma.driver"
install -m 0644 "$top/guest-driver/provider/README.md" "$root/usr/share/doc/$name/README.md"
cat >"$root/usr/share/doc/$name/copyright" <<COPY
libvrdma, the vrdma provider for rdma-core, is licensed GPL-2.0 OR BSD-2-Clause (each file's
SPDX line). On Debian systems the GPL is in /usr/share/common-licenses/GPL-2 and the BSD
license in /usr/share/common-licenses/BSD.
COPY
echo /etc/libibverbs.d/vrdma.driver >"$root/DEBIAN/conffiles"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
# libibverbs1 >= 56 provides IBVERBS_PRIVATE_34, the private ABI the provider binds; glibc
# 2.34 is the newest symbol version it needs (readelf -V).
cat >"$root/DEBIAN/control" <<CTRL
Package: $name
Version: $version
Architecture: $arch
Multi-Arch: same
Maintainer: vrdma developers <vrdma@localhost>
Section: libs
Priority: optional
Installed-Size: $size
Depends: libibverbs1 (>= 44), libc6 (>= 2.34)
Recommends: vrdma-dkms, ibverbs-utils
Description: vrdma provider for rdma-core (user-space verbs)
 vrdma gives QEMU guests an RDMA adapter that speaks RoCEv2 on the wire. This
 package is its libibverbs provider: with it, verbs applications in the guest
 post and poll on the device's rings without system calls. It needs the
 vrdma.ko guest driver (vrdma-dkms).
CTRL
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$pkg" >/dev/null
echo "$pkg"
