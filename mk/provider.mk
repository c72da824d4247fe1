# libvrdma (guest-driver/provider): build inside rdma-core 56.1 and the
# device-less unit test. Owned by the provider engineer.

PROVIDER_DIR := $(TOP)/guest-driver/provider
PROVIDER_PKGS := cmake ninja-build pkg-config libnl-3-dev libnl-route-3-dev gcc libc6-dev

HOST_DEPS_STEPS += provider-deps
BUILD_STEPS += provider-build
CHECK_STEPS += provider-test

.PHONY: provider-deps provider-build provider-test

provider-deps:
	@need=""; for p in $(PROVIDER_PKGS); do \
		dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	if [ -n "$$need" ]; then \
		echo "provider-deps: installing$$need"; \
		apt-get install -y --no-install-recommends $$need; fi

# Prints the path of lib/libvrdma-rdmav34.so (last line of build.sh).
provider-build:
	"$(PROVIDER_DIR)/build.sh"

provider-test:
	so=$$("$(PROVIDER_DIR)/build.sh" 2>/dev/null | tail -n1); \
	"$(PROVIDER_DIR)/tests/check-symbols.sh" "$$so"; \
	$(MAKE) -C "$(PROVIDER_DIR)/tests" RDMA_TREE="$${so%/build/lib/*}"
