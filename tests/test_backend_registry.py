"""The backend registry and how a call picks its backend.

- ``mcr.backends.names()`` and ``get(name)``: what each registered backend
  declares (devices, native operations, reductions), checked against the Comm
  methods and torch's dtypes; bad names.
- ``backend=`` on every Comm buffer method (the list is read from the methods'
  embedded signatures, so a new method cannot be missed): bad names and types
  are rejected before any communication; every valid spelling (None, "mpi",
  "auto", "gloo") runs blocking, non-blocking and persistent forms with the
  right results; "nccl" on host buffers fails clearly, naming nccl.
- The Comm's default backend: the ``backend`` property, ``$MCR_BACKEND`` at
  import (in fresh processes), and inheritance by Dup/Split/Split_type/Create/
  Create_group. Which backend ran is observed through a user-defined op, which
  only MPI runs (the error names the backend that was chosen).

In-process tests for what is local; MPI cases (1-4 ranks) for the rest.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mcr
import mcr.backends
from mcr import MPI
from mcr.backends.base import Backend
from mpiharness import case, mpi_cases, run_script
from util import Failures, assert_comm_works, assert_equal, raises, rank_data

# what each backend must declare: where its buffers live
DEVICES = {"mpi": {"cpu", "cuda"}, "gloo": {"cpu"}, "nccl": {"cuda"}}
HELPER_MODULES = ("base", "compose", "message", "store", "torchpg")
OP_NAMES = ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")
# bad values of backend=: (value, exception, message fragments)
BAD_BACKENDS = [
    ("bogus", ValueError, ["backend:", "unknown backend 'bogus'", "'auto'"]),
    ("MPI", ValueError, ["backend:", "unknown backend 'MPI'"]),      # names are lower case
    ("", ValueError, ["backend:", "unknown backend ''"]),
    ("base", ValueError, ["backend:", "unknown backend 'base'"]),    # a helper module
    (3, TypeError, ["backend:", "expected a string or None", "int"]),
    (b"gloo", TypeError, ["backend:", "expected a string or None", "bytes"]),
]
GOOD_BACKENDS = (None, "mpi", "auto", "gloo")


def buffer_methods():
    """The Comm methods that take ``backend=``, from their embedded signatures."""
    found = []
    for name in dir(mcr.Comm):
        attr = getattr(mcr.Comm, name)
        if name.startswith("_") or not callable(attr):
            continue
        first_line = (attr.__doc__ or "").split("\n", 1)[0]
        if first_line.startswith(name + "(") and "backend=" in first_line:
            found.append(name)
    return sorted(found)


# -- the registry (in-process) -----------------------------------------------------------


def test_names_lists_the_backend_modules_mpi_first():
    names = mcr.backends.names()
    assert isinstance(names, tuple)
    assert names[0] == "mpi"
    assert set(names) == set(DEVICES)
    assert len(set(names)) == len(names)
    assert not set(names) & set(HELPER_MODULES)
    assert mcr.backends.names() == names                # stable


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_each_backend_declares_itself(name):
    backend = mcr.backends.get(name)
    assert isinstance(backend, Backend)
    assert backend is mcr.backends.get(name)             # one object per backend
    assert backend.name == name
    assert set(backend.devices) == DEVICES[name]
    # native operations are Comm methods; reductions name MPI ops and torch dtypes
    assert backend.native, name
    for op in backend.native:
        assert callable(getattr(mcr.Comm, op, None)), (name, op)
    for op, types in backend.reductions.items():
        assert op in OP_NAMES, (name, op)
        for tname in types:
            assert isinstance(getattr(torch, tname, None), torch.dtype), (name, op, tname)


def test_mpi_runs_every_operation_natively():
    mpi = mcr.backends.get("mpi")
    for method in buffer_methods():
        base = method[:-len("_init")] if method.endswith("_init") else method
        if base not in mpi.native and base[0] == "I" and base[1].islower():
            base = base[1].upper() + base[2:]             # Iallreduce -> Allreduce
        assert base in mpi.native, (method, base)
    assert mpi.unavailable() is None


def test_availability_matches_torch():
    import torch.distributed as dist
    assert (mcr.backends.get("gloo").unavailable() is None) == (
        dist.is_available() and dist.is_gloo_available())
    nccl_ok = dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()
    reason = mcr.backends.get("nccl").unavailable()
    assert (reason is None) == nccl_ok
    if reason is not None:
        assert isinstance(reason, str) and ("NCCL" in reason or "CUDA" in reason), reason


# (backend, device ordinal, None or fragments of the ValueError)
DEVICE_ERRORS = [
    ("mpi", -1, None), ("mpi", 0, None), ("mpi", 3, None),
    ("gloo", -1, None), ("gloo", 0, ["buf:", "'gloo'", "CUDA device 0", "host (CPU)"]),
    ("gloo", 2, ["buf:", "'gloo'", "CUDA device 2"]),
    ("nccl", 0, None), ("nccl", -1, ["buf:", "'nccl'", "host memory", "CUDA", "'mpi'"]),
]


@pytest.mark.parametrize("name, device, fragments", DEVICE_ERRORS)
def test_device_errors_name_the_backend_and_the_memory(name, device, fragments):
    err = mcr.backends.get(name).device_error("buf", device)
    if fragments is None:
        assert err is None
    else:
        assert isinstance(err, ValueError)
        for fragment in fragments:
            assert fragment in str(err), (fragment, str(err))


@pytest.mark.parametrize("value, exc, fragments", BAD_BACKENDS)
def test_get_rejects_what_is_not_a_backend(value, exc, fragments):
    with raises(exc, *fragments):
        mcr.backends.get(value)
    if exc is ValueError:
        with raises(ValueError, *mcr.backends.names()):
            mcr.backends.get(value)


def test_get_auto_is_a_clear_error():
    # "auto" is a valid backend= value but no Backend object: asking the
    # registry for it must say so, not fail importing a module
    with raises(ValueError, "auto"):
        mcr.backends.get("auto")


def test_backend_keyword_is_on_every_buffer_method():
    methods = buffer_methods()
    assert set(methods) == set(ALL_METHODS), (
        f"not in this test's table: {sorted(set(methods) - set(ALL_METHODS))}; "
        f"not taking backend=: {sorted(set(ALL_METHODS) - set(methods))}")


# -- the backend property (in-process) -------------------------------------------------------


def test_default_backend_property():
    expected = os.environ.get("MCR_BACKEND") or "mpi"
    assert mcr.COMM_WORLD.backend == expected
    comm = mcr.COMM_SELF.Dup()
    try:
        for value in ("gloo", "auto", "nccl", "mpi"):
            comm.backend = value
            assert comm.backend == value
        comm.backend = "gloo"
        comm.backend = None                          # back to MPI
        assert comm.backend == "mpi"
        comm.backend = "gloo"
        for value, exc, fragments in BAD_BACKENDS:
            with raises(exc, *fragments):
                comm.backend = value
            assert comm.backend == "gloo"              # unchanged by a rejected value
        assert mcr.COMM_WORLD.backend == expected      # no global state
    finally:
        comm.Free()


def run_python(code, **env):
    """Run `code` in a fresh interpreter with `env` added; (returncode, output)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD",
                                                                     "PMIX_", "PMI_"))}
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


