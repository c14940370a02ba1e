"""The backend registry and how a call picks its backend: what each backend declares (devices,
native operations, reductions) against the Comm methods and torch's dtypes; mcr's own backends
as entry points of distribution mcr (pyproject.toml, installed metadata); ``backend=`` on every
Comm buffer method (bad values rejected before communicating, None and "auto" on every form,
"nccl" refusing host buffers); the default backend (the property, ``$MCR_BACKEND`` at import,
inheritance by derived communicators; a user-defined op, MPI only, shows which backend ran).
"""

import ast
import itertools
import os
import subprocess
import sys
import sysconfig
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import torch

import mcr
import mcr.backends
from mcr import MPI
from mcr.backends.base import Backend
from mpiharness import case, mpi_cases, run_script
from opmatrix import FORMS, OPERATIONS, Findings, nonblocking, run
from opref import OPS, rank_data
from util import Failures, assert_comm_works, assert_equal, raises

# what each backend must declare: where its buffers live
DEVICES = {"mpi": {"cpu", "cuda"}, "gloo": {"cpu"}, "nccl": {"cuda"}}
HELPER_MODULES = ("base", "compose", "message", "store", "torchpg")
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
    assert isinstance(names, tuple) and names[0] == "mpi" and len(set(names)) == len(names)
    assert set(names) == set(DEVICES) and not set(names) & set(HELPER_MODULES)
    assert mcr.backends.names() == names                # stable


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_each_backend_declares_itself(name):
    backend = mcr.backends.get(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert backend is mcr.backends.get(name)             # one object per backend
    assert set(backend.devices) == DEVICES[name]
    # native operations are Comm methods; reductions name MPI ops and torch dtypes
    assert backend.native, name
    for op in backend.native:
        assert callable(getattr(mcr.Comm, op, None)), (name, op)
    for op, types in backend.reductions.items():
        assert op in OPS, (name, op)
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


ROOT = Path(__file__).resolve().parent.parent


def backend_modules():
    """The modules of src/mcr/backends that define ``BACKEND`` (read, not imported)."""
    found = set()
    for path in (ROOT / "src" / "mcr" / "backends").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "BACKEND" for t in targets):
                found.add(path.stem)
    return found


def test_pyproject_declares_every_backend_module_as_an_entry_point():
    tomllib = pytest.importorskip("tomllib")          # Python 3.11
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"]["mcr.backends"]
    assert declared == {name: f"mcr.backends.{name}:BACKEND" for name in backend_modules()}


def test_builtins_are_the_entry_points_of_distribution_mcr():
    own = {ep.name: ep for ep in entry_points(group=mcr.backends.ENTRY_POINT_GROUP)
           if ep.dist is not None and ep.dist.name == "mcr"}
    assert set(own) == backend_modules() == set(DEVICES), (
        "mcr's installed metadata is not its pyproject.toml: reinstall it (pip install -e .)")
    assert mcr.backends.BUILTINS == ("mpi", "gloo", "nccl")          # mpi first, then sorted
    assert mcr.backends.names()[:len(own)] == mcr.backends.BUILTINS
    for name, ep in own.items():
        assert ep.value == f"mcr.backends.{name}:BACKEND", ep
        assert mcr.backends.get(name) is ep.load(), name


def test_without_mcrs_metadata_the_registry_says_to_install_it(tmp_path):
    # this interpreter's packages and mcr's package, but not mcr's metadata:
    # mcr as a source tree that was never installed (mcr's package is where
    # this process imports it from: the source tree of an editable install,
    # or site-packages)
    site = sysconfig.get_paths()["purelib"]
    for entry in os.listdir(site):
        if entry != "mcr" and not entry.startswith(("mcr-", "__editable__.mcr")):
            os.symlink(os.path.join(site, entry), tmp_path / entry)
    os.symlink(Path(mcr.__file__).parent, tmp_path / "mcr")
    code, out = run_python("import mcr.backends\nmcr.backends.check_name('gloo')", "-S",
                           PYTHONPATH=str(tmp_path))
    assert code != 0 and "RuntimeError" in out, out
    for fragment in ("'mcr.backends'", "distribution 'mcr'", "none found", "pip install"):
        assert fragment in out, (fragment, out)


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
    assert err is None if fragments is None else isinstance(err, ValueError), err
    for fragment in fragments or ():
        assert fragment in str(err), (fragment, str(err))


# "auto": a valid backend= value but no Backend: say so, do not fail importing a module
@pytest.mark.parametrize("value, exc, fragments",
                         BAD_BACKENDS + [("auto", ValueError, ["backend:", "'auto'"])])
