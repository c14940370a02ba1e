"""Any object in any argument of any buffer method: a Python exception or a correct result.

Every buffer method of ``mcr.Comm`` (point-to-point, collectives, their I- and
_init forms, Probe/Iprobe, Sendrecv(_replace)), the neighborhood collectives
of ``mcr.Cartcomm`` (on a periodic ring), every method of
``mcr.Request``/``mcr.Prequest`` (mpi4py's lowercase forms that mcr defines
too, with the recipe of the uppercase one) and ``mcr.Status.Get_count`` is called with
objects of every kind (``OBJECTS``) in each of its arguments in turn, the
others valid, on MPI and on Gloo. The methods and their parameters come from
the signatures Cython embeds in the docstrings, so a new method, or a new
I-/_init form, is covered without editing this file; one whose operation has
no recipe here fails ``methods_have_recipes`` until a recipe is added.
Methods left out on purpose are in ``EXCLUDED``, with the reason.

A trial passes when the call raises an ``Exception`` other than
``SystemError``, or returns with results equal to values computed with
torch/numpy from what the arguments mean. After each trial the communicator
must still work: an Allreduce on MPI and on the trial's backend gives the
expected sum. Crashes kill the job: ``faulthandler`` prints the traceback,
and each trial writes a line to stderr before it starts, so the job output
names the trial that crashed or hung (the harness's timeout ends a hang).

Collectives run on a duplicate of COMM_WORLD with the same object on every
rank, so that every rank takes the same path: a check that raises on some
ranks while the others enter the collective hangs the job, and is a bug.
Arguments that only the root reads (the receive buffer of Gather(v) and
Reduce, the send buffer of Scatter(v)), and IN_PLACE where only the root may
pass it, are tried on a duplicate of COMM_SELF instead: at 2 ranks a bad one
is seen by the root alone (by MPI's design, as in C and mpi4py) and the
others would wait forever.
Point-to-point and request trials also run on COMM_SELF (messages to
oneself), so that an accepted destination, source or tag cannot leave a
message for another rank; unmatched messages are received after each trial.

Trials known to fail today are skipped through ``KNOWN_FAILURES`` (one line
each, with the reason); empty it as fixes land.
"""

import ast
import faulthandler
import fnmatch
import operator
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI as _mpi4py

import mcr
from mcr import _core
from mpiharness import case, mpi_cases

faulthandler.enable()

N = 4                       # elements of every valid buffer, per rank and block
TAG = 3                     # tag of the valid messages
TAG_UB = 32767              # MPI's guaranteed minimum; tags above may be refused
BACKENDS = ("mpi", "gloo")
VERBOSE = bool(os.environ.get("MCR_FUZZ_VERBOSE"))  # each trial's outcome to stderr
TRIAL_DEADLINE = 5.0        # seconds a message accepted by a send may take to arrive

# Methods of mcr.Comm/Request/Prequest/Status not fuzzed here, and why.
EXCLUDED = {
    "Comm.Free": "communicator management (collective free of the communicator)",
    "Comm.Dup": "communicator management, no buffers",
    "Comm.Split": "communicator management, no buffers",
    "Comm.Split_type": "communicator management, no buffers",
    "Comm.Create": "communicator management, no buffers",
    "Comm.Create_group": "communicator management, no buffers",
    "Comm.Clone": "communicator management, no buffers",
    "Comm.Dup_with_info": "communicator management, no buffers",
    "Comm.Idup": "communicator management, no buffers",
    "Comm.Idup_with_info": "communicator management, no buffers",
    "Comm.Create_cart": "communicator management, no buffers (bad dims: test_comm)",
    "Comm.Create_graph": "communicator management, no buffers",
    "Comm.Create_dist_graph": "communicator management, no buffers",
    "Comm.Create_dist_graph_adjacent": "communicator management, no buffers",
}

# Trials known to fail in today's build, skipped (not run: a crash or a hang
# would hide every later trial). Key: (method, parameter, object, backend),
# fnmatch patterns; value: the reason. Remove a line when its fix lands.
KNOWN_FAILURES: dict[tuple[str, str, str, str], str] = {
    # (the trials whose arguments are all valid)
    **{(method, param, obj, "mpi"): (
        "Open MPI 5.0's non-blocking and persistent MPI_Neighbor_alltoallw on a ring of 2 "
        "processes take the order of MPI before 4.0 (its blocking form does not); mcr "
        "composes Neighbor_alltoall(v) there, not alltoallw (see docs/api.rst)")
       for method, param, obj in (("Ineighbor_alltoallw", "backend", "None"),
                                  ("Neighbor_alltoallw_init", "backend", "None"),
                                  ("Neighbor_alltoallw_init", "info", "None"),
                                  ("Neighbor_alltoallw_init", "info", "Info"))},
}


# -- Objects ------------------------------------------------------------------------


def _readonly_array():
    a = np.arange(N, dtype=np.float64) + 100
    a.flags.writeable = False
    return a


class _Const:
    def __init__(self, name, make, content=None):
        self.name, self.make, self.content = name, make, content


