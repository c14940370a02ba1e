"""`from mcr import MPI` is a drop-in for `from mpi4py import MPI`.

The namespace: mcr's COMM_WORLD/COMM_SELF/Comm/Request/Status/Exception, and
mpi4py's own objects for everything else; wrapping and unwrapping mpi4py
communicators; Dup/Split giving working mcr.Comm objects; the lowercase
pickle-based methods; and an mpi4py-tutorial-style program on numpy arrays
that runs unchanged (and gives the numpy-computed answers) with either import.
"""

import os

import numpy as np
import torch
from mpi4py import MPI as M4       # mpi4py's own module, to compare against

import mcr
from mcr import MPI
from mpiharness import case, mpi_cases
from util import all_data, assert_comm_works, assert_equal, rank_data

OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
MCR_NAMES = ["COMM_WORLD", "COMM_SELF", "Comm", "Request", "Prequest", "Status"]


# -- the namespace (in-process) --------------------------------------------------------


def test_mcr_names_replace_mpi4py_names():
    assert MPI.COMM_WORLD is mcr.COMM_WORLD and MPI.COMM_SELF is mcr.COMM_SELF
    assert isinstance(MPI.COMM_WORLD, mcr.Comm) and isinstance(MPI.COMM_SELF, mcr.Comm)
    assert isinstance(MPI.COMM_WORLD, M4.Intracomm)
    # the namespace's classes are thin subclasses of mcr's (src/mcr/MPI.py)
    for name in ("Comm", "Request", "Prequest", "Status"):
        assert issubclass(getattr(MPI, name), getattr(mcr, name)), name
    assert issubclass(mcr.Exception, M4.Exception)
    assert issubclass(mcr.Comm, M4.Intracomm)
    assert issubclass(mcr.Request, M4.Request)
    assert issubclass(mcr.Status, M4.Status)
    for name in MCR_NAMES:
        assert getattr(MPI, name) is not getattr(M4, name), name


def test_exception_is_mpi4pys_and_catches_both():
    assert MPI.Exception is M4.Exception
    for raiser in (lambda: mcr.COMM_WORLD.Free(),              # mcr's method
                   lambda: M4.Intracomm(M4.COMM_NULL).Get_size()):   # mpi4py's
        try:
            raiser()
        except MPI.Exception as exc:
            assert exc.Get_error_class() == M4.ERR_COMM
        else:
            raise AssertionError("no MPI.Exception")


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
    assert type(req) is mcr.Request and MPI.Request.Wait(req)
    assert got.tolist() == [1.0, 1.0]
    dup = MPI.Comm.Dup(m4comm)
    assert type(dup) is M4.Intracomm
    MPI.Comm.Free(dup)
    st = M4.Status()
    assert MPI.Status.Get_count(st, M4.BYTE) == 0
    # a user's subclass overriding a method keeps its own
    class Mine(MPI.Comm):
        def Free(self):
            return "mine"
    assert Mine.Free(None) == "mine"


def test_requests_convert_as_mpi4pys():
    preq = mcr.COMM_SELF.Send_init(b"", M4.PROC_NULL, 0)
    dupe = MPI.Prequest(preq)
    assert type(dupe) is MPI.Prequest and dupe == preq
    for made in (MPI.Prequest.fromhandle(preq.handle), MPI.Prequest.fromint(preq.toint()),
                 MPI.Prequest.f2py(preq.py2f())):
        assert type(made) is MPI.Prequest and made == preq
    assert type(MPI.Request(preq)) is MPI.Request and MPI.Request(preq) == preq
    assert type(MPI.Request.fromhandle(preq.handle)) is MPI.Request
    try:
        M4.Grequest(preq)
    except TypeError:
        pass
    else:
        raise AssertionError("Grequest(preq) did not raise")
    plain = mcr.COMM_SELF.Isend(b"", M4.PROC_NULL)
    try:
        MPI.Prequest(plain)
    except TypeError as exc:
        assert "request:" in str(exc)
    else:
        raise AssertionError("Prequest(non-persistent request) did not raise")
    plain.Wait()
    assert type(MPI.Prequest()) is MPI.Prequest and not MPI.Prequest()
    preq.Start()
    preq.Wait()
    preq.Free()


def test_request_constructors_refuse_bad_arguments_as_mpi4pys():
    """TypeError, as mpi4py's; mpi4py's __cinit__ refusing them leaves mcr's
    fields unset, which its __dealloc__ must not read (a segfault once)."""
    for args in ((1, 2), ("x",), (M4.COMM_WORLD,)):
        for cls in (MPI.Request, MPI.Prequest, mcr.Request, mcr.Prequest, M4.Request):
            try:
                cls(*args)
            except TypeError:
                pass
            else:
                raise AssertionError(f"{cls.__name__}{args!r} did not raise")
    assert not mcr.Request(request=None) and not MPI.Prequest(request=None)


