# Images for the VM tests (owned by images/): QEMU with vhost-user-rdma,
# the guest kernel and initramfs. Everything is cached in $(VRDMA_CACHE)
# (outside the repository); a second `make images` takes seconds.
#
#   make images          all of the below (via IMAGES_TARGET)
#   make images-host-deps  apt sources + build dependencies (images/setup-host.sh;
#                        the top-level host-deps runs it too)
#   make qemu            $(VRDMA_CACHE)/qemu-system-x86_64
#   make guest-base      $(VRDMA_CACHE)/vmlinuz, $(VRDMA_CACHE)/guest-base.cpio
#   make guest-initrd    $(VRDMA_CACHE)/guest-initrd.cpio (base + overlay with
#                        vrdma.ko and libvrdma; needs guest-driver/kernel/Kbuild
#                        and guest-driver/provider/CMakeLists.txt)
#   make guest-images    the other guest OS images of images/guest_images.py, GUESTS of them
#                        (default: bookworm trixie-7.3; images/build-guest-image.sh). Not part
#                        of `make images`: only tests/vm/scenarios/guests.py boots them.
#   make images-clean    remove $(VRDMA_CACHE)
#   make images-check    syntax checks + the launcher's offline tests (a CHECK_STEP)
# VRDMA_NO_DRIVER=1 builds guest-initrd without the vrdma module/provider
# (for rxe guests only).

export VRDMA_CACHE ?= /var/cache/vrdma
IMAGES_DIR := $(TOP)/images
VRDMA_QEMU := $(VRDMA_CACHE)/qemu-system-x86_64
VRDMA_KERNEL := $(VRDMA_CACHE)/vmlinuz
VRDMA_INITRD := $(VRDMA_CACHE)/guest-initrd.cpio
VRDMAVM := python3 $(IMAGES_DIR)/vrdmavm

IMAGES_TARGET := images-all

.PHONY: images-all images-host-deps qemu guest-base guest-initrd guest-images images-clean \
	images-background

# `make test` starts the image builds at once, at the lowest CPU priority, so that on a cold
# machine the QEMU build and debootstrap use what the Rust steps leave idle (linking, tests
# that wait, downloads) instead of starting after them. When the VM steps reach `images`, each
# build script waits on the step lock the background one holds (`lock_step`), then finds its
# cache; a background failure is repeated there with its output. On a warm machine every step
# is a cache hit. The log: $(RESULTS)/images-background.log.
BACKGROUND_STEPS += images-background
images-background:
	@mkdir -p "$(RESULTS)"
	@echo "images: building in the background at nice 19 (log: $(RESULTS)/images-background.log)"
	@nohup nice -n 19 sh -c '"$(IMAGES_DIR)/build-qemu.sh" && "$(IMAGES_DIR)/build-guest-base.sh" && \
		"$(IMAGES_DIR)/build-guest-overlay.sh"' >"$(RESULTS)/images-background.log" 2>&1 </dev/null &

images-all:
	"$(IMAGES_DIR)/build-all.sh"

images-host-deps:
	"$(IMAGES_DIR)/setup-host.sh"

qemu: images-host-deps
	"$(IMAGES_DIR)/build-qemu.sh"

guest-base: images-host-deps
	"$(IMAGES_DIR)/build-guest-base.sh"

guest-initrd: guest-base
	"$(IMAGES_DIR)/build-guest-overlay.sh"

# bookworm's kernel headers come from kmod-deps (mk/kmod.mk); 7.3's from the trixie build
# root, which build-guest-image.sh makes when it is missing.
GUESTS ?= bookworm trixie-7.3
guest-images: guest-base kmod-deps
	"$(IMAGES_DIR)/build-guest-image.sh" $(GUESTS)

images-clean:
	rm -rf "$(VRDMA_CACHE)"

# Static checks of images/ and the launcher's offline tests (no VM, seconds).
CHECK_STEPS += images-check
.PHONY: images-check
images-check:
	@for f in "$(IMAGES_DIR)"/*.sh "$(IMAGES_DIR)"/guest/mkrootfs*.sh; do bash -n "$$f"; done
	@sh -n "$(IMAGES_DIR)/guest/init"
	@if command -v shellcheck >/dev/null; then \
		shellcheck -x -P "$(IMAGES_DIR)" "$(IMAGES_DIR)"/*.sh "$(IMAGES_DIR)"/guest/mkrootfs*.sh \
			"$(IMAGES_DIR)"/guest/init; fi
	python3 -m unittest discover -s "$(IMAGES_DIR)/tests" -v
