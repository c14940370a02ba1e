"""Interceptors (mcr.interceptors): one registered class sees every call (every backend and form,
constructors, mpi4py's object methods) once, and may answer or refuse it; a communicator's chain
holds what applies to it, rebuilt when a setting changes."""

import re
import weakref

import torch

import mcr
import mcr.hooks
import mcr.interceptors as icp
import mcr.progress
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises

CHAIN_UNDER_TEST = True     # (mpiworker: no coverage-counting hook during these cases)
BUILTIN = ["progress engine", "auto", "hooks",
           "checked mode, timeouts, flight recorder", "logger", "compression"]


class Count(icp.Interceptor):
    """Counts the calls it sees, by (op, form, backend), on the communicators `comms`."""

    def __init__(self, comms, order=35):
        super().__init__(order=order, name="count")
        self.comms, self.seen = comms, []

    def applies(self, comm):
        return any(comm is c for c in self.comms)

    def run(self, call, next):
        self.seen.append((call.op, call.form, call.backend))
        result = next(call)
        assert result is not None or call.form == "blocking"
        return result


@case.matrix(backend=("mpi", "gloo", "auto"))
def a_counting_interceptor_sees_every_call(comm, backend):
    dup = comm.Dup()
    counter = Count([dup])
    assert icp.chain(dup) == []                      # nothing applies: the fast path
    icp.register(counter)
    try:
        assert [x.name for x in icp.chain(dup)] == ["auto", "count"]
        assert icp.chain(comm) == []                 # it does not apply there
        x = torch.arange(4, dtype=torch.float64) + comm.rank
        y = torch.zeros(4, dtype=torch.float64)
        dup.Allreduce(x, y, backend=backend)
        dup.Iallreduce(x, y, backend=backend).Wait()
        dup.Bcast(y, root=0, backend=backend)
        dup.Barrier(backend=backend)
        got = torch.zeros(1, dtype=torch.int64)
        r = dup.Irecv(got, (comm.rank - 1) % comm.size, tag=3, backend=backend)
        dup.Send(torch.tensor([comm.rank]), (comm.rank + 1) % comm.size, tag=3, backend=backend)
        r.Wait()
        comm.Barrier()                               # not counted: another communicator
        cart = dup.Create_cart([comm.size], periods=[True])
        evens = dup.Create_group(dup.Get_group().Incl(range(0, comm.size, 2))) \
            if comm.rank % 2 == 0 else None      # (by the group's processes only)
        counter.comms.append(cart)
        icp.changed()
        cart.Neighbor_allgather(x, torch.zeros(8, dtype=torch.float64), backend=backend)
        assert dup.allreduce(comm.rank) == sum(range(comm.size))
        r = dup.isend({"from": comm.rank}, (comm.rank + 1) % comm.size, tag=4)
        assert dup.recv(source=(comm.rank - 1) % comm.size, tag=4) == {
            "from": (comm.rank - 1) % comm.size}
        r.wait()
    finally:
        icp.unregister(counter)
    p2p = "mpi" if backend == "auto" else backend     # auto: MPI for these
    made = [("Create_cart", "blocking")] + [("Create_group", "blocking")] * (evens is not None)
    # (and none of mcr's own: Gloo's set-up, auto's agreement on its table)
    assert [s[:2] for s in counter.seen] == [
        ("Allreduce", "blocking"), ("Allreduce", "nonblocking"), ("Bcast", "blocking"),
        ("Barrier", "blocking"), ("Recv", "nonblocking"), ("Send", "blocking"),
        *made, ("Neighbor_allgather", "blocking"),
        ("allreduce", "blocking"), ("isend", "nonblocking"), ("recv", "blocking")]
    nb = 6 + len(made)
    assert counter.seen[4][2] == counter.seen[5][2] == p2p
    assert counter.seen[nb][2] == ("mpi" if backend == "auto" else backend)
    assert {s[2] for s in counter.seen[6:nb] + counter.seen[nb + 1:]} == {"mpi"}   # mpi4py's
    if backend != "auto":
        assert {s[2] for s in counter.seen[:6]} == {backend}
    assert got.item() == (comm.rank - 1) % comm.size
    assert icp.chain(dup) == []
    if evens is not None:
        assert evens.size == (comm.size + 1) // 2 and evens.rank == comm.rank // 2
        evens.Free()
    cart.Free()
    dup.Free()
    assert_comm_works(comm)


