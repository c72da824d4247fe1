"""VM scenarios, one module per area; importing them registers the scenarios."""

from . import device, verbs, perftest, rdmacm, async_events, pyverbs_suite, interop, tap  # noqa: F401
from . import ibta15, driver_checks  # noqa: F401
from . import nvmeof, nfs_rdma, rdmacm_apps, mpi  # noqa: F401  (ULPs, rdma_cm apps, MPI)
from . import multihost, trust  # noqa: F401  (VXLAN between hosts; a third guest attacks)
from . import tenancy  # noqa: F401  (port security and networks on one daemon)
from . import neighbours  # noqa: F401  (a flooding or refused neighbour beside a pair)
from . import lifecycle  # noqa: F401  (last: it reloads the driver)
# last in two_vrdma_tap: the migrated guest changes QEMU, TAP, backend
from . import migration  # noqa: F401
from . import guests  # noqa: F401  (a 6.1 and a 7.3 guest, each way; make guest-images)
