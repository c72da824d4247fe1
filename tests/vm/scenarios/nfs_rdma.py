"""NFSv4 over RDMA (rpcrdma, port 20049) with the guest kernel's nfsd and nfs client and the
distro's nfs-utils: write, read back, checksum on both ends, unmount."""

import re
import time

from harness import expect, expect_in, run_ok, scenario

EXPORT = "/srv/nfs"
MNT = "/mnt/nfs"
# (file name, MiB): a few sizes across the inline, chunked-write and chunked-read paths
FILES = [("small", 1), ("medium", 8), ("large", 32)]
UMOUNT_S = 30


def server_up(vm):
    """nfsd v4 only with an RDMA listener. No systemd here: the steps the units would take."""
    run_ok(vm, " && ".join([
        "modprobe nfsd",
        "modprobe rpcrdma",
        "mkdir -p %s /var/lib/nfs/v4recovery /run/rpcbind" % EXPORT,
        "mount -t tmpfs -o size=128m tmpfs %s" % EXPORT,
        "(mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd)",
        # A short grace period: this server has no clients to wait for.
        "echo 10 > /proc/fs/nfsd/nfsv4leasetime",
        "echo 10 > /proc/fs/nfsd/nfsv4gracetime",
        "echo '%s *(rw,fsid=0,no_root_squash,insecure,no_subtree_check)' > /etc/exports" % EXPORT,
        "(pgrep -x rpcbind >/dev/null || rpcbind -w)",
        "exportfs -ra",
        "rpc.mountd --no-nfs-version 3",
        "rpc.nfsd --no-nfs-version 3 --nfs-version 4.2 4",
        "echo 'rdma 20049' > /proc/fs/nfsd/portlist",
        "grep -q 'rdma 20049' /proc/fs/nfsd/portlist",
    ]), timeout=120)


def server_down(vm):
    vm.run("; ".join([
        "rpc.nfsd 0",
        "exportfs -ua",
        "pkill -x rpc.mountd",
        "pkill -x rpcbind",
        "umount /proc/fs/nfsd",
        "umount %s" % EXPORT,
    ]), timeout=120)


@scenario("two_vrdma_fabric", ci=True, timeout=900)
def nfs_v4_over_rdma(ctx):
    """NFSv4.2 over RDMA (`mount -o rdma,port=20049`): files written through the mount have the
    same checksums on both ends."""
    srv, cli = ctx.a, ctx.b
    server_up(srv)
    try:
        run_ok(cli, "modprobe nfsv4 && modprobe rpcrdma && mkdir -p %s" % MNT)
        # The server refuses new state during its (short) grace period: retry the mount.
        out = run_ok(cli, "for i in $(seq 30); do mount -t nfs4 -o rdma,port=20049,vers=4.2 "
                     "%s:/ %s && exit 0; sleep 2; done; exit 1" % (srv.ip, MNT), timeout=180)
        mounts = run_ok(cli, "grep ' %s ' /proc/mounts" % MNT)
        expect(re.search(r"proto=rdma", mounts) is not None, "the mount uses RDMA", mounts)
        expect_in("port=20049", mounts, "/proc/mounts")
        sums = {}
        t0 = time.monotonic()
        for name, mib in FILES:
            run_ok(srv, "true")  # keep both agents warm
            out = run_ok(cli, "dd if=/dev/urandom of=/tmp/%s bs=1M count=%d status=none && "
                         "cp /tmp/%s %s/%s && sync && sha256sum /tmp/%s" % (
                             name, mib, name, MNT, name, name), timeout=300)
            sums[name] = out.split()[0]
        written = time.monotonic() - t0
        # Read back through the client after dropping its page cache, and on the server itself.
        run_ok(cli, "echo 3 > /proc/sys/vm/drop_caches")
        for name, _ in FILES:
            back = run_ok(cli, "sha256sum %s/%s" % (MNT, name), timeout=300).split()[0]
            expect(back == sums[name], "%s read back over NFS/RDMA matches (%s != %s)" % (
                name, back, sums[name]))
            there = run_ok(srv, "sha256sum %s/%s" % (EXPORT, name), timeout=120).split()[0]
            expect(there == sums[name], "%s on the server matches what the client wrote" % name)
        stats = run_ok(cli, "grep -A3 'xprt:' /proc/self/mountstats")
        expect(re.search(r"xprt:\s+rdma", stats) is not None, "mountstats shows an RDMA transport",
               stats)
        ctx.note("wrote %d MiB in %.1f s over NFSv4.2/RDMA" % (
            sum(m for _, m in FILES), written))
        t0 = time.monotonic()
        run_ok(cli, "umount %s" % MNT, timeout=UMOUNT_S + 30)
        dt = time.monotonic() - t0
        expect(dt < UMOUNT_S, "umount returned within %d s (%.1f s)" % (UMOUNT_S, dt))
        gone = cli.run("grep ' %s ' /proc/mounts" % MNT)[0]
        expect(gone != 0, "the mount is gone")
    finally:
        cli.run("umount -f %s" % MNT, timeout=60)
        server_down(srv)