def test_get_rejects_what_is_not_a_backend(value, exc, fragments):
    with raises(exc, *fragments):
        mcr.backends.get(value)
    if exc is ValueError:
        with raises(ValueError, *mcr.backends.names()):
            mcr.backends.get(value)


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


def run_python(code, *flags, **env):
    """Run `code` in a fresh interpreter (`flags`: "-S", no site packages but those `env` puts
    on PYTHONPATH) with `env` added, outside the MPI job; (returncode, output)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD",
                                                                     "PMIX_", "PMI_"))}
    proc = subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)],
                          env=dict(full, **env), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


SHOW_DEFAULTS = """
    import mcr
    from mpi4py import MPI
    dup = mcr.COMM_WORLD.Dup()
    print(mcr.COMM_WORLD.backend, mcr.COMM_SELF.backend, dup.backend,
          mcr.Comm(MPI.COMM_WORLD).backend)
    dup.Free()
"""


# $MCR_BACKEND (stripped, as the other variables): the default of every communicator, or None:
# import fails, naming it
@pytest.mark.parametrize("value, expected", [
    (" gloo ", "gloo"), ("auto", "auto"), ("nccl", "nccl"), ("mpi", "mpi"), ("", "mpi"),
    ("bogus", None), ("Gloo", None), ("mpi,gloo", None)])
def test_mcr_backend_at_import(value, expected):
    code, out = run_python(SHOW_DEFAULTS, MCR_BACKEND=value)
    if expected is None:
        assert code != 0 and "ValueError" in out and "MCR_BACKEND" in out, out
        assert repr(value) in out, out
    else:
        assert code == 0 and out.split() == [expected] * 4, out


ROUTED_BY_ENV = """
    import torch, mcr
    from mcr import MPI
    comm = mcr.COMM_WORLD
    assert comm.backend == "gloo", comm.backend
    x, y = torch.full((3,), float(comm.rank + 1)), torch.zeros(3)
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


# -- every buffer method ------------------------------------------------------------------
N = 2
NULL = mcr.PROC_NULL
# point-to-point with PROC_NULL peers: they run anywhere and move nothing
P2P_NULL = {"Probe": (NULL,), "Iprobe": (NULL,),
            "Sendrecv": (torch.ones(N), NULL, 0, torch.zeros(N), NULL),
            "Sendrecv_replace": (torch.ones(N), NULL, 0, NULL)}
P2P_NULL.update({"I" + k.lower(): v for k, v in P2P_NULL.items() if k.startswith("Sendrecv")})
P2P_NULL.update({form: (torch.zeros(N) if mode == "Recv" else torch.ones(N), NULL)
                 for mode in ("Send", "Bsend", "Ssend", "Rsend", "Recv")
                 for form in (mode, "I" + mode.lower(), mode + "_init")})
COLLECTIVE_FORMS = {form: name for name in OPERATIONS
                    for form in (name, nonblocking(name), name + "_init")}
# backend="mpi" only (a datatype per process): other backends refuse them
ALLTOALLW = ("Alltoallw", "Ialltoallw", "Alltoallw_init")
ALL_METHODS = sorted(set(COLLECTIVE_FORMS) | set(P2P_NULL) | set(ALLTOALLW))


def first_variant(comm, method):
    """(label, make) of collective `method`: the matrix's first float32 variant."""
    return next(OPERATIONS[method].variants(comm, [torch.float32]))


def call_args(comm, method):
    if method in P2P_NULL:
        return P2P_NULL[method]
    if method in ALLTOALLW:
        return ([torch.ones(N), [MPI.FLOAT] * comm.size],
                [torch.zeros(comm.size), [1] * comm.size, [4 * i for i in range(comm.size)],
                 [MPI.FLOAT] * comm.size])
    return first_variant(comm, COLLECTIVE_FORMS[method])[1](0)[0]


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
        args = call_args(comm, method)
        for value, exc, fragments in BAD_BACKENDS:
            with raises(exc, *fragments):
                getattr(comm, method)(*args, backend=value)
        # the list of available backends comes from the registry
        with raises(ValueError, *mcr.backends.names()):
            getattr(comm, method)(*args, backend="nope")
    assert_comm_works(comm)


@case
def every_collective_form_runs_with_the_default_and_auto_spellings(comm):
    # "mpi" and "gloo" spelled out: the operation matrix (tests/test_ops.py)
    found = Findings()
    for backend, method in itertools.product((None, "auto"), OPERATIONS):
        what, make = first_variant(comm, method)
        for turn, form in enumerate(FORMS):
            run(comm, found, what, backend, form, method, make, turn)
    found.report()


