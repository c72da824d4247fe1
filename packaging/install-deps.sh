#!/bin/bash
# install-deps.sh COMMAND=PACKAGE...: install each Debian PACKAGE whose COMMAND is not on PATH
# (idempotent: nothing happens when every command exists). Used by mk/ops.mk.
set -euo pipefail

need=()
for pair in "$@"; do
	cmd=${pair%%=*}
	pkg=${pair#*=}
	command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing ${need[*]} and not root: install them with apt-get" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# wireshark-common asks whether non-root users may capture; the answer does not matter here.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
echo "install-deps: installing ${need[*]}"
if ! apt-get install -y --no-install-recommends "${need[@]}"; then
	# A fresh machine may have no package lists yet.
	apt-get update
	apt-get install -y --no-install-recommends "${need[@]}"
fi
