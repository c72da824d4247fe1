#!/bin/bash
# build-deb.sh BINARY OUTDIR: build vrdma-backend_<version>_<arch>.deb from a built daemon with
# dpkg-deb (no network, no debhelper): the binary, the systemd unit, the sysusers entry, a man
# page generated from --help by help2man, and the examples. Prints the .deb's path last.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "$1")
out=$(realpath -m "$2")
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
name=vrdma-backend
pkg=$out/${name}_${version}_${arch}.deb

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/lib/sysusers.d" \
	"$root/usr/share/man/man1" "$root/usr/share/doc/$name/examples" "$root/etc/vrdma"
install -m 0755 -s "$bin" "$root/usr/bin/$name" 2>/dev/null || install -m 0755 "$bin" "$root/usr/bin/$name"
install -m 0644 "$top/packaging/systemd/vrdma-backend@.service" \
	"$top/packaging/systemd/vrdma-fabric.service" "$root/lib/systemd/system/"
install -m 0644 "$top/packaging/systemd/vrdma.sysusers" "$root/usr/lib/sysusers.d/vrdma.conf"
install -m 0644 "$top/packaging/systemd/vrdma.conf.example" "$top/packaging/systemd/fabric.conf.example" \
	"$top/packaging/libvirt/vrdma-guest.xml" \
	"$root/usr/share/doc/$name/examples/"
install -m 0644 "$top/packaging/README.md" "$root/usr/share/doc/$name/README.md"
cat >"$root/usr/share/doc/$name/copyright" <<COPY
vrdma-backend is dual-licensed: Apache-2.0 OR BSD-3-Clause (see the source's Cargo.toml).
On Debian systems the Apache license is in /usr/share/common-licenses/Apache-2.0 and the BSD
license in /usr/share/common-licenses/BSD.
COPY

# The man page: --help and --version by help2man, plus the `stats` subcommand and the files.
incl=$stage/man.h2m
{
	echo "[COMMANDS]"
	echo ".TP"
	echo ".B vrdma-backend stats --socket PATH"
	"$bin" stats --help | sed -n '1p'
	echo "[FILES]"
	echo ".TP"
	echo ".I /etc/vrdma/DEVICE.conf"
	echo "VRDMA_MAC, VRDMA_UPLINK and VRDMA_OPTS of vrdma-backend@DEVICE.service."
	echo ".TP"
	echo ".I /etc/vrdma/fabric.conf"
	echo "VRDMA_DEVICES, VRDMA_UPLINKS and VRDMA_OPTS of vrdma-fabric.service (one daemon, many devices)."
	echo ".TP"
	echo ".I /run/vrdma/DEVICE/DEVICE.sock, /run/vrdma/DEVICE/DEVICE.sock.stats"
	echo "The vhost-user socket for QEMU and the counters socket of the service."
	echo ".TP"
	echo ".I /run/vrdma/fabric/DEVICE.sock, /run/vrdma/fabric/fabric.stats"
	echo "vrdma-fabric.service: a device's sockets and the operator's fabric-wide counters."
	echo "[SEE ALSO]"
	echo "/usr/share/doc/vrdma-backend/README.md, systemd.exec(5), tshark(1)"
} >"$incl"
help2man --no-info --no-discard-stderr --include="$incl" \
	--name="vhost-user back end of the vrdma virtual RDMA (RoCEv2) device" \
	--version-string="$version" "$bin" >"$stage/$name.1"
sed 's/\\-/-/g' "$stage/$name.1" | grep -- '--pcap' >/dev/null
gzip -9n <"$stage/$name.1" >"$root/usr/share/man/man1/$name.1.gz"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CTRL
Package: $name
Version: $version
Architecture: $arch
Maintainer: vrdma developers <vrdma@localhost>
Section: net
Priority: optional
Installed-Size: $size
Depends: libc6, libgcc-s1
Recommends: systemd
Suggests: tshark, libvirt-clients
Description: vhost-user back end of the vrdma virtual RDMA (RoCEv2) device
 vrdma gives QEMU guests an RDMA adapter that speaks RoCEv2 on the wire; this
 daemon is its device model. One instance of vrdma-backend@.service serves one
 device (configuration in /etc/vrdma/DEVICE.conf); vrdma-fabric.service serves
 many guests' devices on one in-process switch (/etc/vrdma/fabric.conf).
CTRL
# Maintainer scripts honour DPKG_ROOT (an install into another root, e.g. the package check):
# there they only touch files, never the running system.
cat >"$root/DEBIAN/postinst" <<'POST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -z "${DPKG_ROOT:-}" ]; then
	systemd-sysusers vrdma.conf 2>/dev/null || \
		getent passwd vrdma >/dev/null || \
		adduser --system --group --no-create-home --home /nonexistent vrdma
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
	fi
fi
exit 0
POST
cat >"$root/DEBIAN/postrm" <<'POST'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
POST
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$pkg" >/dev/null
echo "$pkg"
