"""The torch.distributed backend "mcr" (mcr.distributed).

MPI cases (1-3 ranks, ``init_process_group("mcr")`` with no MASTER_ADDR): torch.distributed's
API on "mcr" groups running MPI and Gloo against torch on every rank's data; DDP and a
ZeRO-style step against torch's own Gloo group. Then what ``import mcr`` does and does not do.
"""

import functools
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import mcr
import mcr.hooks
from mpiharness import LAYER_SIZES, case, mpi_cases, run_script, world_sizes
from opref import rank_data, reduce_ref
from util import raises

BACKENDS = ("mpi", "gloo")
REDUCTIONS = [(name, dtype) for name in ("SUM", "PRODUCT", "MAX", "MIN")
              for dtype in (torch.float32, torch.int64, torch.float64)] + [
    ("AVG", torch.float64), ("BXOR", torch.int32)] + [
    (name, torch.bool) for name in ("SUM", "PRODUCT", "MAX", "MIN", "BAND", "BOR", "BXOR")]
# what torch computes for each reduction on two bool tensors (True + True is True)
ON_BOOLS = {"SUM": torch.add, "PRODUCT": torch.mul, "MAX": torch.maximum, "MIN": torch.minimum,
            "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
_groups = {}


def group(backend):
    """An "mcr" group running `backend` (the default group first, once per job); "mpi-same":
    on MPI, its ranks promising the same async_op (Options.same_async_op: blocking forms)."""
    if not dist.is_initialized():
        dist.init_process_group("mcr")
    if backend == "torch-gloo" and backend not in _groups:
        _groups[backend] = dist.new_group(backend="gloo")
    if backend not in _groups:
        options = mcr.distributed.Options(backend=backend.removesuffix("-same"),
                                          same_async_op=backend.endswith("-same"))
        _groups[backend] = dist.new_group(backend="mcr", pg_options=options)
    return _groups[backend]


def full(n, value):
    return torch.full((n,), float(value))


@case
def init_takes_ranks_from_mpi(comm):
    group("mpi")
    assert "MASTER_ADDR" not in os.environ
    assert dist.get_backend() == "mcr"
    assert (dist.get_rank(), dist.get_world_size()) == (comm.rank, comm.size)
    world = dist.group.WORLD
    assert isinstance(world, mcr.distributed.ProcessGroupMCR)
    assert world.comm.Get_size() == comm.size and world.comm != comm   # a duplicate
    assert group("gloo").comm.backend == "gloo"


@case.matrix(backend=BACKENDS + ("mpi-same",), quick=lambda backend: backend in BACKENDS)
def reductions_match_torch(comm, backend):
    size, rank = comm.size, comm.rank
    g = group(backend)
    for name, dtype in REDUCTIONS:
        everyone = [rank_data(r, 6, dtype) for r in range(size)]
        if dtype == torch.bool:
            want = functools.reduce(ON_BOOLS[name], everyone)
        elif name == "AVG":
            want = torch.stack(everyone).mean(0)
        else:
            want = reduce_ref(everyone, {"PRODUCT": "PROD"}.get(name, name))
        same = torch.allclose if name == "AVG" else torch.equal
        op = getattr(dist.ReduceOp, name)
        t = rank_data(rank, 6, dtype)
        dist.all_reduce(t, op=op, group=g)
        assert same(t, want), (name, dtype, t, want)
        t = rank_data(rank, 6, dtype)
        dist.reduce(t, dst=size - 1, op=op, group=g)
        assert same(t, want if rank == size - 1 else everyone[rank]), (name, t)


@case.matrix(backend=BACKENDS + ("mpi-same",), quick=lambda backend: backend in BACKENDS)
def gathers_and_scatters_match_torch(comm, backend):
    size, rank = comm.size, comm.rank
    g, root = group(backend), size // 2
    everyone = [rank_data(r, 4) for r in range(size)]
    t = rank_data(rank, 4)
    dist.broadcast(t, src=size - 1, group=g)
    assert torch.equal(t, everyone[-1])
    out = [torch.empty(4) for _ in range(size)]
    dist.all_gather(out, rank_data(rank, 4), group=g)
    assert all(map(torch.equal, out, everyone))
    flat = torch.empty(size, 4)
    dist.all_gather_into_tensor(flat, rank_data(rank, 4), group=g)
    assert torch.equal(flat, torch.stack(everyone))
    # uneven all_gather: rank r contributes r + 1 elements
    out = [torch.empty(r + 1) for r in range(size)]
    dist.all_gather(out, rank_data(rank, rank + 1), group=g)
    assert all(torch.equal(o, rank_data(r, r + 1)) for r, o in enumerate(out))
    got = [torch.empty(4) for _ in range(size)] if rank == root else None
    dist.gather(rank_data(rank, 4), got, dst=root, group=g)
    assert rank != root or all(map(torch.equal, got, everyone))
    out = torch.empty(3)
    blocks = [rank_data(100 + r, 3) for r in range(size)] if rank == root else None
    dist.scatter(out, blocks, src=root, group=g)
    assert torch.equal(out, rank_data(100 + rank, 3))
    # reduce_scatter: block q of rank r is rank_data(10 * r + q)
    out = torch.empty(3)
    dist.reduce_scatter(out, [rank_data(10 * rank + q, 3) for q in range(size)], group=g)
    assert torch.equal(out, sum(rank_data(10 * r + rank, 3) for r in range(size)))
    out = torch.empty(2)
    whole = torch.cat([rank_data(10 * rank + q, 2) for q in range(size)])
    dist.reduce_scatter_tensor(out, whole, group=g)
    assert torch.equal(out, sum(rank_data(10 * r + rank, 2) for r in range(size)))


@case.matrix(backend=BACKENDS, quick=lambda backend: True)
def all_to_all_uneven_matches_torch(comm, backend):
    size, rank = comm.size, comm.rank

    def rows(src, dst):            # rows rank src sends to rank dst: uneven, some empty
        return (src + 2 * dst) % 3

    def block(src, dst, dtype):
        return torch.full((rows(src, dst), 5), float(100 * src + dst)).to(dtype)

    g = group(backend)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        send = torch.cat([block(rank, q, dtype) for q in range(size)])
        recv_splits = [rows(q, rank) for q in range(size)]
        out = torch.empty(sum(recv_splits), 5, dtype=dtype)
        dist.all_to_all_single(out, send, recv_splits, [rows(rank, q) for q in range(size)],
                               group=g, async_op=True).wait()
        expected = torch.cat([block(q, rank, dtype) for q in range(size)])
        assert torch.equal(out, expected), (dtype, out)
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2.0) + 10 * q for q in range(size)])
    out = torch.empty(size * 2)
    dist.all_to_all_single(out, torch.arange(size * 2.0) + 10 * rank, group=g)
    assert torch.equal(out, expected), out
    out.fill_(-1)       # as torch 2.11's all_to_all_single calls the group
    g.alltoall_base(out, torch.arange(size * 2.0) + 10 * rank, [], [], None).wait()
    assert torch.equal(out, expected), out
    outs = [torch.empty(q + 1) for q in range(size)]
    dist.all_to_all(outs, [full(rank + 1, rank * 10 + q) for q in range(size)], group=g)
    assert all(torch.equal(o, full(q + 1, q * 10 + rank)) for q, o in enumerate(outs)), outs