@case.matrix(backend=("mpi", "gloo"))
def a_compressed_call_is_seen_once(comm, backend):
    """Compression's private Dups and stage calls are mcr's: the program's interceptors see
    the one call it made (they saw a Dup per stage and every stage's call). (The call hooks
    see the stages' calls too: test_log's hooks_and_private_comms.)"""
    dup = comm.Dup()
    counter = Count([])
    counter.applies = lambda c: True                  # every communicator
    icp.register(counter)
    try:
        x = torch.arange(4, dtype=torch.float64) + comm.rank
        y = torch.zeros(4, dtype=torch.float64)
        dup.Allreduce(x, y, backend=backend, compress="fp16")
        dup.Iallreduce(x, y, backend=backend, compress="fp16").Wait()
    finally:
        icp.unregister(counter)
    assert [s[:2] for s in counter.seen] == [("Allreduce", "blocking"),
                                             ("Allreduce", "nonblocking")], counter.seen
    assert torch.equal(y, sum(torch.arange(4, dtype=torch.float64) + r
                              for r in range(comm.size)))
    dup.Free()


@case
def an_interceptor_may_answer_or_refuse(comm):
    class Answer(icp.Interceptor):
        def applies(self, c):
            return c is dup

        def run(self, call, next):
            if call.op == "Bcast":
                raise RuntimeError("no Bcast here")
            if call.op == "Barrier":
                return None                          # answered: no barrier runs
            if call.op in WRONG:                     # (nothing posted: no process waits)
                return WRONG[call.op]
            if call.op in ("Scan", "Exscan"):        # next runs only the call given
                return next(self.kept if call.op == "Scan" else object())
            self.kept = call
            return next(call)

    # answers the method cannot take (it would crash on some) raise, naming the interceptor
    WRONG = {"Allgather": mcr.Request(), "Gather": None, "Scatter": 1, "Dup": None,
             "Split": 1, "Idup": None, "Create_cart": None, "isend": 1}
    dup = comm.Dup()
    answer = Answer(order=5)
    icp.register(answer)
    try:
        assert [x.name for x in icp.chain(dup)] == ["Answer", "auto"]
        with raises(RuntimeError, "no Bcast here"):
            dup.Bcast(torch.zeros(2))
        dup.Barrier()
        y = torch.zeros(2)
        dup.Allreduce(torch.ones(2), y)
        assert y.tolist() == [comm.size] * 2
        x, out = torch.ones(2), torch.zeros(2 * comm.size)
        for call, form, got, expected in [
                (lambda: dup.Allgather(x, out), "blocking", "Request", "None"),
                (lambda: dup.Igather(x, out), "nonblocking", "NoneType", "an mcr.Request"),
                (lambda: dup.Scatter_init(out, x), "persistent", "int", "an mcr.Prequest"),
                (dup.Dup, "blocking", "NoneType", "the copy, of the communicator's class"),
                (lambda: dup.Split(0, 0), "blocking", "int", "the new communicator"),
                (dup.Idup, "nonblocking", "NoneType", "(the copy, a request)"),
                (lambda: dup.Create_cart([comm.size]), "blocking", "NoneType", "the new"),
                (lambda: dup.isend(1, 0), "nonblocking", "int", "a request")]:
            with raises(TypeError, "interceptor 'Answer': its answer to ", f"({form}) is {got}; "
                        f"expected {expected}"):
                call()
        for call, got in ((dup.Scan, "another one"), (dup.Exscan, "object")):
            with raises(TypeError, "call: expected the mcr.Call the interceptor was given, got "
                        + got):
                call(x, torch.zeros(2))
    finally:
        icp.unregister(answer)
    dup.Free()
    assert_comm_works(comm)


