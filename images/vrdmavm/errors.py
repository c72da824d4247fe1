"""The launcher's exceptions."""


class VMError(Exception):
    """A guest, its QEMU or its backend failed."""


class CommandTimeout(VMError, TimeoutError):
    """A command did not finish in time (it was killed in the guest)."""

    def __init__(self, msg, rc=None, out=""):
        super().__init__(msg)
        self.rc = rc
        self.out = out
