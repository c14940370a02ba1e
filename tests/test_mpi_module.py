"""`from mcr import MPI` is a drop-in for `from mpi4py import MPI`.

The namespace (mcr's COMM_WORLD/COMM_SELF/Comm/Request/Status/Exception, mpi4py's own objects
for everything else), wrapping and unwrapping mpi4py communicators, Dup/Split giving working
mcr.Comm objects, the lowercase pickle-based methods and mixing both modules' objects.
Tutorial programs under either import are in test_tutorial.py.
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI as M4       # mpi4py's own module, to compare against

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from opref import rank_data
from util import assert_comm_works, assert_equal, raises, ring

OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
# (_handleof, _addressof: mpi4py's, noting that an mcr request's handle was read)
MCR_NAMES = ["COMM_WORLD", "COMM_SELF", "Comm", "Request", "Prequest", "Status", "_handleof",
             "_addressof"]


# -- the namespace (in-process) --------------------------------------------------------

def test_mcr_names_replace_mpi4py_names():
    for name in ("COMM_WORLD", "COMM_SELF"):
        assert getattr(MPI, name) is getattr(mcr, name) and isinstance(getattr(mcr, name), mcr.Comm)
    assert isinstance(MPI.COMM_WORLD, M4.Intracomm)
    # the namespace's classes are thin subclasses of mcr's (src/mcr/MPI.py)
    for name in ("Comm", "Request", "Prequest", "Status"):
        assert issubclass(getattr(MPI, name), getattr(mcr, name)), name
    for mine, theirs in ((mcr.Exception, M4.Exception), (mcr.Comm, M4.Intracomm),
                         (mcr.Request, M4.Request), (mcr.Status, M4.Status)):
        assert issubclass(mine, theirs), mine
    for name in MCR_NAMES:
        assert getattr(MPI, name) is not getattr(M4, name), name
    for name in ("_handleof", "_addressof"):      # mpi4py's values, of any object
        for obj in (M4.COMM_WORLD, M4.DOUBLE, mcr.Request(), mcr.COMM_SELF):
            assert getattr(MPI, name)(obj) == getattr(M4, name)(obj), (name, obj)


def test_every_other_name_is_mpi4pys_own_object():
    compared = {name for name in dir(M4) if not name.startswith("__") and name not in MCR_NAMES}
    assert [name for name in compared if getattr(MPI, name) is not getattr(M4, name)] == []
    assert {"DOUBLE", "FLOAT", "INT", "BYTE", "C_BOOL", "Wtime", "Wtick", "Get_version",
            "Get_library_version", "Op", "Datatype", "Group", "Info", "ERR_TRUNCATE",
            "ERR_TYPE", "TAG_UB", "IDENT", "CONGRUENT", "UNEQUAL", "COMM_NULL",
            "REQUEST_NULL", "IN_PLACE", "BOTTOM", "Is_initialized", "Query_thread",
            "Compute_dims"} <= compared
    assert isinstance(MPI.Wtime(), float)
    assert [n for n in OPS + ["IN_PLACE"] if getattr(mcr, n) is not getattr(M4, n)] == []
    for name in ("ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED"):
        assert getattr(mcr, name) == getattr(M4, name), name
    assert [name for name in mcr.__all__ if not hasattr(mcr, name)] == []


def test_exception_is_mpi4pys_and_catches_both():
    assert MPI.Exception is M4.Exception
    for raiser in (mcr.COMM_WORLD.Free, M4.Intracomm(M4.COMM_NULL).Get_size):  # mcr's, mpi4py's
        with pytest.raises(MPI.Exception) as info:
            raiser()
        assert info.value.Get_error_class() == M4.ERR_COMM


def test_class_relations_are_mpi4pys():
    assert isinstance(M4.COMM_NULL, MPI.Comm) and isinstance(M4.COMM_WORLD, MPI.Comm)
    assert issubclass(M4.Cartcomm, MPI.Comm) and issubclass(M4.Intercomm, MPI.Comm)
    assert isinstance(mcr.COMM_WORLD, MPI.Comm) and isinstance(mcr.COMM_WORLD, MPI.Intracomm)
    assert not isinstance(M4.REQUEST_NULL, MPI.Comm)
    req = MPI.COMM_SELF.isend("x", 0, 0)               # mpi4py's pickle-based method
    assert type(req) is M4.Request and isinstance(req, MPI.Request)
    # receive first: MPI lets a send to oneself wait for its receive (MPICH's does)
    assert MPI.COMM_SELF.recv(source=0, tag=0) == "x" and MPI.Request.Wait(req) is True
    assert isinstance(M4.Prequest(), MPI.Prequest) and isinstance(M4.Prequest(), MPI.Request)
    assert issubclass(MPI.Prequest, MPI.Request) and issubclass(mcr.Prequest, MPI.Request)
    assert not isinstance(M4.REQUEST_NULL, MPI.Prequest)
    assert isinstance(M4.Status(), MPI.Status) and isinstance(mcr.Status(), MPI.Status)
    # mcr's own objects keep their compiled classes (no cost on their calls)
    assert type(mcr.COMM_WORLD.Isend(np.zeros(1), M4.PROC_NULL)) is mcr.Request
    # and are of the namespace's classes, as mpi4py's are of its own
    preq = MPI.COMM_SELF.Send_init(np.zeros(1), M4.PROC_NULL)
    assert type(preq) is mcr.Prequest and isinstance(preq, MPI.Prequest), type(preq)
    assert isinstance(preq, MPI.Request) and issubclass(mcr.Prequest, MPI.Prequest)
    assert not isinstance(mcr.COMM_WORLD.Isend(np.zeros(1), M4.PROC_NULL), MPI.Prequest)
    preq.Free()
    assert issubclass(mcr.Comm, MPI.Comm)


def test_unbound_methods_take_mpi4pys_objects():
    m4comm = M4.COMM_SELF
    req = MPI.Comm.Isend(m4comm, np.arange(3.0), 0, 7)          # mpi4py's Isend
    out = np.zeros(3)
    MPI.Comm.Recv(m4comm, out, 0, 7)
    MPI.Request.Wait(req)
    assert out.tolist() == [0.0, 1.0, 2.0]
    # and mcr's on mcr's objects
    req = MPI.Comm.Isend(mcr.COMM_SELF, torch.ones(2), 0, 8)
    got = torch.zeros(2)
    MPI.Comm.Recv(mcr.COMM_SELF, got, 0, 8)
    assert type(req) is mcr.Request and MPI.Request.Wait(req) and got.tolist() == [1.0, 1.0]
    # Request's methods run mcr's on any mcr request (Prequest's dispatch took them over:
    # MPI.Request.Wait of a Gloo receive returned at once, the buffer untouched)
    for unbound in (MPI.Request.Wait, MPI.Request.Test):
        got = torch.zeros(2)
        req = mcr.COMM_SELF.Irecv(got, 0, 9, backend="gloo")
        mcr.COMM_SELF.Send(torch.full((2,), 3.0), 0, 9, backend="gloo")
        st = MPI.Status()
        while not unbound(req, st):
            pass
        assert got.tolist() == [3.0, 3.0] and not req and st.Get_tag() == 9, unbound
    assert (MPI.Request.Wait.__qualname__, MPI.Prequest.Start.__qualname__) == \
        ("Request.Wait", "Prequest.Start")
    assert type(dup := MPI.Comm.Dup(m4comm)) is M4.Intracomm
    MPI.Comm.Free(dup)
    assert MPI.Status.Get_count(M4.Status(), M4.BYTE) == 0

    class Mine(MPI.Comm):      # a user's subclass overriding a method keeps its own
        def Free(self):
            return "mine"
    assert Mine.Free(None) == "mine"


def test_requests_convert_as_mpi4pys():
    preq = mcr.COMM_SELF.Send_init(b"", M4.PROC_NULL, 0)
    for made in (MPI.Prequest(preq), MPI.Prequest.fromhandle(preq.handle),
                 MPI.Prequest.fromint(preq.toint()), MPI.Prequest.f2py(preq.py2f())):
        assert type(made) is MPI.Prequest and made == preq
    assert type(MPI.Request(preq)) is MPI.Request and MPI.Request(preq) == preq
    assert type(MPI.Request.fromhandle(preq.handle)) is MPI.Request
    with raises(TypeError):
        M4.Grequest(preq)
    plain = mcr.COMM_SELF.Isend(b"", M4.PROC_NULL)
    with raises(TypeError, "request:"):
        MPI.Prequest(plain)
    plain.Wait()
    assert type(MPI.Prequest()) is MPI.Prequest and not MPI.Prequest()
    preq.Start()
    preq.Wait()
    preq.Free()


def test_request_constructors_refuse_bad_arguments_as_mpi4pys():
    """TypeError, as mpi4py's; mcr's __dealloc__ must not read what __cinit__ left unset."""
    for args in ((1, 2), ("x",), (M4.COMM_WORLD,)):
        for cls in (MPI.Request, MPI.Prequest, mcr.Request, mcr.Prequest, M4.Request):
            with raises(TypeError):
                cls(*args)
    assert not mcr.Request(request=None) and not MPI.Prequest(request=None)


def test_communicators_from_handles_take_the_handles_class():
    """As mpi4py's: a plain handle gives the class called on, a topology handle mcr's class
    of that topology (as ``Create_cart`` makes), null gives null."""
    world = MPI.Comm.fromhandle(MPI.COMM_WORLD.handle)
    assert type(world) is MPI.Comm and world == MPI.COMM_WORLD
    assert type(MPI.Comm.fromint(MPI.COMM_SELF.toint())) is MPI.Comm
    cart = MPI.COMM_SELF.Create_cart([1])
    try:
        for made in (MPI.Comm.fromhandle(cart.handle), MPI.Comm.fromint(cart.toint()),
                     MPI.Comm.f2py(cart.py2f())):
            assert type(made) is mcr.Cartcomm and type(made) is type(cart) and made == cart
            assert isinstance(made, MPI.Cartcomm) and made.Get_topo() == ([1], [0], [0])
    finally:
        cart.Free()
    null = MPI.Comm.fromhandle(M4.COMM_NULL.handle)
    assert null == M4.COMM_NULL and isinstance(null, MPI.Comm)


def test_user_subclasses():
    MyComm, MyRequest, MyPrequest = (type(f"My{base.__name__}", (base,), {})
                                     for base in (MPI.Comm, MPI.Request, MPI.Prequest))
    comm = MyComm(MPI.COMM_SELF)
    assert isinstance(comm, MPI.Comm) and type(comm.Clone()) is MyComm
    assert not isinstance(M4.COMM_SELF, MyComm)          # only the namespace's classes
    assert type(dup := comm.Dup()) is MyComm
    dup.Free()
    req = MyRequest(comm.Isend(torch.ones(1), M4.PROC_NULL))
    assert isinstance(req, MPI.Request) and not isinstance(M4.REQUEST_NULL, MyRequest)
    assert type(MyPrequest.fromhandle(M4.REQUEST_NULL.handle)) is MyPrequest
    req.Wait()


def test_mixed_waitall_uses_mcrs():
    # mcr's requests (a Gloo one too) and mpi4py's in one list: mcr's Waitall
    comm = mcr.COMM_SELF.Dup()
    gloo_out = torch.zeros(2)
    reqs = [comm.Iallreduce(torch.ones(2), gloo_out, backend="gloo"),
            M4.COMM_SELF.Isend(np.zeros(1), M4.PROC_NULL), comm.Isend(torch.ones(1), M4.PROC_NULL)]
    assert MPI.Request.Waitall(reqs, [MPI.Status() for _ in reqs]) is True
    assert gloo_out.tolist() == [1.0, 1.0]
    comm.Free()


def test_wrap_and_unwrap_in_process():
    c = mcr.Comm(M4.COMM_SELF)
    assert type(c) is mcr.Comm and c.Compare(M4.COMM_SELF) == MPI.IDENT
    back = c.to_mpi4py()
    assert type(back) is M4.Intracomm and back.Compare(c) == MPI.IDENT
    assert type(mcr.Comm(c)) is mcr.Comm
    assert_comm_works(c)


# -- multi-rank ------------------------------------------------------------------------

@case
def world_is_an_mcr_comm(comm):
    world = MPI.COMM_WORLD
    assert world is comm and isinstance(world, mcr.Comm)
    assert world.Get_rank() == world.rank == M4.COMM_WORLD.Get_rank()
    assert world.Get_size() == world.size == M4.COMM_WORLD.Get_size()
    assert world.Compare(M4.COMM_WORLD) == MPI.IDENT
    assert repr(world) == f"<mcr.Comm rank {world.rank} of {world.size}>"
    assert MPI.COMM_SELF.size == 1 and MPI.COMM_SELF.rank == 0


@case
def wrap_mpi4py_comm_and_back(comm):
    size, rank = comm.size, comm.rank
    right, left = ring(comm)
    m4dup = M4.COMM_WORLD.Dup()
    try:
        wrapped = mcr.Comm(m4dup)
        assert type(wrapped) is mcr.Comm and wrapped.Compare(m4dup) == MPI.IDENT
        assert_comm_works(wrapped)
        # and back: a plain mpi4py communicator on the same MPI communicator
        plain = wrapped.to_mpi4py()
        assert type(plain) is M4.Intracomm and plain.Compare(m4dup) == MPI.IDENT
        a = np.zeros(3)
        plain.Allreduce(np.full(3, rank + 1.0), a, op=M4.SUM)
        np.testing.assert_array_equal(a, np.full(3, size * (size + 1) / 2))
        assert plain.allreduce(rank) == sum(range(size))
        # messages cross between the two views of one communicator
        out = torch.zeros(2, dtype=torch.int64)
        req = plain.Isend(np.full(2, rank, dtype=np.int64), right, 5)
        wrapped.Recv(out, left, 5)
        req.Wait()
        assert_equal(out, torch.full((2,), left, dtype=torch.int64))
    finally:
        m4dup.Free()
    w = mcr.Comm(M4.COMM_WORLD)        # wrapping the world: shares COMM_WORLD
    assert w.Compare(comm) == MPI.IDENT
    assert_comm_works(w)


@case
def dup_and_split_return_working_mcr_comms(comm):
    size, rank = comm.size, comm.rank
    dup = comm.Dup()
    assert type(dup) is mcr.Comm and dup.Compare(comm) == MPI.CONGRUENT
    assert_comm_works(dup)
    sub = comm.Split(rank % 2, -rank)          # by parity, reversed order inside each group
    members = [r for r in range(size) if r % 2 == rank % 2][::-1]
    assert type(sub) is mcr.Comm and sub.size == len(members) and sub.rank == members.index(rank)
    x = rank_data(rank, 3, torch.int64)
    g = torch.zeros(3 * sub.size, dtype=torch.int64)
    sub.Allgather(x, g)
    assert_equal(g, torch.cat([rank_data(r, 3, torch.int64) for r in members]))
    # a Dup of a Split, p2p on it, then Free both
    assert type(subdup := sub.Dup()) is mcr.Comm
    buf = torch.zeros(3, dtype=torch.int64)
    right, left = ring(subdup)
    subdup.Sendrecv(x, right, 0, buf, left, 0)
    assert_equal(buf, rank_data(members[left], 3, torch.int64))
    for c in (subdup, sub, dup):
        c.Free()
        assert c == MPI.COMM_NULL
    # other communicator constructors inherited from mpi4py
    grp = comm.Get_group()
    for made in (comm.Clone(), comm.Create(grp)):
        assert type(made) is mcr.Comm
        assert_comm_works(made)
        made.Free()
    grp.Free()
    assert_comm_works(comm)


@case
def split_type_returns_an_mcr_comm(comm):
    """Every constructor that creates a communicator returns mcr.Comm."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    idup, req = comm.Idup()
    req.Wait()
    for made in (shared, idup):
        assert type(made) is mcr.Comm and made.size == comm.size, (type(made), made.size)
        assert_comm_works(made)
        made.Free()