# name -> factory (a fresh object per trial: receives may write into it).
# `content`: what a data object holds, as a float64 array, or None.
OBJECTS = [
    _Const("str", lambda: "abc"),
    _Const("bytes", lambda: b"abcdefgh"),
    _Const("bytearray", lambda: bytearray(8 * N)),
    _Const("int-negative", lambda: -1),
    _Const("int-large-negative", lambda: -12345),
    _Const("PROC_NULL", lambda: _mpi4py.PROC_NULL),     # -2 on Open MPI, -1 on MPICH
    _Const("int-out-of-range", lambda: 5),
    _Const("int-2**31", lambda: 2 ** 31),
    _Const("int-huge", lambda: 10 ** 30),
    _Const("bool", lambda: True),
    _Const("float", lambda: 1.5),
    _Const("float-nan", lambda: float("nan")),
    _Const("None", lambda: None),
    _Const("list-empty", lambda: []),
    _Const("list-ints", lambda: [2, 2]),
    _Const("list-mixed", lambda: [1, 2.5, "x"]),
    _Const("dict", lambda: {"a": 1}),
    _Const("Status", lambda: mcr.Status()),
    _Const("Request", lambda: mcr.Request()),
    _Const("IN_PLACE", lambda: mcr.IN_PLACE),
    _Const("dlpack-capsule", lambda: torch.ones(N, dtype=torch.float64).__dlpack__(),
           np.ones(N)),
    _Const("tensor-noncontiguous", lambda: torch.arange(2 * N, dtype=torch.float64)[::2],
           np.arange(0, 2 * N, 2, dtype=np.float64)),
    _Const("tensor-0d", lambda: torch.tensor(5.0, dtype=torch.float64)),
    _Const("tensor-float32", lambda: torch.arange(N, dtype=torch.float32) + 7),
    _Const("ndarray-readonly", _readonly_array, np.arange(N, dtype=np.float64) + 100),
    _Const("Datatype", lambda: _mpi4py.DOUBLE),
    _Const("Op", lambda: _mpi4py.MAX),
    _Const("Op-REPLACE", lambda: _mpi4py.REPLACE),
    _Const("Comm", lambda: mcr.COMM_SELF),
    _Const("Info", lambda: _mpi4py.INFO_NULL),
]


def is_integer(value):
    """Whether Python reads `value` as an integer (int, bool, IN_PLACE: __index__)."""
    try:
        operator.index(value)
    except Exception:
        return False
    return True


def lenient_tag(value):
    """The tag a call uses for `value`, None if it must refuse it. Like
    mpi4py, mcr reads tags with int(): 1.5 is tag 1, a 0-d tensor 5.0 tag 5."""
    try:
        tag = operator.index(value) if is_integer(value) else int(value)
    except Exception:
        return None
    return tag if 0 <= tag <= TAG_UB else None


TAG_PARAMS = ("tag", "sendtag", "recvtag")


def is_proc_null(value):
    """Whether a rank argument `value` reads as MPI.PROC_NULL, as C ints are read
    from Python: on MPICH, PROC_NULL is -1, so -1 and IN_PLACE (address -1) are it."""
    try:
        return int(value) == _mpi4py.PROC_NULL
    except Exception:
        return False


def known(method, param, obj, backend):
    for (m, p, o, b), reason in KNOWN_FAILURES.items():
        if all(fnmatch.fnmatchcase(v, pat) for v, pat in
               ((method, m), (param, p), (obj, o), (backend, b))):
            return reason
    return None


# -- Methods, from the embedded signatures ----------------------------------------------