SHOW_DEFAULTS = """
    import mcr
    from mpi4py import MPI
    dup = mcr.COMM_WORLD.Dup()
    print(mcr.COMM_WORLD.backend, mcr.COMM_SELF.backend, dup.backend,
          mcr.Comm(MPI.COMM_WORLD).backend)
    dup.Free()
"""


@pytest.mark.parametrize("value, expected", [("gloo", "gloo"), ("auto", "auto"),
                                             ("nccl", "nccl"), ("mpi", "mpi"), ("", "mpi")])
def test_mcr_backend_sets_every_communicators_default(value, expected):
    code, out = run_python(SHOW_DEFAULTS, MCR_BACKEND=value)
    assert code == 0, out
    assert out.split() == [expected] * 4, out


@pytest.mark.parametrize("value", ["bogus", "Gloo", "mpi,gloo"])
def test_bad_mcr_backend_fails_at_import(value):
    code, out = run_python("import mcr", MCR_BACKEND=value)
    assert code != 0, out
    assert "ValueError" in out and "MCR_BACKEND" in out and repr(value) in out, out


ROUTED_BY_ENV = """
    import torch, mcr
    from mcr import MPI
    comm = mcr.COMM_WORLD
    assert comm.backend == "gloo", comm.backend
    x = torch.full((3,), float(comm.rank + 1))
    y = torch.zeros(3)
    comm.Allreduce(x, y)                                   # on gloo
    assert y.tolist() == [float(sum(range(1, comm.size + 1)))] * 3, y
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        comm.Allreduce(x, y, op=op)
    except TypeError as exc:
        assert "'gloo'" in str(exc), exc
    else:
        raise AssertionError("the default backend was not gloo")
    comm.Allreduce(x, y, op=MPI.SUM, backend="mpi")        # explicit beats the default
    print(f"routed {comm.rank}")     # one write: MPICH's mpiexec mixes unbuffered ranks' output
"""