def test_communicators_from_handles_take_the_handles_class():
    """As mpi4py's Comm.fromhandle: a plain intracommunicator handle gives the
    class called on; a topology handle gives mcr's class of that topology (a
    subclass of mpi4py's, as ``Create_cart`` makes); null gives null."""
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
    class MyComm(MPI.Comm):
        pass

    class MyRequest(MPI.Request):
        pass

    class MyPrequest(MPI.Prequest):
        pass
    comm = MyComm(MPI.COMM_SELF)
    assert isinstance(comm, MPI.Comm) and type(comm.Clone()) is MyComm
    assert not isinstance(M4.COMM_SELF, MyComm)          # only the namespace's classes
    dup = comm.Dup()
    assert type(dup) is MyComm
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
            M4.COMM_SELF.Isend(np.zeros(1), M4.PROC_NULL),
            comm.Isend(torch.ones(1), M4.PROC_NULL)]
    statuses = [MPI.Status() for _ in reqs]
    assert MPI.Request.Waitall(reqs, statuses) is True
    assert gloo_out.tolist() == [1.0, 1.0]
    comm.Free()


def test_predefined_communicators_pickle_and_survive_free():
    import pickle
    for predefined in (MPI.COMM_WORLD, MPI.COMM_SELF):
        assert pickle.loads(pickle.dumps(predefined)) is predefined
        predefined.free()
        assert predefined and predefined.handle == M4.Comm(predefined).handle


def test_every_other_name_is_mpi4pys_own_object():
    replaced = set(MCR_NAMES)
    for name in dir(M4):
        if name.startswith("__") or name in replaced:
            continue
        assert getattr(MPI, name) is getattr(M4, name), name
    for name in ("DOUBLE", "FLOAT", "INT", "BYTE", "C_BOOL", "Wtime", "Wtick",
                 "Get_version", "Get_library_version", "Op", "Datatype", "Group", "Info",
                 "ERR_TRUNCATE", "ERR_TYPE", "TAG_UB", "IDENT", "CONGRUENT", "UNEQUAL",
                 "COMM_NULL", "REQUEST_NULL", "IN_PLACE", "BOTTOM", "Is_initialized",
                 "Query_thread", "Compute_dims"):
        assert getattr(MPI, name) is getattr(M4, name), name
    assert isinstance(MPI.Wtime(), float)


def test_mcr_constants_are_mpi4pys():
    for name in OPS:
        assert getattr(mcr, name) is getattr(M4, name), name
        assert getattr(MPI, name) is getattr(M4, name), name
    assert mcr.IN_PLACE is M4.IN_PLACE
    for name in ("ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED"):
        assert getattr(mcr, name) == getattr(M4, name), name
    for name in mcr.__all__:
        assert hasattr(mcr, name), name


def test_build_info():
    info = mcr.build_info()
    assert set(info) >= {"mpicc", "libmpi", "mpi_library_version"}
    # the wrapper used at build time (it may have lived in pip's temporary build env)
    assert os.path.basename(info["mpicc"]).startswith("mpicc"), info
    assert os.path.isfile(info["libmpi"]) and "libmpi" in os.path.basename(info["libmpi"])
    assert info["mpi_library_version"] == M4.Get_library_version().strip("\x00 \n")
    # the libmpi mcr calls is the one loaded into this process (mpi4py's)
    with open("/proc/self/maps") as maps:
        loaded = {os.path.realpath(line.split()[-1]) for line in maps
                  if "libmpi" in line and "/" in line}
    assert os.path.realpath(info["libmpi"]) in loaded, (info["libmpi"], loaded)