@case
def a_call_object_is_reused_only_when_nothing_holds_it(comm):
    # (a blocking call's object goes to the next call once it returns: core's recycle)
    x, y = torch.ones(3), torch.zeros(3)
    refs = [weakref.ref(x), weakref.ref(y)]
    comm.Allreduce(x, y)                             # the fast path
    assert y.tolist() == [comm.size] * 3
    r = comm.Iallreduce(y, x)                        # a request's call, given back at Wait
    r.Wait()
    assert x.tolist() == [comm.size ** 2] * 3
    del x, y, r
    assert [ref() for ref in refs] == [None, None]   # the kept object holds no buffer

    class Keep(icp.Interceptor):
        def applies(self, c):
            return c is dup

        def run(self, call, next):
            kept.append(call)
            return next(call)

    dup, kept, keep = comm.Dup(), [], Keep()
    icp.register(keep)
    try:
        bufs = [(torch.full((2,), float(i)), torch.zeros(2)) for i in range(3)]
        for a, b in bufs:
            dup.Allreduce(a, b)
        dup.Bcast(bufs[0][1], root=0)
    finally:
        icp.unregister(keep)
    # each kept call still shows its own arguments: none was reused under it
    assert [k.op for k in kept] == ["Allreduce"] * 3 + ["Bcast"]
    assert all(k.args[0] is a and k.args[1] is b for k, (a, b) in zip(kept, bufs))
    assert kept[3].args[0] is bufs[0][1] and kept[3].args[1] == 0
    assert [b.tolist() for _, b in bufs] == [[float(i * comm.size)] * 2 for i in range(3)]
    for _ in range(3):                               # the fast path again, after the chain
        dup.Allreduce(mcr.IN_PLACE, bufs[2][1])
    assert bufs[2][1].tolist() == [float(2 * comm.size ** 4)] * 2
    dup.Free()
    assert_comm_works(comm)


class Idle:
    """A driver of mcr.progress with nothing to post: pump(helper), blocking(), collective(comm)."""
    pump = blocking = collective = staticmethod(lambda *args: None)


@case
def the_chain_follows_the_settings(comm):
    dup = comm.Dup()
    assert icp.chain(dup) == []
    assert [x.name for x in icp.registered()] == BUILTIN
    dup.compress = "fp16"
    assert [x.name for x in icp.chain(dup)] == ["auto", "compression"]
    dup.compress = None
    dup.timeout = 5
    assert [x.name for x in icp.chain(dup)] == ["auto", BUILTIN[3]]
    dup.timeout = None
    assert icp.chain(dup) == []
    hook = lambda call: None                         # noqa: E731
    with mcr.hooks.installed(hook):
        assert [x.name for x in icp.chain(dup)] == ["auto", "hooks"]
        dup.checked = True
        assert [x.name for x in icp.chain(dup)] == ["auto", "hooks", BUILTIN[3]]
        assert [x.name for x in icp.chain(comm)] == ["auto", "hooks"]
        dup.checked = False
    assert icp.chain(dup) == []
    idle = Idle()                                    # staged operations pending
    mcr.progress.enlist(idle)
    try:
        assert [x.name for x in icp.chain(dup)] == ["progress engine", "auto"]
    finally:
        mcr.progress.dismiss(idle)
    assert icp.chain(dup) == []
    dup.Free()
    assert_comm_works(comm)


def test_the_documented_table_is_the_registered_chain():
    rows = re.findall(r"^(\d+) {2,}(\S.*?)(?: {2,}|$)", icp.__doc__, re.M)
    assert [(int(order), name) for order, name in rows] == [
        (x.order, x.name) for x in icp.registered()]


def test_registration_errors():
    class Nothing(icp.Interceptor):
        pass

    with raises(TypeError, "interceptor: expected an mcr.Interceptor, got function"):
        icp.register(lambda call, next: next(call))
    with raises(TypeError, "order: expected an integer, got str"):
        Nothing(order="1")
    with raises(TypeError, "mcr.Call: made by mcr for each call, not by hand"):
        icp.Call()
    with raises(TypeError, "expected the mcr.Call the interceptor was given, got NoneType"):
        mcr._core._Next()(None)      # (a next made by hand runs nothing)
    x = Nothing()
    with raises(ValueError, "is not registered"):
        icp.unregister(x)
    icp.register(x)
    try:
        with raises(ValueError, "is registered already"):
            icp.register(x)
        assert icp.registered()[-1] is x or x in icp.registered()
    finally:
        icp.unregister(x)
    assert x not in icp.registered()


test_mpi = mpi_cases(__name__)
