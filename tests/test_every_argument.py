"""Any object in any argument of any buffer method: a Python exception or a correct result.

Every buffer method of mcr.Comm, the neighborhood collectives of mcr.Cartcomm (on a periodic ring),
every method of mcr.Request/Prequest (lowercase forms with the uppercase one's recipe) and
Status.Get_count get each of OBJECTS in each argument in turn, the others valid, on MPI and Gloo;
the methods come from the signatures Cython embeds (a new one fails methods_have_recipes). A trial
passes when the call raises an Exception other than SystemError, or returns what torch/numpy
compute from what the arguments mean; then Allreduce on MPI and on its backend must still work.
Trials are named on stderr first, so a crash or a hang names its trial. Collectives get the same
object on every rank; point-to-point and request trials run on COMM_SELF.
"""

import ast
import collections
import contextlib
import faulthandler
import fnmatch
import itertools
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
# MPICH's collectives may hang on a message that does not match its peers' (Open MPI raises
# MPI_ERR_TRUNCATE on every rank): there collectives run in checked mode (MismatchError everywhere)
MPICH = "MPICH" in _mpi4py.Get_library_version()
# Not fuzzed: communicator management (no buffers; bad Create_cart dims: test_comm), and a
# request's handle (no arguments; mcr's only to note the handle lent: test_request)
EXCLUDED = {"Comm." + n for n in (
    "Free", "Dup", "Split", "Split_type", "Create", "Create_group", "Clone", "Dup_with_info",
    "Idup", "Idup_with_info", "Create_cart", "Create_graph", "Create_dist_graph",
    "Create_dist_graph_adjacent")} | {"Request.py2f", "Request.toint"}
# Trials known to fail, skipped (a crash or a hang would hide every later trial): (method,
# parameter, object, backend) fnmatch patterns -> the reason. Remove a line when its fix lands.
KNOWN_FAILURES: dict[tuple[str, str, str, str], str] = {
    ("Cartcomm.*eighbor_all*v*", "recvbuf", "tensor-0d", "mpi"): (
        "one element for the blocks of 2 neighbours (counts [1, 0]) truncates; Open MPI 5.0 "
        "aborts the schedule and writes past the buffer (heap corrupt in 1 run of 6; plain "
        "mpi4py too, MALLOC_CHECK_=3); unchecked, mcr does not see the neighbours' counts before "
        "calling MPI (checked mode swaps them first: test_check)")}


# -- Objects ------------------------------------------------------------------------
def _readonly_array():
    a = np.arange(N, dtype=np.float64) + 100
    a.flags.writeable = False
    return a


Obj = collections.namedtuple("Obj", "name make")
CAPSULE = np.ones(N)        # what the DLPack capsule holds (Python cannot tell)
# a fresh object per trial: receives may write into it
OBJECTS = [Obj(*o) for o in [
    ("str", lambda: "abc"), ("bytes", lambda: b"abcdefgh"),
    ("bytearray", lambda: bytearray(8 * N)), ("int-negative", lambda: -1),
    ("int-large-negative", lambda: -12345),
    ("PROC_NULL", lambda: _mpi4py.PROC_NULL),     # -2 on Open MPI, -1 on MPICH
    ("int-out-of-range", lambda: 5), ("int-2**31", lambda: 2 ** 31),
    ("int-huge", lambda: 10 ** 30), ("bool", lambda: True), ("float", lambda: 1.5),
    ("float-nan", lambda: float("nan")), ("None", lambda: None), ("list-empty", lambda: []),
    ("list-ints", lambda: [2, 2]), ("list-mixed", lambda: [1, 2.5, "x"]),
    ("dict", lambda: {"a": 1}), ("Status", lambda: mcr.Status()),
    ("Request", lambda: mcr.Request()), ("IN_PLACE", lambda: mcr.IN_PLACE),
    ("dlpack-capsule", lambda: torch.from_numpy(CAPSULE.copy()).__dlpack__()),
    ("tensor-noncontiguous", lambda: torch.arange(2 * N, dtype=torch.float64)[::2]),
    ("tensor-0d", lambda: torch.tensor(5.0, dtype=torch.float64)),
    ("tensor-float32", lambda: torch.arange(N, dtype=torch.float32) + 7),
    ("ndarray-readonly", _readonly_array), ("Datatype", lambda: _mpi4py.DOUBLE),
    ("Op", lambda: _mpi4py.MAX), ("Op-REPLACE", lambda: _mpi4py.REPLACE),
    ("Comm", lambda: mcr.COMM_SELF), ("Info", lambda: _mpi4py.INFO_NULL)]]