def test_wrap_and_unwrap_in_process():
    c = mcr.Comm(M4.COMM_SELF)
    assert type(c) is mcr.Comm and c.Compare(M4.COMM_SELF) == MPI.IDENT
    back = c.to_mpi4py()
    assert type(back) is M4.Intracomm and back.Compare(c) == MPI.IDENT
    assert type(mcr.Comm(c)) is mcr.Comm
    out = torch.zeros(2)
    c.Allreduce(torch.ones(2), out)
    assert_equal(out, torch.ones(2))


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
    m4dup = M4.COMM_WORLD.Dup()
    try:
        wrapped = mcr.Comm(m4dup)
        assert type(wrapped) is mcr.Comm and wrapped.Compare(m4dup) == MPI.IDENT
        x = torch.full((4,), float(rank))
        y = torch.zeros(4)
        wrapped.Allreduce(x, y, op=MPI.SUM)
        assert_equal(y, torch.full((4,), float(sum(range(size)))))
        # and back: a plain mpi4py communicator on the same MPI communicator
        plain = wrapped.to_mpi4py()
        assert type(plain) is M4.Intracomm and plain.Compare(m4dup) == MPI.IDENT
        a = np.zeros(3)
        plain.Allreduce(np.full(3, rank + 1.0), a, op=M4.SUM)
        np.testing.assert_array_equal(a, np.full(3, size * (size + 1) / 2))
        assert plain.allreduce(rank) == sum(range(size))
        # messages cross between the two views of one communicator
        right, left = (rank + 1) % size, (rank - 1) % size
        out = torch.zeros(2, dtype=torch.int64)
        req = plain.Isend(np.full(2, rank, dtype=np.int64), right, 5)
        wrapped.Recv(out, left, 5)
        req.Wait()
        assert_equal(out, torch.full((2,), left, dtype=torch.int64))
    finally:
        m4dup.Free()
    # wrapping the world: shares COMM_WORLD
    w = mcr.Comm(M4.COMM_WORLD)
    assert w.Compare(comm) == MPI.IDENT
    assert_comm_works(w)


@case
def dup_and_split_return_working_mcr_comms(comm):
    size, rank = comm.size, comm.rank
    dup = comm.Dup()
    assert type(dup) is mcr.Comm and dup.Compare(comm) == MPI.CONGRUENT
    assert_comm_works(dup)
    data = all_data(size, 4, torch.float16)
    out = torch.zeros(4, dtype=torch.float16)
    dup.Allreduce(data[rank], out, op=MPI.MAX)
    assert_equal(out, torch.stack(data).max(0).values)
    # Split by parity, reversed order inside each group
    color = rank % 2
    sub = comm.Split(color, -rank)
    assert type(sub) is mcr.Comm
    members = [r for r in range(size) if r % 2 == color]
    assert sub.size == len(members) and sub.rank == members[::-1].index(rank)
    x = rank_data(rank, 3, torch.int64)
    y = torch.zeros(3, dtype=torch.int64)
    sub.Allreduce(x, y)
    assert_equal(y, torch.stack([rank_data(r, 3, torch.int64) for r in members]).sum(0))
    g = torch.zeros(3 * sub.size, dtype=torch.int64)
    sub.Allgather(x, g)
    assert_equal(g, torch.cat([rank_data(r, 3, torch.int64) for r in members[::-1]]))
    # a Dup of a Split, p2p on it, then Free both
    subdup = sub.Dup()
    assert type(subdup) is mcr.Comm
    buf = torch.zeros(3, dtype=torch.int64)
    subdup.Sendrecv(x, (subdup.rank + 1) % subdup.size, 0, buf,
                    (subdup.rank - 1) % subdup.size, 0)
    left_world = members[::-1][(subdup.rank - 1) % subdup.size]
    assert_equal(buf, rank_data(left_world, 3, torch.int64))
    for c in (subdup, sub, dup):
        c.Free()
        assert c == MPI.COMM_NULL
    # other communicator constructors inherited from mpi4py
    clone = comm.Clone()
    assert type(clone) is mcr.Comm
    assert_comm_works(clone)
    clone.Free()
    grp = comm.Get_group()
    created = comm.Create(grp)
    assert type(created) is mcr.Comm
    assert_comm_works(created)
    created.Free()
    grp.Free()
    assert_comm_works(comm)


