#!/bin/bash
# check-deb.sh BACKEND_DEB DKMS_DEB LIBVRDMA_DEB: install the three packages with dpkg into one
# scratch root (maintainer scripts run with DPKG_ROOT set, so they leave this system alone) and
# check the files land where systemd, DKMS and rdma-core expect them: the daemon and its man
# page; vrdma-dkms' tree, its dkms.conf, and vrdma.ko built from it by DKMS itself (into a
# scratch DKMS tree) against the 6.1, 6.12 and 7.3 headers (7.3 in the trixie build root); libvrdma's provider and .driver file where
# trixie's libibverbs 56.1 looks, binding IBVERBS_PRIVATE_34. Then dpkg purges all three.
set -euo pipefail

# A package builder that failed prints no path: say which packages arrived.
[ $# -eq 3 ] || { echo "check-deb: expected 3 .deb files, got $#: $*" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
deb=$(realpath "$1")
dkms_deb=$(realpath "$2")
lib_deb=$(realpath "$3")
# The kernels DKMS builds for: by the host's compiler, and in the trixie build root.
KVERS=${KVERS-${KMOD_HOST_KVERS-6.1.0-57-amd64 6.12.95+deb12-amd64}}
KVERS_TRIXIE=${KVERS_TRIXIE-${KMOD_TRIXIE_KVERS-7.3.4+deb13-amd64}}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
root=$scratch/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
dpk() { dpkg --root="$root" --log=/dev/null --force-script-chrootless --force-depends "$@"; }
fail() { echo "check-deb: $*" >&2; exit 1; }
# --force-depends: the scratch root has no libc6, dkms or libibverbs1; dpkg warns and installs.
log=$(dpk -i "$deb" "$dkms_deb" "$lib_deb" 2>&1) || { echo "$log" >&2; exit 1; }
for p in vrdma-backend vrdma-dkms libvrdma; do
	grep -qx 'Status: install ok installed' <<<"$(dpkg --root="$root" -s $p)" || fail "$p not installed"
done

# ---- vrdma-backend ----
for f in usr/bin/vrdma-backend lib/systemd/system/vrdma-backend@.service \
	lib/systemd/system/vrdma-fabric.service usr/share/doc/vrdma-backend/examples/fabric.conf.example \
	usr/lib/sysusers.d/vrdma.conf usr/share/man/man1/vrdma-backend.1.gz \
	usr/share/doc/vrdma-backend/examples/vrdma.conf.example \
	usr/share/doc/vrdma-backend/examples/vrdma-guest.xml \
	usr/share/doc/vrdma-backend/README.md usr/share/doc/vrdma-backend/copyright; do
	[ -f "$root/$f" ] || fail "/$f not installed"
done
[ -x "$root/usr/bin/vrdma-backend" ]
"$root/usr/bin/vrdma-backend" --version | grep '^vrdma-backend ' >/dev/null
dpk -L vrdma-backend | grep -x /usr/bin/vrdma-backend >/dev/null
man_text=$(zcat "$root/usr/share/man/man1/vrdma-backend.1.gz" | sed 's/\\-/-/g')
for w in '--socket-path' '--pcap' 'stats --socket' '/etc/vrdma/DEVICE.conf' '/etc/vrdma/fabric.conf'; do
	grep -qF -- "$w" <<<"$man_text" || { echo "check-deb: man page lacks $w" >&2; exit 1; }
done
if command -v man >/dev/null; then
	MANWIDTH=80 man -l "$root/usr/share/man/man1/vrdma-backend.1.gz" 2>&1 >/dev/null | \
		(! grep .) || { echo "check-deb: man page has troff warnings" >&2; exit 1; }
fi

# ---- vrdma-dkms ----
version=$(dpkg-deb -f "$dkms_deb" Version)
[ "$(dpkg-deb -f "$dkms_deb" Architecture)" = all ] || fail "vrdma-dkms is not Architecture: all"
grep -qw dkms <<<"$(dpkg-deb -f "$dkms_deb" Depends)" || fail "vrdma-dkms does not depend on dkms"
src=usr/src/vrdma-$version
for f in dkms.conf Kbuild Makefile vrdma.h include/vrdma_abi.h include/vrdma_uapi.h; do
	[ -f "$root/$src/$f" ] || fail "/$src/$f not installed"
done
# every object Kbuild links has its source in the tree
# (the object list: from "vrdma-y" to the first line without a continuation backslash)
objs=$(sed -n '/^vrdma-y/,/[^[:punct:]]$/p' "$root/$src/Kbuild" | grep -o '[a-z_]*\.o')
[ -n "$objs" ] || fail "no vrdma-y objects in /$src/Kbuild"
for o in $objs; do
	[ -f "$root/$src/${o%.o}.c" ] || fail "/$src/${o%.o}.c (for $o in Kbuild) not installed"
done
# dkms sources dkms.conf with these set: read its fields the same way
conf=$(kernel_source_dir=/KSRC dkms_tree=/DTREE kernelver=KVER bash -c '
	set -eu; . "$1"
	printf "%s\n" "name=$PACKAGE_NAME" "version=$PACKAGE_VERSION" "module=${BUILT_MODULE_NAME[0]}" \
		"dest=${DEST_MODULE_LOCATION[0]}" "auto=$AUTOINSTALL" "make=${MAKE[0]}"' _ "$root/$src/dkms.conf")
want() { grep -qxF -- "$1" <<<"$conf" || fail "dkms.conf: want $1, have: $(tr '\n' ' ' <<<"$conf")"; }
want name=vrdma
want "version=$version"
want module=vrdma
want auto=yes
grep -qxE 'dest=/updates/dkms|dest=/kernel/drivers/infiniband/hw/vrdma' <<<"$conf" || \
	fail "dkms.conf: DEST_MODULE_LOCATION[0] not /updates/dkms"
grep -qE '^make=make( .*)? KDIR=/KSRC( |$)' <<<"$conf" || fail "dkms.conf: MAKE[0] does not build with KDIR=\$kernel_source_dir"
# DKMS builds the installed tree for every guest kernel we support (mk/kmod.mk): its own tree
# and signing key in the scratch directory, the source tree the scratch root's /usr/src. The
# host's gcc-12 builds KVERS (headers: make kmod-deps); KVERS_TRIXIE (7.3, gcc-14) builds with
# the dkms of the trixie build root (images/build-trixie-buildroot.sh), which sees the scratch
# directory at /mnt through a private mount namespace.
command -v dkms >/dev/null || fail "dkms missing: run make ops-deps"
# dkms_build KVER [BUILDROOT]: dkms build of the installed tree; checks vrdma.ko and its vermagic
dkms_build() {
	local kver=$1 broot=${2:-} s=$scratch out ko
	if [ -n "$broot" ]; then
		s=/mnt
		[ -d "$broot/lib/modules/$kver/build" ] || fail "no headers for $kver in $broot"
	else
		[ -d "/lib/modules/$kver/build" ] || fail "no headers for $kver (/lib/modules/$kver/build): run make host-deps"
	fi
	rm -rf "$scratch/dkms"
	mkdir "$scratch/dkms"
	set -- env mok_signing_key="$s/mok.key" mok_certificate="$s/mok.pub" \
		dkms build -m vrdma -v "$version" -k "$kver" --dkmstree "$s/dkms" --sourcetree "$s/root/usr/src"
	if [ -n "$broot" ]; then
		# (the inner shell expands its own arguments)
		# shellcheck disable=SC2016
		set -- unshare -m --propagation private sh -c 'r=$1; d=$2; shift 2
			mount -t proc proc "$r/proc" && mount --bind "$d" "$r/mnt" && exec chroot "$r" "$@"' \
			_ "$broot" "$scratch" "$@"
	fi
	if ! out=$("$@" 2>&1); then
		echo "$out" >&2
		cat "$scratch/dkms/vrdma/$version/build/make.log" >&2 2>/dev/null || true
		fail "dkms build of vrdma $version for $kver failed"
	fi
	ko=$(find "$scratch/dkms/vrdma/$version/$kver" -path '*/module/vrdma.ko*' | head -n1)
	[ -n "$ko" ] || fail "dkms build for $kver produced no vrdma.ko: $out"
	case "$ko" in
	*.xz) xz -dc "$ko" >"$scratch/vrdma.ko" ;;
	*.zst) zstd -qdc "$ko" >"$scratch/vrdma.ko" ;;
	*.gz) gzip -dc "$ko" >"$scratch/vrdma.ko" ;;
	*) cp "$ko" "$scratch/vrdma.ko" ;;
	esac
	[ "$(modinfo -F vermagic "$scratch/vrdma.ko" | awk '{print $1}')" = "$kver" ] ||
		fail "vrdma.ko: vermagic is not $kver"
	# virtio device ID 42 (spec §1): the module binds the vrdma device
	grep -q '^virtio:d0000002Av' <<<"$(modinfo -F alias "$scratch/vrdma.ko")" ||
		fail "vrdma.ko for $kver: no virtio ID 42 alias"
	built="$built $kver"
}
built=
for k in $KVERS; do
	dkms_build "$k"
