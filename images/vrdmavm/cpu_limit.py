"""A CPU quota on a set of host processes (cgroup v1 `cpu` or cgroup v2 `cpu.max`).

A cloud gives each guest its own vCPUs; on a small test host the guests' QEMUs share a few
cores, so one busy guest shows up as slowness of every other. A test that measures what the
*daemon* does between tenants (fair queues, rate bounds) gives each guest the same fixed share
of the host's CPU with this, so that a guest's own CPU use cannot stand in for the daemon's
fairness. Needs root and a cgroup hierarchy with the cpu controller; without one it raises
VMError saying why (a test that needs it fails loudly instead of measuring something else).
"""

import os

from .errors import VMError

V1_ROOT = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"
PERIOD_US = 100000


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


class CpuLimit:
    """Put `pids` (whole processes, all their threads) under one quota of `cores` CPUs (a
    fraction of one core is fine) until close(), which moves them back to the cgroups they
    came from and removes the group."""

    def __init__(self, name, pids, cores):
        if cores <= 0:
            raise ValueError("cores must be positive")
        self.pids = [int(p) for p in pids]
        quota = max(1000, int(cores * PERIOD_US))
        if os.path.exists(os.path.join(V1_ROOT, "cpu.cfs_quota_us")):
            self.parent = V1_ROOT
            self.dir = os.path.join(V1_ROOT, name)
            self._mkdir()
            _write(os.path.join(self.dir, "cpu.cfs_period_us"), str(PERIOD_US))
            _write(os.path.join(self.dir, "cpu.cfs_quota_us"), str(quota))
        elif "cpu" in self._v2_controllers():
            self.parent = V2_ROOT
            try:
                _write(os.path.join(V2_ROOT, "cgroup.subtree_control"), "+cpu")
            except OSError as e:
                raise VMError("cannot enable the cgroup v2 cpu controller: %s" % e)
            self.dir = os.path.join(V2_ROOT, name)
            self._mkdir()
            _write(os.path.join(self.dir, "cpu.max"), "%d %d" % (quota, PERIOD_US))
        else:
            raise VMError("no cgroup cpu controller at %s or %s: cannot give guests a fixed "
                          "CPU share" % (V1_ROOT, V2_ROOT))
        self.cores = quota / PERIOD_US
        self.origins = {pid: self._cgroup_of(pid) for pid in self.pids}
        try:
            for pid in self.pids:
                _write(os.path.join(self.dir, "cgroup.procs"), str(pid))
        except OSError as e:
            self.close()
            raise VMError("cannot put pid %s under the CPU quota %s: %s" % (pid, self.dir, e))

    def _cgroup_of(self, pid):
        """The directory of `pid`'s cgroup in this hierarchy (where close() puts it back)."""
        v1 = self.parent == V1_ROOT
        try:
            with open("/proc/%d/cgroup" % pid) as f:
                for line in f:
                    _, controllers, path = line.rstrip("\n").split(":", 2)
                    if (v1 and "cpu" in controllers.split(",")) or (not v1 and controllers == ""):
                        return os.path.join(self.parent, path.lstrip("/"))
        except OSError:
            pass
        return self.parent

    @staticmethod
    def _v2_controllers():
        try:
            with open(os.path.join(V2_ROOT, "cgroup.controllers")) as f:
                return f.read().split()
        except OSError:
            return []

    def _mkdir(self):
        try:
            os.mkdir(self.dir)
        except FileExistsError:
            pass
        except OSError as e:
            raise VMError("cannot create the cgroup %s: %s" % (self.dir, e))

    def close(self):
        for pid in self.pids:
            try:
                _write(os.path.join(self.origins.get(pid, self.parent), "cgroup.procs"), str(pid))
            except OSError:
                pass  # the process is gone
        try:
            os.rmdir(self.dir)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
