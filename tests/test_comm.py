"""Communicators: Dup, Split, Create_group, Compare, Free, and operations on
sub-communicators, at 1-4 ranks."""

import numpy as np
import torch
from mpi4py import MPI as M4

import mcr
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, raises, rank_data


def world_ranks(sub, comm):
    """The world ranks of `sub`'s processes, in sub-rank order (from mpi4py)."""
    return M4.Group.Translate_ranks(sub.Get_group(), list(range(sub.size)),
                                    comm.Get_group())


@case
def split_by_parity_runs_collectives(comm):
    sub = comm.Split(comm.rank % 2, key=-comm.rank)          # reversed order
    assert isinstance(sub, mcr.Comm)
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    assert world_ranks(sub, comm) == sorted(members, reverse=True)
    data = {r: rank_data(r, 5, torch.float32) for r in members}
    out = torch.zeros(5)
    sub.Allreduce(data[comm.rank], out)
    assert_equal(out, torch.stack(list(data.values())).sum(0))
    # uneven Allgatherv in sub-rank order
    order = world_ranks(sub, comm)
    counts = [r % 3 for r in order]
    mine = rank_data(comm.rank, 3, torch.int64)[:comm.rank % 3]
    gathered = torch.zeros(sum(counts), dtype=torch.int64)
    sub.Allgatherv(mine, [gathered, counts])
    assert_equal(gathered, torch.cat([rank_data(r, 3, torch.int64)[:r % 3] for r in order]))
    req = sub.Ibcast(buf := (rank_data(order[0], 4, torch.float16) if sub.rank == 0
                             else torch.zeros(4, dtype=torch.float16)), root=0)
    req.Wait()
    assert_equal(buf, rank_data(order[0], 4, torch.float16))
    sub.Free()


@case
def dup_is_congruent_and_independent(comm):
    dup = comm.Dup()
    assert isinstance(dup, mcr.Comm)
    assert comm.Compare(dup) == M4.CONGRUENT
    assert comm.Compare(comm) == M4.IDENT
    # messages on the two communicators do not mix
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    a, b = torch.zeros(2), torch.zeros(2)
    reqs = [dup.Irecv(a, left, 0), comm.Irecv(b, left, 0),
            comm.Isend(torch.full((2,), 1.0), right, 0),
            dup.Isend(torch.full((2,), 2.0), right, 0)]
    mcr.Request.Waitall(reqs)
    assert a.tolist() == [2.0, 2.0] and b.tolist() == [1.0, 1.0]
    dup.Free()


@case
def create_group_of_the_first_half(comm):
    half = list(range((comm.size + 1) // 2))
    group = comm.Get_group().Incl(half)
    if comm.rank in half:
        sub = comm.Create_group(group)
        assert isinstance(sub, mcr.Comm) and sub.size == len(half)
        x = np.full(3, comm.rank, dtype=np.int32)
        y = np.zeros(3, dtype=np.int32)
        sub.Allreduce(x, y, op=mcr.MAX)
        assert y.tolist() == [max(half)] * 3
        sub.Free()
    group.Free()


@case
def split_undefined_gives_a_null_comm(comm):
    sub = comm.Split(mcr.UNDEFINED if comm.rank == 0 else 1, 0)
    if comm.rank == 0:
        assert sub.to_mpi4py() == M4.COMM_NULL
        with raises(ValueError, "comm:", "null"):
            sub.Allreduce(torch.ones(1), torch.zeros(1))
        sub.Free()                                   # freeing a null comm: no-op
    else:
        assert sub.size == comm.size - 1
        sub.Barrier()
        sub.Free()
    assert_comm_works(comm)


@case
def free_is_idempotent_and_freed_comms_raise(comm):
    dup = comm.Dup()
    dup.Free()
    dup.Free()                                       # idempotent
    assert repr(dup) == "<mcr.Comm null>"
    with raises(ValueError, "comm:", "null"):
        dup.Bcast(torch.zeros(1))
    with raises(ValueError, "comm:", "null"):
        dup.Iallreduce(torch.ones(1), torch.zeros(1))
    for predefined in (mcr.COMM_WORLD, mcr.COMM_SELF):
        try:                                         # MPI's error, as mpi4py raises
            predefined.Free()
        except M4.Exception as exc:
            assert isinstance(exc, mcr.Exception)
            assert exc.Get_error_class() == M4.ERR_COMM
        else:
            raise AssertionError("Free() of a predefined communicator did not raise")
        predefined.free()                            # mpi4py's safe free: a no-op
        assert predefined and predefined.handle == M4.Comm(predefined).handle != 0
    assert_comm_works(comm)


class MyComm(mcr.Comm):
    """A user's subclass."""


@case
def subclass_dup_and_clone_keep_the_class_and_backend(comm):
    mine = MyComm(comm)
    mine.backend = "gloo"
    for copy in (mine.Dup(), mine.Clone()):
        assert type(copy) is MyComm and copy.backend == "gloo"
        assert comm.Compare(copy) == M4.CONGRUENT
        copy.backend = "mpi"
        out = torch.zeros(2)
        copy.Allreduce(torch.ones(2), out)
        assert out.tolist() == [comm.size] * 2
        copy.Free()
    sub = mine.Split(0, comm.rank)
    assert type(sub) is mcr.Comm and sub.backend == "gloo"   # as mpi4py: not the subclass
    sub.Free()


@case
def handles_round_trip(comm):
    dup = comm.Dup()
    for cls in (mcr.Comm, MyComm):
        for made in (cls.fromhandle(dup.handle), cls.fromint(dup.toint()),
                     cls.f2py(dup.py2f())):
            assert type(made) is cls and made == dup
    assert type(mcr.Comm.fromhandle(M4.COMM_NULL.handle)) is mcr.Comm
    dup.Free()
    if comm.size > 1:
        half = comm.Split(comm.rank % 2)
        inter = half.Create_intercomm(0, comm, 1 - comm.rank % 2)
        with raises(TypeError, "handle:", "Intercomm"):
            mcr.Comm.fromhandle(inter.handle)
        inter.Free()
        half.Free()


def test_pickle_of_predefined_communicators():
    import pickle
    for predefined in (mcr.COMM_WORLD, mcr.COMM_SELF):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(predefined, protocol)) is predefined
            copy = pickle.loads(pickle.dumps(mcr.Comm(predefined), protocol))
            assert type(copy) is mcr.Comm and copy == predefined and copy is not predefined
    dup = mcr.COMM_SELF.Dup()
    with raises(ValueError, "cannot serialize"):
        pickle.dumps(dup)
    dup.Free()


@case
def split_type_shared(comm):
    sub = comm.Split_type(M4.COMM_TYPE_SHARED)
    assert isinstance(sub, mcr.Comm)
    assert sub.size == comm.size                    # one node
    out = torch.zeros(1, dtype=torch.int64)
    sub.Allreduce(torch.ones(1, dtype=torch.int64), out)
    assert out.item() == comm.size
    sub.Free()


test_mpi = mpi_cases(__name__)