@case.matrix(backend=BACKENDS + ("auto",))
def ranks_may_differ_in_async_op_and_splits(comm, backend):
    """torch lets each rank choose async_op, and give all_to_all_single's even splits or none:
    the collectives match whatever each rank chose (MPI never matches a blocking collective
    with a non-blocking one, nor Alltoall with Alltoallv)."""
    size, rank = comm.size, comm.rank
    g = group(backend)
    for turn in range(2):
        waits = rank % 2 == turn           # these ranks wait at once, the others post

        def run(fn, *args, **kwargs):
            work = fn(*args, **kwargs, group=g, async_op=not waits)
            if not waits:
                work.wait()
        t = rank_data(rank, 4)
        run(dist.all_reduce, t)
        assert torch.equal(t, reduce_ref([rank_data(r, 4) for r in range(size)], "SUM")), t
        t = rank_data(rank, 4)
        run(dist.broadcast, t, src=size - 1)
        assert torch.equal(t, rank_data(size - 1, 4)), t
        whole = torch.empty(4 * size)
        run(dist.all_gather_into_tensor, whole, rank_data(rank, 4))
        assert torch.equal(whole, torch.cat([rank_data(r, 4) for r in range(size)])), whole
        out = torch.empty(2)
        run(dist.reduce_scatter_tensor, out, torch.cat([rank_data(10 * rank + q, 2)
                                                        for q in range(size)]))
        assert torch.equal(out, sum(rank_data(10 * r + rank, 2) for r in range(size))), out
        even = [2] * size
        splits = ((even, even), (even, None))[turn] if waits else (None, None)
        out = torch.empty(2 * size)
        run(dist.all_to_all_single, out, torch.arange(2.0 * size) + 10 * rank, *splits)
        assert torch.equal(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2.0) + 10 * q
                                           for q in range(size)])), (splits, out)