@case
def split_type_returns_an_mcr_comm(comm):
    """Every constructor that creates a communicator returns mcr.Comm."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        assert type(shared) is mcr.Comm, type(shared)
        assert_comm_works(shared)
    finally:
        shared.Free()
    idup, req = comm.Idup()
    req.Wait()
    assert type(idup) is mcr.Comm, type(idup)
    assert_comm_works(idup)
    idup.Free()


@case
def lowercase_pickle_methods(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    obj = {"rank": rank, "list": list(range(rank + 1)), "arr": np.arange(rank + 2)}
    req = comm.isend(obj, dest=right, tag=3)
    got = comm.recv(source=left, tag=3)
    req.wait()
    assert got["rank"] == left and got["list"] == list(range(left + 1))
    np.testing.assert_array_equal(got["arr"], np.arange(left + 2))
    if size > 1:
        comm.send(("hello", rank), dest=right, tag=4)
        st = MPI.Status()
        assert comm.recv(source=MPI.ANY_SOURCE, tag=4, status=st) == ("hello", left)
        assert st.source == left and st.tag == 4
    assert comm.sendrecv(rank * 10, dest=right, source=left) == left * 10
    assert comm.bcast("root says hi" if rank == size - 1 else None, root=size - 1) == "root says hi"
    gathered = comm.gather(rank ** 2, root=0)
    assert gathered == ([r ** 2 for r in range(size)] if rank == 0 else None)
    chunk = comm.scatter([f"item{r}" for r in range(size)] if rank == 0 else None, root=0)
    assert chunk == f"item{rank}"
    assert comm.allgather(rank) == list(range(size))
    assert comm.alltoall([(rank, j) for j in range(size)]) == [(i, rank) for i in range(size)]
    assert comm.reduce(rank + 1, op=MPI.SUM, root=0) == (size * (size + 1) // 2 if rank == 0
                                                         else None)
    assert comm.allreduce(rank, op=MPI.MAX) == size - 1
    assert comm.allreduce([rank]) == list(range(size))          # SUM of lists: concat
    comm.barrier()
    # a pickled torch tensor
    t = comm.bcast(torch.arange(3) if rank == 0 else None, root=0)
    assert_equal(t, torch.arange(3))
    reqs = [comm.irecv(source=left, tag=9), comm.isend(rank, dest=right, tag=9)]
    assert MPI.Request.waitall(reqs)[0] == left


@case
def mixing_mpi4py_and_mcr_objects(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    # mpi4py's ops and IN_PLACE in mcr calls
    buf = torch.full((3,), float(rank + 1))
    comm.Allreduce(M4.IN_PLACE, buf, op=M4.PROD)
    assert_equal(buf, torch.full((3,), float(np.prod(np.arange(1, size + 1)))))
    # an mpi4py Status filled by an mcr receive (counted in bytes, as mpi4py does)
    st = M4.Status()
    out = torch.zeros(4)
    comm.Sendrecv(torch.ones(4) * rank, right, 1, out, left, 1, st)
    assert st.Get_source() == left and st.Get_count() == 16
    assert st.Get_count(MPI.FLOAT) == 4
    # mcr requests completed by mpi4py's Waitall, mpi4py requests by mcr's
    out = torch.zeros(2)
    reqs = [comm.Irecv(out, left, 2), comm.Isend(torch.full((2,), float(rank)), right, 2)]
    M4.Request.Waitall(reqs)
    assert_equal(out, torch.full((2,), float(left)))
    m4 = comm.to_mpi4py()
    a = np.zeros(2)
    reqs = [m4.Irecv(a, left, 3), m4.Isend(np.full(2, float(rank)), right, 3)]
    mcr.Request.Waitall(reqs)
    np.testing.assert_array_equal(a, np.full(2, float(left)))


@case
def exception_is_mpi4py_compatible(comm):
    """A truncated receive raises mcr.Exception, which `except MPI.Exception`
    catches with either module's MPI."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for tag, handler in enumerate((MPI.Exception, M4.Exception)):
        req = comm.Isend(np.arange(8, dtype=np.float64), right, tag)
        try:
            comm.Recv(np.zeros(2), left, tag)
        except handler as exc:
            assert type(exc) is mcr.Exception and isinstance(exc, M4.Exception)
            assert exc.Get_error_class() == MPI.ERR_TRUNCATE
            assert exc.Get_error_code() != MPI.SUCCESS and str(exc)
        else:
            raise AssertionError("MPI_ERR_TRUNCATE not raised")
        req.Wait()
        assert_comm_works(comm)


# -- an mpi4py-tutorial-style program, unchanged under either import ----------------------