def parameters(cls, name):
    """[(name, has_default)] of method `name` of `cls` (without self/cls), and
    whether it is a class method."""
    doc = getattr(cls, name).__doc__ or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    if not first.startswith(name + "("):
        raise AssertionError(f"{cls.__name__}.{name}: no embedded signature in its "
                             f"docstring (was mcr built with embedsignature?): {first!r}")
    tree = ast.parse(f"def {first}: pass")
    a = tree.body[0].args
    pos = a.posonlyargs + a.args
    ndefault = len(a.defaults)
    out = [(p.arg, i >= len(pos) - ndefault) for i, p in enumerate(pos)]
    out += [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return [(p, d) for p, d in out if p not in ("self", "cls")], pos[0].arg == "cls"


def own_methods(cls, lowercase=False):
    """Public methods `cls` defines itself (not inherited from mpi4py): the
    uppercase ones, and with `lowercase` mpi4py's lowercase forms too."""
    return sorted(n for n, v in vars(cls).items()
                  if (n[:1].isupper() or lowercase and n[:1].isalpha())
                  and callable(getattr(cls, n)) and f"{cls.__name__}.{n}" not in EXCLUDED)


def uppercase(name):
    """The uppercase method whose recipe a lowercase one shares: wait -> Wait."""
    return name[:1].upper() + name[1:]


# Send modes are sends to this test: same arguments, same partner (the receive
# is posted before the send, so a ready or synchronous send completes; a
# buffered one uses the buffer attached in `main`).
SEND_MODES = {"Bsend": "Send", "Ssend": "Send", "Rsend": "Send"}


def operation(name):
    """(base operation, form) of a Comm method: Iallreduce -> (Allreduce, nonblocking)."""
    if name.endswith("_init"):
        base, form = name[:-5], "persistent"
    elif name not in COMM_RECIPES and name.startswith("I") and name[1:2].islower():
        base, form = name[1].upper() + name[2:], "nonblocking"
    else:
        base, form = name, "blocking"
    return SEND_MODES.get(base, base), form


# -- Results ------------------------------------------------------------------------


_CONTENT = {}      # id of this trial's object -> what it holds, where Python cannot tell


def values(obj):
    """What a data object holds, as a flat numpy array, or None if it is not one."""
    if id(obj) in _CONTENT:
        return _CONTENT[id(obj)].copy()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().reshape(-1).numpy().copy()
    if isinstance(obj, np.ndarray):
        return obj.reshape(-1).copy()
    return None


def raw(obj):
    """The bytes a buffer-like object holds, or None."""
    v = values(obj)
    if v is not None:
        return v.tobytes()
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    return None


def message(obj):
    """The bytes a send of `obj` moves: None is an empty message (as in
    mpi4py); None for an object that is no buffer."""
    return b"" if obj is None else raw(obj)


def data(rank):
    return torch.arange(N, dtype=torch.float64) + 10 * (rank + 1)


class Outcome(Exception):
    """A trial's failure, described."""


def expect_equal(label, got, want):
    got = values(got) if not isinstance(got, np.ndarray) else got.reshape(-1)
    if got is None:
        raise Outcome(f"{label}: not readable as an array")
    want = np.asarray(want).reshape(-1)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        raise Outcome(f"{label}: got {got!r}, expected {want!r}")


# -- Collectives ----------------------------------------------------------------------

UFUNC = {id(_mpi4py.SUM): np.add, id(_mpi4py.MAX): np.maximum, id(_mpi4py.MIN): np.minimum,
         id(_mpi4py.PROD): np.multiply}


def sends(args, valid, size, inplace_ok=True):
    """Each rank's send block (a float64 array), from args['sendbuf'] (`valid`
    is the valid one, the rank's own data)."""
    s = args["sendbuf"]
    if s is None or s is mcr.IN_PLACE:
        if not inplace_ok:
            raise Outcome("accepted sendbuf None/IN_PLACE where it is not allowed")
        return [data(r).numpy() for r in range(size)]   # recvbuf was prefilled
    if s is valid:
        return [data(r).numpy() for r in range(size)]
    v = values(s)
    if v is None:
        raise Outcome(f"accepted sendbuf {type(s).__name__} with no checkable meaning")
    return [v] * size                                  # the same object on every rank


def ufunc(op):
    try:
        return UFUNC[id(op)]
    except KeyError:
        raise Outcome(f"accepted op {op!r}, which is not a reduction on float64") from None


def as_root(value, size):
    """The root a call uses for `value`: read with int() as mpi4py does (1.5
    is rank 1; IN_PLACE, an int in mpi4py, is rank 1 too)."""
    try:
        r = operator.index(value) if is_integer(value) else int(value)
    except Exception:
        raise Outcome(f"accepted root {value!r}") from None
    if not 0 <= r < size:
        raise Outcome(f"accepted root {value!r} out of range at size {size}")
    return r


def vspec(buf, size, n):
    return [buf, [n] * size, [i * n for i in range(size)]]


def coll_recipe(base, comm):
    """(valid args, outputs to check(args) -> [(label, buffer, expected)]) for a collective."""
    size, rank = comm.size, comm.rank
    x = data(rank)
    full = torch.cat([data(r) for r in range(size)])
    if base == "Barrier":
        return {}, lambda a: []
    if base == "Bcast":
        buf = x.clone() if rank == 0 else torch.zeros(N, dtype=torch.float64)
        # a root other than 0 sends what it holds: zeros unless it is rank 0
        args = {"buf": buf, "root": 0}

        def out_fixed(a):
            root = as_root(a["root"], size)
            b = a["buf"]
            if b is buf:
                return [("buf", buf, data(0).numpy() if root == 0 else np.zeros(N))]
            # the same object on every rank: it must hold what it held
            if b is mcr.IN_PLACE:
                raise Outcome("accepted buf IN_PLACE")
            if b is None:
                return []                           # an empty message, as in mpi4py
            before = raw(obj_before.get("buf"))
            if before is None:
                raise Outcome(f"accepted buf {type(b).__name__}")
            if isinstance(b, np.ndarray) and not b.flags.writeable and rank != root:
                raise Outcome("accepted a read-only array as the buffer Bcast receives into")
            if raw(b) != before:
                raise Outcome(f"buf holds {raw(b)!r}, expected {before!r}")
            return []
        return args, out_fixed
    if base in ("Gather", "Gatherv"):
        recv = torch.zeros(size * N, dtype=torch.float64)
        recv[rank * N:(rank + 1) * N] = x         # what IN_PLACE at the root sends
        args = {"sendbuf": x, "recvbuf": vspec(recv, size, N) if base == "Gatherv" else recv,
                "root": 0}

        def out(a):
            root = as_root(a["root"], size)
            blocks = sends(a, x, size, inplace_ok=(rank == root))
            if rank != root:
                return []
            return [("recvbuf", recv, np.concatenate(blocks))]
        return args, out
    if base in ("Scatter", "Scatterv"):
        recv = torch.zeros(N, dtype=torch.float64)
        recv.copy_(data(rank))                    # IN_PLACE at the root keeps its block
        args = {"sendbuf": vspec(full, size, N) if base == "Scatterv" else full,
                "recvbuf": recv, "root": 0}

        def out(a):
            root = as_root(a["root"], size)
            s = a["sendbuf"]
            # None at the root is IN_PLACE (as in mpi4py)
            if a["recvbuf"] is mcr.IN_PLACE or (a["recvbuf"] is None and rank == root):
                if rank != root:
                    raise Outcome("accepted recvbuf IN_PLACE at a non-root")
                return []                            # the root's block stays in sendbuf
            if s is not args_sendbuf and rank == root:
                v = values(s)
                if v is None or v.size != size * N:
                    raise Outcome(f"accepted sendbuf {type(s).__name__}")
                return [("recvbuf", recv, v[rank * N:(rank + 1) * N])]
            return [("recvbuf", recv, data(rank).numpy())]
        args_sendbuf = args["sendbuf"]
        return args, out
    if base in ("Allgather", "Allgatherv"):
        recv = torch.zeros(size * N, dtype=torch.float64)
        recv[rank * N:(rank + 1) * N] = x
        args = {"sendbuf": x,
                "recvbuf": vspec(recv, size, N) if base == "Allgatherv" else recv}
        return args, lambda a: [("recvbuf", recv, np.concatenate(sends(a, x, size)))]
    if base in ("Alltoall", "Alltoallv"):
        k = N // size
        recv = x.clone()                          # IN_PLACE sends what recvbuf holds
        v = base == "Alltoallv"
        args = {"sendbuf": vspec(x, size, k) if v else x,
                "recvbuf": vspec(recv, size, k) if v else recv}

        def out(a):
            s = a["sendbuf"]
            if s is args_sendbuf:
                blocks = [data(r).numpy() for r in range(size)]
            else:
                blocks = sends(a, x, size)
            want = np.concatenate([blocks[r][rank * k:(rank + 1) * k] for r in range(size)])
            return [("recvbuf", recv, want)]
        args_sendbuf = args["sendbuf"]
        return args, out
    if base == "Alltoallw":
        k = N // size
        recv = x.clone()                          # IN_PLACE sends what recvbuf holds

        def wspec(t):
            byte_displs = [t.element_size() * k * j for j in range(size)]
            return [t, ([k] * size, byte_displs), [_mpi4py.DOUBLE] * size]
        args = {"sendbuf": wspec(x), "recvbuf": wspec(recv)}

        def out(a):
            s = a["sendbuf"]
            if s is not valid_send and s is not mcr.IN_PLACE and s is not None:
                raise Outcome(f"accepted sendbuf {type(s).__name__}, not a [buf, counts, "
                              "displs, datatypes] spec")
            if a["recvbuf"] is not valid_recv:
                raise Outcome(f"accepted recvbuf {type(a['recvbuf']).__name__}")
            want = np.concatenate([data(r).numpy()[rank * k:(rank + 1) * k]
                                   for r in range(size)])
            return [("recvbuf", recv, want)]
        valid_send, valid_recv = args["sendbuf"], args["recvbuf"]
        return args, out
    if base in ("Reduce", "Allreduce", "Scan", "Exscan"):
        recv = x.clone()                          # IN_PLACE reduces what recvbuf holds
        args = {"sendbuf": x, "recvbuf": recv, "op": _mpi4py.SUM}
        if base == "Reduce":
            args["root"] = 0

        def out(a):
            f = ufunc(a["op"])
            if base == "Reduce":
                root = as_root(a["root"], size)
                blocks = sends(a, x, size, inplace_ok=(rank == root))
                if rank != root:
                    return []
                ranks = range(size)
            else:
                blocks = sends(a, x, size)
                ranks = {"Allreduce": range(size), "Scan": range(rank + 1),
                         "Exscan": range(rank)}[base]
            if not ranks:
                return []                          # Exscan on rank 0: undefined
            return [("recvbuf", recv, f.reduce(np.stack([blocks[r] for r in ranks])))]
        return args, out
    if base in ("Reduce_scatter_block", "Reduce_scatter"):
        k = N // size
        # prefilled with the operand that IN_PLACE reads: the whole vector at
        # size 1; at more ranks, size blocks of k // size (as mpi4py splits it)
        recv = x[:k].clone()
        args = {"sendbuf": x, "recvbuf": recv, "op": _mpi4py.SUM}
        if base == "Reduce_scatter":
            args["recvcounts"] = [k] * size

        def out(a):
            f = ufunc(a["op"])
            if (a["sendbuf"] is mcr.IN_PLACE or a["sendbuf"] is None) and size > 1:
                if base == "Reduce_scatter" or k % size:
                    raise Outcome(f"accepted sendbuf {a['sendbuf']!r} with a recvbuf of "
                                  f"{k} elements, not a multiple of {size} blocks")
                c = k // size                     # result: the first c elements
                total = f.reduce(np.stack([data(q).numpy()[:k] for q in range(size)]))
                return [("recvbuf", recv[:c], total[rank * c:(rank + 1) * c])]
            if base == "Reduce_scatter" and a["recvcounts"] is not None and (
                    not isinstance(a["recvcounts"], list) or a["recvcounts"] != [k] * size):
                raise Outcome(f"accepted recvcounts {a['recvcounts']!r}")
            total = f.reduce(np.stack(sends(a, x, size)))
            return [("recvbuf", recv, total[rank * k:(rank + 1) * k])]
        return args, out
    return None


obj_before = {}       # the fuzzed argument's value before the call, for in-out buffers

ROOT_ONLY = {("Gather", "recvbuf"), ("Gatherv", "recvbuf"), ("Scatter", "sendbuf"),
             ("Scatterv", "sendbuf"), ("Reduce", "recvbuf")}
# where IN_PLACE is valid at the root only (MPI): tried on COMM_SELF too, and so
# is None, which the root reads as IN_PLACE and the others as an empty message
# (as mpi4py 4.1.2 does: passed by every rank, the root would wait for blocks)
IN_PLACE_AT_ROOT = {("Gather", "sendbuf"), ("Gatherv", "sendbuf"), ("Scatter", "recvbuf"),
                    ("Scatterv", "recvbuf"), ("Reduce", "sendbuf")}
# Bcast's buffer is sent by the root and written by the others: read-only memory
# is valid at the root only, so the root's message would reach no receive (MPI
# sends it eagerly and it poisons a later trial; Gloo's root waits forever).
# Tried on COMM_SELF (the root's side); tests/test_errors.py checks the others
# refuse it.
READ_ONLY_OBJECTS = {"bytes", "ndarray-readonly"}
# Arguments every rank passes but the root alone checks against its own other
# buffer (the type and size of Gather's sendbuf against the root's recvbuf ...):
# a buffer object the root refuses while the others accept it is an erroneous
# program that only an agreement step could report on every rank (issue 14);
# the others would wait for the root (Gloo, MPI's persistent and rendezvous
# forms) or leave messages for a later call. Buffer objects there are tried on
# COMM_SELF (the root's side, results checked); objects that are no buffer are
# refused alike everywhere and stay on the 2-rank communicator.
ROOT_CHECKED = {("Gather", "sendbuf"), ("Gatherv", "sendbuf"), ("Scatter", "recvbuf"),
                ("Scatterv", "recvbuf"), ("Reduce", "sendbuf")}
BUFFER_OBJECTS = {"bytes", "bytearray", "dlpack-capsule", "tensor-noncontiguous",
                  "tensor-0d", "tensor-float32", "ndarray-readonly"}


# -- Point-to-point (on COMM_SELF: messages to oneself) --------------------------------------


def drain(comm, backend):
    """Receive every message still queued on `comm` (a rejected or stray send)."""
    st = mcr.Status()
    while comm.Iprobe(mcr.ANY_SOURCE, mcr.ANY_TAG, st, backend=backend):
        n = st.Get_count(_mpi4py.BYTE)
        comm.Recv(torch.zeros(n, dtype=torch.uint8), st.source, st.tag, backend=backend)


def wait_for(req, what):
    """Wait for `req`, giving up (an Outcome) after TRIAL_DEADLINE seconds."""
    st = mcr.Status()
    start = time.monotonic()
    while not req.Test(st):
        if time.monotonic() - start > TRIAL_DEADLINE:
            raise Outcome(f"{what}: never completed")
        time.sleep(0.001)
    return st


def run_form(comm, method, form, args, backend):
    """Call `method` in its form with `args` to completion; its result."""
    fn = getattr(comm, method)
    if form == "blocking":
        return fn(**args, backend=backend)
    req = fn(**args, backend=backend)
    if form == "nonblocking":
        req.Wait()
        return None
    try:
        req.Start()
        req.Wait()
    finally:
        req.Free()
    return None


class P2P:
    """One point-to-point trial on COMM_SELF: the valid partner of the call
    (a receive for a send, a send for a receive), and its check."""

    def __init__(self, comm, base, backend, param, obj):
        self.comm, self.base, self.backend = comm, base, backend
        self.partner = None
        self.param, self.value = param, obj
        self.sent = data(0)
        tag = lenient_tag(obj) if param in TAG_PARAMS else None
        tag = TAG if tag is None else tag
        self.tag = tag
        # a dest or source that is PROC_NULL: nothing is sent, or received
        self.null = param in ("dest", "source") and is_proc_null(obj)
        self.receiving = base == "Send" or (          # the partner is a receive
            self.null and param == "source" and base in ("Sendrecv", "Sendrecv_replace"))
        if base == "Send":
            self.args = {"buf": data(0), "dest": 0, "tag": TAG}
        elif base == "Recv":
            self.rbuf = torch.zeros(N, dtype=torch.float64)
            self.args = {"buf": self.rbuf, "source": 0, "tag": TAG, "status": None}
        elif base == "Sendrecv":
            self.rbuf = torch.zeros(N, dtype=torch.float64)
            self.args = {"sendbuf": self.sent, "dest": 0, "sendtag": tag,
                         "recvbuf": self.rbuf, "source": 0, "recvtag": tag, "status": None}
        elif base == "Sendrecv_replace":
            self.args = {"buf": data(0), "dest": 0, "sendtag": tag, "source": 0,
                         "recvtag": tag, "status": None}
        elif base in ("Probe", "Iprobe"):
            self.args = {"source": 0, "tag": TAG, "status": None}
        else:
            raise KeyError(base)

    def before(self, args):
        if self.base == "Send":
            self.pbuf = torch.zeros(N, dtype=torch.float64)
            self.partner = self.comm.Irecv(self.pbuf, mcr.ANY_SOURCE, mcr.ANY_TAG,
                                           backend=self.backend)
        elif self.base in ("Recv", "Probe", "Iprobe"):
            self.partner = self.comm.Isend(self.sent, 0, self.tag, backend=self.backend)
        elif self.null and self.param == "dest":
            # Sendrecv(_replace) to PROC_NULL: the message it receives comes from here
            self.partner = self.comm.Isend(self.sent, 0, self.tag, backend=self.backend)
        elif self.null:
            # Sendrecv(_replace) from PROC_NULL: its message to itself is received
            # here (a send to oneself that nothing receives may block: MPICH's does)
            self.pbuf = torch.zeros(N, dtype=torch.float64)
            self.partner = self.comm.Irecv(self.pbuf, 0, mcr.ANY_TAG, backend=self.backend)

    def after(self, args, raised, result):
        """Check a call that returned, then leave nothing pending."""
        try:
            if not raised:
                self.check(args, result)
        finally:
            self.cleanup()

    def check(self, args, result):
        b, st = self.base, args.get("status")
        if self.null:
            return self.check_null(args, result)
        if b == "Send":
            want = message(args["buf"])
            if want is None:
                raise Outcome(f"accepted buf {type(args['buf']).__name__}: what was sent?")
            pst = wait_for(self.partner, "the receive of the message sent")
            self.partner = None
            got = self.pbuf.numpy().tobytes()[:len(want)]
            if got != want[:8 * N] or pst.tag != lenient_tag(args["tag"]):
                raise Outcome(f"received {got!r} tag {pst.tag}, sent {want!r} tag "
                              f"{args['tag']!r}")
        elif b in ("Recv", "Sendrecv"):
            key = "buf" if b == "Recv" else "recvbuf"
            got = message(args[key])        # None: an empty buffer, as in mpi4py
            if got is None:
                raise Outcome(f"accepted {key} {type(args[key]).__name__}")
            if b == "Sendrecv":
                want = message(args["sendbuf"])
                if want is None:
                    raise Outcome(f"accepted sendbuf {type(args['sendbuf']).__name__}")
            else:
                want = self.sent.numpy().tobytes()
            # Open MPI does not report truncation of a message to oneself (neither
            # through mpi4py): what fits must have arrived
            n = min(len(got), len(want))
            if got[:n] != want[:n]:
                raise Outcome(f"{key} holds {got!r}, expected {want!r}")
            self.check_status(st)
        elif b == "Sendrecv_replace":
            got = message(args["buf"])
            if got is None:
                raise Outcome(f"accepted buf {type(args['buf']).__name__}")
            if isinstance(args["buf"], np.ndarray) and not args["buf"].flags.writeable:
                raise Outcome("accepted a read-only array as the buffer received into")
            self.check_status(st)
        elif b == "Probe":
            if result is not True:
                raise Outcome(f"Probe returned {result!r}")
            self.check_status(st)
        elif b == "Iprobe" and result:
            self.check_status(st)

    def check_null(self, args, result):
        """A call with PROC_NULL for `dest` (nothing sent: the receive posted for
        it is satisfied at cleanup) or `source` (nothing received)."""
        b = self.base
        if self.param == "dest":
            if b in ("Sendrecv", "Sendrecv_replace"):
                key = "recvbuf" if b == "Sendrecv" else "buf"
                got, want = raw(args[key]), self.sent.numpy().tobytes()
                if got is None or got[:len(want)] != want:
                    raise Outcome(f"{key} holds {got!r}, expected {want!r}")
            return
        if b in ("Probe", "Iprobe"):
            if result is not True:
                raise Outcome(f"{b} from PROC_NULL returned {result!r}")
        elif b != "Send":
            key = "recvbuf" if b == "Sendrecv" else "buf"
            got = raw(args[key])
            want = (torch.zeros(N, dtype=torch.float64) if b != "Sendrecv_replace"
                    else data(0)).numpy().tobytes()
            if got != want:
                raise Outcome(f"{key} changed by a receive from PROC_NULL: {got!r}")
        st = args.get("status")
        if isinstance(st, _mpi4py.Status) and st.source != _mpi4py.PROC_NULL:
            raise Outcome(f"status: source {st.source} after a receive from PROC_NULL")

    def check_status(self, st):
        if isinstance(st, _mpi4py.Status) and (st.source != 0 or st.tag != self.tag):
            raise Outcome(f"status: source {st.source} tag {st.tag}, expected 0 and {self.tag}")

    def cleanup(self):
        if self.partner is not None and self.receiving and not self.partner.Test():
            # nothing came (the call was refused, or sent to PROC_NULL): satisfy
            # the receive posted for it
            self.comm.Send(torch.zeros(N, dtype=torch.float64), 0, TAG, backend=self.backend)
        drain(self.comm, self.backend)
        if self.partner is not None:
            self.partner.Wait()
            self.partner = None


P2P_BASES = ("Send", "Recv", "Sendrecv", "Sendrecv_replace", "Probe", "Iprobe")
COLL_BASES = ("Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
              "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce", "Scan", "Exscan",
              "Reduce_scatter_block", "Reduce_scatter")
COMM_RECIPES = set(P2P_BASES) | set(COLL_BASES)


# -- Trials ----------------------------------------------------------------------------


class Fuzzer:
    """Runs trials and records what went wrong (never raises mid-case, so that
    every rank keeps making the same calls)."""

    def __init__(self, world):
        self.world = world
        self.rank = world.rank
        self.found = []
        self.trials = 0
        self.skipped = 0

    def progress(self, label):
        sys.stderr.write(f"[fuzz r{self.rank}] {label}\n")
        sys.stderr.flush()

    def trial(self, label, key, run, comm, backend):
        """`run()` -> None or raises; then the communicator must still work."""
        reason = known(*key)
        if reason is not None:
            self.skipped += 1
            return
        self.trials += 1
        self.progress(label)
        try:
            run()
            if VERBOSE:
                self.progress(f"  accepted: {label}")
        except Outcome as exc:
            self.found.append(f"{label}: {exc}")
        except SystemError as exc:
            self.found.append(f"{label}: SystemError: {exc}")
        except Exception as exc:
            if VERBOSE:
                self.progress(f"  raised {type(exc).__name__}: {str(exc)[:150]}")
        except BaseException as exc:  # noqa: B902 - anything else is a finding too
            self.found.append(f"{label}: {type(exc).__name__} (not an Exception): {exc}")
        self.comm_works(label, comm, backend)

    def comm_works(self, label, comm, backend):
        # a tuple, not a set: every rank must check in the same order
        for b in ("mpi",) if backend == "mpi" else ("mpi", backend):
            x = torch.full((3,), float(comm.rank + 1))
            y = torch.zeros(3)
            try:
                comm.Allreduce(x, y, _mpi4py.SUM, backend=b)
            except Exception as exc:
                self.found.append(f"{label}: afterwards Allreduce on {b} raised "
                                  f"{type(exc).__name__}: {exc}")
                continue
            want = float(comm.size * (comm.size + 1) // 2)
            if not torch.equal(y, torch.full((3,), want)):
                self.found.append(f"{label}: afterwards Allreduce on {b} gave {y.tolist()}")

    def done(self):
        assert not self.found, (f"rank {self.rank}: {len(self.found)} of {self.trials} "
                                f"trials failed:\n" + "\n".join(self.found))


def comm_trial(fz, world_comm, self_comm, method, param, obj, backend):
    base, form = operation(method)
    if base in P2P_BASES:
        comm = self_comm
    elif (base, param) in ROOT_ONLY or (
            obj.name in ("IN_PLACE", "None") and (base, param) in IN_PLACE_AT_ROOT) or (
            base == "Bcast" and param == "buf" and obj.name in READ_ONLY_OBJECTS) or (
            (base, param) in ROOT_CHECKED and obj.name in BUFFER_OBJECTS):
        comm = self_comm
    else:
        comm = world_comm
    label = f"Comm.{method} {param}={obj.name} backend={backend}"

    def run():
        value = obj.make()
        _CONTENT.clear()
        if obj.content is not None and values(value) is None:
            _CONTENT[id(value)] = obj.content       # a DLPack capsule
        if param == "backend":
            call_backend = value
        else:
            call_backend = backend
        if base in P2P_BASES:
            # backend=None is the communicator's default, MPI: the partner goes there
            partner = "mpi" if param == "backend" and value is None else backend
            t = P2P(comm, base, partner, param, value)
            # the recipe is the blocking form's: Irecv, Recv_init and Isendrecv
            # take no status
            names = {p for p, _ in parameters(mcr.Comm, method)[0]}
            args = {k: v for k, v in t.args.items() if k in names}
            if param != "backend":
                args[param] = value
            t.before(args)
            raised, result = True, None
            try:
                result = run_form(comm, method, form, args, call_backend)
                raised = False
            finally:
                t.after(args, raised, result)
            return
        args, out = coll_recipe(base, comm)
        if form == "persistent":
            args["info"] = _mpi4py.INFO_NULL
        valid = dict(args)
        if param != "backend":
            args[param] = value
        obj_before.clear()
        obj_before[param] = obj.make()              # an unused copy, to compare with
        run_form(comm, method, form, args, call_backend)
        for name, buf, want in out(args):
            if name == param and value is not valid.get(name):
                buf = value                         # the result is in the object given
            if isinstance(buf, np.ndarray) and not buf.flags.writeable:
                raise Outcome(f"{name}: a read-only array was accepted as a receive buffer")
            expect_equal(name, buf, want)

    fz.trial(label, (method, param, obj.name, backend), run, comm, backend)


def comm_methods():
    out = {}
    for name in own_methods(mcr.Comm):
        params = [p for p, _ in parameters(mcr.Comm, name)[0]]
        out[name] = params
    return out


# MPICH's collectives may hang where the message of one rank does not match its
# peers' (an erroneous MPI program: Open MPI raises MPI_ERR_TRUNCATE on every
# rank, MPICH on some): there the trials on several ranks run in checked mode,
# whose MismatchError every rank raises before any communicates.
MPICH = "MPICH" in _mpi4py.Get_library_version()


def fuzz_comm(world, family):
    fz = Fuzzer(world)
    wc = world.Dup()
    wc.checked = MPICH
    sc = mcr.COMM_SELF.Dup()
    try:
        for name, params in comm_methods().items():
            base, _ = operation(name)
            if base not in family:
                continue
            for backend in BACKENDS:
                for param in params:
                    for obj in OBJECTS:
                        comm_trial(fz, wc, sc, name, param, obj, backend)
    finally:
        sc.Free()
        wc.Free()
    fz.done()


# -- Neighborhood collectives (on a periodic ring) ------------------------------------


def filled(before, slots):
    """`before` (a float64 array) with each (offset, block) written at offset."""
    out = before.copy()
    for offset, block in slots:
        out[offset:offset + block.size] = block
    return out


def ngh_sends(args, valid, size):
    """Each rank's send buffer (a float64 array): None is an empty message, as
    in mpi4py; IN_PLACE is refused (MPI has none for these)."""
    if args["sendbuf"] is None:
        return [np.zeros(0)] * size
    if args["sendbuf"] is valid:
        return [data(r).numpy() for r in range(size)]
    return sends(args, valid, size, inplace_ok=False)


def ngh_recipe(base, ring):
    """(valid args, outputs to check) for a neighborhood collective on a
    periodic ring: block 0 goes left and block 1 right; slot 0 holds what
    the left neighbour sent right, slot 1 what the right one sent left (MPI
    4.0's order)."""
    size, rank = ring.size, ring.rank
    left, right = (rank - 1) % size, (rank + 1) % size
    x = data(rank)
    k = N // 2
    if base in ("Neighbor_alltoall", "Neighbor_alltoallv"):
        recv = torch.zeros(N, dtype=torch.float64)
        v = base == "Neighbor_alltoallv"
        args = {"sendbuf": vspec(x, 2, k) if v else x, "recvbuf": vspec(recv, 2, k) if v else recv}

        def out(a):
            blocks = ngh_sends(a, args_sendbuf, size)
            bl, br = blocks[left], blocks[right]
            if bl.size % 2 and not v:
                raise Outcome(f"accepted sendbuf of {bl.size} elements for 2 neighbours")
            # a buffer alone in a vector spec splits as mpi4py's: the first block longer
            cut = (bl.size + 1) // 2
            return [("recvbuf", recv, filled(np.zeros(N), [(0, bl[cut:]),
                                                            (k, br[:(br.size + 1) // 2])]))]
        args_sendbuf = args["sendbuf"]
        return args, out
    if base in ("Neighbor_allgather", "Neighbor_allgatherv"):
        recv = torch.zeros(2 * N, dtype=torch.float64)
        v = base == "Neighbor_allgatherv"
        args = {"sendbuf": x, "recvbuf": vspec(recv, 2, N) if v else recv}

        def out(a):
            blocks = ngh_sends(a, x, size)
            return [("recvbuf", recv, filled(np.zeros(2 * N), [(0, blocks[left]),
                                                                (N, blocks[right])]))]
        return args, out
    assert base == "Neighbor_alltoallw"
    recv = torch.zeros(N, dtype=torch.float64)

    def wspec(t):
        return [t, ([k, k], [0, 8 * k]), [_mpi4py.DOUBLE] * 2]
    args = {"sendbuf": wspec(x), "recvbuf": wspec(recv)}

    def out_w(a):
        if a["sendbuf"] is not args_w or a["recvbuf"] is not args_wr:
            return []                     # a substituted spec: accepted or refused, no crash
        return [("recvbuf", recv, np.concatenate([data(left).numpy()[k:],
                                                  data(right).numpy()[:k]]))]
    args_w, args_wr = args["sendbuf"], args["recvbuf"]
    return args, out_w


def ngh_methods():
    return {n: [p for p, _ in parameters(mcr.Cartcomm, n)[0]]
            for n in sorted(vars(_core._Neighborhood))
            if n[:1].isupper() and callable(getattr(mcr.Cartcomm, n))}


def ngh_base(name):
    base = name[:-5] if name.endswith("_init") else name
    form = "persistent" if name.endswith("_init") else "blocking"
    if base.startswith("Ineighbor"):
        base, form = "N" + base[2:], "nonblocking"
    return base, form


@case
def neighborhood_collectives(comm):
    fz = Fuzzer(comm)
    wc = comm.Dup()
    wc.checked = MPICH
    ring = wc.Create_cart([comm.size], periods=[True])
    try:
        for name, params in ngh_methods().items():
            base, form = ngh_base(name)
            for backend in BACKENDS if base != "Neighbor_alltoallw" else ("mpi",):
                for param in params:
                    for obj in OBJECTS:
                        label = f"Cartcomm.{name} {param}={obj.name} backend={backend}"

                        def run(base=base, form=form, param=param, obj=obj, backend=backend,
                                name=name):
                            value = obj.make()
                            _CONTENT.clear()
                            if obj.content is not None and values(value) is None:
                                _CONTENT[id(value)] = obj.content       # a DLPack capsule
                            args, out = ngh_recipe(base, ring)
                            if form == "persistent":
                                args["info"] = _mpi4py.INFO_NULL
                            valid = dict(args)
                            call_backend = value if param == "backend" else backend
                            if param != "backend":
                                args[param] = value
                            run_form(ring, name, form, args, call_backend)
                            for out_name, buf, want in out(args):
                                if out_name == param and value is not valid.get(out_name):
                                    buf = value
                                if isinstance(buf, np.ndarray) and not buf.flags.writeable:
                                    raise Outcome(f"{out_name}: a read-only array was "
                                                  "accepted as a receive buffer")
                                expect_equal(out_name, buf, want)
                        fz.trial(label, (name, param, obj.name, backend), run, ring, backend)
    finally:
        ring.Free()
        wc.Free()
    fz.done()


# -- Requests and statuses (on COMM_SELF) ----------------------------------------------


def request_pair(comm, backend, persistent=False):
    """[receive, send] requests of one message to oneself, and the receive buffer."""
    rbuf = torch.zeros(N, dtype=torch.float64)
    if persistent:
        reqs = [comm.Recv_init(rbuf, 0, TAG, backend=backend),
                comm.Send_init(data(0), 0, TAG, backend=backend)]
    else:
        reqs = [comm.Irecv(rbuf, 0, TAG, backend=backend),
                comm.Isend(data(0), 0, TAG, backend=backend)]
    return reqs, rbuf


def check_statuses(value, count):
    if isinstance(value, list):
        for i, st in enumerate(value[:count]):
            if isinstance(st, _mpi4py.Status) and st.source not in (0, _mpi4py.ANY_SOURCE,
                                                                     _mpi4py.PROC_NULL):
                raise Outcome(f"statuses[{i}]: source {st.source}")


def request_trial(fz, comm, cls, method, param, obj, backend):
    label = f"{cls.__name__}.{method} {param}={obj.name} backend={backend}"
    persistent = cls is mcr.Prequest
    base = uppercase(method)        # (mpi4py's lowercase forms: the same recipe)

    def run():
        value = obj.make()
        reqs, rbuf = request_pair(comm, backend, persistent)
        started = False
        try:
            if persistent:
                mcr.Prequest.Startall(reqs)
                started = True
            fn = getattr(cls, method)
            if param == "self":
                fn(value)
                return
            if base in ("Wait", "Test", "Get_status"):
                reqs[1].Wait()
                result = fn(reqs[0], value)
                if method == "test":
                    result, obj_ = result               # (flag, object): None here
                    if obj_ is not None:
                        raise Outcome(f"test returned the object {obj_!r}")
                if base == "Wait" or result:
                    if base != "Get_status":
                        expect_equal("the received message", rbuf, data(0).numpy())
                    if isinstance(value, _mpi4py.Status) and value.source != 0:
                        raise Outcome(f"status: source {value.source}, expected 0")
            elif base in ("Cancel", "Free", "Start"):
                return                               # only `self`, tried above
            elif base == "Startall":
                if not persistent or started:
                    for r in reqs:
                        r.Wait()
                    started = False
                result = fn(value)
                started = True
            elif base == "Get_count":
                reqs[1].Wait()
                st = mcr.Status()
                reqs[0].Wait(st)
                count = st.Get_count(value)
                if isinstance(value, _mpi4py.Datatype):
                    want = 8 * N // value.Get_size()
                    if count != want:
                        raise Outcome(f"Get_count({value}) = {count}, expected {want}")
                elif value is not None:
                    raise Outcome(f"accepted datatype {value!r}: count {count}")
            else:                                   # Waitall, Testsome, ...: (requests, st)
                args = {"requests": reqs, "statuses" if "statuses" in PARAMS[method]
                        else "status": None}
                args[param] = value
                result = getattr(cls, method)(**args)
                check_statuses(args.get("statuses"), len(reqs))
        finally:
            # leave nothing pending: complete what the trial left
            for r in reqs:
                try:
                    if r or (persistent and started):
                        r.Wait()
                except Exception:
                    pass
            drain(comm, backend)
            if persistent:
                for r in reqs:
                    try:
                        r.Free()
                    except Exception:
                        pass

    fz.trial(label, (f"{cls.__name__}.{method}", param, obj.name, backend), run, comm, backend)


PARAMS = {}


def request_methods():
    out = []
    for cls in (mcr.Request, mcr.Prequest, mcr.Status):
        for name in own_methods(cls, lowercase=True):
            params, is_class = parameters(cls, name)
            params = [p for p, _ in params]
            PARAMS[name] = params
            out.append((cls, name, params if is_class else ["self"] + params))
    return out


# -- Cases -----------------------------------------------------------------------------------


@case
def methods_have_recipes(comm):
    missing = [n for n in comm_methods() if operation(n)[0] not in COMM_RECIPES]
    known_req = {"Wait", "Test", "Get_status", "Cancel", "Free", "Start", "Startall",
                 "Get_count", "Waitall", "Testall", "Waitany", "Testany", "Waitsome",
                 "Testsome", "Get_status_all", "Get_status_any", "Get_status_some"}
    missing += [f"{c.__name__}.{n}" for c, n, _ in request_methods()
                if uppercase(n) not in known_req]
    assert not missing, f"methods with no recipe in this test (add one): {missing}"


@case
def point_to_point(comm):
    _mpi4py.Attach_buffer(bytearray(1 << 22))     # for Bsend, Ibsend, Bsend_init
    try:
        fuzz_comm(comm, P2P_BASES)
    finally:
        _mpi4py.Detach_buffer()


@case
def collectives_rooted(comm):
    fuzz_comm(comm, ("Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce"))


@case
def collectives_all(comm):
    fuzz_comm(comm, ("Allgather", "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw",
                     "Allreduce"))


@case
def collectives_scans(comm):
    fuzz_comm(comm, ("Scan", "Exscan", "Reduce_scatter_block", "Reduce_scatter"))


@case
def requests_and_statuses(comm):
    fz = Fuzzer(comm)
    sc = mcr.COMM_SELF.Dup()
    try:
        for cls, name, params in request_methods():
            for backend in BACKENDS:
                for param in params:
                    for obj in OBJECTS:
                        request_trial(fz, sc, cls, name, param, obj, backend)
    finally:
        sc.Free()
    fz.done()


test_mpi = mpi_cases(__name__, sizes=(2,), timeout=240)
