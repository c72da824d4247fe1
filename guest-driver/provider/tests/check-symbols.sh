#!/bin/sh
# Check that the built provider binds only symbols that the guests' libibverbs export
# (bookworm's rdma-core 44.0 and trixie's 56.1: both provider ABI IBVERBS_PRIVATE_34, and
# the private structures a provider shares with libibverbs, struct verbs_context_ops and
# the ibv_qp_ex / ibv_port_attr tails, only grew at their ends between them: one binary
# serves both), and exports none of its own (providers register through a constructor).
#
#   check-symbols.sh /path/to/libvrdma-rdmav34.so
set -eu

SO=$1
CACHE=/var/tmp/vrdma-provider
DEB_VERS="44.0-2 56.1-1"

needed=$(nm -D --undefined-only "$SO" | awk '{print $2}' | grep '@IBVERBS' || true)
[ -n "$needed" ] || { echo "check-symbols: no IBVERBS imports?" >&2; exit 1; }

missing=0
for DEB_VER in $DEB_VERS; do
	WORK="$CACHE/libibverbs1-$DEB_VER"
	if [ ! -f "$WORK/usr/lib/x86_64-linux-gnu/libibverbs.so.1" ]; then
		mkdir -p "$WORK"
		(cd "$CACHE" && apt-get download "libibverbs1=$DEB_VER" >/dev/null 2>&1) || {
			echo "check-symbols: cannot download libibverbs1=$DEB_VER (bookworm and trixie sources?)" >&2
			exit 1
		}
		dpkg-deb -x "$CACHE"/libibverbs1_"$DEB_VER"_*.deb "$WORK"
	fi
	exported=$(nm -D --defined-only "$WORK/usr/lib/x86_64-linux-gnu/libibverbs.so.1" |
		awk '{print $3}' | sed 's/@@/@/')
	for sym in $needed; do
		printf '%s\n' "$exported" | grep -qx "$sym" || {
			echo "check-symbols: $sym not exported by libibverbs $DEB_VER" >&2
			missing=1
		}
	done
done
for sym in $needed; do
	case "$sym" in
	*@IBVERBS_PRIVATE_34 | *@IBVERBS_1.*) ;;
	*) echo "check-symbols: $sym: wrong provider ABI" >&2; missing=1 ;;
	esac
done
printf '%s\n' "$needed" | grep -q '^verbs_register_driver_34@IBVERBS_PRIVATE_34$' || {
	echo "check-symbols: no verbs_register_driver_34 import" >&2
	missing=1
}
own=$(nm -D --defined-only "$SO" | awk '$2 ~ /^[TDBR]$/ {print $3}')
if [ -n "$own" ]; then
	echo "check-symbols: provider exports symbols: $own" >&2
	missing=1
fi
nm "$SO" | grep -q ' verbs_provider_vrdma$' || {
	echo "check-symbols: verbs_provider_vrdma missing" >&2
	missing=1
}
[ $missing -eq 0 ] || exit 1
echo "check-symbols: $(printf '%s\n' "$needed" | wc -l) libibverbs imports, all exported by libibverbs $DEB_VERS; no exports"
