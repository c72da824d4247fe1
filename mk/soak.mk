# The soak (issue 38 item 4, tests/vm/soak.py): three vrdma guests on one daemon for
# SOAK_MINUTES minutes of QP/MR/CQ churn, perftest beside a neighbour's flood, NVMe-oF and a
# daemon restart, failing on a failed operation, a kernel warning, daemon RSS growth or a
# descriptor leak. Not part of `make test` (VMs under TCG; see the script for the bounds).
#   make soak SOAK_MINUTES=3

SOAK_MINUTES ?= 3

.PHONY: soak

soak: vm-prereqs
	python3 "$(TOP)/tests/vm/soak.py" --minutes "$(SOAK_MINUTES)" --results "$(RESULTS)/soak"