def test_mcr_backend_routes_calls_without_backend(monkeypatch):
    monkeypatch.setenv("MCR_BACKEND", "gloo")
    code, out = run_script(2, ["-c", textwrap.dedent(ROUTED_BY_ENV)], timeout=120)
    assert code == 0, out
    assert "routed 0" in out and "routed 1" in out, out


# -- every buffer method, as a table -----------------------------------------------------------
#
# COLLECTIVES[name](comm) gives (args, kwargs, outputs, expected): the
# arguments of `name`, `I<name>` and `<name>_init`, the tensors they write on
# this rank and what those must hold afterwards (computed with torch on every
# rank's data). Results are small integers in float32: every order is exact.

N = 2


def data(rank, n, seed=0):
    return rank_data(rank, n, torch.float32, seed)


def uneven(size):
    return [i % 2 + 1 for i in range(size)]


def bcast(comm):
    root = comm.size - 1
    buf = data(root, N) if comm.rank == root else torch.zeros(N)
    return (buf,), {"root": root}, [buf], [data(root, N)]


def gather(comm):
    root = comm.size - 1
    here = comm.rank == root
    out = torch.zeros(N * comm.size) if here else None
    expected = torch.cat([data(r, N) for r in range(comm.size)])
    return ((data(comm.rank, N), out), {"root": root}, [out] if here else [],
            [expected] if here else [])


def gatherv(comm):
    root, counts = 0, uneven(comm.size)
    here = comm.rank == root
    out = torch.zeros(sum(counts)) if here else None
    expected = torch.cat([data(r, counts[r], 1) for r in range(comm.size)])
    return ((data(comm.rank, counts[comm.rank], 1), [out, counts] if here else None),
            {"root": root}, [out] if here else [], [expected] if here else [])


def scatter(comm):
    root = 0
    whole = data(root, N * comm.size, 2)
    out = torch.zeros(N)
    return ((whole if comm.rank == root else None, out), {"root": root}, [out],
            [whole[comm.rank * N:(comm.rank + 1) * N]])


def scatterv(comm):
    root, counts = comm.size - 1, uneven(comm.size)
    whole = data(root, sum(counts), 3)
    start = sum(counts[:comm.rank])
    out = torch.zeros(counts[comm.rank])
    send = [whole, counts] if comm.rank == root else None
    return (send, out), {"root": root}, [out], [whole[start:start + counts[comm.rank]]]


def allgather(comm):
    out = torch.zeros(N * comm.size)
    return ((data(comm.rank, N), out), {}, [out],
            [torch.cat([data(r, N) for r in range(comm.size)])])


def allgatherv(comm):
    counts = uneven(comm.size)
    out = torch.zeros(sum(counts))
    return ((data(comm.rank, counts[comm.rank], 4), [out, counts]), {}, [out],
            [torch.cat([data(r, counts[r], 4) for r in range(comm.size)])])


def alltoall(comm):
    size, rank = comm.size, comm.rank
    out = torch.zeros(N * size)
    expected = torch.cat([data(r, N * size, 5)[rank * N:(rank + 1) * N] for r in range(size)])
    return (data(rank, N * size, 5), out), {}, [out], [expected]


def alltoallv(comm):
    size, rank = comm.size, comm.rank

    def count(src, dst):
        return (src + dst) % 2 + 1

    def sent(src):
        return data(src, sum(count(src, d) for d in range(size)), 6)

    def block(src, dst):
        start = sum(count(src, d) for d in range(dst))
        return sent(src)[start:start + count(src, dst)]

    rcounts = [count(src, rank) for src in range(size)]
    out = torch.zeros(sum(rcounts))
    scounts = [count(rank, dst) for dst in range(size)]
    return (([sent(rank), scounts], [out, rcounts]), {}, [out],
            [torch.cat([block(src, rank) for src in range(size)])])


