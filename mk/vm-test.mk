# The VM test suite (tests/vm) and the demo (tests/demo.py). Owned by the lead.
#
#   make vm-test     images + release backend, then every VM scenario (tests/vm/run.py)
#   make demo        images + release backend, then two guests doing RDMA for a person to watch
#   VM_TEST_ARGS     extra arguments for tests/vm/run.py, e.g. VM_TEST_ARGS="-k rping"

VM_TEST_ARGS ?=

DEMO_TARGET := demo-run
VM_TEST_TARGET := vm-test-run

.PHONY: vm-prereqs backend-release vm-test-run demo-run

backend-release:
	cd "$(TOP)" && $(CARGO) build --release -p vrdma-backend

vm-prereqs: backend-release
	$(MAKE) -f "$(TOP)/Makefile" images

vm-test-run: vm-prereqs
	python3 "$(TOP)/tests/vm/run.py" --results "$(RESULTS)/vm" $(VM_TEST_ARGS)

demo-run: vm-prereqs
	python3 "$(TOP)/tests/demo.py"