@case
def blocking_forms_only_where_the_ranks_promise_the_same_async_op(comm):
    """async_op=False posts the non-blocking form and waits for it, unless the group's ranks
    promise the same async_op (Options.same_async_op): the blocking form then."""
    for backend, form in (("mpi", "nonblocking"), ("mpi-same", "blocking")):
        g, seen, t = group(backend), [], torch.ones(3)
        with mcr.hooks.installed(lambda call: seen.append((call.op, call.form))):
            dist.all_reduce(t, group=g)
            dist.all_reduce(t, group=g, async_op=True).wait()
        assert seen == [("Allreduce", form), ("Allreduce", "nonblocking")], (backend, seen)
        assert torch.equal(t, full(3, comm.size ** 2)), (backend, t)


@case.matrix(backend=BACKENDS, asynchronous=(False, True))
def inputs_that_alias_outputs_as_torch_allows(comm, backend, asynchronous):
    """torch lets a collective's input and output share memory, MPI does not: the input as the
    output's own block (all_gather_into_tensor, as FSDP calls it), the output as the input's own
    block (reduce_scatter_tensor), one tensor as both (all_to_all_single, even and uneven)."""
    size, rank, n = comm.size, comm.rank, 5
    g = group(backend)

    def run(op, *args, **kwargs):
        work = op(*args, group=g, async_op=asynchronous, **kwargs)
        if asynchronous:
            work.wait()

    whole = torch.zeros(size * n)
    mine = whole[rank * n:(rank + 1) * n]
    mine.copy_(rank_data(rank, n))
    run(dist.all_gather_into_tensor, whole, mine)
    assert torch.equal(whole, torch.cat([rank_data(r, n) for r in range(size)])), whole
    before = rank_data(10 * rank, size * n)
    t = before.clone()
    run(dist.reduce_scatter_tensor, t[rank * n:(rank + 1) * n], t)
    want = sum(rank_data(10 * r, size * n) for r in range(size))[rank * n:(rank + 1) * n]
    assert torch.equal(t[rank * n:(rank + 1) * n], want), t
    assert torch.equal(t[:rank * n], before[:rank * n])       # the other blocks unchanged
    assert torch.equal(t[(rank + 1) * n:], before[(rank + 1) * n:])
    t = rank_data(100 * rank, size * n)
    run(dist.all_to_all_single, t, t)
    want = torch.cat([rank_data(100 * r, size * n)[rank * n:(rank + 1) * n] for r in range(size)])
    assert torch.equal(t, want), t
    def rows(src, dst):            # rows rank src sends to rank dst: as many as it gets back
        return (src + dst) % 3

    t = rank_data(1000 * rank, sum(rows(rank, q) for q in range(size)))
    splits = [rows(rank, q) for q in range(size)]
    run(dist.all_to_all_single, t, t, splits, splits)
    want = torch.cat([torch.split(rank_data(1000 * q, sum(rows(q, p) for p in range(size))),
                                  [rows(q, p) for p in range(size)])[rank] for q in range(size)])
    assert torch.equal(t, want), t


@case.matrix(backend=BACKENDS, quick=lambda backend: True)
def point_to_point_and_batches(comm, backend):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    g = group(backend)
    t = torch.empty(4)
    if size > 1 and rank == 0:
        dist.send(rank_data(0, 4), dst=1, group=g)
        source = dist.recv(t, tag=7, group=g)      # from any source
        assert source == 1 and torch.equal(t, rank_data(1, 4)), source
    elif size > 1 and rank == 1:
        dist.recv(t, src=0, group=g)
        assert torch.equal(t, rank_data(0, 4))
        dist.send(rank_data(1, 4), dst=0, tag=7, group=g)
    got = torch.empty(3)
    for work in dist.batch_isend_irecv([
            dist.P2POp(dist.irecv, got, left, group=g),
            dist.P2POp(dist.isend, rank_data(rank, 3), right, group=g)]):
        work.wait()
    assert torch.equal(got, rank_data(left, 3))
    send = dist.isend(rank_data(rank, 2), right, group=g, tag=3)
    dist.irecv(got := torch.empty(2), left, group=g, tag=3).wait()
    send.wait()
    assert torch.equal(got, rank_data(left, 2))