def reduce(comm):
    root = comm.size - 1
    here = comm.rank == root
    out = torch.zeros(N) if here else None
    expected = torch.stack([data(r, N, 7) for r in range(comm.size)]).sum(0)
    return ((data(comm.rank, N, 7), out), {"op": mcr.SUM, "root": root},
            [out] if here else [], [expected] if here else [])


def allreduce(comm):
    out = torch.zeros(N)
    return ((data(comm.rank, N, 8), out), {"op": mcr.MAX}, [out],
            [torch.stack([data(r, N, 8) for r in range(comm.size)]).amax(0)])


def reduce_scatter_block(comm):
    size, rank = comm.size, comm.rank
    out = torch.zeros(N)
    total = torch.stack([data(r, N * size, 9) for r in range(size)]).sum(0)
    return ((data(rank, N * size, 9), out), {"op": mcr.SUM}, [out],
            [total[rank * N:(rank + 1) * N]])


def reduce_scatter(comm):
    size, rank = comm.size, comm.rank
    counts = uneven(size)
    out = torch.zeros(counts[rank])
    total = torch.stack([data(r, sum(counts), 10) for r in range(size)]).sum(0)
    start = sum(counts[:rank])
    return ((data(rank, sum(counts), 10), out, counts), {"op": mcr.SUM}, [out],
            [total[start:start + counts[rank]]])


def scan(comm):
    out = torch.zeros(N)
    return ((data(comm.rank, N, 11), out), {"op": mcr.SUM}, [out],
            [torch.stack([data(r, N, 11) for r in range(comm.rank + 1)]).sum(0)])


def exscan(comm):
    out = torch.zeros(N)
    if comm.rank == 0:                          # undefined on rank 0
        return (data(0, N, 12), out), {"op": mcr.SUM}, [], []
    return ((data(comm.rank, N, 12), out), {"op": mcr.SUM}, [out],
            [torch.stack([data(r, N, 12) for r in range(comm.rank)]).sum(0)])


def barrier(comm):
    return (), {}, [], []


COLLECTIVES = {
    "Barrier": barrier, "Bcast": bcast, "Gather": gather, "Gatherv": gatherv,
    "Scatter": scatter, "Scatterv": scatterv, "Allgather": allgather,
    "Allgatherv": allgatherv, "Alltoall": alltoall, "Alltoallv": alltoallv,
    "Reduce": reduce, "Allreduce": allreduce,
    "Reduce_scatter_block": reduce_scatter_block, "Reduce_scatter": reduce_scatter,
    "Scan": scan, "Exscan": exscan,
}
COLLECTIVE_FORMS = {form: name for name in COLLECTIVES
                    for form in (name, "I" + name[0].lower() + name[1:], name + "_init")}

# point-to-point, with PROC_NULL peers: they run anywhere and communicate nothing
P2P_NULL = {
    "Send": lambda comm: (torch.ones(N), mcr.PROC_NULL),
    "Isend": lambda comm: (torch.ones(N), mcr.PROC_NULL),
    "Send_init": lambda comm: (torch.ones(N), mcr.PROC_NULL),
    "Recv": lambda comm: (torch.zeros(N), mcr.PROC_NULL),
    "Irecv": lambda comm: (torch.zeros(N), mcr.PROC_NULL),
    "Recv_init": lambda comm: (torch.zeros(N), mcr.PROC_NULL),
    "Sendrecv": lambda comm: (torch.ones(N), mcr.PROC_NULL, 0, torch.zeros(N),
                              mcr.PROC_NULL),
    "Sendrecv_replace": lambda comm: (torch.ones(N), mcr.PROC_NULL, 0, mcr.PROC_NULL),
    "Probe": lambda comm: (mcr.PROC_NULL,),
    "Iprobe": lambda comm: (mcr.PROC_NULL,),
    "Isendrecv": lambda comm: (torch.ones(N), mcr.PROC_NULL, 0, torch.zeros(N),
                               mcr.PROC_NULL),
    "Isendrecv_replace": lambda comm: (torch.ones(N), mcr.PROC_NULL, 0, mcr.PROC_NULL),
}
for _mode in ("Bsend", "Ssend", "Rsend"):
    for _form in (_mode, "I" + _mode.lower(), _mode + "_init"):
        P2P_NULL[_form] = P2P_NULL["Send"]
