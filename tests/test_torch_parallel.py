"""DeviceMesh, DTensor and FSDP2 (``fully_shard``) on CPU over the "mcr" backend.

At 2 and 4 ranks, default group "mcr", on three 1-D meshes over all ranks: the default group
(mcr on MPI), an "mcr" group running Gloo, and torch's own Gloo group; each against plain
torch on the whole data in one process (the full tensor, the unsharded model on the whole
batch). The meshes' dimension names differ: ``DeviceMesh`` equality ignores the group, so
DTensor's caches would send one mesh's collectives to another's group.
"""

import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import mcr
from mpiharness import case, mpi_cases
from util import raises

_meshes = {}


def meshes():
    """The meshes compared, by name (made once per job; the default group is "mcr")."""
    if not _meshes:
        if not dist.is_initialized():
            dist.init_process_group("mcr")
        assert dist.get_backend() == "mcr", dist.get_backend()
        size = dist.get_world_size()
        _meshes["mcr"] = init_device_mesh("cpu", (size,), mesh_dim_names=("mcr",))
        on_gloo = dist.new_group(backend="mcr", pg_options=mcr.distributed.Options(backend="gloo"))
        _meshes["mcr-gloo"] = DeviceMesh.from_group(on_gloo, "cpu", mesh_dim_names=("mcr_gloo",))
        _meshes["torch-gloo"] = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu",
                                                      mesh_dim_names=("torch_gloo",))
    return _meshes