@case
def works_behave_as_torch(comm):
    size, rank = comm.size, comm.rank
    g = group("mpi")
    t = torch.ones(3)
    work = dist.all_reduce(t, group=g, async_op=True)
    assert isinstance(work, dist.Work)
    future = work.get_future()
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert torch.equal(future.wait()[0], full(3, size))
    assert future.wait()[0] is t and work.result() == [t]
    # a chained callback, as DDP's communication hooks use
    doubled = dist.all_reduce(torch.ones(2), group=g, async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    assert torch.equal(doubled.wait(), full(2, 2 * size))
    # is_completed drives progress: polling alone completes a posted barrier
    work = dist.barrier(group=g, async_op=True)
    while not work.is_completed():
        pass
    assert work.wait() is True
    # async ops on two backends in flight at once complete in any order
    a, b = full(2, 1), full(2, 2)
    wa = dist.all_reduce(a, group=group("gloo"), async_op=True)
    dist.all_reduce(b, group=g, async_op=True).wait()
    wa.wait()
    assert torch.equal(a, full(2, size)) and torch.equal(b, full(2, 2 * size))
    # wait(timeout) gives up on a receive nobody has sent yet, which stays pending
    if size > 1:
        got = torch.zeros(2)
        if rank == 0:
            work = dist.irecv(got, src=1, tag=99, group=g)
            with raises(RuntimeError, "recv: not completed within 0.05 s"):
                work.wait(timeout=timedelta(seconds=0.05))
            assert not work.is_completed()
        dist.barrier(group=g)
        if rank == 1:
            dist.send(full(2, 5), dst=0, tag=99, group=g)
        if rank == 0:
            assert work.wait() and torch.equal(got, full(2, 5))
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank}, group=g)
    assert objects == [{"rank": r} for r in range(size)]
    box = [{"from": rank}]
    dist.broadcast_object_list(box, src=0, group=g)
    assert box == [{"from": 0}]
    got = [None] * size if rank == size - 1 else None
    dist.gather_object(("r", rank), got, dst=size - 1, group=g)
    assert rank != size - 1 or got == [("r", r) for r in range(size)], got
    mine = [None]
    dist.scatter_object_list(mine, [f"to {r}" for r in range(size)] if rank == 0 else None,
                             src=0, group=g)
    assert mine == [f"to {rank}"], mine


@case
def subgroups(comm):
    size, rank = comm.size, comm.rank
    group("mpi")
    evens = list(range(0, size, 2))
    g = dist.new_group(evens, backend="mcr")
    if rank in evens:
        assert isinstance(g, mcr.distributed.ProcessGroupMCR)
        assert dist.get_rank(g) == evens.index(rank) and dist.get_world_size(g) == len(evens)
        t = full(2, rank)
        dist.all_reduce(t, group=g)
        assert torch.equal(t, full(2, sum(evens)))
        t = full(2, rank)
        dist.broadcast(t, src=evens[-1], group=g)       # a global rank, as torch takes it
        assert torch.equal(t, full(2, evens[-1]))
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    t = full(1, rank)
    dist.all_reduce(t, group=dist.new_subgroups(group_size=1)[0])
    assert t.item() == rank
    # an mcr group over all ranks whose default backend is changed later
    g = dist.new_group(backend="mcr")
    g.comm.backend = "gloo"
    t = full(2, 1)
    dist.all_reduce(t, group=g)
    assert torch.equal(t, full(2, size))


@case
def unsupported_and_bad_calls_raise_clearly(comm):
    size = comm.size
    g = group("mpi")
    with raises(TypeError, "AVG", "torch.int64"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG, group=g)
    with raises(ValueError, "PREMUL_SUM", "not supported by the 'mcr' backend", "SUM"):
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0), group=g)
    with raises(ValueError, "sparse tensor", "SUM only", "MAX"):
        dist.all_reduce(torch.ones(2).to_sparse(), op=dist.ReduceOp.MAX, group=g)
    with raises(ValueError, "all_gather_coalesced", f"{size + 1} lists for {size} ranks"):
        dist.all_gather_coalesced([[torch.empty(1)]] * (size + 1), [torch.ones(1)], group=g)
    with raises(ValueError, "all_reduce", "strides (0,)", "expanded tensor"):
        dist.all_reduce(torch.ones(1).expand(4), group=g)
    with raises(ValueError, "input_split_sizes", "sum to"):
        dist.all_to_all_single(torch.empty(size), torch.empty(size), [1] * size,
                               [2] * size, group=g)
    splits = [-1] + [1] * (size - 2) + [3] if size > 1 else [-1]      # (they sum to size)
    with raises(ValueError, "output_split_sizes", "negative size, -1 (for rank 0)"):
        dist.all_to_all_single(torch.empty(size), torch.empty(size), splits, None, group=g)
    with raises(TypeError, "broadcast", "torch.sparse_coo", "all_reduce only"):
        dist.broadcast(torch.ones(2).to_sparse(), src=0, group=g)
    with raises(ValueError, "all_gather_into_tensor", "expected"):
        dist.all_gather_into_tensor(torch.empty(size + 1), torch.empty(1), group=g)
    with raises(ValueError, "reduce_scatter_tensor"):
        dist.reduce_scatter_tensor(torch.empty(2), torch.empty(2 * size + 1), group=g)
    with raises(TypeError, "pg_options", "mcr.distributed.Options"):
        dist.new_group(backend="mcr", pg_options={"backend": "gloo"})
    with raises(ValueError, "unknown backend"):
        mcr.distributed.Options(backend="nope")
    t = torch.ones(2)
    dist.all_reduce(t, group=g)          # the group still works after every refusal
    assert torch.equal(t, full(2, size))