@case
def lowercase_pickle_methods(comm):
    # those test_tutorial.py's python_objects does not use
    size, rank = comm.size, comm.rank
    right, left = ring(comm)
    obj = {"rank": rank, "list": list(range(rank + 1)), "arr": np.arange(rank + 2)}
    req = comm.isend(obj, dest=right, tag=3)           # to itself at one rank
    got = comm.recv(source=left, tag=3)
    req.wait()
    assert got["rank"] == left and got["list"] == list(range(left + 1))
    np.testing.assert_array_equal(got["arr"], np.arange(left + 2))
    if size > 1:
        comm.send(("hello", rank), dest=right, tag=4)
        st = MPI.Status()
        assert comm.recv(source=MPI.ANY_SOURCE, tag=4, status=st) == ("hello", left)
        assert st.source == left and st.tag == 4
    assert comm.allreduce([rank]) == list(range(size))          # SUM of lists: concat
    assert_equal(comm.bcast(torch.arange(3) if rank == 0 else None, root=0), torch.arange(3))
    reqs = [comm.irecv(source=left, tag=9), comm.isend(rank, dest=right, tag=9)]
    assert MPI.Request.waitall(reqs)[0] == left


@case
def mixing_mpi4py_and_mcr_objects(comm):
    right, left = ring(comm)
    rank = comm.rank
    # an mpi4py Status filled by an mcr receive (counted in bytes, as mpi4py does)
    st = M4.Status()
    out = torch.zeros(4)
    comm.Sendrecv(torch.ones(4) * rank, right, 1, out, left, 1, st)
    assert st.Get_source() == left and st.Get_count() == 16 and st.Get_count(MPI.FLOAT) == 4
    # mcr requests completed by mpi4py's Waitall, mpi4py requests by mcr's
    out = torch.zeros(2)
    M4.Request.Waitall([comm.Irecv(out, left, 2),
                        comm.Isend(torch.full((2,), float(rank)), right, 2)])
    assert_equal(out, torch.full((2,), float(left)))
    m4 = comm.to_mpi4py()
    a = np.zeros(2)
    mcr.Request.Waitall([m4.Irecv(a, left, 3), m4.Isend(np.full(2, float(rank)), right, 3)])
    np.testing.assert_array_equal(a, np.full(2, float(left)))


@case
def zero_d_arrays_as_mpi4pys(comm):
    """pi as mpi4py's tutorial computes it, with 0-d arrays as ``[buf, type]`` messages (Bcast,
    and Reduce with None off the root), under either module."""
    size, rank = comm.size, comm.rank
    h = 1.0 / 1000
    parts = [h * sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(r, 1000, size))
             for r in range(size)]
    for module in (MPI, M4):
        world = module.COMM_WORLD
        n = np.array(1000 if rank == 0 else 0, dtype="i")
        world.Bcast([n, module.INT], root=0)
        assert n.shape == () and int(n) == 1000
        pi = np.array(0.0, "d") if rank == 0 else None
        world.Reduce([np.array(parts[rank], "d"), module.DOUBLE],
                     [pi, module.DOUBLE] if rank == 0 else None, op=module.SUM, root=0)
        assert rank != 0 or (abs(float(pi) - sum(parts)) < 1e-12
                             and abs(float(pi) - np.pi) < 1e-6), pi


test_mpi = mpi_cases(__name__)
