#!/bin/bash
# Guest kernel + base initramfs (the slow, rarely changing part).
#
#  $VRDMA_CACHE/kernel-$KVER/vmlinuz          bookworm-backports kernel
#  $VRDMA_CACHE/kernel-$KVER/lib/modules/...  its full module tree
#  $VRDMA_CACHE/guest-base-<hash>/rootfs/     trixie minbase + rdma-core
#  $VRDMA_CACHE/guest-base-<hash>/base.cpio   the rootfs as an uncompressed cpio
#  $VRDMA_CACHE/guest-base.cpio               stable symlink to it
#
# <hash> covers this script, lib.sh and guest/modules.list. The overlay
# (build-guest-overlay.sh) adds /init, the agent and our own module/provider.
LOG_TAG=guest-base
# shellcheck source=images/lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap)"

SUITE=trixie
MIRROR=http://deb.debian.org/debian
INCLUDE=ibverbs-utils,ibverbs-providers,rdmacm-utils,perftest,iproute2,python3,python3-pyverbs,libibverbs1,librdmacm1t64,kmod,busybox,strace,procps,ethtool

kdir="$VRDMA_CACHE/kernel-$KVER"
key=$(hash_of "$0" "$IMAGES_DIR/lib.sh" "$IMAGES_DIR/guest/modules.list")
out="$VRDMA_CACHE/guest-base-$key"

# ---- kernel -------------------------------------------------------------
if [ ! -f "$kdir/.done" ]; then
	log "fetching linux-image-$KVER (bookworm-backports)"
	rm -rf "$kdir"
	mkdir -p "$kdir/deb"
	(cd "$kdir/deb" && run_logged "$kdir/download.log" \
		apt-get download "linux-image-$KVER")
	dpkg-deb -x "$kdir"/deb/linux-image-*.deb "$kdir/x"
	mv "$kdir/x/boot/vmlinuz-$KVER" "$kdir/vmlinuz"
	mv "$kdir/x/boot/config-$KVER" "$kdir/config"
	mkdir -p "$kdir/lib/modules"
	mv "$kdir/x/lib/modules/$KVER" "$kdir/lib/modules/"
	rm -rf "$kdir/x" "$kdir/deb"
	depmod -b "$kdir" "$KVER"
	touch "$kdir/.done"
	log "kernel ready: $kdir/vmlinuz"
else
	log "cache hit: kernel $kdir"
fi
ln -sfn "$kdir/vmlinuz" "$VRDMA_CACHE/vmlinuz"

if [ -f "$out/.done" ]; then
	ln -sfn "$out/base.cpio" "$VRDMA_CACHE/guest-base.cpio"
	log "cache hit: $out/base.cpio"
	exit 0
fi

# ---- root filesystem ----------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
root="$out/rootfs"
log "debootstrap $SUITE minbase (+ $INCLUDE), ~1 min"
t0=$(date +%s)
run_logged "$out/debootstrap.log" debootstrap --variant=minbase \
	--include="$INCLUDE" "$SUITE" "$root" "$MIRROR"
log "debootstrap done in $(($(date +%s) - t0)) s"

# pyverbs tests: keep them (ungzipped) before the docs go away
tests_src="$root/usr/share/doc/rdma-core/tests"
[ -d "$tests_src" ] || tests_src="$root/usr/share/doc/python3-pyverbs/tests"
if [ -d "$tests_src" ]; then
	mkdir -p "$root/opt/pyverbs-tests"
	cp -a "$tests_src/." "$root/opt/pyverbs-tests/"
	find "$root/opt/pyverbs-tests" -name '*.gz' -exec gunzip -f {} +
	log "pyverbs tests in /opt/pyverbs-tests ($(find "$root/opt/pyverbs-tests" -name 'test_*.py' | wc -l) modules)"
else
	die "pyverbs tests not found in the rootfs"
fi

log "trimming docs, man pages, locales, apt caches"
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/usr/share/locale/* "$root"/usr/share/i18n/* \
	"$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/*
find "$root/usr/share/zoneinfo" -mindepth 1 -maxdepth 1 ! -name UTC ! -name Etc \
	-exec rm -rf {} + 2>/dev/null || true

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

# ---- kernel modules -----------------------------------------------------
log "copying kernel modules (with dependencies)"
mods="$kdir/lib/modules/$KVER"
python3 - "$mods" "$root/lib/modules/$KVER" "$IMAGES_DIR/guest/modules.list" <<'PY'
import fnmatch, os, shutil, sys
src, dst, listfile = sys.argv[1:4]
pats = [l.strip() for l in open(listfile) if l.strip() and not l.startswith('#')]
deps = {}
for line in open(os.path.join(src, 'modules.dep')):
    mod, _, rest = line.partition(':')
    deps[mod] = rest.split()
def stem(m):
    for suf in ('.ko.xz', '.ko.zst', '.ko.gz', '.ko'):
        if m.endswith(suf):
            return m[:-len(suf)]
    return m
want = set()
for p in pats:
    hits = [m for m in deps if fnmatch.fnmatch(stem(m), 'kernel/' + p)]
    if not hits:
        sys.exit('no module matches ' + p)
    want.update(hits)
todo = list(want)
while todo:
    for d in deps[todo.pop()]:
        if d not in want:
            want.add(d)
            todo.append(d)
for m in sorted(want):
    os.makedirs(os.path.dirname(os.path.join(dst, m)), exist_ok=True)
    shutil.copy2(os.path.join(src, m), os.path.join(dst, m))
for f in ('modules.order', 'modules.builtin', 'modules.builtin.modinfo'):
    if os.path.exists(os.path.join(src, f)):
        shutil.copy2(os.path.join(src, f), os.path.join(dst, f))
print(len(want), 'modules')
PY
depmod -b "$root" "$KVER"

# ---- pack ---------------------------------------------------------------
log "packing base.cpio"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$out/base.cpio.tmp"
mv "$out/base.cpio.tmp" "$out/base.cpio"
touch "$out/.done"
ln -sfn "$out/base.cpio" "$VRDMA_CACHE/guest-base.cpio"
for d in "$VRDMA_CACHE"/guest-base-*/; do
	[ "${d%/}" = "$out" ] || { log "removing stale ${d%/}"; rm -rf "${d%/}"; }
done
log "done: $out/base.cpio ($(du -h "$out/base.cpio" | cut -f1))"
