# Coverage-guided fuzzing ([hardening] "Coverage-guided fuzzing"): AFL++ targets on the stable
# toolchain through cargo-afl, in the crate fuzz/ (its own workspace and Cargo.lock; the main
# workspace never builds it). Targets: control (commands), wqe (SQ WQEs), pagelist (REG_MR,
# fast-reg and ring page lists), packet (wire frames, both roles), vring (descriptor chains),
# snapshot (migration state streams), vhost_user (frontend messages), fabric (multi-port frames).
#
#   make fuzz                      each target for FUZZ_SECONDS (60), with execs/s and coverage
#   make fuzz FUZZ_TARGETS=packet FUZZ_SECONDS=600
#   FUZZ_TIMEOUT_MS=10000 chrt -i 0 make fuzz ...   a campaign on the host's idle time only:
#                                  a longer hang limit (2 s by default), as an execution
#                                  may wait seconds for a CPU
#   make fuzz-smoke                (in `make test`) every seed replayed (vhost_user's also three
#                                  times at once in PID namespaces), then each target fuzzed
#                                  FUZZ_SMOKE_SECONDS (4) from fuzz/corpus/<target>/; fails loudly
#   make fuzz-corpus               regenerate fuzz/corpus/ from real commands, WQEs and frames
#   make fuzz-cmin FUZZ_TARGETS=t  fold the last `make fuzz` run's queue into fuzz/corpus/<t>/,
#                                  minimized (afl-cmin): the next campaign starts from there;
#                                  found inputs over FUZZ_CMIN_MAX_BYTES (4096) are left out
#   make fuzz-report               per target: CPU-hours fuzzed so far, executions, edges, crashes
#                                  found and still open
# The ledger fuzz/campaigns.tsv (committed) gets one line per target of every `make fuzz`; smoke
# runs are not campaigns and are not recorded. A crash is closed by a line in fuzz/findings.tsv
# (the campaign line's date and target, the count, the fixing commit, its regression test).
# Findings: $(RESULTS)/fuzz/<target>/default/crashes/; replay one with
#   $(VRDMA_TARGET_DIR)/fuzz/release/<target> < <file>
# (VRDMA_FUZZ_REPEAT=N: N executions in one process, as in AFL's persistent mode, for a finding
# that needs what earlier executions left behind; VRDMA_FUZZ_TRACE=1: what the harness did).

FUZZ_TARGETS ?= control wqe pagelist packet vring snapshot vhost_user fabric
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 4
FUZZ_OUT ?= $(RESULTS)/fuzz
FUZZ_LEDGER ?= $(TOP)/fuzz/campaigns.tsv
# The fuzz build (instrumented, `fuzzing` feature) never shares artifacts with the workspace's.
FUZZ_TARGET_DIR := $(VRDMA_TARGET_DIR)/fuzz
FUZZ_BIN := $(FUZZ_TARGET_DIR)/release
# Must match the `afl` crate version in fuzz/Cargo.lock.
CARGO_AFL_VERSION := 0.18.2

HOST_DEPS_STEPS += fuzz-deps
BUILD_STEPS += fuzz-build
TEST_STEPS += fuzz-smoke

.PHONY: fuzz fuzz-deps fuzz-build fuzz-smoke fuzz-corpus fuzz-cmin fuzz-report

# Idempotent: installs only what is missing. AFL++ itself is built by cargo-afl from the copy
# of its sources in the crate (needs make and a C compiler), so crates.io and Debian suffice.
fuzz-deps:
	@command -v make >/dev/null || apt-get install -y --no-install-recommends make
	@command -v cc >/dev/null || apt-get install -y --no-install-recommends gcc libc6-dev
	@if ! $(CARGO) afl --version 2>/dev/null | grep -q "cargo-afl $(CARGO_AFL_VERSION)"; then \
		echo "fuzz-deps: installing cargo-afl $(CARGO_AFL_VERSION)"; \
		$(CARGO) install cargo-afl --locked --version $(CARGO_AFL_VERSION); \
	fi
	@out=$$($(CARGO) afl config --build 2>&1) || echo "$$out" | grep -q "already built" || { \
		echo "$$out" >&2; echo "fuzz-deps: building AFL++ failed" >&2; exit 1; }

fuzz-build:
	cd "$(TOP)/fuzz" && CARGO_TARGET_DIR="$(FUZZ_TARGET_DIR)" $(CARGO) afl build --release --locked

fuzz-smoke: fuzz-build
	"$(TOP)/fuzz/fuzz.sh" smoke "$(FUZZ_BIN)" "$(FUZZ_OUT)/smoke" $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

fuzz: fuzz-build
	@mkdir -p "$(FUZZ_OUT)"
	FUZZ_LEDGER="$(FUZZ_LEDGER)" "$(TOP)/fuzz/fuzz.sh" run "$(FUZZ_BIN)" "$(FUZZ_OUT)" \
		$(FUZZ_SECONDS) $(FUZZ_TARGETS) | tee "$(FUZZ_OUT).txt"

fuzz-report:
	@"$(TOP)/fuzz/fuzz.sh" report "$(FUZZ_LEDGER)"

fuzz-cmin:
	"$(TOP)/fuzz/fuzz.sh" cmin "$(FUZZ_BIN)" "$(FUZZ_OUT)" 0 $(FUZZ_TARGETS)

fuzz-corpus: fuzz-build
	cd "$(TOP)/fuzz" && "$(FUZZ_BIN)/gen_corpus" corpus
