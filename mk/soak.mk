# The soak (issue 38 item 4, tests/vm/soak.py): three vrdma guests on one daemon for
# SOAK_MINUTES minutes of QP/MR/CQ churn, perftest beside a neighbour's flood, NVMe-oF, a
# daemon restart and the live migration of a fourth guest that talks to them; it fails on a
# failed operation, a kernel warning, daemon RSS growth or a descriptor leak (see the script
# for the bounds). `make test` runs the short version (soak-ci, 3 minutes: about 5 minutes
# with the boot); longer runs by hand:
#   make soak SOAK_MINUTES=60

SOAK_MINUTES ?= 3

TEST_STEPS += soak-ci

.PHONY: soak soak-ci

soak: vm-prereqs
	python3 "$(TOP)/tests/vm/soak.py" --minutes "$(SOAK_MINUTES)" --results "$(RESULTS)/soak"

soak-ci: vm-prereqs
	python3 "$(TOP)/tests/vm/soak.py" --minutes 3 --results "$(RESULTS)/soak-ci"
