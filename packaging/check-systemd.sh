#!/bin/bash
# check-systemd.sh BINARY: `systemd-analyze verify` of vrdma-backend@.service and
# vrdma-fabric.service (any message is a failure: verify exits 0 on unknown keys and bad
# values) and their exposure scores (offline `systemd-analyze security`). verify checks that
# ExecStart's binary exists, so the copies under test point it at BINARY (the build) instead of
# /usr/bin/vrdma-backend. Also: the fabric example configuration gives every device the
# settings a multi-tenant daemon needs (README "One daemon for many tenants").
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "$1")
# The highest exposure accepted, in tenths (0 = locked down, 100 = unprotected; the units
# score about 17 and 20, "1.7 OK" and "2.0 OK").
max_exposure=${VRDMA_MAX_EXPOSURE:-30}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check_unit() { # UNIT-FILE CHECK-NAME KEY-LINE...
	local unit=$1 name=$2 out key
	shift 2
	sed "s|/usr/bin/vrdma-backend|$bin|" "$unit" >"$tmp/$name"
	grep -q "$bin" "$tmp/$name"
	out=$(cd "$tmp" && systemd-analyze verify --man=no "./$name" 2>&1) || {
		echo "$out" >&2
		exit 1
	}
	if [ -n "$out" ]; then
		echo "systemd-analyze verify complained about $unit:" >&2
		echo "$out" >&2
		exit 1
	fi
	(cd "$tmp" && systemd-analyze security --offline=yes --threshold="$max_exposure" \
		"./$name") | tail -n 1 || {
		echo "$unit: exposure above $max_exposure (systemd-analyze security --offline=yes)" >&2
		exit 1
	}
	for key in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes MemoryDenyWriteExecute=yes \
		"RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" User=vrdma \
		"SystemCallFilter=@system-service" "SystemCallFilter=~@privileged @resources" "$@"; do
		grep -qx -- "$key" "$unit" || { echo "$unit: no line $key" >&2; exit 1; }
	done
}

unit=$here/systemd/vrdma-backend@.service
check_unit "$unit" vrdma-backend@check.service "CapabilityBoundingSet=CAP_NET_ADMIN" \
	"EnvironmentFile=/etc/vrdma/%i.conf" "RuntimeDirectory=vrdma/%i"
grep -q -- "--socket-path /run/vrdma/%i/%i.sock" "$unit"

fabric=$here/systemd/vrdma-fabric.service
check_unit "$fabric" vrdma-fabric-check.service "CapabilityBoundingSet=CAP_NET_ADMIN CAP_CHOWN" \
	"EnvironmentFile=/etc/vrdma/fabric.conf" "RuntimeDirectory=vrdma/fabric" \
	"RuntimeDirectoryMode=0711" "UMask=0077" "SystemCallFilter=@chown"
grep -q -- "--stats-socket /run/vrdma/fabric/fabric.stats \$VRDMA_DEVICES" "$fabric"
# Memory: MemoryHigh= and MemoryMax= above the example's --max-host-memory (the daemon's own
# bound, to which its fixed costs come on top; see the unit's comment).
bytes() { numfmt --from=iec "$1"; }
high=$(bytes "$(sed -n 's/^MemoryHigh=//p' "$fabric")")
max=$(bytes "$(sed -n 's/^MemoryMax=//p' "$fabric")")
limit=$(bytes "$(sed -n 's/^VRDMA_OPTS=.*--max-host-memory \([0-9]*[KMG]\).*/\1/p' "$here/systemd/fabric.conf.example")")
[ "$limit" -gt 0 ] && [ "$high" -gt "$limit" ] && [ "$max" -gt "$high" ] || {
	echo "$fabric: need --max-host-memory ($limit) < MemoryHigh ($high) < MemoryMax ($max)" >&2
	exit 1
}
# Every example device: a socket in the unit's runtime directory, its addresses, its network
# and its socket given to one tenant (the README's rules; a device without ip= can claim any
# address of its network).
conf=$here/systemd/fabric.conf.example
devices=$(sed -z 's/\\\n//g' "$conf" | sed -n 's/^VRDMA_DEVICES=//p' | tr -s ' ' '\n' | grep -v -e '^--device$' -e '^$' || true)
[ -n "$devices" ] || { echo "$conf: no devices" >&2; exit 1; }
while read -r dev; do
	for k in 'socket=/run/vrdma/fabric/[^,]*\.sock' 'mac=' 'ip=' 'net=' '\(owner\|group\)=' 'mode=0[67][0-9]0'; do
		grep -q "\(^\|,\)$k" <<<"$dev" || { echo "$conf: device $dev lacks $k" >&2; exit 1; }
	done
done <<<"$devices"
echo "systemd units: ok"
