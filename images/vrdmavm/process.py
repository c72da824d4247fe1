"""Host processes (QEMU, backends): started so that they die with the launcher, stopped
politely, their logs read back."""

import ctypes
import signal
import subprocess

_PR_SET_PDEATHSIG = 1


def child_setup():
    """preexec_fn of every process the launcher starts."""
    # Die with the launcher even if it is SIGKILLed (the signal is sent when
    # the *thread* that forked exits: start processes from a long-lived one).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def stop(proc, grace=3.0):
    """SIGTERM, then SIGKILL after `grace` seconds; nothing if proc is None or gone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except OSError:
        pass


def tail(path, n=30):
    """The last n lines of a log file ("" if it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""
