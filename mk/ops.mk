# Operator integration (packaging/): the systemd unit, the libvirt domain, the --pcap capture
# checked by Wireshark's dissector, and the Debian package. Owned by the ops engineer.
#
#   make ops-deps       install what the checks need when its command is missing (a HOST_DEPS_STEP)
#   make systemd-check  systemd-analyze verify + offline security score of vrdma-backend@.service
#                       and vrdma-fabric.service, and every system call of the daemon (strace)
#                       allowed by each one's SystemCallFilter (the fabric one running the
#                       devices of fabric.conf.example)
#   make libvirt-check  virt-xml-validate of packaging/libvirt/vrdma-guest.xml
#   make libvirt-boot   boot one guest from that domain through a private session libvirtd
#                       (tests/libvirt/boot_guest.py; images + release backend first), ~1 minute
#   make pcap-check     the uplink_pcap test with tshark required (never skips)
#   make deb            $(RESULTS)/vrdma-backend_<version>_<arch>.deb, vrdma-dkms_<version>_all.deb
#                       and libvrdma_<version>_<arch>.deb (dpkg-deb; the provider is built by
#                       guest-driver/provider/build.sh, see mk/provider.mk)
#   make deb-check      build the three, install them into one scratch root, check the files and
#                       build vrdma.ko from the installed source with dkms (scratch DKMS tree)
# The four checks are CHECK_STEPS; each installs its own tools first, so `make check` works on
# a fresh machine too. libvirt-boot boots a VM, so it is a TEST_STEP (make test only).

PACKAGING := $(TOP)/packaging
OPS_INSTALL := "$(PACKAGING)/install-deps.sh"
OPS_BIN := $(CARGO_TARGET_DIR)/debug/vrdma-backend
# The daemon the package is built from: release (as shipped), DEB_PROFILE=debug for a quick try.
DEB_PROFILE ?= release
DEB_BIN := $(CARGO_TARGET_DIR)/$(DEB_PROFILE)/vrdma-backend
DEB_BUILD := $(CARGO) build $(if $(filter release,$(DEB_PROFILE)),--release) -p vrdma-backend --bin vrdma-backend

HOST_DEPS_STEPS += ops-deps
CHECK_STEPS += systemd-check libvirt-check pcap-check deb-check
TEST_STEPS += libvirt-boot

.PHONY: ops-deps ops-deps-systemd ops-deps-libvirt ops-deps-tshark ops-deps-deb \
	ops-deps-libvirtd ops-bin systemd-check libvirt-check libvirt-boot pcap-check deb deb-check

ops-deps: ops-deps-systemd ops-deps-libvirt ops-deps-libvirtd ops-deps-tshark ops-deps-deb

ops-deps-systemd:
	@$(OPS_INSTALL) systemd-analyze=systemd strace=strace

# virt-xml-validate runs xmllint, which libvirt-clients only recommends.
ops-deps-libvirt:
	@$(OPS_INSTALL) virt-xml-validate=libvirt-clients xmllint=libxml2-utils

# libvirt-daemon depends on its QEMU driver (libvirt-daemon-driver-qemu).
ops-deps-libvirtd:
	@$(OPS_INSTALL) libvirtd=libvirt-daemon virsh=libvirt-clients

ops-deps-tshark:
	@$(OPS_INSTALL) tshark=tshark

ops-deps-deb:
	@$(OPS_INSTALL) dpkg-deb=dpkg help2man=help2man man=man-db dkms=dkms readelf=binutils

ops-bin:
	cd "$(TOP)" && $(CARGO) build -p vrdma-backend --bin vrdma-backend

# The test executables traced next to the daemon: guest memory, vrings and TAP paths.
OPS_TRACED_TESTS := vhost_user_device uplink_tap

systemd-check: ops-deps-systemd ops-bin
	"$(PACKAGING)/check-systemd.sh" "$(OPS_BIN)"
	CARGO=$(CARGO) "$(PACKAGING)/check-syscalls.py" "$(PACKAGING)/systemd/vrdma-backend@.service" \
		"$(OPS_BIN)" $(OPS_TRACED_TESTS)
	CARGO=$(CARGO) "$(PACKAGING)/check-syscalls.py" --fabric "$(PACKAGING)/systemd/fabric.conf.example" \
		"$(PACKAGING)/systemd/vrdma-fabric.service" "$(OPS_BIN)" $(OPS_TRACED_TESTS)

libvirt-check: ops-deps-libvirt
	"$(PACKAGING)/check-libvirt.sh"

# vm-prereqs (mk/vm-test.mk): the release backend and the images (QEMU, kernel, initrd).
# LIBVIRT_BOOT_PREREQS=backend-release boots the images already in $(VRDMA_CACHE) as they are.
LIBVIRT_BOOT_PREREQS ?= vm-prereqs
libvirt-boot: ops-deps-libvirtd $(LIBVIRT_BOOT_PREREQS)
	"$(TOP)/tests/libvirt/boot_guest.py" --results "$(RESULTS)/libvirt-boot"

pcap-check: ops-deps-tshark
	cd "$(TOP)" && VRDMA_REQUIRE_TSHARK=1 $(CARGO) test -p vrdma-backend --test uplink_pcap

# Builds the daemon and the provider, then the three packages; leaves their paths in $$debs.
DEB_BUILD_ALL = cd "$(TOP)" && $(DEB_BUILD); \
	so=$$("$(PROVIDER_DIR)/build.sh" | tail -n1); echo "provider: $$so"; \
	debs="$$("$(PACKAGING)/deb/build-deb.sh" "$(DEB_BIN)" "$(RESULTS)" | tail -n1) \
	$$("$(PACKAGING)/deb/build-deb-dkms.sh" "$(RESULTS)" | tail -n1) \
	$$("$(PACKAGING)/deb/build-deb-libvrdma.sh" "$$so" "$(RESULTS)" | tail -n1)"

deb: ops-deps-deb provider-deps
	$(DEB_BUILD_ALL); printf '%s\n' $$debs

deb-check: ops-deps-deb provider-deps
	@for f in "$(PACKAGING)"/*.sh "$(PACKAGING)"/deb/*.sh; do bash -n "$$f"; done
	@if command -v shellcheck >/dev/null; then shellcheck "$(PACKAGING)"/*.sh "$(PACKAGING)"/deb/*.sh; fi
	$(DEB_BUILD_ALL); "$(PACKAGING)/deb/check-deb.sh" $$debs
