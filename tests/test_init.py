"""Importing mcr honors mpi4py.rc (programs that initialize and finalize MPI themselves, as
mpi4py's init-fini demos): it calls no MPI that needs MPI initialized (float16 ops, TAG_UB, the
progress communicator are made at first use), and mcr calls none after MPI_Finalize."""

import pytest

from mpiharness import run_script, world_sizes

# after MPI.Init: the lazily made parts of mcr, each checked against numpy
USE_MCR = """
import numpy as np
import torch
import mcr
comm = MPI.COMM_WORLD
n = comm.Get_size()
x, y = torch.full((4,), 1.5, dtype=torch.float16), torch.zeros(4, dtype=torch.float16)
comm.Allreduce(x, y, op=MPI.SUM)                    # the first float16 reduction
assert y.tolist() == [1.5 * n] * 4, y
b, z = torch.full((2,), 2.0, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)
comm.Allreduce(b, z, op=MPI.MAX)
assert z.tolist() == [2.0, 2.0], z
tag = 40000                                         # above 32767: reads TAG_UB
if tag <= MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
    r = (comm.rank + 1) % n
    req = comm.Irecv(out := np.zeros(3), (comm.rank - 1) % n, tag)
    comm.Send(np.arange(3.0), r, tag)
    req.Wait()
    assert out.tolist() == [0.0, 1.0, 2.0]
mcr._core._poll()                                  # drives MPI: the progress comm
sub = comm.Dup()
sub.Barrier()
sub.Free()
"""

FINALIZE = "MPI.Finalize()\nassert MPI.Is_finalized()"
PROGRAMS = {     # each starts with "from mpi4py import rc"
    # mpi4py's demo/init-fini/test_1.py and test_2.py, with mcr's MPI
    "init": ["rc.initialize = False", "from mcr import MPI", "assert not MPI.Is_initialized()",
             "MPI.Init()", "assert MPI.Is_initialized() and not MPI.Is_finalized()",
             USE_MCR, FINALIZE],
    "init_thread": ["rc.initialize = False", "from mcr import MPI",
                    "assert not MPI.Is_initialized()",
                    "level = MPI.Init_thread(MPI.THREAD_MULTIPLE)",
                    "assert MPI.Query_thread() == level", USE_MCR, FINALIZE],
    # rc.threads/thread_level chosen before the import; mpi4py finalizes at exit
    "thread_level": ["rc.threads = True", "rc.thread_level = 'serialized'", "from mcr import MPI",
                     "assert MPI.Query_thread() == MPI.THREAD_SERIALIZED", USE_MCR],
    # rc.finalize = False: the program finalizes; mcr calls no MPI after it
    "finalize_self": ["rc.finalize = False", "from mcr import MPI", USE_MCR, FINALIZE,
                      "MPI.COMM_WORLD.free()"],             # a no-op on predefined handles
    # never initialized: importing mcr and leaving must not call MPI at all
    "never_initialized": ["rc.initialize = False", "rc.finalize = False", "from mcr import MPI",
                          "import mcr", "assert not MPI.Is_initialized()",
                          "assert bool(MPI.COMM_WORLD)"],
}


@pytest.mark.parametrize("nprocs", world_sizes([1, 2]))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_manages_mpi_init(tmp_path, name, nprocs):
    if name == "never_initialized" and nprocs > 1:
        pytest.skip("one process is enough: nothing communicates")
    script = tmp_path / f"{name}.py"
    script.write_text("\n".join(["from mpi4py import rc", *PROGRAMS[name], "print('done')\n"]))
    returncode, out = run_script(nprocs, [str(script)], timeout=120)
    assert returncode == 0, out
    assert out.count("done") == nprocs, out