def setup(steps, size, d_in, hidden, d_out, activation, n, seed):
    """A seeded MLP d_in -> hidden -> d_out, and batches x, y of (steps, size, n, d)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), activation(),
                                torch.nn.Linear(hidden, d_out))
    data = torch.Generator().manual_seed(seed)
    return model, torch.randn(steps, size, n, d_in, generator=data), \
        torch.randn(steps, size, n, d_out, generator=data)


def train_ddp(g, size, rank, steps=8, uneven=False):
    """A small MLP trained with DDP on group `g`: the losses and final weights. `uneven`: rank r
    trains on 3 + r batches under torch's Join (the ranks still training post their allreduces
    with async_op=True; a joined one shadows them with async_op=False)."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel
    batches = 3 + size if uneven else steps
    model, x, y = setup(batches, size, 12, 24, 3, torch.nn.Tanh, 6, seed=3 if uneven else 1)
    # tiny buckets: several allreduces per step, as in a large model
    ddp = DistributedDataParallel(model, process_group=g, bucket_cap_mb=0.0005)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    with Join([ddp], enable=uneven):
        for step in range(3 + rank if uneven else steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[step, rank]), y[step, rank])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, parameters_to_vector(model.parameters()).detach()


def train_zero(g, size, rank, steps=6):
    """ZeRO/FSDP-style on group `g`: each rank keeps a shard of the flat parameters; a step
    all-gathers them, computes gradients, and reduce-scatters those onto the shards."""
    model, x, y = setup(steps, size, 10, 16, 2, torch.nn.ReLU, 5, seed=2)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    per = -(-n // size)

    def padded(flat):
        return torch.nn.functional.pad(flat, (0, per * size - n))
    shard = padded(parameters_to_vector(params).detach())[rank * per:(rank + 1) * per].clone()
    losses = []
    for step in range(steps):
        whole = torch.empty(per * size)
        dist.all_gather_into_tensor(whole, shard, group=g)
        vector_to_parameters(whole[:n], params)
        for p in params:
            p.grad = None
        loss = torch.nn.functional.mse_loss(model(x[step, rank]), y[step, rank])
        loss.backward()
        mine = torch.empty(per)
        dist.reduce_scatter_tensor(mine, padded(parameters_to_vector(p.grad for p in params)),
                                   group=g)
        shard -= 0.1 * mine / size
        losses.append(loss.item())
    return losses, shard


def train_joined(g, size, rank):
    """DDP with uneven inputs under torch's Join (train_ddp)."""
    return train_ddp(g, size, rank, uneven=True)


@case.matrix(train=(train_ddp, train_zero, train_joined))
def training_matches_torch_gloo(comm, train):
    """`train` on torch's own Gloo group, then on each mcr group: the same losses, parameters."""
    size, rank = comm.size, comm.rank
    reference, ref_params = train(group("torch-gloo"), size, rank)
    for backend in BACKENDS + (("mpi-same",) if train is train_zero else ()):
        losses, params = train(group(backend), size, rank)
        assert torch.allclose(torch.tensor(losses), torch.tensor(reference), rtol=1e-5,
                              atol=1e-6), (backend, losses, reference)
        assert torch.allclose(params, ref_params, rtol=1e-5, atol=1e-6), backend
    if train is train_ddp:     # the weights are the same everywhere (DDP's point)
        everyone = [torch.empty_like(ref_params) for _ in range(size)]
        dist.all_gather(everyone, ref_params, group=group("mpi"))
        assert all(torch.equal(w, ref_params) for w in everyone)


@case
def groups_are_found_by_name_and_destroyed(comm):
    """torch looks groups up by name (destroy_process_group, functional collectives)."""
    from torch.distributed.distributed_c10d import _resolve_process_group
    group("mpi")
    sub = dist.new_group(list(range(comm.size)))
    assert dist.group.WORLD.group_name and sub.group_name != dist.group.WORLD.group_name
    assert _resolve_process_group(sub.group_name) is sub
    assert dist.get_process_group_ranks(sub) == list(range(comm.size))
    t = torch.ones(3)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)
    assert torch.equal(t, full(3, comm.size))
    with raises(ValueError, "(destroyed)", "not initialized"):
        dist.all_reduce(t, group=sub)


