#!/bin/bash
# check-systemd.sh BINARY: `systemd-analyze verify` of vrdma-backend@.service (any message is a
# failure: verify exits 0 on unknown keys and bad values) and its exposure score (offline
# `systemd-analyze security`). verify checks that ExecStart's binary exists, so the copy under
# test points it at BINARY (the build) instead of /usr/bin/vrdma-backend.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
unit=$here/systemd/vrdma-backend@.service
bin=$(realpath "$1")
# The highest exposure accepted, in tenths (0 = locked down, 100 = unprotected; the unit
# scores about 17, "1.7 OK").
max_exposure=${VRDMA_MAX_EXPOSURE:-30}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/bin/vrdma-backend|$bin|" "$unit" >"$tmp/vrdma-backend@check.service"
grep -q "$bin" "$tmp/vrdma-backend@check.service"

out=$(cd "$tmp" && systemd-analyze verify --man=no ./vrdma-backend@check.service 2>&1) || {
	echo "$out" >&2
	exit 1
}
if [ -n "$out" ]; then
	echo "systemd-analyze verify complained:" >&2
	echo "$out" >&2
	exit 1
fi
(cd "$tmp" && systemd-analyze security --offline=yes --threshold="$max_exposure" \
	./vrdma-backend@check.service) | tail -n 1 || {
	echo "exposure above $max_exposure (systemd-analyze security --offline=yes)" >&2
	exit 1
}
for key in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes MemoryDenyWriteExecute=yes \
	"CapabilityBoundingSet=CAP_NET_ADMIN" "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" \
	"EnvironmentFile=/etc/vrdma/%i.conf" "RuntimeDirectory=vrdma/%i" User=vrdma; do
	grep -qx "$key" "$unit" || { echo "$unit: no line $key" >&2; exit 1; }
done
grep -q -- "--socket-path /run/vrdma/%i/%i.sock" "$unit"
echo "systemd unit: ok"