def as_int(value):
    """The int a call reads from `value` (int() as in mpi4py: 1.5 is 1, IN_PLACE too), or None."""
    for read in (operator.index, int):
        with contextlib.suppress(Exception):
            return read(value)
    return None


def lenient_tag(value):
    """The tag a call uses for `value`, None if it must refuse it."""
    tag = as_int(value)
    return tag if tag is not None and 0 <= tag <= TAG_UB else None


# -- Methods, from the embedded signatures ----------------------------------------------
def parameters(cls, name):
    """The parameter names of `cls`.`name` (no self/cls), and whether it is a class method."""
    doc = (getattr(cls, name).__doc__ or "").strip()
    first = doc.splitlines()[0] if doc else ""
    if not first.startswith(name + "("):
        raise AssertionError(f"{cls.__name__}.{name}: no embedded signature in its "
                             f"docstring (was mcr built with embedsignature?): {first!r}")
    a = ast.parse(f"def {first}: pass").body[0].args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return [p for p in names if p not in ("self", "cls")], names[0] == "cls"


def own_methods(cls, lowercase=False):
    """Public methods `cls` defines itself: uppercase ones, with `lowercase` mpi4py's too."""
    return sorted(n for n, v in vars(cls).items()
                  if (n[:1].isupper() or lowercase and n[:1].isalpha())
                  and callable(getattr(cls, n)) and f"{cls.__name__}.{n}" not in EXCLUDED)


def uppercase(name):
    """The uppercase method whose recipe a lowercase one shares: wait -> Wait."""
    return name[:1].upper() + name[1:]


# Send modes are sends here: the receive is posted before the send, so a ready or synchronous send
# completes; a buffered one uses the buffer point_to_point attaches
SEND_MODES = {"Bsend": "Send", "Ssend": "Send", "Rsend": "Send"}


def operation(name):
    """(base operation, form) of a method: Iallreduce -> (Allreduce, nonblocking)."""
    if name.endswith("_init"):
        base, form = name[:-5], "persistent"
    elif name not in COMM_RECIPES and name.startswith("I") and name[1:2].islower():
        base, form = name[1].upper() + name[2:], "nonblocking"
    else:
        base, form = name, "blocking"
    return SEND_MODES.get(base, base), form


# -- Results ------------------------------------------------------------------------
def values(obj):
    """What a data object holds, as a flat numpy array, or None if it is not one."""
    if type(obj).__name__ == "PyCapsule":
        return CAPSULE.copy()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().reshape(-1).numpy().copy()
    return obj.reshape(-1).copy() if isinstance(obj, np.ndarray) else None


def raw(obj):
    """The bytes a buffer-like object holds, or None."""
    v = values(obj)
    if v is not None:
        return v.tobytes()
    return bytes(obj) if isinstance(obj, (bytes, bytearray)) else None


def message(obj):
    """The bytes a send of `obj` moves: None is an empty message (as in mpi4py)."""
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


def read_only(buf):
    return isinstance(buf, np.ndarray) and not buf.flags.writeable


# -- Collectives ----------------------------------------------------------------------
UFUNC = {id(_mpi4py.SUM): np.add, id(_mpi4py.MAX): np.maximum, id(_mpi4py.MIN): np.minimum,
         id(_mpi4py.PROD): np.multiply}


def sends(args, valid, size, inplace_ok=True):
    """Each rank's send block (float64) from args['sendbuf']; `valid`: the rank's own data."""
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
    """The root a call uses for `value` (read as as_int does)."""
    r = as_int(value)
    if r is None:
        raise Outcome(f"accepted root {value!r}")
    if not 0 <= r < size:
        raise Outcome(f"accepted root {value!r} out of range at size {size}")
    return r


def vspec(buf, size, n):
    return [buf, [n] * size, [i * n for i in range(size)]]


