#!/usr/bin/python3
"""MPI ping-pong between two ranks (mpi4py): checks every reply byte for byte and prints the
round-trip time per size. Exit status 0 only if every message came back intact."""

import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if size != 2:
    print("need exactly 2 ranks, got %d" % size)
    sys.exit(2)
peer = 1 - rank
names = comm.allgather(MPI.Get_processor_name())
if rank == 0:
    print("ranks on %s and %s" % (names[0], names[1]))
if names[0] == names[1]:
    print("both ranks run on %s: not a test between two hosts" % names[0])
    sys.exit(2)
ok = True
for nbytes in (8, 4096, 65536, 1 << 20):
    iters = 200 if nbytes <= 65536 else 20
    buf = bytearray(nbytes)
    t0 = time.perf_counter()
    for i in range(iters):
        if rank == 0:
            msg = bytes((i + j) & 0xFF for j in range(min(nbytes, 256))) * (nbytes // 256 or 1)
            msg = msg[:nbytes].ljust(nbytes, b"\x5a")
            comm.Send(msg, dest=peer, tag=i)
            comm.Recv(buf, source=peer, tag=i)
            if bytes(buf) != msg:
                ok = False
        else:
            comm.Recv(buf, source=peer, tag=i)
            comm.Send(buf, dest=peer, tag=i)
    dt = time.perf_counter() - t0
    if rank == 0:
        print("pingpong %8d B  %4d iters  %10.1f us/round trip" % (nbytes, iters, dt / iters * 1e6))
if rank == 0:
    print("pingpong data %s" % ("OK" if ok else "CORRUPT"))
sys.exit(0 if ok else 1)
