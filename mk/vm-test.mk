# The VM test suite (tests/vm) and the demo (tests/demo.py). Owned by the lead.
#
#   make vm-test     images + release backend, then every VM scenario (tests/vm/run.py)
#   make demo        images + release backend, then two guests doing RDMA for a person to watch
#   make vm-test-ci  the scenarios marked @scenario(..., ci=True) (part of `make test`)
#   make scenarios-catalogue  write docs/scenarios.md from the scenario registry (tests/vm/catalogue.py)
#   make vm-test-repeat RUNS=10   the CI scenarios RUNS times in a row, failures tallied per
#                    scenario and appended to results/vm-repeat/record.txt (tests/vm/repeat.py)
#   make vm-test-guests  the cross-version scenarios (tests/vm/scenarios/guests.py: a 6.1
#                    guest with rdma-core 44 and a 7.3 guest; make guest-images builds them)
#   make test-matrix what `make test` leaves out across guest versions (today: vm-test-guests)
#   VM_TEST_ARGS     extra arguments for tests/vm/run.py, e.g. VM_TEST_ARGS="-k rping"

VM_TEST_ARGS ?=

DEMO_TARGET := demo-run
VM_TEST_TARGET := vm-test-run
# CI runs the scenarios marked ci=True in their @scenario (those that pass reliably).
TEST_STEPS += vm-test-ci

RUNS ?= 10

# The committed catalogue docs/scenarios.md must be what the registry generates (no VM, 1 s).
CHECK_STEPS += scenarios-catalogue-check

.PHONY: vm-prereqs backend-release vm-test-run vm-test-ci vm-test-repeat vm-test-guests test-matrix \
	demo-run scenarios-catalogue \
	scenarios-catalogue-check

# The daemon, and the test frontend the tenancy scenarios run against it (neighbours.py).
backend-release:
	cd "$(TOP)" && $(CARGO) build --release -p vrdma-backend --bin vrdma-backend \
		--example hostile_frontend

vm-prereqs: backend-release
	$(MAKE) -f "$(TOP)/Makefile" images

# every scenario: the guests.py ones boot the other guest images too
vm-test-run: vm-prereqs guest-images
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" $(VM_TEST_ARGS)

vm-test-ci: vm-prereqs
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" --ci $(VM_TEST_ARGS)

vm-test-repeat: vm-prereqs
	python3 "$(TOP)/tests/vm/repeat.py" $(RUNS) --ci $(VM_TEST_ARGS)

vm-test-guests: vm-prereqs guest-images
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" -k guests_ $(VM_TEST_ARGS)

test-matrix: vm-test-guests

demo-run: vm-prereqs
	python3 "$(TOP)/tests/demo.py"

scenarios-catalogue:
	python3 "$(TOP)/tests/vm/catalogue.py" --write

scenarios-catalogue-check:
	python3 "$(TOP)/tests/vm/catalogue.py" --check
