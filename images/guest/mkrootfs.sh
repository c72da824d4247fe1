#!/bin/bash
# Build the guest root filesystem (trixie minbase + rdma-core userspace)
# into DIR. Called by images/build-guest-base.sh; the cache key of the
# result is the hash of this file, so any change here rebuilds it.
#   mkrootfs.sh DIR
set -euo pipefail
root=$1
SUITE=trixie
MIRROR=http://deb.debian.org/debian
INCLUDE=ibverbs-utils,ibverbs-providers,rdmacm-utils,perftest,iproute2,python3,python3-pyverbs,libibverbs1,librdmacm1t64,kmod,busybox,strace,procps,ethtool
# Kernel RDMA users (ULPs) and their tools: NVMe-oF host and target, NFS over RDMA, fio.
INCLUDE=$INCLUDE,nvme-cli,fio,nfs-kernel-server,nfs-common

echo "debootstrap $SUITE minbase (+ $INCLUDE)" >&2
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$MIRROR"

# MPI users: UCX (verbs transports) and Open MPI with mpi4py. Trixie's libucx0 depends on
# ROCm (HIP, HSA: ~200 MB with LLVM) for its GPU transport module only; equivalent-free
# stand-ins satisfy those dependencies, and UCX skips the module it cannot load.
MPI_PKGS=(openmpi-bin ucx-utils python3-mpi4py)
ROCM_STANDINS=(libamdhip64-5 libhsa-runtime64-1)
standins=$(mktemp -d)
for p in "${ROCM_STANDINS[@]}"; do
	mkdir -p "$standins/$p/DEBIAN"
	cat >"$standins/$p/DEBIAN/control" <<CTL
Package: $p
Version: 99:0-vrdma
Architecture: amd64
Maintainer: vrdma tests <vrdma@localhost>
Description: stand-in without ROCm (vrdma guest image: no GPU)
CTL
	dpkg-deb --root-owner-group -b "$standins/$p" "$root/tmp/$p.deb" >/dev/null
done
rm -rf "$standins"
chroot "$root" sh -c "dpkg -i /tmp/*.deb && rm /tmp/*.deb"
echo "deb $MIRROR $SUITE main" >"$root/etc/apt/sources.list"
chroot "$root" apt-get update -q
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${MPI_PKGS[@]}"
if chroot "$root" dpkg -l | grep -E '^ii +(libllvm|libamd-comgr|libhsakmt)'; then
	echo "ROCm slipped into the guest image" >&2
	exit 1
fi
chroot "$root" apt-get clean

# pyverbs tests: keep them (ungzipped) before the docs go away
tests_src="$root/usr/share/doc/rdma-core/tests"
[ -d "$tests_src" ] || tests_src="$root/usr/share/doc/python3-pyverbs/tests"
[ -d "$tests_src" ] || { echo "pyverbs tests not found in the rootfs" >&2; exit 1; }
mkdir -p "$root/opt/pyverbs-tests"
cp -a "$tests_src/." "$root/opt/pyverbs-tests/"
find "$root/opt/pyverbs-tests" -name '*.gz' -exec gunzip -f {} +

# trim docs, man pages, locales, apt caches
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/usr/share/locale/* "$root"/usr/share/i18n/* \
	"$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/*
find "$root/usr/share/zoneinfo" -mindepth 1 -maxdepth 1 ! -name UTC ! -name Etc \
	-exec rm -rf {} + 2>/dev/null || true
# Nothing runs udev or iconv here, and every MB costs boot time under TCG
# (the kernel unpacks the initramfs at ~30 MB/s).
rm -rf "$root"/usr/lib/udev/hwdb.bin "$root"/usr/lib/udev/hwdb.d \
	"$root"/usr/lib/x86_64-linux-gnu/gconv \
	"$root"/usr/lib/python3.13/test "$root"/usr/lib/python3.13/pydoc_data \
	"$root"/usr/lib/python3.13/ensurepip "$root"/usr/lib/python3.13/idlelib \
	"$root"/var/cache/debconf/*-old

# busybox applets that minbase lacks (ping, vi, ...) without shadowing real tools
for a in $(chroot "$root" /bin/busybox --list); do
	for d in bin sbin usr/bin usr/sbin; do
		[ -e "$root/$d/$a" ] && continue 2
	done
	ln -s /bin/busybox "$root/usr/bin/$a"
done

echo vrdma-guest >"$root/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
: >"$root/etc/fstab"
# root without password, for the interactive shell mode
sed -i 's/^root:[^:]*:/root::/' "$root/etc/shadow"
