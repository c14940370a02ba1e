"""A third-party backend, added through the ``mcr.backends`` entry-point group: ``tiny``
(tests/plugins) defines only ``tensor_alltoall``/``tensor_send``/``tensor_recv``, so all runs
by composition (its point-to-point here, its collectives in test_ops.py); distribution
``brokenbackend`` (a temporary directory) has entry point ``broken``, which does not import
(the error names it and the distribution), and ``gloo``, which mcr's own overrides (one
warning). In-process: ``native`` is what a Subcomm defines.
"""

import os
import tempfile
import warnings

import pytest
import torch

import mcr
import mcr.backends
from mcr.backends.base import Backend, Subcomm
from mpiharness import case, mpi_cases
from test_backend_registry import ring_messages
from util import Failures, assert_comm_works, raises

TINY = "tiny"
BROKEN = "broken = brokenbackend_missing:BACKEND\ngloo = tinybackend:TinyBackend\n"


@pytest.fixture(autouse=True, scope="module")
def broken_distribution_on_the_path():
    """The MPI jobs of this module run with distribution brokenbackend installed."""
    with tempfile.TemporaryDirectory(prefix="mcr-plugins-") as root, \
            pytest.MonkeyPatch.context() as mp:
        info = os.path.join(root, "brokenbackend-0.1.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: brokenbackend\nVersion: 0.1\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[mcr.backends]\n" + BROKEN)
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
def entry_points_are_read_once_mcrs_own_with_the_plugins(comm):
    # the first case of this module's job: the first to ask for a backend
    backends = mcr.backends
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backends.check_name("gloo")
        backends.check_name(TINY)
        assert backends.names() == ("mpi", "gloo", "nccl", "broken", TINY)
        assert backends.BUILTINS == ("mpi", "gloo", "nccl")
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
        want = torch.arange(4, dtype=torch.int64) + 100 * left + k
        sreq = getattr(comm, "I" + mode.lower())(sent, right, 30 + k, backend=TINY)
        status = mcr.Status()
        rreq.Wait(status)
        sreq.Wait()
        failures.check(f"I{mode.lower()} -> Irecv(ANY_SOURCE)", out, want)
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
            failures.check(f"{mode} -> Recv", out, want)
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


# own job: the broken/gloo entry points must not reach the shared jobs, and mcr
# reads entry points once per process
test_mpi = mpi_cases(__name__, sizes=(1, 2, 3), timeout=240, own_job=True)