@case
def all_gather_coalesced_lays_out_rank_then_tensor(comm):
    shapes = [(2,), (3, 2), (1,)]
    inputs = [torch.full(shape, float(10 * comm.rank + i)) for i, shape in enumerate(shapes)]
    outputs = [[torch.empty(shape) for shape in shapes] for _ in range(comm.size)]
    dist.all_gather_coalesced(outputs, inputs, group=group("mpi"))
    for r in range(comm.size):
        for i, shape in enumerate(shapes):
            assert torch.equal(outputs[r][i], torch.full(shape, float(10 * r + i))), (r, i)


def strided(rank, rows=3, cols=4):
    """A (rows, cols) tensor that is not contiguous (a transpose), rank's values."""
    return (torch.arange(float(rows * cols)).view(cols, rows) + 100 * rank).t()


@case.matrix(backend=BACKENDS)
def tensors_of_any_strides_move_through_copies(comm, backend):
    """A transpose, or chunks along dim 1, as inputs and outputs (torch's Gloo takes them; they
    were refused as not contiguous): outputs are written in place through a contiguous copy."""
    size, rank, g = comm.size, comm.rank, group(backend)
    everyone = sum(strided(r) for r in range(size))
    t = strided(rank)
    dist.all_reduce(t, group=g)
    assert torch.equal(t, everyone) and not t.is_contiguous()
    t = strided(rank)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g, async_op=True).wait()
    assert torch.allclose(t, everyone / size)
    t = strided(rank)
    dist.broadcast(t, size - 1, group=g)
    assert torch.equal(t, strided(size - 1))
    big = torch.zeros(3, 4 * size)                    # all_gather into chunks along dim 1
    dist.all_gather(list(big.chunk(size, dim=1)), strided(rank), group=g)
    assert torch.equal(big, torch.cat([strided(r) for r in range(size)], dim=1))
    out = torch.zeros(3, 4 * size).t()
    dist.all_gather_into_tensor(out, strided(rank).t(), group=g)
    assert torch.equal(out, torch.cat([strided(r).t() for r in range(size)]))
    out = torch.zeros(4, 3).t()
    dist.reduce_scatter_tensor(out, torch.cat([strided(rank)] * size), group=g)
    assert torch.equal(out, sum(strided(r) for r in range(size)))
    if size > 1:
        t = strided(rank) if rank == 0 else torch.zeros(4, 3).t()
        if rank == 0:
            dist.send(t, 1, group=g)
        elif rank == 1:
            dist.recv(t, 0, group=g)
            assert torch.equal(t, strided(0))


@case
def coalesced_averages_divide_once(comm):
    """ReduceOp.AVG in torch's coalescing manager: each result divided by the size once (the
    parts that completed at once were divided again when the whole completed)."""
    size, rank = comm.size, comm.rank
    g = group("mpi")
    for async_ops in (False, True):
        inputs = [torch.arange(k * size, dtype=torch.float64) * (rank + 1) for k in (2, 3)]
        outputs = [torch.zeros(k, dtype=torch.float64) for k in (2, 3)]
        means = [torch.zeros(k, dtype=torch.float64) + rank for k in (2, 3)]
        with dist._coalescing_manager(group=g, async_ops=async_ops) as cm:
            for out, inp in zip(outputs, inputs):
                dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG, group=g)
        with dist._coalescing_manager(group=g, async_ops=async_ops) as cm2:
            for t in means:
                dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
        if async_ops:
            cm.wait()
            cm2.wait()
        factor = sum(r + 1 for r in range(size)) / size
        for out, k in zip(outputs, (2, 3)):
            want = torch.arange(k * size, dtype=torch.float64)[rank * k:(rank + 1) * k] * factor
            assert torch.allclose(out, want), (async_ops, out, want)
        assert all(torch.allclose(t, torch.full_like(t, (size - 1) / 2)) for t in means), means


