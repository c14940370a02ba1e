"""A third-party backend, added through the ``mcr.backends`` entry-point group.

A real package is written to a temporary directory with its ``*.dist-info``
(``entry_points.txt``), put on the MPI job's PYTHONPATH, and found by
importlib.metadata as an installed distribution would be:

- ``tiny`` (distribution ``tinybackend``): a backend whose sub-communicator
  defines only the three primitives (``tensor_alltoall``, ``tensor_send``,
  ``tensor_recv``) on mpi4py, and reduces nothing itself. Every operation
  runs by composition: every collective blocking, non-blocking and
  persistent; every reduction op on every element type it applies to, with
  IN_PLACE; every send mode, receive, Sendrecv(_replace), Probe/Iprobe,
  ANY_SOURCE; compared with torch on the whole data. Its ``native`` is empty.
- distribution ``brokenbackend``: an entry point ``broken`` whose module does
  not import (the error names the entry point and the distribution, when the
  backend is asked for, not before), and one named ``gloo``, which mcr's own
  gloo overrides (a warning says so).
"""

import os
import tempfile
import warnings

import pytest
import torch

import mcr
import mcr.backends
from ccoref import OP_NAMES, operands, reduce_ref, reduction_cases
from mcr.backends.base import Backend, Subcomm
from mpiharness import case, mpi_cases
from test_backend_registry import collective_forms, ring_messages
from util import Failures, assert_comm_works, raises

TINY = "tiny"

PLUGIN = '''
"""tinybackend: a backend for mcr defining only the primitives, on mpi4py."""

from mpi4py import MPI

from mcr.backends.base import Backend, Subcomm


class MpiWork:
    def __init__(self, request, *keep):
        self.request, self.keep = request, keep

    def is_completed(self):
        return self.request.Test()

    def wait(self):
        self.request.Wait()


def displacements(split):
    return [sum(split[:i]) for i in range(len(split))]


class TinySubcomm(Subcomm):
    def connect(self):
        self.mpi = self.comm.to_mpi4py().Dup()

    def disconnect(self):
        self.mpi.Free()

    def tensor_alltoall(self, output, input, output_split, input_split):
        send = [input.numpy(), (input_split, displacements(input_split)), MPI.BYTE]
        recv = [output.numpy(), (output_split, displacements(output_split)), MPI.BYTE]
        return MpiWork(self.mpi.Ialltoallv(send, recv), send, recv)

    def tensor_send(self, tensor, dest, tag):
        return MpiWork(self.mpi.Isend([tensor.numpy(), MPI.BYTE], dest, tag), tensor)

    def tensor_recv(self, tensor, source, tag):
        return MpiWork(self.mpi.Irecv([tensor.numpy(), MPI.BYTE], source, tag), tensor)


class TinyBackend(Backend):
    name = "tiny"
    devices = frozenset({"cpu"})
    subcomm = TinySubcomm
'''

DISTRIBUTIONS = {
    "tinybackend": "tiny = tinybackend:TinyBackend\n",
    "brokenbackend": "broken = brokenbackend_missing:BACKEND\ngloo = tinybackend:TinyBackend\n",
}


def write_plugins(root):
    """The plugin package and two distributions' metadata under `root`."""
    with open(os.path.join(root, "tinybackend.py"), "w") as f:
        f.write(PLUGIN)
    for dist, entry_points in DISTRIBUTIONS.items():
        info = os.path.join(root, f"{dist}-0.1.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[mcr.backends]\n" + entry_points)


@pytest.fixture(autouse=True, scope="module")
def plugins_on_the_path():
    """The MPI jobs of this module run with the plugins installed."""
    with tempfile.TemporaryDirectory(prefix="mcr-plugins-") as root, \
            pytest.MonkeyPatch.context() as mp:
        write_plugins(root)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root,
                                                              os.environ.get("PYTHONPATH")])))
        yield root


# -- in-process: native is what a Subcomm class defines ------------------------------


class PrimitivesOnly(Subcomm):
    def tensor_alltoall(self, output, input, output_split, input_split): ...

    def tensor_send(self, tensor, dest, tag): ...

    def tensor_recv(self, tensor, source, tag): ...


class OwnBcastAndProbe(PrimitivesOnly):
    def bcast(self, msg, root): ...

    def probe(self, source, tag, status, blocking): ...


def test_native_is_derived_from_the_methods_a_subcomm_defines():
    assert PrimitivesOnly.native == frozenset()
    assert OwnBcastAndProbe.native == {"Bcast", "Probe", "Iprobe"}

    class Own(Backend):
        name = "own"
        subcomm = OwnBcastAndProbe
    assert Own().native == {"Bcast", "Probe", "Iprobe"}
    # mcr's own: what torch's process group runs, and everything on MPI
    assert mcr.backends.get("gloo").native == {
        "Barrier", "Bcast", "Allgather", "Allgatherv", "Allreduce", "Reduce",
        "Reduce_scatter", "Reduce_scatter_block"}
    assert {"Alltoallw", "Iprobe", "Scan", "Ssend"} <= mcr.backends.get("mpi").native


# -- the plugins, under mpiexec -------------------------------------------------------