def coll_recipe(base, comm, fresh):
    """(valid args, check(args) -> [(label, buffer, expected)]); `fresh`: a copy of the object."""
    size, rank = comm.size, comm.rank
    x, k = data(rank), N // size
    mine = slice(rank * k, (rank + 1) * k)
    if base == "Barrier":
        return {}, lambda a: []
    if base == "Bcast":
        buf = x.clone() if rank == 0 else torch.zeros(N, dtype=torch.float64)

        def out_bcast(a):
            root, b = as_root(a["root"], size), a["buf"]
            if b is buf:        # a root other than 0 sends what it holds: zeros
                return [("buf", buf, data(0).numpy() if root == 0 else np.zeros(N))]
            if b is mcr.IN_PLACE:
                raise Outcome("accepted buf IN_PLACE")
            if b is None:
                return []                           # an empty message, as in mpi4py
            before = raw(fresh)   # the same object on every rank: it must hold what it held
            if before is None:
                raise Outcome(f"accepted buf {type(b).__name__}")
            if read_only(b) and rank != root:
                raise Outcome("accepted a read-only array as the buffer Bcast receives into")
            if raw(b) != before:
                raise Outcome(f"buf holds {raw(b)!r}, expected {before!r}")
            return []
        return {"buf": buf, "root": 0}, out_bcast
    if base in ("Scatter", "Scatterv"):
        recv = data(rank).clone()                 # IN_PLACE at the root keeps its block
        full = torch.cat([data(r) for r in range(size)])
        valid = vspec(full, size, N) if base == "Scatterv" else full

        def out_scatter(a):
            root, s = as_root(a["root"], size), a["sendbuf"]
            # None at the root is IN_PLACE (as in mpi4py)
            if a["recvbuf"] is mcr.IN_PLACE or (a["recvbuf"] is None and rank == root):
                if rank != root:
                    raise Outcome("accepted recvbuf IN_PLACE at a non-root")
                return []                            # the root's block stays in sendbuf
            if s is not valid and rank == root:
                v = values(s)
                if v is None or v.size != size * N:
                    raise Outcome(f"accepted sendbuf {type(s).__name__}")
                return [("recvbuf", recv, v[rank * N:(rank + 1) * N])]
            return [("recvbuf", recv, data(rank).numpy())]
        return {"sendbuf": valid, "recvbuf": recv, "root": 0}, out_scatter
    if base == "Alltoallw":
        recv = x.clone()                          # IN_PLACE sends what recvbuf holds
        sbuf, rbuf = ([t, ([k] * size, [t.element_size() * k * j for j in range(size)]),
                       [_mpi4py.DOUBLE] * size] for t in (x, recv))

        def out_alltoallw(a):
            s = a["sendbuf"]
            if s is not sbuf and s is not mcr.IN_PLACE and s is not None:
                raise Outcome(f"accepted sendbuf {type(s).__name__}, not a [buf, counts, "
                              "displs, datatypes] spec")
            if a["recvbuf"] is not rbuf:
                raise Outcome(f"accepted recvbuf {type(a['recvbuf']).__name__}")
            return [("recvbuf", recv, np.concatenate([data(r).numpy()[mine] for r in range(size)]))]
        return {"sendbuf": sbuf, "recvbuf": rbuf}, out_alltoallw
    # the others: a result computed from every rank's send block, of which Alltoall(v) and
    # Reduce_scatter(_block) keep this rank's part
    v, rooted, pick = base.endswith("v"), base in ("Gather", "Gatherv", "Reduce"), mine
    if base in ("Gather", "Gatherv", "Allgather", "Allgatherv"):
        recv = torch.zeros(size * N, dtype=torch.float64)
        recv[rank * N:(rank + 1) * N] = x         # what IN_PLACE sends
        args = {"sendbuf": x, "recvbuf": vspec(recv, size, N) if v else recv}
        pick = slice(None)
    elif base in ("Alltoall", "Alltoallv"):
        recv = x.clone()                          # IN_PLACE sends what recvbuf holds
        args = {"sendbuf": vspec(x, size, k) if v else x,
                "recvbuf": vspec(recv, size, k) if v else recv}
    else:
        # IN_PLACE reduces what recvbuf holds: Reduce_scatter(_block)'s is the whole vector at size
        # 1; at more ranks, size blocks of k // size (as mpi4py splits it)
        scatter = base.startswith("Reduce_scatter")
        recv = x[:k].clone() if scatter else x.clone()
        args = {"sendbuf": x, "recvbuf": recv, "op": _mpi4py.SUM}
        pick = mine if scatter else slice(None)
    if rooted:
        args["root"] = 0
    if base == "Reduce_scatter":
        args["recvcounts"] = [k] * size
    n = {"Scan": rank + 1, "Exscan": rank}.get(base, size)       # the blocks reduced
    valid = args["sendbuf"]

    def out(a):
        f = ufunc(a["op"]) if "op" in args else None
        if base.startswith("Reduce_scatter") and size > 1 and (
                a["sendbuf"] is mcr.IN_PLACE or a["sendbuf"] is None):
            if base == "Reduce_scatter" or k % size:
                raise Outcome(f"accepted sendbuf {a['sendbuf']!r} with a recvbuf of "
                              f"{k} elements, not a multiple of {size} blocks")
            c = k // size                     # result: the first c elements
            total = f.reduce(np.stack([data(q).numpy()[:k] for q in range(size)]))
            return [("recvbuf", recv[:c], total[rank * c:(rank + 1) * c])]
        if base == "Reduce_scatter" and a["recvcounts"] is not None and (
                not isinstance(a["recvcounts"], list) or a["recvcounts"] != [k] * size):
            raise Outcome(f"accepted recvcounts {a['recvcounts']!r}")
        root = as_root(a["root"], size) if rooted else rank
        blocks = sends(a, valid, size, inplace_ok=rank == root)
        if rank != root or not n:
            return []                          # not the root; Exscan on rank 0: undefined
        want = np.concatenate([b[pick] for b in blocks]) if f is None else \
            f.reduce(np.stack(blocks[:n]))[pick]
        return [("recvbuf", recv, want)]
    return dict(args), out


