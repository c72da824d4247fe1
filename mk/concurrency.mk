# Concurrency checks of the backend (issue 38 item 5), a CHECK_STEP:
#   make cargo-test-release  the backend's unit tests in a release build: its threads race
#                            differently than in debug (the tests that run threads beside each
#                            other make them overlap, see backend/src/sync/overlap.rs)
# The integration tests are not run in release here: they take long to build (each test file is
# a crate of its own at opt-level 3) and run in debug under cargo-test.

CHECK_STEPS += cargo-test-release

.PHONY: cargo-test-release

cargo-test-release:
	cd "$(TOP)" && $(CARGO) test -p vrdma-backend --lib --release
