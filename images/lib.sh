# shellcheck shell=bash disable=SC2034
# Common helpers for the images/ scripts. Source it, do not run it.
#
# VRDMA_CACHE  where everything large lives (never inside the repo);
#              default /var/cache/vrdma.

set -euo pipefail

VRDMA_CACHE=${VRDMA_CACHE:-/var/cache/vrdma}
IMAGES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_DIR=$(cd "$IMAGES_DIR/.." && pwd -P)
# What is built from a checkout's own sources (overlay, vrdma.ko, provider)
# lives in a directory per checkout, so worktrees and CI clones never
# overwrite each other's; vrdmavm/paths.py computes the same name.
CHECKOUT_DIR="$VRDMA_CACHE/checkout-$(printf %s "$REPO_DIR" | sha256sum | cut -c1-8)"

# Versions pinned by the project. Change them here only.
KVER=6.12.95+deb12-amd64
QEMU_SRCVER=1:10.0.2+ds-2+deb13u1~bpo12+1
QEMU_UPVER=10.0.2
RDMA_CORE_VER=56.1-1
RDMA_CORE_UPVER=56.1

export VRDMA_CACHE KVER

log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "${LOG_TAG:-images}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Refuse to put build outputs into the work tree.
case "$VRDMA_CACHE/" in
"$REPO_DIR"/*) die "VRDMA_CACHE ($VRDMA_CACHE) must be outside the repository" ;;
esac
mkdir -p "$VRDMA_CACHE"

# lock_step NAME: one build of NAME at a time (engineers share the cache)
lock_step() {
	exec 9>"$VRDMA_CACHE/.lock-$1"
	if ! flock -n 9; then
		log "waiting for another $1 build to finish"
		flock 9
	fi
}

# hash_of FILE... : short, stable hash of the contents of files
hash_of() { cat "$@" | sha256sum | cut -c1-12; }

# hash_tree DIR : hash of all files under DIR (names and contents), ignoring build outputs
hash_tree() {
	(cd "$1" && find . -type f ! -name '*.o' ! -name '*.ko' ! -name '*.mod*' \
		! -name '.*.cmd' ! -name 'Module.symvers' ! -name 'modules.order' \
		-print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12
}

# Run a step that prints a lot into a log file, keeping the last lines on error.
run_logged() {
	local logf=$1
	shift
	if ! "$@" >"$logf" 2>&1; then
		tail -n 40 "$logf" >&2
		die "command failed: $* (full log: $logf)"
	fi
}
