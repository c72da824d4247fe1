#!/bin/bash
# The trixie build root for guest kernels the host's compiler cannot build for.
#
# trixie-backports' Linux 7.3 headers were configured with gcc-14 (the kernel's
# Makefile passes options such as -fmin-function-alignment that bookworm's
# gcc-12 lacks). The host never gets gcc-14: modules for that kernel are built
# in this chroot instead, made by debootstrap and cached like the guest root
# filesystem:
#
#  $VRDMA_CACHE/buildroot-trixie-<hash>/rootfs/  trixie minbase + gcc-14, make,
#      dkms, linux-headers-$KVER_BPO (trixie-backports, apt sources inside
#      the root only: the host's sources and pinning are not touched), and
#      /opt/checkpatch (scripts/checkpatch.pl with its data files, from
#      linux-source of the same kernel)
#  $VRDMA_CACHE/buildroot-trixie                  stable symlink to rootfs/
#
# <hash> covers this script, lib.sh and $KVER_BPO, so a change to either builds a new
# root. Idempotent: a second run is a cache hit in well under a second.
# Used by mk/kmod.mk (kmod-matrix, kmod-checkpatch) and packaging/deb/check-deb.sh.
export LOG_TAG="buildroot-trixie"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
lock_step buildroot-trixie

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"

# trixie-backports' kernel (also named in mk/kmod.mk) and its linux-source package.
KVER_BPO=${KVER_BPO:-7.3.4+deb13-amd64}
KVER_BPO_SRC=${KVER_BPO%.*+*}
MIRROR=http://deb.debian.org/debian
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
key=$(printf '%s\n' "$KVER_BPO" | cat - "$0" "$IMAGES_DIR/lib.sh" | sha256sum | cut -c1-12)
dir="$VRDMA_CACHE/buildroot-trixie-$key"
root="$dir/rootfs"
link="$VRDMA_CACHE/buildroot-trixie"

if [ -f "$dir/.done" ]; then
	ln -sfn "$root" "$link"
	log "cache hit: $root"
	exit 0
fi
command -v debootstrap >/dev/null || die "debootstrap missing: run make host-deps"
rm -rf "$dir"
mkdir -p "$dir"
start=$(date +%s)

log "debootstrap trixie minbase + gcc-14 (log: $dir/debootstrap.log)"
run_logged "$dir/debootstrap.log" debootstrap --variant=minbase \
	--include=gcc-14,make,libc6-dev,dkms,kmod,perl,xz-utils \
	trixie "$root" "$MIRROR"

# Sources for the root itself; the host's apt configuration stays as it is.
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: trixie trixie-backports
Components: main
Signed-By: $KEYRING
SRC
rm -f "$root/etc/apt/sources.list"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
run_logged "$dir/apt.log" in_root apt-get update -q
log "installing linux-headers-$KVER_BPO (trixie-backports)"
run_logged "$dir/apt.log" in_root apt-get install -y -q --no-install-recommends \
	-t trixie-backports "linux-headers-$KVER_BPO"
[ -d "$root/usr/src/linux-headers-$KVER_BPO" ] || die "no /usr/src/linux-headers-$KVER_BPO in $root"

# checkpatch.pl: only in the kernel source; keep the script and the files it reads.
log "extracting checkpatch.pl from linux-source-$KVER_BPO_SRC"
(cd "$root/tmp" && run_logged "$dir/apt.log" chroot "$root" sh -c \
	"cd /tmp && apt-get download -q linux-source-$KVER_BPO_SRC")
mkdir -p "$root/opt/checkpatch"
tarball=$(dpkg-deb --fsys-tarfile "$root"/tmp/linux-source-"$KVER_BPO_SRC"_*.deb |
	tar -t | grep '/linux-source-.*\.tar\.xz$')
dpkg-deb --fsys-tarfile "$root"/tmp/linux-source-"$KVER_BPO_SRC"_*.deb |
	tar -xO "$tarball" | tar -xJ -C "$root/opt/checkpatch" --strip-components=1 \
		--wildcards '*/scripts/checkpatch.pl' '*/scripts/spelling.txt' \
		'*/scripts/const_structs.checkpatch'
rm -f "$root"/tmp/linux-source-*.deb
[ -x "$root/opt/checkpatch/scripts/checkpatch.pl" ] || die "no checkpatch.pl in linux-source-$KVER_BPO_SRC"

in_root apt-get clean
touch "$dir/.done"
ln -sfn "$root" "$link"
log "ready: $root ($(du -sh "$root" | cut -f1), $(($(date +%s) - start)) s)"