@case.matrix(backend=BACKENDS)
def sparse_all_reduce_sums_as_dense(comm, backend):
    size, rank = comm.size, comm.rank
    for dense_dims in (0, 2):
        shape = (size + 2,) + (3,) * dense_dims

        def data(r):
            dense = torch.zeros(shape, dtype=torch.float64)
            dense[r % shape[0]] = r + 1.0            # overlapping rows between ranks
            dense[(r + 1) % shape[0]] = -2.0 * r
            return dense
        sparse = data(rank).to_sparse(1)
        dist.all_reduce(sparse, group=group(backend))
        assert sparse.is_sparse
        assert torch.equal(sparse.to_dense(), sum(data(r) for r in range(size))), dense_dims


GROUP_TIMEOUT = 0.75


@case.matrix(backend=BACKENDS + ("auto",))
def barrier_gives_up_after_its_timeout(comm, backend):
    """A rank alone in a barrier raises after the barrier's timeout, or the group's, also at the
    group's first call (a Gloo group is set up when it is made, as torch's; an auto group agrees
    on its tuning table then). Then every rank destroys the group (collective on Gloo: rank 0
    too, its barrier still posted)."""
    group("mpi")
    # (a Gloo group's set-up took 83 ms at 4 ranks on 2 cores: room enough under the timeout)
    lonely = dist.new_group(list(range(comm.size)), timeout=timedelta(seconds=GROUP_TIMEOUT),
                            backend="mcr", pg_options=mcr.distributed.Options(backend=backend))
    if comm.size > 1 and comm.rank == 0:
        for timeout in (None, 0.2):     # the group's, then the call's
            start = time.monotonic()
            kwargs = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
            with raises(RuntimeError, "barrier", "Timed out waiting"):
                dist.barrier(group=lonely, **kwargs)
            waited = time.monotonic() - start
            assert (timeout or GROUP_TIMEOUT) <= waited < (timeout or GROUP_TIMEOUT) + 5, waited
    comm.Barrier()
    dist.destroy_process_group(lonely)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == comm.size


@case.matrix(backend=BACKENDS)
def monitored_barrier_names_the_missing_ranks(comm, backend):
    size, rank = comm.size, comm.rank
    g = group(backend)
    dist.monitored_barrier(group=g, timeout=timedelta(seconds=30))
    dist.monitored_barrier(group=g, timeout=timedelta(seconds=30), wait_all_ranks=True)
    if size == 1:
        return
    for absent, wait_all in (([size - 1], False), (list(range(1, size)), True)):
        if rank not in absent:
            # Gloo's wording: "Ranks" with wait_all_ranks, even for one
            who = ("Ranks " if wait_all else "Rank ") + ", ".join(map(str, absent))
            message = f"{who} failed to pass monitoredBarrier in 300 ms" if rank == 0 else \
                f"Rank {rank} successfully reached monitoredBarrier"
            with raises(RuntimeError, message):
                dist.monitored_barrier(group=g, timeout=timedelta(seconds=0.3),
                                       wait_all_ranks=wait_all)
        comm.Barrier()
    dist.monitored_barrier(group=g, timeout=timedelta(seconds=30))   # usable again
    t = torch.ones(1)
    dist.all_reduce(t, group=g)
    assert t.item() == size


test_mpi = mpi_cases(__name__, sizes=LAYER_SIZES)


# -- single process: what import mcr does ----------------------------------------

def _with_mcr(env):
    """``env`` whose Python finds the mcr this test imported (source tree or installed)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mcr.__file__)))
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))


def _outside_mpi_env(**set_vars):
    from mcr import launch
    env = {k: v for k, v in os.environ.items()
           if k not in launch.LAUNCHER_VARS
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    return _with_mcr(dict(env, **set_vars))


def _python(code, env=None, ok=True):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env or _with_mcr(os.environ))
    assert not ok or (result.returncode == 0 and "ok" in result.stdout), result.stderr
    return result


def _job(tmp_path, nprocs, code):
    script = tmp_path / "job.py"
    script.write_text(code)
    returncode, out = run_script(nprocs, [str(script)], timeout=120)
    assert returncode == 0, out
    return out


def test_outside_mpi_without_master_addr_torch_error_unchanged():
    """A process that says it has peers (RANK set) and no MASTER_ADDR gets torch's error."""
    result = _python("import mcr, torch.distributed as dist\n"
                     "dist.init_process_group('gloo')\n", _outside_mpi_env(RANK="1"), ok=False)
    assert result.returncode != 0 and "environment variable WORLD_SIZE expected" in \
        result.stderr, result.stderr


