# The VM test suite (tests/vm) and the demo (tests/demo.py). Owned by the lead.
#
#   make vm-test     images + release backend, then every VM scenario (tests/vm/run.py)
#   make demo        images + release backend, then two guests doing RDMA for a person to watch
#   make vm-test-ci  the scenarios of tests/vm/ci-scenarios.txt (part of `make test`)
#   VM_TEST_ARGS     extra arguments for tests/vm/run.py, e.g. VM_TEST_ARGS="-k rping"

VM_TEST_ARGS ?=

DEMO_TARGET := demo-run
VM_TEST_TARGET := vm-test-run
# CI runs the scenarios listed in tests/vm/ci-scenarios.txt (those that pass today).
TEST_STEPS += vm-test-ci

.PHONY: vm-prereqs backend-release vm-test-run vm-test-ci vm-test-ci-run vm-test-background demo-run

# `make test` starts the CI scenarios right after host-deps, in the background (at nice -5 where
# allowed), because they need only the release daemon and the images: measured on the 2-core CI
# host, the scenarios leave 34-42 % of the CPU idle (TCG guests waiting for each other, boots),
# and the Rust checks in the foreground use it instead of starting the 11-minute VM run after
# them (the long compiles as SCHED_IDLE, `IDLE_CPU` in the Makefile). The TEST_STEP vm-test-ci then waits for that run, prints its log and has its status.
# VRDMA_RUN_ID (set once per top-level make, inherited by the sub-makes) ties the two: a
# vm-test-ci outside such a `make test` (or a stale log from an earlier one) runs the
# scenarios itself.
VM_BG := $(RESULTS)/vm-test-background
BACKGROUND_STEPS += vm-test-background
vm-test-background:
	@mkdir -p "$(RESULTS)"; rm -f "$(VM_BG).rc" "$(VM_BG).log"
	@echo "$(VRDMA_RUN_ID)" > "$(VM_BG).id"
	@echo "vm-test-ci: started in the background (log: $(VM_BG).log)"
	@nohup nice -n -5 sh -c '$(MAKE) -f "$(TOP)/Makefile" vm-test-ci-run; echo $$? > "$(VM_BG).rc.tmp"; \
		mv "$(VM_BG).rc.tmp" "$(VM_BG).rc"' >"$(VM_BG).log" 2>&1 </dev/null &

vm-test-ci:
	@if [ "$$(cat "$(VM_BG).id" 2>/dev/null)" != "$(VRDMA_RUN_ID)" ]; then \
		exec $(MAKE) -f "$(TOP)/Makefile" vm-test-ci-run; fi; \
	echo "vm-test-ci: waiting for the background run (log: $(VM_BG).log)"; \
	t0=$$(date +%s); \
	while [ ! -f "$(VM_BG).rc" ]; do \
		if [ $$(( $$(date +%s) - t0 )) -gt 5400 ]; then \
			echo "vm-test-ci: the background run did not end within 90 minutes" >&2; \
			cat "$(VM_BG).log"; exit 1; fi; \
		sleep 5; \
	done; \
	cat "$(VM_BG).log"; rc=$$(cat "$(VM_BG).rc"); \
	echo "vm-test-ci: background run exited with $$rc (waited $$(( $$(date +%s) - t0 )) s)"; \
	[ "$$rc" = 0 ]

backend-release:
	cd "$(TOP)" && $(CARGO) build --release -p vrdma-backend

vm-prereqs: backend-release
	$(MAKE) -f "$(TOP)/Makefile" images

vm-test-run: vm-prereqs
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" $(VM_TEST_ARGS)

vm-test-ci-run: vm-prereqs
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" \
		--scenarios "$(TOP)/tests/vm/ci-scenarios.txt" $(VM_TEST_ARGS)

demo-run: vm-prereqs
	python3 "$(TOP)/tests/demo.py"
