# `make bench`: benchmark figures for the [engine] and [odp] issues (backend/benches/vrdma).
# Not part of `make test`. Owned by the bench engineer.
#
#   make bench                     every section, printed as tables (a few minutes at most)
#   make bench BENCH_ARGS="engine odp-reg"    only some sections
#                                  (engine, engine-qps, odp-reg, odp-touch, odp-steady, wire,
#                                  control-wait, headline: the closing headline lines, run last;
#                                  only when named: udp, fabric, fabric-64, idle-qps,
#                                  pair-ceiling, workers, fairness, tenants-8, the headline's
#                                  points alone, to profile)
#   make bench BENCH_ARGS=--quick  fewer and shorter runs
# The tables are also saved to $(RESULTS)/bench.txt.

BENCH_TARGET := bench-run
BENCH_ARGS ?=

.PHONY: bench-run bench-build

bench-build:
	cd "$(TOP)" && $(CARGO) bench -p vrdma-backend --bench vrdma --no-run

bench-run: bench-build
	@mkdir -p "$(RESULTS)"
	cd "$(TOP)" && $(CARGO) bench -p vrdma-backend --bench vrdma -- $(BENCH_ARGS) | tee "$(RESULTS)/bench.txt"