# backend="mpi" only (a datatype per process): other backends refuse them
MPI_ONLY = {form: lambda comm: ([torch.ones(N), [MPI.FLOAT] * comm.size],
                                [torch.zeros(comm.size), [1] * comm.size,
                                 [4 * i for i in range(comm.size)], [MPI.FLOAT] * comm.size])
            for form in ("Alltoallw", "Ialltoallw", "Alltoallw_init")}
ALL_METHODS = sorted(set(COLLECTIVE_FORMS) | set(P2P_NULL) | set(MPI_ONLY))


def call_args(comm, method):
    if method in P2P_NULL:
        return P2P_NULL[method](comm), {}
    if method in MPI_ONLY:
        return MPI_ONLY[method](comm), {}
    args, kwargs, _, _ = COLLECTIVES[COLLECTIVE_FORMS[method]](comm)
    return args, kwargs


def complete(result):
    """Finish what a method returned: Wait a Request; Start, Wait, Free a Prequest."""
    if isinstance(result, mcr.Prequest):
        result.Start()
        result.Wait()
        result.Free()
    elif isinstance(result, mcr.Request):
        result.Wait()


@case
def every_method_rejects_bad_backends_before_communicating(comm):
    for method in ALL_METHODS:
        args, kwargs = call_args(comm, method)
        for value, exc, fragments in BAD_BACKENDS:
            with raises(exc, *fragments):
                getattr(comm, method)(*args, backend=value, **kwargs)
        # the list of available backends comes from the registry
        with raises(ValueError, *[n for n in mcr.backends.names()]):
            getattr(comm, method)(*args, backend="nope", **kwargs)
    assert_comm_works(comm)


def collective_forms(comm, backend, failures):
    """Every collective, blocking, non-blocking and persistent, on `backend`."""
    for method, name in COLLECTIVE_FORMS.items():
        label = f"{method}(backend={backend!r})"
        args, kwargs, outputs, expected = COLLECTIVES[name](comm)
        try:
            complete(getattr(comm, method)(*args, backend=backend, **kwargs))
        except Exception as exc:  # noqa: BLE001 - recorded; raised the same on every rank
            failures.error(label, exc)
            continue
        for got, want in zip(outputs, expected):
            failures.check(label, got, want)


@case
def every_collective_form_runs_with_each_backend_spelling(comm):
    failures = Failures(comm)
    for backend in GOOD_BACKENDS:
        collective_forms(comm, backend, failures)
    failures.done()


