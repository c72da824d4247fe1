#!/bin/bash
# check-deb.sh DEB: install the package with dpkg into a scratch root (maintainer scripts run
# with DPKG_ROOT set, so they leave this system alone) and check the files land where expected,
# the man page renders and documents --pcap, and dpkg can remove it again.
set -euo pipefail

deb=$(realpath "$1")
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
dpk() { dpkg --root="$root" --log=/dev/null --force-script-chrootless --force-depends "$@"; }
# --force-depends: the scratch root has no libc6; dpkg warns about it and installs anyway.
log=$(dpk -i "$deb" 2>&1) || { echo "$log" >&2; exit 1; }

for f in usr/bin/vrdma-backend lib/systemd/system/vrdma-backend@.service \
	usr/lib/sysusers.d/vrdma.conf usr/share/man/man1/vrdma-backend.1.gz \
	usr/share/doc/vrdma-backend/examples/vrdma.conf.example \
	usr/share/doc/vrdma-backend/examples/vrdma-guest.xml \
	usr/share/doc/vrdma-backend/README.md usr/share/doc/vrdma-backend/copyright; do
	[ -f "$root/$f" ] || { echo "check-deb: /$f not installed" >&2; exit 1; }
done
[ -x "$root/usr/bin/vrdma-backend" ]
"$root/usr/bin/vrdma-backend" --version | grep -q '^vrdma-backend '
dpk -L vrdma-backend | grep -qx /usr/bin/vrdma-backend
dpkg --root="$root" -s vrdma-backend | grep -qx 'Status: install ok installed'
man_text=$(zcat "$root/usr/share/man/man1/vrdma-backend.1.gz" | sed 's/\\-/-/g')
for w in '--socket-path' '--pcap' 'stats --socket' '/etc/vrdma/DEVICE.conf'; do
	grep -qF -- "$w" <<<"$man_text" || { echo "check-deb: man page lacks $w" >&2; exit 1; }
done
if command -v man >/dev/null; then
	MANWIDTH=80 man -l "$root/usr/share/man/man1/vrdma-backend.1.gz" 2>&1 >/dev/null | \
		(! grep .) || { echo "check-deb: man page has troff warnings" >&2; exit 1; }
fi
dpk -r vrdma-backend >/dev/null
[ ! -e "$root/usr/bin/vrdma-backend" ] || { echo "check-deb: not removed" >&2; exit 1; }
echo "deb: ok ($(basename "$deb"))"
