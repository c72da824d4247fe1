#!/bin/bash
# build-deb-dkms.sh OUTDIR: build vrdma-dkms_<version>_all.deb with dpkg-deb (no network, no
# debhelper): the guest driver's source (guest-driver/kernel) and the ABI headers it includes
# (device-spec/include, as include/, which the Kbuild file picks up) in /usr/src/vrdma-<version>/
# with a dkms.conf, so DKMS builds vrdma.ko for every installed kernel. Prints the .deb's path last.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "$1")
# The workspace version: one version for the daemon and the guest side.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$top/Cargo.toml")
[ -n "$version" ] || { echo "build-deb-dkms: no version in Cargo.toml" >&2; exit 1; }
name=vrdma-dkms
pkg=$out/${name}_${version}_all.deb

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
src=$root/usr/src/vrdma-$version
install -d "$root/DEBIAN" "$src/include" "$root/usr/share/doc/$name"
kdir=$top/guest-driver/kernel
install -m 0644 "$kdir"/*.c "$kdir"/*.h "$kdir/Kbuild" "$kdir/Makefile" "$src/"
install -m 0644 "$kdir/README.md" "$root/usr/share/doc/$name/README.md"
# Only the headers the module includes (vrdma.h); a new one must be added here and to Kbuild.
install -m 0644 "$top/device-spec/include/vrdma_abi.h" "$top/device-spec/include/vrdma_uapi.h" \
	"$src/include/"
# DKMS sources this file with $kernel_source_dir set to the target kernel's build tree and
# replaces the leading "make" with "make -jN KERNELRELEASE=<kernel>". The Makefile drives
# kbuild with KDIR; W= turns the developers' W=1 off, since a user's newer kernel may warn
# where 6.12 does not.
cat >"$src/dkms.conf" <<CONF
PACKAGE_NAME="vrdma"
PACKAGE_VERSION="$version"
BUILT_MODULE_NAME[0]="vrdma"
DEST_MODULE_LOCATION[0]="/updates/dkms"
MAKE[0]="make KDIR=\$kernel_source_dir W= modules"
CLEAN="make KDIR=\$kernel_source_dir clean"
AUTOINSTALL="yes"
CONF
cat >"$root/usr/share/doc/$name/copyright" <<COPY
The vrdma guest driver (vrdma.ko) is licensed GPL-2.0; the ABI headers state their licenses in
their SPDX lines. On Debian systems the GPL is in /usr/share/common-licenses/GPL-2.
COPY

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CTRL
Package: $name
Version: $version
Architecture: all
Maintainer: vrdma developers <vrdma@localhost>
Section: kernel
Priority: optional
Installed-Size: $size
Depends: dkms
Recommends: linux-headers-amd64 | linux-headers-generic
Suggests: libvrdma
Description: vrdma guest driver (vrdma.ko), DKMS source
 vrdma gives QEMU guests an RDMA adapter that speaks RoCEv2 on the wire. This
 package holds the source of the guest's kernel driver, built by DKMS for
 every installed kernel (Linux 6.1, 6.12 and 7.3 are built in its tests) into
 /lib/modules/<kernel>/updates/dkms/vrdma.ko.
CTRL
# Maintainer scripts honour DPKG_ROOT (an install into another root, e.g. the package check):
# there they only touch files, never the running system's DKMS tree.
cat >"$root/DEBIAN/postinst" <<POST
#!/bin/sh
set -e
if [ "\$1" = configure ] && [ -z "\${DPKG_ROOT:-}" ]; then
	# dkms' own helper: add, then build and install for the running and newest kernel
	/usr/lib/dkms/common.postinst vrdma $version "" "" "\$2"
fi
exit 0
POST
cat >"$root/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
case "\$1" in
remove|upgrade|deconfigure)
	if [ -z "\${DPKG_ROOT:-}" ] && [ -n "\$(dkms status -m vrdma -v $version 2>/dev/null)" ]; then
		dkms remove -m vrdma -v $version --all
	fi
	;;
esac
exit 0
PRERM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$pkg" >/dev/null
echo "$pkg"