PROGRAM = '''
from {module} import MPI
import numpy as np

comm = MPI.COMM_WORLD
size = comm.Get_size()
rank = comm.Get_rank()
results = {{"comm_type": type(comm)}}
t0 = MPI.Wtime()

# point-to-point with explicit datatypes
if size > 1:
    if rank == 0:
        data = np.arange(1000, dtype='i')
        comm.Send([data, MPI.INT], dest=1, tag=77)
    elif rank == 1:
        data = np.empty(1000, dtype='i')
        comm.Recv([data, MPI.INT], source=0, tag=77)
        results["p2p"] = data.copy()
    # automatic datatype discovery
    if rank == 0:
        data = np.arange(100, dtype=np.float64)
        comm.Send(data, dest=1, tag=13)
    elif rank == 1:
        data = np.empty(100, dtype=np.float64)
        comm.Recv(data, source=0, tag=13)
        results["p2p_auto"] = data.copy()

# broadcast a numpy array
if rank == 0:
    data = np.arange(100, dtype='i')
else:
    data = np.empty(100, dtype='i')
comm.Bcast(data, root=0)
results["bcast"] = data.copy()

# scatter rows, gather them back
sendbuf = None
if rank == 0:
    sendbuf = np.empty([size, 100], dtype='i')
    sendbuf.T[:, :] = range(size)
recvbuf = np.empty(100, dtype='i')
comm.Scatter(sendbuf, recvbuf, root=0)
results["scatter"] = recvbuf.copy()
sendbuf = np.zeros(100, dtype='i') + rank
recvbuf = None
if rank == 0:
    recvbuf = np.empty([size, 100], dtype='i')
comm.Gather(sendbuf, recvbuf, root=0)
results["gather"] = None if recvbuf is None else recvbuf.copy()

# parallel matrix-vector product with Allgather
m = 3
A = np.arange(m * size * m, dtype='d').reshape(m, m * size) + rank
x = np.arange(m, dtype='d') + rank
xg = np.zeros(m * size, dtype='d')
comm.Allgather([x, MPI.DOUBLE], [xg, MPI.DOUBLE])
results["matvec"] = A @ xg

# compute pi: Bcast the number of intervals, Reduce the partial sums
N = np.array(1000 if rank == 0 else 0, dtype='i')
comm.Bcast([N, MPI.INT], root=0)
h = 1.0 / N
s = sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(rank, int(N), size))
mypi = np.array(s * h, dtype='d')
PI = np.array(0.0, 'd') if rank == 0 else None
comm.Reduce([mypi, MPI.DOUBLE], [PI, MPI.DOUBLE] if rank == 0 else None, op=MPI.SUM, root=0)
results["pi"] = None if PI is None else float(PI)

# Allreduce and non-blocking ring exchange
total = np.zeros(4, dtype=np.int64)
comm.Allreduce(np.full(4, rank, dtype=np.int64), total, op=MPI.SUM)
results["allreduce"] = total
right, left = (rank + 1) % size, (rank - 1) % size
inbox = np.empty(5, dtype=np.float32)
reqs = [comm.Irecv([inbox, MPI.FLOAT], source=left, tag=1),
        comm.Isend([np.full(5, rank, dtype=np.float32), MPI.FLOAT], dest=right, tag=1)]
MPI.Request.Waitall(reqs)
results["ring"] = inbox.copy()
try:
    comm.Recv(np.empty(1), source=size + 5)
except (MPI.Exception, ValueError, IndexError) as exc:
    results["bad_rank"] = type(exc).__name__
results["elapsed"] = MPI.Wtime() - t0
'''


def run_program(module):
    namespace = {}
    exec(compile(PROGRAM.format(module=module), f"<tutorial with {module}>", "exec"), namespace)
    return namespace["results"]


def check_program_results(res, size, rank):
    """The numpy-computed answers of PROGRAM on this rank."""
    if size > 1 and rank == 1:
        np.testing.assert_array_equal(res["p2p"], np.arange(1000, dtype="i"))
        np.testing.assert_array_equal(res["p2p_auto"], np.arange(100, dtype=np.float64))
    np.testing.assert_array_equal(res["bcast"], np.arange(100, dtype="i"))
    np.testing.assert_array_equal(res["scatter"], np.full(100, rank, dtype="i"))
    if rank == 0:
        np.testing.assert_array_equal(res["gather"], np.repeat(np.arange(size, dtype="i"),
                                                               100).reshape(size, 100))
    else:
        assert res["gather"] is None
    m = 3
    A = np.arange(m * size * m, dtype="d").reshape(m, m * size) + rank
    xg = np.concatenate([np.arange(m, dtype="d") + r for r in range(size)])
    np.testing.assert_array_equal(res["matvec"], A @ xg)
    if rank == 0:
        h = 1.0 / 1000
        expected = sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(1000)) * h
        assert abs(res["pi"] - expected) < 1e-12 and abs(res["pi"] - np.pi) < 1e-6
    np.testing.assert_array_equal(res["allreduce"], np.full(4, size * (size - 1) // 2))
    np.testing.assert_array_equal(res["ring"], np.full(5, (rank - 1) % size, np.float32))
    assert res["bad_rank"] in ("Exception", "IndexError", "ValueError")
    assert res["elapsed"] >= 0


@case
def tutorial_program_runs_unchanged(comm):
    mine = run_program("mcr")
    assert mine["comm_type"] is mcr.Comm          # the mcr code path ran
    check_program_results(mine, comm.size, comm.rank)
    assert mine["bad_rank"] == "IndexError"
    theirs = run_program("mpi4py")
    assert theirs["comm_type"] is M4.Intracomm
    check_program_results(theirs, comm.size, comm.rank)


test_mpi = mpi_cases(__name__)
