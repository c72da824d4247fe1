#!/usr/bin/python3
"""ibv_advise_mr with another PD's lkey must fail (vrdma.ko checks each SGE's MR is an ODP MR of
the caller's PD) while the same advice on the MR's own PD succeeds.

  advise_cross_pd.py DEV
Prints one verdict line per case; exits 0 only if both behave."""

import errno
import sys

import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.wr import SGE

LEN = 1 << 20
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_ON_DEMAND


def advise(pd, mr):
    pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, e._IBV_ADVISE_MR_FLAG_FLUSH,
                 [SGE(mr.buf, LEN, mr.lkey)])


def main(dev):
    ctx = Context(name=dev)
    own, other = PD(ctx), PD(ctx)
    mr = MR(own, LEN, ACCESS)
    ok = True
    try:
        advise(own, mr)
        print("own PD: advice accepted")
    except PyverbsRDMAError as ex:
        print("own PD: advice refused: %s" % ex)
        ok = False
    try:
        advise(other, mr)
        print("other PD: advice ACCEPTED (the lkey of another PD's MR was forwarded)")
        ok = False
    except PyverbsRDMAError as ex:
        code = getattr(ex, "error_code", None)
        print("other PD: advice refused (errno %s)" % code)
        if code not in (errno.EFAULT, errno.EINVAL, errno.EPERM):
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