def shard_of(full, dim, rank, size):
    """Rank `rank`'s block of `full` along `dim` as Shard lays it out (the last short or empty)."""
    per = -(-full.shape[dim] // size)
    return full.narrow(dim, min(rank * per, full.shape[dim]),
                       max(0, min(per, full.shape[dim] - rank * per)))


@case
def meshes_hold_the_groups(comm):
    size, rank = comm.size, comm.rank
    by_name = meshes()
    assert by_name["mcr"].get_group() is dist.group.WORLD
    for name, mesh in by_name.items():
        group = mesh.get_group()
        assert (mesh.size(), mesh.get_local_rank()) == (size, rank), name
        assert dist.get_process_group_ranks(group) == list(range(size)), name
        # torch finds the group by its name (functional collectives do)
        assert dist.distributed_c10d._resolve_process_group(group.group_name) is group, name
        assert isinstance(group, mcr.distributed.ProcessGroupMCR) == (name != "torch-gloo")
    # a 2-D mesh: its row and column groups are "mcr" groups made by torch
    grid = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("rows", "cols"))
    row, col = divmod(rank, size // 2)
    assert dist.get_process_group_ranks(grid.get_group("cols")) == \
        [row * (size // 2) + c for c in range(size // 2)]
    assert dist.get_process_group_ranks(grid.get_group("rows")) == [col, size // 2 + col]
    assert isinstance(grid.get_group("rows"), mcr.distributed.ProcessGroupMCR)
    full = torch.randint(-9, 9, (5, 2 * size + 1)).float()
    dist.broadcast(full, src=0)
    spread = distribute_tensor(full, grid, [Shard(0), Shard(1)])
    assert torch.equal(spread.to_local(), shard_of(shard_of(full, 0, row, 2), 1, col, size // 2))
    assert torch.equal(spread.redistribute(grid, [Replicate(), Replicate()]).to_local(), full)


@case
def redistribute_matches_the_full_tensor(comm):
    size, rank = comm.size, comm.rank
    # uneven on purpose; small integers: every sum is exact whatever the order
    full = torch.randint(-9, 9, (2 * size + 1, size + 3),
                         generator=torch.Generator().manual_seed(3)).float()
    summed = full * sum(range(1, size + 1))
    for name, mesh in meshes().items():
        rows = distribute_tensor(full, mesh, [Shard(0)])
        assert torch.equal(rows.to_local(), shard_of(full, 0, rank, size)), name
        whole = rows.redistribute(mesh, [Replicate()])
        assert torch.equal(whole.to_local(), full), name
        again = whole.redistribute(mesh, [Shard(0)])
        assert torch.equal(again.to_local(), shard_of(full, 0, rank, size)), name
        columns = rows.redistribute(mesh, [Shard(1)])
        assert torch.equal(columns.to_local(), shard_of(full, 1, rank, size)), name
        assert torch.equal(columns.full_tensor(), full), name
        # Partial: rank r holds (r + 1) * full; all_reduce, then reduce_scatter
        for placement, want in [(Replicate(), summed),
                                (Shard(0), shard_of(summed, 0, rank, size))]:
            partial = DTensor.from_local(full * (rank + 1), mesh, [Partial()])
            assert torch.equal(partial.redistribute(mesh, [placement]).to_local(), want), name
        pending = rows.redistribute(mesh, [Replicate()], async_op=True)
        assert torch.equal(pending.to_local().wait(), full), name


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(size, steps=4, rows=5):
    data = torch.Generator().manual_seed(1)
    return (torch.randn(steps, size, rows, 8, generator=data),
            torch.randn(steps, size, rows, 4, generator=data))


def step(model, optimizer, x, y):
    """MSE loss, backward, gradient clipping (sharded: an all_reduce), Adam; the loss."""
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    optimizer.step()
    return loss.detach()


def train_sharded(mesh, size, rank):
    """fully_shard on each Linear and the model, rank r on its part of each batch: the losses
    and the full final parameters."""
    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batches(size)
    losses = torch.stack([step(model, optimizer, x[i, rank], y[i, rank]) for i in range(len(x))])
    return losses, [p.full_tensor() for p in model.parameters()]


def train_whole(size, rank):
    """The unsharded model on each whole batch: the losses on `rank`'s part, final parameters."""
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = batches(size)
    losses = []
    for i in range(len(x)):
        with torch.no_grad():
            losses.append(torch.nn.functional.mse_loss(model(x[i, rank]), y[i, rank]))
        step(model, optimizer, x[i].flatten(0, 1), y[i].flatten(0, 1))
    return torch.stack(losses), [p.detach() for p in model.parameters()]


@case
def fully_shard_trains_as_the_whole_model(comm):
    size, rank = comm.size, comm.rank
    ref_losses, ref_params = train_whole(size, rank)
    results = {name: train_sharded(mesh, size, rank) for name, mesh in meshes().items()}
    for name, (losses, params) in results.items():
        assert torch.allclose(losses, ref_losses, rtol=1e-5, atol=1e-6), (name, losses, ref_losses)
        for p, ref in zip(params, ref_params):
            assert torch.allclose(p, ref, rtol=1e-4, atol=1e-6), (name, (p - ref).abs().max())
    gloo_losses, gloo_params = results["torch-gloo"]
    for name in ("mcr", "mcr-gloo"):
        losses, params = results[name]
        assert torch.allclose(losses, gloo_losses, rtol=1e-6, atol=1e-7), name
        assert all(torch.allclose(p, q, rtol=1e-6, atol=1e-7)
                   for p, q in zip(params, gloo_params)), name


@case
def gradient_divide_factor_needs_sum_reductions_as_on_gloo(comm):
    """set_gradient_divide_factor makes FSDP2 reduce-scatter with PREMUL_SUM, which neither Gloo
    nor mcr has; set_force_sum_reduction_for_comms: SUM, then divide."""
    size, rank = comm.size, comm.rank
    x = torch.randn(size, 3, 8, generator=torch.Generator().manual_seed(4))
    whole = mlp()
    whole(x.flatten(0, 1)).sum().backward()
    for name, mesh in meshes().items():
        model = fully_shard(mlp(), mesh=mesh)
        model.set_gradient_divide_factor(3.0)
        gloo = name == "torch-gloo"
        with raises(*(RuntimeError, "Cannot use ReduceOp.PREMUL_SUM with Gloo") if gloo
                    else (ValueError, "PREMUL_SUM is not supported by the 'mcr' backend")):
            model(x[rank]).sum().backward()
        model = fully_shard(mlp(), mesh=mesh)
        model.set_gradient_divide_factor(3.0)
        model.set_force_sum_reduction_for_comms(True)
        model(x[rank]).sum().backward()
        for p, ref in zip(model.parameters(), whole.parameters()):
            assert torch.allclose(p.grad.full_tensor(), ref.grad / 3.0, rtol=1e-5, atol=1e-6), name


@case
def checkpoints_load_and_save_as_on_gloo(comm):
    """torch asks an "mcr" group for its devices (it listed none): a full state dict loaded from
    rank 0 (broadcast_from_rank0, FSDP2's way to load a checkpoint) and dcp.async_save."""
    rank = comm.rank
    whole = mlp()
    for name, mesh in meshes().items():
        model = fully_shard(mlp(), mesh=mesh)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        set_model_state_dict(model, whole.state_dict() if rank == 0 else {},
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True))
        for p, ref in zip(model.parameters(), whole.parameters()):
            assert torch.equal(p.full_tensor(), ref.detach()), name
    folder = comm.bcast(tempfile.mkdtemp(prefix="mcr-dcp-") if rank == 0 else None)
    try:
        state = {"x": torch.arange(4.0), "y": torch.full((2,), 7.0)}
        dcp.async_save(state, checkpoint_id=folder).result()
        loaded = {"x": torch.zeros(4), "y": torch.zeros(2)}
        dcp.load(loaded, checkpoint_id=folder)
        assert all(torch.equal(loaded[k], state[k]) for k in state), loaded
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(folder)


# a job of its own: the meshes and DTensor's caches are the process's for good
test_mpi = mpi_cases(__name__, sizes=(2, 4), timeout=240, own_job=True)
