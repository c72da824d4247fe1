# `make bench-vm`: a Linux rxe pair and a vrdma pair of TCG guests in the same run (same kernel,
# rootfs and commands), a table with ratios and an SVG plot (tests/bench_vm.py). Not part of
# `make test`: benchmarks are figures, not pass criteria.
#
#   make bench-vm                       results in $(RESULTS)/bench-vm.{log,svg}
#   make bench-vm BENCH_VM_ARGS="--iters 200 --plot docs/bench-vm.svg"

BENCH_VM_ARGS ?=

.PHONY: bench-vm

bench-vm: vm-prereqs
	python3 "$(TOP)/tests/bench_vm.py" --results "$(RESULTS)" $(BENCH_VM_ARGS)
