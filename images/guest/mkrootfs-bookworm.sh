#!/bin/bash
# Build the Debian 12 guest's root filesystem (bookworm minbase + rdma-core 44
# userspace) into DIR. Called by images/build-guest-image.sh for the "bookworm"
# guest; the cache key of the result is the hash of this file.
#   mkrootfs-bookworm.sh DIR
#
# The trixie guests' root filesystem (guest/mkrootfs.sh) also carries MPI and
# pyverbs' test suite; this one carries what the cross-version scenarios run:
# ibverbs-utils, rdmacm-utils, perftest, nvme-cli, fio and the NFS tools.
set -euo pipefail
root=$1
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
INCLUDE=ibverbs-utils,ibverbs-providers,rdmacm-utils,perftest,iproute2,python3,libibverbs1,librdmacm1,kmod,busybox,strace,procps,ethtool
INCLUDE=$INCLUDE,nvme-cli,fio,nfs-kernel-server,nfs-common

echo "debootstrap $SUITE minbase (+ $INCLUDE)" >&2
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$MIRROR"
chroot "$root" apt-get clean

# trim docs, man pages, locales, apt caches: every MB costs boot time under TCG
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/usr/share/locale/* "$root"/usr/share/i18n/* \
	"$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/*
find "$root/usr/share/zoneinfo" -mindepth 1 -maxdepth 1 ! -name UTC ! -name Etc \
	-exec rm -rf {} + 2>/dev/null || true
rm -rf "$root"/usr/lib/udev/hwdb.bin "$root"/usr/lib/udev/hwdb.d \
	"$root"/usr/lib/x86_64-linux-gnu/gconv \
	"$root"/usr/lib/python3.11/test "$root"/usr/lib/python3.11/pydoc_data \
	"$root"/usr/lib/python3.11/ensurepip "$root"/usr/lib/python3.11/idlelib \
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