def test_one_process_without_mpiexec_is_a_world_of_one():
    """python prog.py: init_process_group("mcr") is MPI's singleton, as ``from mcr import MPI``."""
    _python("import mcr, torch, torch.distributed as dist\n"
            "dist.init_process_group('mcr')\n"
            "assert (dist.get_rank(), dist.get_world_size()) == (0, 1)\n"
            "t = torch.arange(4.0); dist.all_reduce(t)\n"
            "assert t.tolist() == [0.0, 1.0, 2.0, 3.0]\n"
            "dist.barrier(); dist.monitored_barrier()\n"
            "dist.destroy_process_group(); print('ok')\n", _outside_mpi_env())


def test_torch_ranks_that_are_not_mpi_ranks_are_refused():
    """Two processes as torchrun starts them: each is MPI's rank 0 of 1; the group refuses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import mcr, torch.distributed as dist\n"
            "try:\n    dist.init_process_group('mcr')\n"
            "except RuntimeError as exc:\n    print('refused:', exc)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=_outside_mpi_env(
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                  RANK=str(rank), WORLD_SIZE="2"))
             for rank in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert "refused:" in outs[1] and "torch says rank 1 of 2, MPI says rank 0 of 1" in outs[1], outs
    assert "start the processes with mpiexec" in outs[1]


@pytest.mark.parametrize("nprocs", world_sizes([2]))
def test_plain_gloo_init_under_mpiexec(nprocs, tmp_path):
    """import mcr also lets torch's own Gloo start under mpiexec with nothing set."""
    out = _job(tmp_path, nprocs, (
        "import os, torch, mcr, torch.distributed as dist\n"
        "assert 'MASTER_ADDR' not in os.environ\n"
        "mine = int(os.environ.get('OMPI_COMM_WORLD_RANK') or os.environ['PMI_RANK'])\n"
        "try:\n"
        "    dist.init_process_group('gloo', rank=1 - mine, world_size=2)\n"
        "except ValueError as exc:\n"
        "    assert f'rank={1 - mine} was given, but MPI says rank {mine} of 2' in str(exc), exc\n"
        "    print('wrong rank refused')\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(2) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "assert dist.get_backend() == 'gloo' and t.tolist() == [3.0, 3.0], t\n"
        "print('gloo ok', dist.get_rank())\n"
        # before exit: torch's Gloo threads can abort at interpreter shutdown
        "dist.destroy_process_group()\n"))
    assert out.count("wrong rank refused") == nprocs and out.count("gloo ok") == nprocs, out


@pytest.mark.parametrize("nprocs", world_sizes([2]))
def test_init_times_out_when_a_rank_never_calls_it(nprocs, tmp_path):
    """Without MASTER_ADDR, init_process_group's timeout bounds the rendezvous over MPI too."""
    out = _job(tmp_path, nprocs, (
        "import datetime, time, mcr, torch.distributed as dist\n"
        "from mpi4py import MPI\n"
        "world = MPI.COMM_WORLD\n"
        "if world.rank == 0:\n"
        "    t0 = time.monotonic()\n"
        "    try:\n"
        "        dist.init_process_group('mcr', timeout=datetime.timedelta(seconds=1))\n"
        "    except dist.DistStoreError as exc:\n"
        "        took = time.monotonic() - t0\n"
        "        assert 1 <= took < 60, took\n"
        "        print('timed out:', exc, flush=True)\n"
        "    world.send('go', dest=1)\n"
        "    world.recv(source=1)\n"
        "else:\n"
        "    world.recv(source=0)\n"
        "    world.Ibarrier().Wait()      # the barrier rank 0 left pending\n"
        "    world.send('done', dest=0)\n"
        "print('exit', world.rank, flush=True)\n"))
    assert "timed out: init_process_group: timed out after 1 s (its timeout) waiting for " \
        "every rank of the MPI job (2) to call it; rank 0 has" in out, out
    assert out.count("exit") == 2, out


def test_bench_torchdist_tiny():
    """python -m mcr.bench.torchdist: a checked row per operation and size, ratios to Gloo."""
    proc = subprocess.run([sys.executable, "-m", "mcr.bench.torchdist", "-n", "2", "--ops",
                           "all_reduce,all_to_all_single", "--sizes", "4,4096", "--rounds",
                           "1", "--time", "0.005", "--timeout", "150"],
                          capture_output=True, text=True, timeout=180, env=_outside_mpi_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("all_reduce", "all_to_all_single"))]
    assert [(r[0], r[1]) for r in rows] == [(op, n) for op in ("all_reduce", "all_to_all_single")
                                            for n in ("4", "4096")], proc.stdout
    for row in rows:
        assert len(row) == 8 and all(float(x) > 0 for x in row[2:6]), row
        assert row[6].endswith("x") and row[7].endswith("x"), row