def ring_messages(comm, backend, failures):
    """Every send form against every receive form, Sendrecv, Sendrecv_replace
    and Probe/Iprobe, to the right neighbour on a ring of at least 2 ranks."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    for k, (send, recv) in enumerate([("Isend", "Recv"), ("Send", "Irecv"),
                                      ("Send_init", "Recv_init")]):
        out = torch.zeros(N)
        tag = 10 + k
        if recv == "Recv":
            sreq = comm.Isend(data(rank, N, k), right, tag, backend=backend)
            comm.Recv(out, left, tag, backend=backend)
            sreq.Wait()
        elif recv == "Irecv":
            rreq = comm.Irecv(out, left, tag, backend=backend)
            comm.Send(data(rank, N, k), right, tag, backend=backend)
            rreq.Wait()
        else:
            rreq = comm.Recv_init(out, left, tag, backend=backend)
            sreq = comm.Send_init(data(rank, N, k), right, tag, backend=backend)
            mcr.Prequest.Startall([rreq, sreq])
            mcr.Request.Waitall([rreq, sreq])
            rreq.Free()
            sreq.Free()
        failures.check(f"{send} -> {recv} (backend={backend!r})", out, data(left, N, k))
    out = torch.zeros(N)
    status = mcr.Status()
    comm.Sendrecv(data(rank, N, 5), right, 20, out, left, 20, status, backend=backend)
    failures.check(f"Sendrecv (backend={backend!r})", out, data(left, N, 5))
    assert (status.source, status.tag, status.Get_count()) == (left, 20, N), backend
    buf = data(rank, N, 6)
    comm.Sendrecv_replace(buf, right, 21, left, 21, backend=backend)
    failures.check(f"Sendrecv_replace (backend={backend!r})", buf, data(left, N, 6))
    sreq = comm.Isend(data(rank, N, 7), right, 22, backend=backend)
    assert comm.Probe(left, 22, status, backend=backend) is True
    assert (status.source, status.tag) == (left, 22), backend
    while not comm.Iprobe(left, 22, backend=backend):
        pass
    comm.Recv(out, left, 22, backend=backend)
    sreq.Wait()
    failures.check(f"Probe, Recv (backend={backend!r})", out, data(left, N, 7))


@case
def point_to_point_forms_run_with_each_backend_spelling(comm):
    failures = Failures(comm)
    for backend in GOOD_BACKENDS:
        for method in P2P_NULL:                          # PROC_NULL: nothing moves
            args, _ = call_args(comm, method)
            result = getattr(comm, method)(*args, backend=backend)
            if method in ("Probe", "Iprobe"):
                assert result is True, (method, backend, result)
            complete(result)
        if comm.size > 1:
            ring_messages(comm, backend, failures)
    failures.done()


def nccl_refusal(exc):
    """Whether `exc` is a clear refusal of host buffers by nccl."""
    message = str(exc)
    if isinstance(exc, ValueError):
        return "'nccl'" in message and ("host memory" in message
                                        or "cannot run it" in message)   # Alltoallw
    if isinstance(exc, RuntimeError):
        return ("backend 'nccl'" in message
                and mcr.backends.get("nccl").unavailable() is not None)
    return False


@case
def nccl_refuses_host_buffers_clearly(comm):
    failures = []
    for method in ALL_METHODS:
        args, kwargs = call_args(comm, method)
        if method in ("Probe", "Iprobe") or "arrier" in method:
            continue                                     # no buffer to refuse
        try:
            complete(getattr(comm, method)(*args, backend="nccl", **kwargs))
        except Exception as exc:  # noqa: BLE001 - the kind is what is checked
            if not nccl_refusal(exc):
                failures.append(f"{method}: {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{method}: no error for host buffers on nccl")
    assert not failures, "\n".join(failures)
    assert_comm_works(comm)


USER_OP = MPI.Op.Create(lambda a, b, datatype: None, commute=True)


def default_runs_on(comm, backend):
    """Whether `comm`'s calls without backend= run on `backend` ("mpi" or
    "gloo"): a user-defined op runs on MPI and is refused naming any other."""
    x, y = torch.ones(2), torch.zeros(2)
    try:
        comm.Allreduce(x, y, op=USER_OP)
    except TypeError as exc:
        assert "user-defined" in str(exc), exc
        return f"'{backend}'" in str(exc)
    return backend == "mpi"


def derived_comms(comm):
    """Communicators made from `comm` in every way mcr offers (all collective)."""
    group = comm.Get_group()
    made = {"Dup": comm.Dup(), "Split": comm.Split(comm.rank % 2, comm.rank),
            "Split_type": comm.Split_type(MPI.COMM_TYPE_SHARED),
            "Create": comm.Create(group), "Create_group": comm.Create_group(group)}
    group.Free()
    return made


@case
def derived_communicators_inherit_the_default_backend(comm):
    world_default = comm.backend
    parent = comm.Dup()
    assert parent.backend == world_default
    parent.backend = "gloo"
    assert comm.backend == world_default              # the original is untouched
    assert default_runs_on(parent, "gloo")
    for how, child in derived_comms(parent).items():
        assert child.backend == "gloo", (how, child.backend)
        assert default_runs_on(child, "gloo"), how
        # the default does give the right result, and backend= still overrides it
        x = torch.full((3,), float(comm.rank + 1))
        y = torch.zeros(3)
        child.Allreduce(x, y)
        members = child.allgather(comm.rank)
        assert_equal(y, torch.full((3,), float(sum(r + 1 for r in members))))
        child.Allreduce(x, y, op=USER_OP, backend="mpi")
        child.backend = None
        assert child.backend == "mpi" and default_runs_on(child, "mpi"), how
        child.Free()
    # what a communicator is made with, not what it was made from later
    parent.backend = "mpi"
    child = parent.Dup()
    parent.backend = "gloo"
    assert child.backend == "mpi" and default_runs_on(child, "mpi")
    child.Free()
    parent.Free()
    assert_comm_works(comm)


@case
def auto_and_mpi_run_on_mpi(comm):
    dup = comm.Dup()
    for value in ("auto", "mpi"):
        dup.backend = value
        assert default_runs_on(dup, "mpi"), value
        x, y = np.full(3, comm.rank, np.int64), np.zeros(3, np.int64)
        dup.Allreduce(x, y, op=mcr.MAX, backend=value)
        assert y.tolist() == [comm.size - 1] * 3
    dup.Free()


test_mpi = mpi_cases(__name__, timeout=120)