# Where a trial of a collective runs on COMM_SELF, not on all ranks (elsewhere the others wait):
# - arguments only the root reads (by MPI's design, as in C and mpi4py);
ROOT_ONLY = {("Gather", "recvbuf"), ("Gatherv", "recvbuf"), ("Scatter", "sendbuf"),
             ("Scatterv", "sendbuf"), ("Reduce", "recvbuf")}
# - arguments the root alone checks against its own other buffer (Gather's sendbuf against its
#   recvbuf): only an agreement step could report that on every rank (issue 14). Buffers are
#   tried there, IN_PLACE (valid at the root only) and None (the root's IN_PLACE, the others'
#   empty message, as mpi4py 4.1.2); objects that are no buffer are refused alike everywhere;
ROOT_CHECKED = {("Gather", "sendbuf"), ("Gatherv", "sendbuf"), ("Scatter", "recvbuf"),
                ("Scatterv", "recvbuf"), ("Reduce", "sendbuf")}
ROOT_CHECKED_OBJECTS = {"bytes", "bytearray", "dlpack-capsule", "tensor-noncontiguous",
                        "tensor-0d", "tensor-float32", "ndarray-readonly", "IN_PLACE", "None"}
# - read-only memory as Bcast's buffer: valid at the root only, whose message would poison a later
#   trial (MPI) or never end (Gloo); test_errors checks the others refuse it.
READ_ONLY_OBJECTS = {"bytes", "ndarray-readonly"}



def on_self(base, param, obj_name):
    return (base, param) in ROOT_ONLY or (
        (base, param) in ROOT_CHECKED and obj_name in ROOT_CHECKED_OBJECTS) or (
        (base, param) == ("Bcast", "buf") and obj_name in READ_ONLY_OBJECTS)


# -- Point-to-point (on COMM_SELF: messages to oneself) --------------------------------------
def drain(comm, backend):
    """Receive every message still queued on `comm` (a rejected or stray send)."""
    st = mcr.Status()
    while comm.Iprobe(mcr.ANY_SOURCE, mcr.ANY_TAG, st, backend=backend):
        n = st.Get_count(_mpi4py.BYTE)
        comm.Recv(torch.zeros(n, dtype=torch.uint8), st.source, st.tag, backend=backend)


def wait_for(req, what):
    """Wait for `req`, giving up (an Outcome) after TRIAL_DEADLINE seconds."""
    st, start = mcr.Status(), time.monotonic()
    while not req.Test(st):
        if time.monotonic() - start > TRIAL_DEADLINE:
            raise Outcome(f"{what}: never completed")
        time.sleep(0.001)
    return st


def run_form(comm, method, form, args, backend):
    """Call `method` in its form with `args` to completion; its result."""
    result = getattr(comm, method)(**args, backend=backend)
    if form == "nonblocking":
        result.Wait()
    elif form == "persistent":
        try:
            result.Start()
            result.Wait()
        finally:
            result.Free()
    return result if form == "blocking" else None


