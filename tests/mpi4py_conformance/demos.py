"""The one table of mpi4py's demos (``demo/`` of its sdist) that the demo test runs ported to mcr,
and of those it leaves out, each with its reason.

tests/test_mpi4py_demos.py runs each demo as shipped, on mpi4py, and ported (every ``from mpi4py
import MPI`` is ``from mcr import MPI``): both must exit with 0, and the ported run must print what
the shipped one prints (``output``). docs/conf.py renders both tables into docs/porting.rst.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Demo:
    """A demo, and how its ported run is checked: ``output`` ``"same"``, the lines mpi4py's
    run prints, in any order; ``"timings"``, the same once every number is masked (a
    benchmark); ``"close"``, the same with numbers compared to 1e-12 (sums that arrive in
    any order, as one-sided ``Accumulate``'s); ``"exit"``, only the exit status (a demo that
    checks its results with asserts)."""

    path: str                           # below demo/
    args: tuple[str, ...] = ()
    sizes: tuple[int, ...] = (2, 3)
    output: str = "exit"
    stdin: str = ""
    build: tuple[str, ...] = ()         # a command run first in the demo's folder
    # ("mpicc" is the mpicc beside the mpiexec the test uses)
    retry: str = ""                     # why the ported run gets a second try: a
    # failure that plain mpi4py has too, measured (empty: one try)
    shared: bool = False                # runs in one job with the other shared demos
    # of its folder (each alone again if anything in that job goes wrong)
    timeout: float = 60                 # seconds for one run (the longest takes about 8 s;
    # a hung run costs this)

    @property
    def name(self) -> str:
        return " ".join((self.path, *self.args))


_PI_INPUT = "100\n1000\n10000\n0\n"     # interval counts; 0 ends the demo
_RC_OPTIONS = ("threads=true", "threads=false", "thread_level=single", "thread_level=funneled",
               "thread_level=serialized", "thread_level=multiple", "fast_reduce=true",
               "fast_reduce=false", "recv_mprobe=true", "recv_mprobe=false", "errors=default",
               "errors=exception", "errors=abort", "errors=fatal")

DEMOS = [
    Demo("helloworld.py", sizes=(1, 2, 3), output="same"),
    Demo("sequential/test_seq.py", output="same"),
    Demo("compute-pi/cpi-cco.py", output="same", stdin=_PI_INPUT),
    Demo("compute-pi/cpi-rma.py", output="close", stdin=_PI_INPUT),
    Demo("mandelbrot/mandelbrot.py", output="timings"),
    Demo("reductions/test_reductions.py", args=("-q",)),
    Demo("threads/sendrecv.py"),
    Demo("wrap-ctypes/test.py", output="same",
         build=("mpicc", "-shared", "-fPIC", "-o", "libhelloworld.so", "helloworld.c")),
    # the OSU benchmarks time loops of 1 B to 1 MiB: a run checks the port, not the MPI
    # library (mpi4py's suite runs the collectives at 3), so each runs at one size
    *(Demo(f"osu_{name}.py", sizes=(2,), output="timings")
      for name in ("allgather", "alltoall", "alltoallv", "barrier", "bcast", "gather",
                   "scatter")),
    *(Demo(f"osu_{name}.py", sizes=(2,), output="timings")       # "exactly two processes"
      for name in ("bw", "bibw", "latency")),
    Demo("osu_multi_lat.py", sizes=(4,), output="timings"),      # pairs: two of them
    *(Demo(f"mpi-ref-v1/ex-{number}.py", shared=True)
      for number in ("2.01", "2.08", "2.16", "2.29", "2.32", "2.34", "2.35", "3.01", "3.02",
                     "3.03", "3.04", "3.05", "3.06", "3.07", "3.08", "3.09", "3.11", "3.12",
                     "3.13")),
    Demo("nxtval/nxtval-threads.py", sizes=(2, 4)),
    Demo("nxtval/nxtval-onesided.py", sizes=(2, 4)),
    # not at 4: its Mutex (add 1 to a counter; taken: subtract 1, add 1 again)
    # livelocks two waiting processes on plain mpi4py too (3 runs in 16 hung)
    Demo("nxtval/nxtval-scalable.py", sizes=(2,)),
    Demo("nxtval/nxtval-mpi3.py", sizes=(2, 4), timeout=15,   # at 3 it fails its assert on
         # mpi4py too; it takes 0.5 s
         retry="Open MPI's ``Get_accumulate`` under ``Win.Lock`` now and then loses an update, "
               "on plain mpi4py too: two processes get the same counter value (2 runs in 50 "
               "at 2 processes), or the demo's mutex keeps a count nobody holds and its "
               "waiter spins forever (2 runs in 150 at 2 processes; 1 in 60 ported), so a "
               "run gets 15 s"),
    *(Demo("init-fini/test_0.py", args=(option,), sizes=(2,)) for option in _RC_OPTIONS),
    *(Demo(f"init-fini/test_{n}.py", sizes=(2,)) for n in (1, 2, 3, 4, 5)),
    Demo("init-fini/test_mpi40.py", sizes=(2,)),
]

_SPAWN = ("dynamic processes (``Spawn``): mpi4py's own methods, which mcr does not claim "
          "(left out of the conformance run too)")
_COMPILED = ("compiled against mpi4py's C API or headers (C, C++, Fortran, Cython, "
             "binding generators); ``wrap-ctypes`` runs, and shows a ported communicator's "
             "handle reaching C")

LEFT_OUT = [
    ("futures/", "``mpi4py.futures`` runs on mpi4py's own ``MPI`` module inside the "
     "package; a port does not change it"),
    ("profiling/", "``mpi4py.profile`` loads MPE or VampirTrace, which the wheels here do "
     "not ship"),
    ("test-run/", "tests ``python -m mpi4py``, mpi4py's command line, not the ``MPI`` module"),
    ("check-mpiexec/", "shell scripts about the mpiexec environment"),
    ("init-fini/test_6.py", "checks the warnings of ``import mpi4py.MPI`` itself; nothing "
     "in it is ported"),
    ("mandelbrot/mandelbrot-seq.py", "sequential: no MPI"),
    ("compute-pi/cpi-dpm.py", _SPAWN),
    ("nxtval/nxtval-dynproc.py", _SPAWN),
    ("spawning/", _SPAWN + "; its workers are compiled programs"),
    ("mandelbrot/mandelbrot-master.py", _SPAWN + "; its worker is a Fortran program"),
    *((folder, _COMPILED) for folder in (
        "cython/", "embedding/", "libmpi-cffi/", "wrap-boost/", "wrap-c/", "wrap-cffi/",
        "wrap-ctypes-f08/", "wrap-ctypes-f90/", "wrap-cython/", "wrap-f2py/", "wrap-nanobind/",
        "wrap-pybind11/", "wrap-swig/", "helloworld.c", "helloworld.cxx", "helloworld.f08",
        "helloworld.f90")),
    ("python-config", "prints the build flags of Python; no MPI"),
    ("cuda-aware-mpi/", "CuPy and Numba arrays on a GPU (``__cuda_array_interface__``); "
     "tests/gpu/check_gpu.py covers mcr on CUDA tensors"),
]
