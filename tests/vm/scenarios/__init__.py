"""VM scenarios, one module per area; importing them registers the scenarios."""

from . import device, verbs, perftest, rdmacm, async_events, pyverbs_suite, interop, tap  # noqa: F401
from . import ibta15, driver_checks  # noqa: F401
from . import nvmeof, nfs_rdma, rdmacm_apps, mpi  # noqa: F401  (ULPs, rdma_cm apps, MPI)
from . import multihost, trust  # noqa: F401  (D: VXLAN between hosts; E: a third guest attacks)
from . import tenancy  # noqa: F401  (H, I: port security and networks on one daemon)
from . import neighbours  # noqa: F401  (H: a flooding or refused neighbour beside a pair)
from . import lifecycle  # noqa: F401  (last: it reloads the driver)
from . import migration  # noqa: F401  (last in B: the migrated guest changes QEMU, TAP, backend)
from . import guests  # noqa: F401  (V, W: a 6.1 and a 7.3 guest; make guest-images)
