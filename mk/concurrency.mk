# Concurrency checks of the backend (issue 38 items 1 and 5), both CHECK_STEPS:
#   make cargo-test-release  the backend's unit tests in a release build: its threads race
#                            differently than in debug (the tests that run threads beside each
#                            other make them overlap, see backend/src/sync/overlap.rs)
#   make loom-test           the loom models (`loom_*` tests, backend/src/sync/modeled.rs): every
#                            interleaving of a few threads driving the real code, up to
#                            LOOM_MAX_PREEMPTIONS preemptions, in a target directory of their own
#                            (`--cfg loom` changes every crate's flags; the normal one stays built)
# The integration tests are not run in release here: they take long to build (each test file is
# a crate of its own at opt-level 3) and run in debug under cargo-test.

CHECK_STEPS += cargo-test-release loom-test

LOOM_TARGET_DIR ?= $(VRDMA_TARGET_DIR)/loom
LOOM_MAX_PREEMPTIONS ?= 3

.PHONY: cargo-test-release loom-test

cargo-test-release:
	cd "$(TOP)" && $(CARGO) test -p vrdma-backend --lib --release

# Release at opt-level 1 without debug info: the four models run as fast as at opt-level 3
# with debug info (7.5 s against 7.7 s) and the cold step takes half the time (48.8 s against
# 1m42s, empty target directory, 2-core host at load 3-6, 2026-12-06).
loom-test:
	cd "$(TOP)" && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$(LOOM_TARGET_DIR)" \
		CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=0 \
		LOOM_MAX_PREEMPTIONS=$(LOOM_MAX_PREEMPTIONS) \
		$(CARGO) test -p vrdma-backend --lib --release loom_
