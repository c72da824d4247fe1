# vrdma top-level entry points.
#
#   make test       everything CI runs (.ci/run): host-deps, then every step below, then a summary line
#   make check      cargo fmt --check, clippy -D warnings, cargo test, the ABI agreement test (+ CHECK_STEPS)
#   make build      cargo build of the workspace (+ BUILD_STEPS: kernel module, provider, QEMU, ...)
#   make host-deps  install/verify what the build needs, idempotently (+ images/setup-host.sh, HOST_DEPS_STEPS)
#   make demo | vm-test | bench | images
#                   provided by mk/*.mk fragments; until a fragment provides one, it says so and fails
#   make help       this text and the hook variables
#
# Hooks for mk/*.mk fragments (each fragment is included below; keep them self-contained and use
# $(TOP) for paths, so the Makefile works from any checkout path):
#   HOST_DEPS_STEPS += <target>   run by `make host-deps` (must be idempotent and fast when done)
#   BUILD_STEPS     += <target>   run by `make build` and by `make test`
#   CHECK_STEPS     += <target>   run by `make check` and by `make test` (static checks, C builds)
#   TEST_STEPS      += <target>   run by `make test` only, after the checks (e.g. the VM tests in CI)
#   BACKGROUND_STEPS += <target>  started by `make test` right after host-deps; the target must
#                                 detach its work (nice, output to a log) and the step that needs
#                                 the result must wait for it (e.g. the images' step locks)
#   DEMO_TARGET     := <target>   what `make demo` runs
#   VM_TEST_TARGET  := <target>   what `make vm-test` runs
#   BENCH_TARGET    := <target>   what `make bench` runs
#   IMAGES_TARGET   := <target>   what `make images` runs
# Every step is a make target run as `$(MAKE) <target>`; it fails by exiting non-zero. `make test`
# runs every step even after a failure and ends with "make test: N passed, M failed".

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

TOP := $(abspath $(dir $(firstword $(MAKEFILE_LIST))))
export PATH := $(HOME)/.cargo/bin:$(PATH)
# One target directory per checkout. A target directory shared by several checkouts of this
# workspace is not safe: cargo gives a workspace crate the same artifact name in every checkout, so
# concurrent builds overwrite each other's vrdma_backend/vrdma_spec libraries and tests fail at
# random. An exported CARGO_TARGET_DIR is therefore ignored here; to force one anyway, pass
# VRDMA_TARGET_DIR=... (e.g. on a CI cache).
VRDMA_TARGET_DIR ?= $(TOP)/target
export CARGO_TARGET_DIR := $(VRDMA_TARGET_DIR)
CARGO ?= cargo
RESULTS ?= $(TOP)/results

HOST_DEPS_STEPS :=
BUILD_STEPS :=
CHECK_STEPS :=
TEST_STEPS :=
BACKGROUND_STEPS :=
DEMO_TARGET :=
VM_TEST_TARGET :=
BENCH_TARGET :=
IMAGES_TARGET :=