class P2P:
    """A point-to-point trial on COMM_SELF: the valid partner of the call, and its check."""

    def __init__(self, comm, base, backend, param, value):
        self.comm, self.base, self.backend, self.param = comm, base, backend, param
        self.partner, self.sent = None, data(0)
        tag = lenient_tag(value) if param in ("tag", "sendtag", "recvtag") else None
        self.tag = tag = TAG if tag is None else tag
        # a dest or source that reads as PROC_NULL (on MPICH -1, so IN_PLACE, address -1, too):
        # nothing is sent, or received
        self.null = param in ("dest", "source") and as_int(value) == _mpi4py.PROC_NULL
        self.receiving = base == "Send" or (          # the partner is a receive
            self.null and param == "source" and base in ("Sendrecv", "Sendrecv_replace"))
        self.rbuf, st = torch.zeros(N, dtype=torch.float64), {"status": None}
        self.args = {
            "Send": {"buf": data(0), "dest": 0, "tag": TAG},
            "Recv": {"buf": self.rbuf, "source": 0, "tag": TAG, **st},
            "Sendrecv": {"sendbuf": self.sent, "dest": 0, "sendtag": tag, "recvbuf": self.rbuf,
                         "source": 0, "recvtag": tag, **st},
            "Sendrecv_replace": {"buf": data(0), "dest": 0, "sendtag": tag, "source": 0,
                                 "recvtag": tag, **st},
        }.get(base, {"source": 0, "tag": TAG, **st})      # Probe, Iprobe

    def post_partner(self):
        c, b, kw = self.comm, self.base, {"backend": self.backend}
        self.pbuf = torch.zeros(N, dtype=torch.float64)
        if b == "Send":
            self.partner = c.Irecv(self.pbuf, mcr.ANY_SOURCE, mcr.ANY_TAG, **kw)
        elif b in ("Recv", "Probe", "Iprobe") or self.null and self.param == "dest":
            # (Sendrecv(_replace) to PROC_NULL: the message it receives comes from here)
            self.partner = c.Isend(self.sent, 0, self.tag, **kw)
        elif self.null:
            # Sendrecv(_replace) from PROC_NULL: its message to itself is received here (a send to
            # oneself that nothing receives may block: MPICH's does)
            self.partner = c.Irecv(self.pbuf, 0, mcr.ANY_TAG, **kw)

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
            want = self.sent.numpy().tobytes() if b == "Recv" else message(args["sendbuf"])
            if want is None:
                raise Outcome(f"accepted sendbuf {type(args['sendbuf']).__name__}")
            # Open MPI does not report truncation of a message to oneself (neither through mpi4py):
            # what fits must have arrived
            n = min(len(got), len(want))
            if got[:n] != want[:n]:
                raise Outcome(f"{key} holds {got!r}, expected {want!r}")
            self.check_status(st)
        elif b == "Sendrecv_replace":
            if message(args["buf"]) is None:
                raise Outcome(f"accepted buf {type(args['buf']).__name__}")
            if read_only(args["buf"]):
                raise Outcome("accepted a read-only array as the buffer received into")
            self.check_status(st)
        elif b == "Probe" and result is not True:
            raise Outcome(f"Probe returned {result!r}")
        elif b == "Probe" or b == "Iprobe" and result:
            self.check_status(st)

    def check_null(self, args, result):
        """PROC_NULL as `dest` (the receive posted is satisfied at cleanup) or as `source`."""
        b, key = self.base, "recvbuf" if self.base == "Sendrecv" else "buf"
        if self.param == "dest":
            if b in ("Sendrecv", "Sendrecv_replace"):
                got, want = raw(args[key]), self.sent.numpy().tobytes()
                if got is None or got[:len(want)] != want:
                    raise Outcome(f"{key} holds {got!r}, expected {want!r}")
            return
        if b in ("Probe", "Iprobe"):
            if result is not True:
                raise Outcome(f"{b} from PROC_NULL returned {result!r}")
        elif b != "Send":
            got = raw(args[key])
            want = data(0) if b == "Sendrecv_replace" else torch.zeros(N, dtype=torch.float64)
            if got != want.numpy().tobytes():
                raise Outcome(f"{key} changed by a receive from PROC_NULL: {got!r}")
        st = args.get("status")
        if isinstance(st, _mpi4py.Status) and st.source != _mpi4py.PROC_NULL:
            raise Outcome(f"status: source {st.source} after a receive from PROC_NULL")

    def check_status(self, st):
        if isinstance(st, _mpi4py.Status) and (st.source != 0 or st.tag != self.tag):
            raise Outcome(f"status: source {st.source} tag {st.tag}, expected 0 and {self.tag}")

    def cleanup(self):
        if self.partner is not None and self.receiving and not self.partner.Test():
            # nothing came (refused, or sent to PROC_NULL): satisfy the receive posted
            self.comm.Send(torch.zeros(N, dtype=torch.float64), 0, TAG, backend=self.backend)
        drain(self.comm, self.backend)
        if self.partner is not None:
            self.partner.Wait()
            self.partner = None