@case
def entry_points_are_read_once_when_a_name_is_not_built_in(comm):
    backends = mcr.backends
    assert backends._PLUGINS is None, "read before a name needed it"
    backends.check_name("gloo")                  # a built-in name: no scan
    assert backends._PLUGINS is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backends.check_name(TINY)
    assert backends.names() == ("mpi", "gloo", "nccl", "broken", TINY)
    shadowed = [str(w.message) for w in caught]
    assert len(shadowed) == 1 and "'gloo'" in shadowed[0] and "brokenbackend" in \
        shadowed[0] and "mcr's own" in shadowed[0], shadowed
    assert type(backends.get("gloo")).__module__ == "mcr.backends.gloo"
    tiny = backends.get(TINY)
    assert tiny is backends.get(TINY) and tiny.name == TINY
    assert type(tiny).__module__ == "tinybackend"
    assert tiny.native == frozenset() and tiny.reductions == {}


@case
def a_broken_entry_point_fails_clearly_when_asked_for(comm):
    fragments = ["backend 'broken'", "entry point 'broken'", "brokenbackend_missing:BACKEND",
                 "distribution 'brokenbackend'", "ModuleNotFoundError"]
    with raises(RuntimeError, *fragments):
        mcr.backends.get("broken")
    x, y = torch.ones(3), torch.zeros(3)
    with raises(RuntimeError, *fragments):       # before anything is communicated
        comm.Allreduce(x, y, backend="broken")
    assert_comm_works(comm)


@case.quick
def every_collective_runs_by_composition(comm):
    failures = Failures(comm)
    collective_forms(comm, TINY, failures)
    failures.done()


@case.quick
def every_reduction_runs_by_composition(comm):
    failures = Failures(comm)
    size, rank, n = comm.size, comm.rank, 3
    for dtype, op in reduction_cases():
        values = operands(size, n * size, dtype, op)
        whole = reduce_ref(values, op)
        label = f"{dtype} {op}"
        out = torch.zeros(n * size, dtype=dtype)
        comm.Allreduce(values[rank], out, op=OP_NAMES[op], backend=TINY)
        failures.check(f"Allreduce {label}", out, whole)
        buf = values[rank].clone()
        comm.Allreduce(mcr.IN_PLACE, buf, op=OP_NAMES[op], backend=TINY)
        failures.check(f"Allreduce IN_PLACE {label}", buf, whole)
        out = torch.zeros(n * size, dtype=dtype)
        comm.Reduce(values[rank], out if rank == 0 else None, op=OP_NAMES[op], root=0,
                    backend=TINY)
        if rank == 0:
            failures.check(f"Reduce {label}", out, whole)
        out = torch.zeros(n, dtype=dtype)
        comm.Reduce_scatter_block(values[rank], out, op=OP_NAMES[op], backend=TINY)
        failures.check(f"Reduce_scatter_block {label}", out, whole[rank * n:(rank + 1) * n])
        out = torch.zeros(n * size, dtype=dtype)
        comm.Scan(values[rank], out, op=OP_NAMES[op], backend=TINY)
        failures.check(f"Scan {label}", out, reduce_ref(values[:rank + 1], op))
        if rank > 0:
            comm.Exscan(values[rank], out, op=OP_NAMES[op], backend=TINY)
            failures.check(f"Exscan {label}", out, reduce_ref(values[:rank], op))
        else:
            comm.Exscan(values[rank], out, op=OP_NAMES[op], backend=TINY)
    failures.done()


@case.quick
def point_to_point_runs_by_composition(comm):
    failures = Failures(comm)
    size, rank = comm.size, comm.rank
    ring_messages(comm, TINY, failures)
    # every send mode, blocking and not, to the right; ANY_SOURCE/ANY_TAG receives
    right, left = (rank + 1) % size, (rank - 1) % size
    for k, mode in enumerate(("Send", "Bsend", "Ssend", "Rsend")):
        out = torch.zeros(4, dtype=torch.int64)
        rreq = comm.Irecv(out, mcr.ANY_SOURCE, mcr.ANY_TAG, backend=TINY)
        comm.Barrier(backend=TINY)              # Rsend: the receive is posted
        sent = torch.arange(4, dtype=torch.int64) + 100 * rank + k
        sreq = getattr(comm, "I" + mode.lower())(sent, right, 30 + k, backend=TINY)
        status = mcr.Status()
        rreq.Wait(status)
        sreq.Wait()
        failures.check(f"I{mode.lower()} -> Irecv(ANY_SOURCE)", out,
                       torch.arange(4, dtype=torch.int64) + 100 * left + k)
        assert (status.source, status.tag, status.Get_count()) == (left, 30 + k, 4), mode
        if size > 1 or mode != "Ssend":       # a synchronous send to oneself would block
            out.zero_()
            if rank % 2 == 0:
                getattr(comm, mode)(sent, right, 40 + k, backend=TINY)
                comm.Recv(out, left, 40 + k, backend=TINY)
            else:
                rreq = comm.Irecv(out, left, 40 + k, backend=TINY)
                getattr(comm, mode)(sent, right, 40 + k, backend=TINY)
                rreq.Wait()
            failures.check(f"{mode} -> Recv", out,
                           torch.arange(4, dtype=torch.int64) + 100 * left + k)
    failures.done()


@case
def the_plugin_communicator_is_freed_with_its_comm(comm):
    dup = comm.Dup()
    x, y = torch.full((2,), float(comm.rank)), torch.zeros(2)
    req = dup.Isend(x, (comm.rank + 1) % comm.size, 7, backend=TINY)
    dup.Recv(y, (comm.rank - 1) % comm.size, 7, backend=TINY)
    req.Wait()
    assert y.tolist() == [float((comm.rank - 1) % comm.size)] * 2
    dup.Free()
    assert_comm_works(comm)


# own job: the plug-in is found through entry points, which mcr reads once per process
test_mpi = mpi_cases(__name__, sizes=(1, 2, 3), timeout=240, own_job=True)