done
if [ -n "$KVERS_TRIXIE" ]; then
	"$top/images/build-trixie-buildroot.sh"
	broot=$(realpath "${VRDMA_CACHE:-/var/cache/vrdma}/buildroot-trixie")
	for k in $KVERS_TRIXIE; do
		dkms_build "$k" "$broot"
	done
fi

# ---- libvrdma ----
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
so=usr/lib/$multiarch/libibverbs/libvrdma-rdmav34.so
[ -f "$root/$so" ] || fail "/$so not installed"
[ "$(cat "$root/etc/libibverbs.d/vrdma.driver")" = "driver vrdma" ] || \
	fail "/etc/libibverbs.d/vrdma.driver is not 'driver vrdma'"
grep -q '^ /etc/libibverbs.d/vrdma.driver ' <<<"$(dpkg --root="$root" -s libvrdma)" || \
	fail "vrdma.driver is not a conffile"
grep -qF 'libibverbs1 (>= 44)' <<<"$(dpkg-deb -f "$lib_deb" Depends)" || fail "libvrdma: no Depends libibverbs1 (>= 44)"
dyn=$(readelf -d "$root/$so")
grep -q 'NEEDED.*\[libibverbs\.so\.1\]' <<<"$dyn" || fail "$so does not need libibverbs.so.1"
# loaded by path like rdma-core's own provider modules: no SONAME, and no RUNPATH into a build tree
! grep -qE '\((SONAME|RPATH|RUNPATH)\)' <<<"$dyn" || fail "$so has a SONAME or a run path: $dyn"
grep -q 'Name: IBVERBS_PRIVATE_34 ' <<<"$(readelf -V "$root/$so")" || fail "$so does not bind IBVERBS_PRIVATE_34"
# every libibverbs import is exported by trixie's libibverbs1 56.1 (downloaded once and cached)
"$top/guest-driver/provider/tests/check-symbols.sh" "$root/$so" >/dev/null
# ... and that library loads providers from exactly this path and reads /etc/libibverbs.d
ibv=/var/tmp/vrdma-provider/libibverbs1-56.1-1/usr/lib/$multiarch/libibverbs.so.1
ibv_strings=$(strings "$ibv")
grep -qxF "/$(dirname "$so")/lib%s-rdmav34.so" <<<"$ibv_strings" || \
	fail "libibverbs 56.1 does not load providers from /$(dirname "$so")"
grep -qxF /etc/libibverbs.d <<<"$ibv_strings" || fail "libibverbs 56.1 does not read /etc/libibverbs.d"

dpk -P vrdma-backend vrdma-dkms libvrdma >/dev/null
for f in usr/bin/vrdma-backend "$src" "$so" etc/libibverbs.d/vrdma.driver; do
	[ ! -e "$root/$f" ] || fail "/$f not removed"
done
echo "deb: ok ($(basename "$deb"), $(basename "$dkms_deb") with vrdma.ko by dkms for$built, $(basename "$lib_deb"))"