P2P_BASES = ("Send", "Recv", "Sendrecv", "Sendrecv_replace", "Probe", "Iprobe")
COLL_BASES = ("Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
              "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce",
              "Scan", "Exscan", "Reduce_scatter_block", "Reduce_scatter")
COMM_RECIPES = set(P2P_BASES) | set(COLL_BASES)


# -- Trials ----------------------------------------------------------------------------
class Fuzzer:
    """Runs trials, recording (never raising) what went wrong: every rank makes the same calls."""

    def __init__(self, world):
        self.rank, self.found, self.trials = world.rank, [], 0

    def progress(self, label):
        sys.stderr.write(f"[fuzz r{self.rank}] {label}\n")
        sys.stderr.flush()

    def trial(self, method, param, obj, backend, run, comm):
        """`run()` returns or raises; then the communicator must still work."""
        key = (method, param, obj.name, backend)
        if any(all(map(fnmatch.fnmatchcase, key, pattern)) for pattern in KNOWN_FAILURES):
            return
        label = f"{method} {param}={obj.name} backend={backend}"
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
        # a tuple, not a set: every rank must check in the same order
        for b in ("mpi",) if backend == "mpi" else ("mpi", backend):
            x, y = torch.full((3,), float(comm.rank + 1)), torch.zeros(3)
            try:
                comm.Allreduce(x, y, _mpi4py.SUM, backend=b)
            except Exception as exc:
                self.found.append(f"{label}: afterwards Allreduce on {b} raised "
                                  f"{type(exc).__name__}: {exc}")
                continue
            if not torch.equal(y, torch.full((3,), float(comm.size * (comm.size + 1) // 2))):
                self.found.append(f"{label}: afterwards Allreduce on {b} gave {y.tolist()}")

    def done(self):
        assert not self.found, (f"rank {self.rank}: {len(self.found)} of {self.trials} "
                                f"trials failed:\n" + "\n".join(self.found))


def collective(recipe, comm, method, param, obj, backend):
    """Call `method` with `obj` as `param`, the other arguments from `recipe`; check the result."""
    base, form = operation(method)
    value = obj.make()
    args, out = recipe(base, comm, obj.make())
    if form == "persistent":
        args["info"] = _mpi4py.INFO_NULL
    valid = dict(args)
    if param != "backend":
        args[param] = value
    run_form(comm, method, form, args, value if param == "backend" else backend)
    for name, buf, want in out(args):
        if name == param and value is not valid.get(name):
            buf = value                         # the result is in the object given
        if read_only(buf):
            raise Outcome(f"{name}: a read-only array was accepted as a receive buffer")
        expect_equal(name, buf, want)


def comm_trial(fz, world_comm, self_comm, method, param, obj, backend):
    base, form = operation(method)

    def run():
        if base not in P2P_BASES:
            return collective(coll_recipe, comm, method, param, obj, backend)
        value = obj.make()
        # backend=None is the communicator's default, MPI: the partner goes there
        t = P2P(comm, base, "mpi" if param == "backend" and value is None else backend,
                param, value)
        # the recipe is the blocking form's: Irecv, Recv_init and Isendrecv take no status
        names = set(parameters(mcr.Comm, method)[0])
        args = {k: v for k, v in t.args.items() if k in names}
        if param != "backend":
            args[param] = value
        t.post_partner()
        try:
            t.check(args, run_form(comm, method, form, args,
                                   value if param == "backend" else backend))
        finally:
            t.cleanup()

    comm = self_comm if base in P2P_BASES or on_self(base, param, obj.name) else world_comm
    fz.trial(f"Comm.{method}", param, obj, backend, run, comm)


def comm_methods():
    return {name: parameters(mcr.Comm, name)[0] for name in own_methods(mcr.Comm)}


# -- Neighborhood collectives (on a periodic ring) ------------------------------------
def filled(before, slots):
    """`before` (a float64 array) with each (offset, block) written at offset."""
    out = before.copy()
    for offset, block in slots:
        out[offset:offset + block.size] = block
    return out


def ngh_sends(args, valid, size):
    """Each rank's send buffer (float64): None is an empty message (mpi4py), IN_PLACE refused."""
    if args["sendbuf"] is None:
        return [np.zeros(0)] * size
    return sends(args, valid, size, inplace_ok=False)


def ngh_recipe(base, ring, fresh):
    """coll_recipe on a periodic ring: block 0 goes left and block 1 right; slot 0 holds what the
    left neighbour sent right, slot 1 what the right one sent left (MPI 4.0's order)."""
    size, rank = ring.size, ring.rank
    left, right = (rank - 1) % size, (rank + 1) % size
    x, k = data(rank), N // 2
    if base in ("Neighbor_alltoall", "Neighbor_alltoallv"):
        recv = torch.zeros(N, dtype=torch.float64)
        v = base == "Neighbor_alltoallv"
        args = {"sendbuf": vspec(x, 2, k) if v else x, "recvbuf": vspec(recv, 2, k) if v else recv}

        def out_alltoall(a):
            blocks = ngh_sends(a, args["sendbuf"], size)
            bl, br = blocks[left], blocks[right]
            if bl.size % 2 and not v:
                raise Outcome(f"accepted sendbuf of {bl.size} elements for 2 neighbours")
            # a buffer alone in a vector spec splits as mpi4py's: the first block longer
            return [("recvbuf", recv, filled(np.zeros(N), [(0, bl[(bl.size + 1) // 2:]),
                                                            (k, br[:(br.size + 1) // 2])]))]
        return dict(args), out_alltoall
    if base in ("Neighbor_allgather", "Neighbor_allgatherv"):
        recv = torch.zeros(2 * N, dtype=torch.float64)
        args = {"sendbuf": x, "recvbuf": vspec(recv, 2, N) if base[-1] == "v" else recv}

        def out_allgather(a):
            blocks = ngh_sends(a, x, size)
            return [("recvbuf", recv, filled(np.zeros(2 * N), [(0, blocks[left]),
                                                                (N, blocks[right])]))]
        return args, out_allgather
    assert base == "Neighbor_alltoallw", base
    recv = torch.zeros(N, dtype=torch.float64)
    args = {p: [t, ([k, k], [0, 8 * k]), [_mpi4py.DOUBLE] * 2]
            for p, t in (("sendbuf", x), ("recvbuf", recv))}

    def out_alltoallw(a):
        if a["sendbuf"] is not args["sendbuf"] or a["recvbuf"] is not args["recvbuf"]:
            return []                     # a substituted spec: accepted or refused, no crash
        return [("recvbuf", recv, np.concatenate([data(left).numpy()[k:],
                                                  data(right).numpy()[:k]]))]
    return dict(args), out_alltoallw


@case
def neighborhood_collectives(comm):
    fz = Fuzzer(comm)
    wc = comm.Dup()
    wc.checked = MPICH
    ring = wc.Create_cart([comm.size], periods=[True])
    try:
        for name in sorted(vars(_core._Neighborhood)):
            if not (name[:1].isupper() and callable(getattr(mcr.Cartcomm, name))):
                continue
            backends = ("mpi",) if operation(name)[0] == "Neighbor_alltoallw" else BACKENDS
            params = parameters(mcr.Cartcomm, name)[0]
            for backend, param, obj in itertools.product(backends, params, OBJECTS):
                fz.trial(f"Cartcomm.{name}", param, obj, backend, lambda: collective(
                    ngh_recipe, ring, name, param, obj, backend), ring)
    finally:
        ring.Free()
        wc.Free()
    fz.done()


# -- Requests and statuses (on COMM_SELF) ----------------------------------------------
def request_trial(fz, comm, cls, method, params, param, obj, backend):
    persistent, base = cls is mcr.Prequest, uppercase(method)

    def run():
        value, rbuf = obj.make(), torch.zeros(N, dtype=torch.float64)
        recv, send = (comm.Recv_init, comm.Send_init) if persistent else (comm.Irecv, comm.Isend)
        reqs = [recv(rbuf, 0, TAG, backend=backend), send(data(0), 0, TAG, backend=backend)]
        started = False
        fn = getattr(cls, method)
        try:
            if persistent:
                mcr.Prequest.Startall(reqs)
                started = True
            if param == "self":
                fn(value)
            elif base in ("Wait", "Test", "Get_status"):
                reqs[1].Wait()
                result = fn(reqs[0], value)
                if method == "test":
                    result, obj_ = result               # (flag, object): None here
                    if obj_ is not None:
                        raise Outcome(f"test returned the object {obj_!r}")
                if (base == "Wait" or result) and base != "Get_status":
                    expect_equal("the received message", rbuf, data(0).numpy())
                if (base == "Wait" or result) and isinstance(value, _mpi4py.Status) and \
                        value.source != 0:
                    raise Outcome(f"status: source {value.source}, expected 0")
            elif base == "Startall":
                if not persistent or started:
                    for r in reqs:
                        r.Wait()
                    started = False
                fn(value)
                started = True
            elif base == "Get_count":
                reqs[1].Wait()
                st = mcr.Status()
                reqs[0].Wait(st)
                count = st.Get_count(value)
                if isinstance(value, _mpi4py.Datatype):
                    if count != 8 * N // value.Get_size():
                        raise Outcome(f"Get_count({value}) = {count}, expected "
                                      f"{8 * N // value.Get_size()}")
                elif value is not None:
                    raise Outcome(f"accepted datatype {value!r}: count {count}")
            elif base not in ("Cancel", "Free", "Start"):   # only `self`, tried above
                # Waitall, Testsome, ...: (requests, statuses or status)
                args = {"requests": reqs, "statuses" if "statuses" in params else "status": None}
                args[param] = value
                fn(**args)
                if isinstance(args.get("statuses"), list):
                    for i, st in enumerate(args["statuses"][:len(reqs)]):
                        if isinstance(st, _mpi4py.Status) and st.source not in (
                                0, _mpi4py.ANY_SOURCE, _mpi4py.PROC_NULL):
                            raise Outcome(f"statuses[{i}]: source {st.source}")
        finally:
            # leave nothing pending: complete what the trial left
            for r in reqs:
                with contextlib.suppress(Exception):
                    if r or (persistent and started):
                        r.Wait()
            drain(comm, backend)
            for r in reqs if persistent else ():
                with contextlib.suppress(Exception):
                    r.Free()

    fz.trial(f"{cls.__name__}.{method}", param, obj, backend, run, comm)


def request_methods():
    """(class, method, parameters, with self for an instance method)."""
    out = []
    for cls in (mcr.Request, mcr.Prequest, mcr.Status):
        for name in own_methods(cls, lowercase=True):
            params, is_class = parameters(cls, name)
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


FAMILIES = {"point_to_point": P2P_BASES,
            "rooted": ("Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Reduce"),
            "all": ("Allgather", "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Allreduce"),
            "scans": ("Scan", "Exscan", "Reduce_scatter_block", "Reduce_scatter")}


@case.matrix(family=tuple(FAMILIES))
def comm_methods_fuzzed(comm, family):
    fz = Fuzzer(comm)
    wc = comm.Dup()
    wc.checked = MPICH
    sc = mcr.COMM_SELF.Dup()
    _mpi4py.Attach_buffer(bytearray(1 << 22))     # for Bsend, Ibsend, Bsend_init
    try:
        for name, params in comm_methods().items():
            if operation(name)[0] in FAMILIES[family]:
                for backend, param, obj in itertools.product(BACKENDS, params, OBJECTS):
                    comm_trial(fz, wc, sc, name, param, obj, backend)
    finally:
        _mpi4py.Detach_buffer()
        sc.Free()
        wc.Free()
    fz.done()


@case
def requests_and_statuses(comm):
    fz = Fuzzer(comm)
    sc = mcr.COMM_SELF.Dup()
    try:
        for cls, name, params in request_methods():
            for backend, param, obj in itertools.product(BACKENDS, params, OBJECTS):
                request_trial(fz, sc, cls, name, params, param, obj, backend)
    finally:
        sc.Free()
    fz.done()


test_mpi = mpi_cases(__name__, sizes=(2,), timeout=240)
