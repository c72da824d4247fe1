# vrdma.ko on the guest kernels users run (issue 35): Debian 12's 6.1, trixie's / bookworm-
# backports' 6.12 and trixie-backports' 7.3. Differences between them live in
# guest-driver/kernel/vrdma_compat.h only.
#
#   make kmod-deps        headers for the host-built kernels (apt, idempotent; a HOST_DEPS_STEP)
#   make kmod-buildroot   the trixie build root with gcc-14 and the 7.3 headers
#                         (images/build-trixie-buildroot.sh, cached in $(VRDMA_CACHE))
#   make kmod-matrix      vrdma.ko with W=1 against all three, any warning fails
#                         (images/build-kmod-matrix.sh; modules in $(KMOD_OUT)/<kver>/)
#   make kmod-checkpatch  checkpatch.pl --strict on the driver's sources (the script comes
#                         from linux-source-7.3 in the build root)
# kmod-matrix and kmod-checkpatch are CHECK_STEPS; `make test` starts the build root in the
# background right after host-deps (kmod-buildroot-background), and the steps that need it
# wait on its lock. The log: $(RESULTS)/kmod-buildroot.log.

# Built with the host's gcc-12: bookworm's kernel and the guest images' (images/lib.sh KVER).
KMOD_HOST_KVERS ?= 6.1.0-57-amd64 6.12.95+deb12-amd64
# Built with gcc-14 in the trixie build root.
KMOD_TRIXIE_KVERS ?= 7.3.4+deb13-amd64
KMOD_OUT := $(CARGO_TARGET_DIR)/kmod-matrix
KMOD_SRC := $(TOP)/guest-driver/kernel
KMOD_CHECKPATCH := $(VRDMA_CACHE)/buildroot-trixie/opt/checkpatch/scripts/checkpatch.pl
export KMOD_HOST_KVERS KMOD_TRIXIE_KVERS

HOST_DEPS_STEPS += kmod-deps
BACKGROUND_STEPS += kmod-buildroot-background
CHECK_STEPS += kmod-matrix kmod-checkpatch

.PHONY: kmod-deps kmod-buildroot kmod-buildroot-background kmod-matrix kmod-checkpatch

# The guest images' 6.12 headers come from bookworm-backports through images/setup-host.sh
# (which host-deps runs after the HOST_DEPS_STEPS, and which adds that suite); the others from
# the host's default sources (bookworm, bookworm-security). --no-install-recommends: no
# kernel image, no initramfs run. A fresh machine may have no package lists yet: one
# apt-get update, then again.
KMOD_APT = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
kmod-deps:
	@for k in $(KMOD_HOST_KVERS); do \
		[ -d "/usr/src/linux-headers-$$k" ] && continue; \
		case "$$k" in *+deb12-*) continue ;; esac; \
		echo "kmod-deps: installing linux-headers-$$k"; \
		$(KMOD_APT) "linux-headers-$$k" >/dev/null || \
			{ apt-get update -q >/dev/null && $(KMOD_APT) "linux-headers-$$k" >/dev/null; }; \
	done

kmod-buildroot:
	"$(IMAGES_DIR)/build-trixie-buildroot.sh"

kmod-buildroot-background:
	@mkdir -p "$(RESULTS)"
	@echo "kmod: trixie build root in the background at nice 19 (log: $(RESULTS)/kmod-buildroot.log)"
	@nohup nice -n 19 "$(IMAGES_DIR)/build-trixie-buildroot.sh" >"$(RESULTS)/kmod-buildroot.log" 2>&1 </dev/null &

kmod-matrix: kmod-deps
	"$(IMAGES_DIR)/build-kmod-matrix.sh" "$(KMOD_OUT)"

# The version checks are what vrdma_compat.h is for; the *_obj allocators that 7.3's
# checkpatch prefers do not exist in 6.1 or 6.12.
kmod-checkpatch: kmod-buildroot
	cd "$(KMOD_SRC)" && perl "$(KMOD_CHECKPATCH)" --no-tree --strict --terse --show-types \
		--ignore ALLOC_WITH_SIZEOF -f $(filter-out vrdma_compat.h,$(notdir $(wildcard $(KMOD_SRC)/*.[ch])))
	cd "$(KMOD_SRC)" && perl "$(KMOD_CHECKPATCH)" --no-tree --strict --terse --show-types \
		--ignore LINUX_VERSION_CODE,CONSTANT_COMPARISON -f vrdma_compat.h

# deb-check (mk/ops.mk) has DKMS build the vrdma-dkms package for the same kernels
# (packaging/deb/check-deb.sh reads KMOD_HOST_KVERS and KMOD_TRIXIE_KVERS).
deb-check: kmod-deps