def ring_messages(comm, backend, failures):
    """Send forms against receive forms, Sendrecv(_replace), Probe/Iprobe, on a ring of 2+."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    for k, (send, recv) in enumerate([("Isend", "Recv"), ("Send", "Irecv"),
                                      ("Send_init", "Recv_init")]):
        out, tag, mine = torch.zeros(N), 10 + k, rank_data(rank, N, seed=k)
        if recv == "Recv":
            sreq = comm.Isend(mine, right, tag, backend=backend)
            comm.Recv(out, left, tag, backend=backend)
            sreq.Wait()
        elif recv == "Irecv":
            rreq = comm.Irecv(out, left, tag, backend=backend)
            comm.Send(mine, right, tag, backend=backend)
            rreq.Wait()
        else:
            reqs = [comm.Recv_init(out, left, tag, backend=backend),
                    comm.Send_init(mine, right, tag, backend=backend)]
            mcr.Prequest.Startall(reqs)
            mcr.Request.Waitall(reqs)
            for r in reqs:
                r.Free()
        failures.check(f"{send} -> {recv} (backend={backend!r})", out, rank_data(left, N, seed=k))
    out, status = torch.zeros(N), mcr.Status()
    comm.Sendrecv(rank_data(rank, N, seed=5), right, 20, out, left, 20, status, backend=backend)
    failures.check(f"Sendrecv (backend={backend!r})", out, rank_data(left, N, seed=5))
    assert (status.source, status.tag, status.Get_count()) == (left, 20, N), backend
    buf = rank_data(rank, N, seed=6)
    comm.Sendrecv_replace(buf, right, 21, left, 21, backend=backend)
    failures.check(f"Sendrecv_replace (backend={backend!r})", buf, rank_data(left, N, seed=6))
    sreq = comm.Isend(rank_data(rank, N, seed=7), right, 22, backend=backend)
    assert comm.Probe(left, 22, status, backend=backend) is True
    assert (status.source, status.tag) == (left, 22), backend
    while not comm.Iprobe(left, 22, backend=backend):
        pass
    comm.Recv(out, left, 22, backend=backend)
    sreq.Wait()
    failures.check(f"Probe, Recv (backend={backend!r})", out, rank_data(left, N, seed=7))


@case
def point_to_point_forms_run_with_each_backend_spelling(comm):
    failures = Failures(comm)
    for backend in GOOD_BACKENDS:
        for method, args in P2P_NULL.items():
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
        if method in ("Probe", "Iprobe") or "arrier" in method:
            continue                                     # no buffer to refuse
        try:
            complete(getattr(comm, method)(*call_args(comm, method), backend="nccl"))
        except Exception as exc:  # noqa: BLE001 - the kind is what is checked
            if not nccl_refusal(exc):
                failures.append(f"{method}: {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{method}: no error for host buffers on nccl")
    assert not failures, "\n".join(failures)
    assert_comm_works(comm)


USER_OP = MPI.Op.Create(lambda a, b, datatype: None, commute=True)


def default_runs_on(comm, backend):
    """Whether `comm`'s calls run on `backend` by default: MPI runs a user-defined op, others
    refuse it by name."""
    x, y = torch.ones(2), torch.zeros(2)
    try:
        comm.Allreduce(x, y, op=USER_OP)
    except TypeError as exc:
        assert "user-defined" in str(exc), exc
        return f"'{backend}'" in str(exc)
    return backend == "mpi"


@case
def derived_communicators_inherit_the_default_backend(comm):
    world_default = comm.backend
    parent = comm.Dup()
    assert parent.backend == world_default
    parent.backend = "gloo"
    assert comm.backend == world_default              # the original is untouched
    assert default_runs_on(parent, "gloo")
    group = parent.Get_group()          # every way mcr offers to make a communicator
    derived = {"Dup": parent.Dup(), "Split": parent.Split(comm.rank % 2, comm.rank),
               "Split_type": parent.Split_type(MPI.COMM_TYPE_SHARED),
               "Create": parent.Create(group), "Create_group": parent.Create_group(group)}
    group.Free()
    for how, child in derived.items():
        assert child.backend == "gloo", (how, child.backend)
        assert default_runs_on(child, "gloo"), how
        # the default does give the right result, and backend= still overrides it
        x, y = torch.full((3,), float(comm.rank + 1)), torch.zeros(3)
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
