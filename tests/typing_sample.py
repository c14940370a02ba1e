"""An mcr program written the way users write them, for tests/test_typing.py: mypy must accept
it (the stubs describe what users call), and it runs, under mpiexec or not.
"""

import numpy as np
import torch

import mcr
from mcr import MPI

comm = MPI.COMM_WORLD
rank: int = comm.Get_rank()
size: int = comm.size
assert isinstance(comm, mcr.Comm) and comm is mcr.COMM_WORLD

# Blocking collectives, in place, with mpi4py's ops and datatypes
grad = torch.full((8,), float(rank + 1), dtype=torch.float64)
comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
comm.Allreduce(MPI.IN_PLACE, [grad, 8, MPI.DOUBLE], op=mcr.SUM, backend="auto")
assert grad[0].item() == size * size * (size + 1) // 2

# A vector gather, non-blocking: [buf, counts, displs]
counts = [r + 1 for r in range(size)]
displs = [sum(counts[:r]) for r in range(size)]
mine = torch.full((rank + 1,), rank, dtype=torch.int32)
out = torch.empty(sum(counts), dtype=torch.int32)
req: mcr.Request = comm.Igatherv(mine, [out, counts, displs], root=0, backend="mpi")
req.Wait()

# Point-to-point with a status, and a set of requests
status = mcr.Status()
buf = np.zeros(4, dtype=np.float32)
reqs = [comm.Irecv(buf, source=rank, tag=7), comm.Isend(np.ones(4, dtype=np.float32), rank, 7)]
statuses: list[mcr.Status] = []
mcr.Request.Waitall(reqs, statuses)
n: int = statuses[0].Get_count()
assert n == 4 and statuses[0].Get_source() == rank and statuses[0].tag == 7
comm.Sendrecv(np.ones(2, dtype=np.float32), rank, 3, buf[:2], rank, 3, status=status)
assert status.Get_count(MPI.FLOAT) == 2 and status.Get_count("d") == 1
index: int = MPI.Request.Waitany([comm.Ibarrier()])
done: list[int] | None = mcr.Request.Waitsome([comm.Ibcast(grad, root=0)])

# Persistent operations
x, y = torch.arange(4, dtype=torch.float32), torch.empty(4, dtype=torch.float32)
preq: mcr.Prequest = comm.Allreduce_init(x, y, op=MPI.MAX)
for step in range(3):
    x += 1
    preq.Start()
    preq.Wait()
preq.Free()
both = [comm.Bcast_init(grad, root=0), comm.Barrier_init(info=MPI.INFO_NULL)]
mcr.Prequest.Startall(both)
assert mcr.Request.Testall(both) or mcr.Request.Waitall(both)
for p in both:
    p.Free()

# Communicators and errors
sub = comm.Split(color=rank % 2, key=rank)
sub.Barrier(backend=None)
sub.Free()
try:
    comm.Recv(buf, source=MPI.PROC_NULL, tag=MPI.ANY_TAG)
except MPI.Exception as exc:
    print(exc.Get_error_class())
t0: float = MPI.Wtime()
print(f"rank {rank}: ok, {mcr.build_info()['mpicc']}, {MPI.Wtime() - t0:.3f} s")