-include $(sort $(wildcard $(TOP)/mk/*.mk))

# The base steps, in order; fragments add theirs through the hook variables.
CHECK_ALL := fmt-check clippy cargo-test abi-test $(CHECK_STEPS)
TEST_ALL := build $(CHECK_ALL) $(TEST_STEPS)

.PHONY: help test check build host-deps demo vm-test bench images \
	rust-toolchain cargo-build fmt-check clippy cargo-test abi-test fmt

help:
	@sed -n '2,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))
	@echo "Hooks set by mk/*.mk here:"
	@echo "  HOST_DEPS_STEPS = $(HOST_DEPS_STEPS)"
	@echo "  BUILD_STEPS     = $(BUILD_STEPS)"
	@echo "  CHECK_STEPS     = $(CHECK_STEPS)"
	@echo "  TEST_STEPS      = $(TEST_STEPS)"
	@echo "  DEMO_TARGET=$(DEMO_TARGET) VM_TEST_TARGET=$(VM_TEST_TARGET) BENCH_TARGET=$(BENCH_TARGET) IMAGES_TARGET=$(IMAGES_TARGET)"

# ---- host dependencies ------------------------------------------------------------------------

rust-toolchain:
	@command -v $(CARGO) >/dev/null || { echo "host-deps: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
	@if ! $(CARGO) fmt --version >/dev/null 2>&1 || ! $(CARGO) clippy --version >/dev/null 2>&1; then \
		command -v rustup >/dev/null || { echo "host-deps: rustfmt/clippy missing and no rustup to add them" >&2; exit 1; }; \
		rustup component add rustfmt clippy; \
	fi
	@command -v $${CC:-cc} >/dev/null || command -v gcc >/dev/null || { \
		echo "host-deps: installing gcc (the ABI agreement test compiles C)"; \
		apt-get install -y --no-install-recommends gcc libc6-dev linux-libc-dev; }
	@test -e /usr/include/linux/types.h || apt-get install -y --no-install-recommends linux-libc-dev

host-deps: rust-toolchain $(HOST_DEPS_STEPS)
	@if [ -x "$(TOP)/images/setup-host.sh" ]; then "$(TOP)/images/setup-host.sh"; fi
	@echo "host-deps: ok"

# ---- build and checks -------------------------------------------------------------------------

cargo-build:
	cd "$(TOP)" && $(CARGO) build --workspace --all-targets

build: cargo-build $(BUILD_STEPS)

fmt:
	cd "$(TOP)" && $(CARGO) fmt --all

fmt-check:
	cd "$(TOP)" && $(CARGO) fmt --all --check

clippy:
	cd "$(TOP)" && $(CARGO) clippy --workspace --all-targets -- -D warnings

cargo-test:
	cd "$(TOP)" && $(CARGO) test --workspace

# The C header vs Rust mirror agreement (also part of cargo-test); shown here with its summary.
abi-test:
	cd "$(TOP)" && $(CARGO) test -p vrdma-spec --test abi_agreement -- --nocapture --test-threads=1

# $(call run_steps,LABEL,STEPS): runs each step as `$(MAKE) <step>`, continues after failures, logs
# the summary to $(RESULTS)/summary.log and prints it as the last line of its own output; fails if
# any step failed.
define run_steps
	@pass=0; fail=0; failed=""; mkdir -p "$(RESULTS)"; \
	for s in $(2); do \
		echo "=== $$s ($$(date -u +%TZ))"; t0=$$(date +%s); \
		if $(MAKE) -f "$(firstword $(MAKEFILE_LIST))" $$s; then \
			pass=$$((pass + 1)); echo "--- PASS $$s ($$(($$(date +%s) - t0)) s)"; \
		else \
			fail=$$((fail + 1)); failed="$$failed $$s"; echo "--- FAIL $$s ($$(($$(date +%s) - t0)) s)"; \
		fi; \
	done; \
	line="$(1): $$pass passed, $$fail failed$${failed:+ (failed:$$failed)}"; \
	echo "$$(date -u +%FT%TZ) $$line" >> "$(RESULTS)/summary.log"; \
	echo "$$line"; \
	[ $$fail -eq 0 ]
endef

check: rust-toolchain
	$(call run_steps,make check,$(CHECK_ALL))

test: host-deps
	@for s in $(BACKGROUND_STEPS); do $(MAKE) -s -f "$(firstword $(MAKEFILE_LIST))" $$s; done
	$(call run_steps,make test,$(TEST_ALL))

# ---- entry points owned by fragments ----------------------------------------------------------

demo: $(or $(DEMO_TARGET),missing-demo)
vm-test: $(or $(VM_TEST_TARGET),missing-vm-test)
bench: $(or $(BENCH_TARGET),missing-bench)
images: $(or $(IMAGES_TARGET),missing-images)

missing-%:
	@echo "make $*: not available yet: no mk/*.mk fragment provides it (set $(shell echo '$*' | tr a-z- A-Z_)_TARGET)." >&2
	@echo "make $*: nothing was run." >&2
	@exit 1
