"""Staging of device buffers on the MPI backend, tested on host memory.

A CUDA buffer given to an MPI library that is not CUDA-aware is staged: copied
to host memory before the call, and the receive side copied back when the
operation completes (at once for blocking calls, in Wait/Test/Waitall/... for
requests, at each start and completion for persistent requests). The private
switch ``mcr._core._set_host_staging(True)`` stages host buffers through the
very same code (``mcr.device.HostInterface``), so the logic is tested here
without a GPU.

- ``mcr.device`` unit tests (in-process): ``byte_region`` over tensors, numpy
  arrays and buffers; ``HostInterface``; ``CudaInterface`` without a GPU;
  ``interface(ordinal)``; ``mpi_cuda_aware()`` and ``MCR_CUDA_AWARE``.
- MPI cases, each run with staging off (the control) and on: every
  operation (vector layouts with gaps, IN_PLACE, numpy and bytearray buffers,
  messages at an offset) blocking, non-blocking (completed in every way) and
  persistent (native and emulated, started three times with new contents in
  place); results land only at completion; a staged receive changes nothing
  outside its message; inactive and freed requests behave as without staging.

Expected values are computed with torch on every rank's data, never by mcr.
"""

import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mcr
from mcr import _core, device
from ccoref import layout, place, sentinel
from mpiharness import case, mpi_cases
from util import assert_comm_works, assert_equal, rank_data

N = 3
MODES = (False, True)                 # host staging off (control), on
COMPLETIONS = ("wait", "test", "waitall", "testall", "waitany", "testany", "waitsome",
               "testsome")


@contextlib.contextmanager
def host_staging(on):
    """Stage host buffers (on) or not inside the block; restore afterwards."""
    previous = _core._set_host_staging(on)
    try:
        assert _core._set_host_staging(on) == on
        yield
    finally:
        _core._set_host_staging(previous)


@contextlib.contextmanager
def persistent_emulation(on):
    previous = _core._set_persistent_emulation(on)
    try:
        yield
    finally:
        _core._set_persistent_emulation(previous)


def mode_name(on):
    return "staged" if on else "not staged"


# -- mcr.device (in-process) ---------------------------------------------------------------


def as_bytes(x):
    """The bytes of a tensor or array, as a uint8 tensor (a copy)."""
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).view(torch.uint8).clone()
    return torch.from_numpy(np.frombuffer(bytes(memoryview(x).cast("B")), np.uint8).copy())


def address(x):
    if isinstance(x, torch.Tensor):
        return x.data_ptr()
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    return np.frombuffer(x, np.uint8).ctypes.data


# (label, owner factory): the memory byte_region must view
OWNERS = [
    ("float32 tensor", lambda: torch.arange(8, dtype=torch.float32)),
    ("bfloat16 tensor", lambda: torch.arange(8).to(torch.bfloat16)),
    ("bool tensor", lambda: torch.arange(8) % 3 == 0),
    ("complex64 tensor", lambda: torch.arange(8).to(torch.complex64)),
    ("2-D int16 tensor", lambda: torch.arange(12, dtype=torch.int16).reshape(3, 4)),
    ("tensor view at an offset", lambda: torch.arange(12, dtype=torch.int64)[3:]),
    ("0-d tensor", lambda: torch.tensor(7.0)),
    ("numpy array", lambda: np.arange(8, dtype=np.float64)),
    ("bytearray", lambda: bytearray(range(40))),
]


@pytest.mark.parametrize("label, make", OWNERS, ids=[o[0] for o in OWNERS])
def test_byte_region_views_the_owners_memory(label, make):
    owner = make()
    whole = as_bytes(owner)
    total = whole.numel()
    for start, nbytes in [(0, total), (1, total - 1), (total // 2, total - total // 2),
                          (0, 1), (total, 0), (2, 0)]:
        region = device.byte_region(owner, address(owner) + start, nbytes)
        assert region.dtype == torch.uint8 and region.numel() == nbytes, (start, nbytes)
        assert torch.equal(region, whole[start:start + nbytes]), (start, nbytes)
    # a view, not a copy: writing the region writes the owner
    region = device.byte_region(owner, address(owner) + 1, 2)
    region.fill_(0xAB)
    after = as_bytes(owner)
    assert after[1:3].tolist() == [0xAB, 0xAB]
    assert torch.equal(after[3:], whole[3:]) and after[0] == whole[0]


@pytest.mark.parametrize("start, nbytes", [(-1, 4), (0, 33), (30, 3), (33, 0)])
def test_byte_region_outside_a_tensor_is_refused(start, nbytes):
    t = torch.zeros(8)                        # 32 bytes
    with pytest.raises(ValueError) as info:
        device.byte_region(t, t.data_ptr() + start, nbytes)
    message = str(info.value)
    assert f"{nbytes} bytes" in message and f"offset {start}" in message and "32" in message


def test_host_interface_stages_through_a_copy():
    host = device.interface(-1)
    assert isinstance(host, device.HostInterface)
    assert device.interface(-1) is host and device.interface(-7) is host
    assert host.mpi_reads_device is False
    owner = torch.arange(6, dtype=torch.int32)
    region = host.region(owner, owner.data_ptr() + 4, 8)
    assert torch.equal(region, device.byte_region(owner, owner.data_ptr() + 4, 8))
    host.synchronize(region)                          # nothing to wait for
    staged = host.alloc_host(region.numel())
    assert staged.dtype == torch.uint8 and staged.numel() == 8
    assert staged.data_ptr() != region.data_ptr()     # separate memory MPI may write
    host.copy(staged, region)
    assert torch.equal(staged, region)
    staged.fill_(0)
    assert owner.tolist() == [0, 1, 2, 3, 4, 5]       # the owner is untouched ...
    host.copy(region, staged)
    assert owner.tolist() == [0, 0, 0, 3, 4, 5]       # ... until copied back


def test_cuda_interface_without_a_gpu():
    for aware in (False, True):
        cuda = device.CudaInterface(3, aware)
        assert cuda.ordinal == 3 and cuda.mpi_reads_device is aware
    cuda = device.CudaInterface(0, False)
    for owner in (torch.zeros(4), np.zeros(4), bytearray(16)):
        with pytest.raises(TypeError, match="CUDA buffer"):
            cuda.region(owner, address(owner), 4)


def test_mpi_library_is_not_cuda_aware():
    # the Open MPI wheel the tests run on has no CUDA support
    assert _core._mpi_cuda_aware() in (0, -1)


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("yes", True), ("true", True), ("ON", True), (" 1 ", True),
    ("0", False), ("no", False), ("false", False), ("OFF", False), (" 0 ", False),
    ("", None), ("   ", None), (None, None),      # None: what the library reports
])
def test_mcr_cuda_aware_overrides_the_library(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MCR_CUDA_AWARE", raising=False)
    else:
        monkeypatch.setenv("MCR_CUDA_AWARE", value)
    if expected is None:
        expected = _core._mpi_cuda_aware() == 1
    assert device.mpi_cuda_aware() is expected


SHOW_INTERFACE = """
    from mcr import device
    first = device.interface(0)
    assert device.interface(0) is first and device.interface(1) is not first
    print(type(first).__name__, first.ordinal, first.mpi_reads_device,
          device.interface(1).ordinal)
"""


@pytest.mark.parametrize("value, aware", [("1", True), ("0", False), ("", False)])
def test_interface_of_a_cuda_device(value, aware):
    # interfaces are made once per process: each setting in a fresh one
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD",
                                                                    "PMIX_", "PMI_"))}
    env["MCR_CUDA_AWARE"] = value
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SHOW_INTERFACE)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["CudaInterface", "0", str(aware), "1"], proc.stdout


NUMPY_ONLY = """
    import sys
    import numpy as np
    from mcr import MPI
    comm = MPI.COMM_SELF
    a, out = np.arange(4.0), np.zeros(4)
    comm.Sendrecv(a, 0, 0, out, 0, 0)
    req = comm.Irecv(out, 0, 1)
    comm.Send([a, MPI.DOUBLE], 0, 1)
    req.Wait()
    comm.Bcast(out, 0)
    comm.Allreduce(a, out)
    comm.Allgather(bytearray(b"ab"), bytearray(2))
    assert (out == a).all()
    print("torch" in sys.modules)
"""


def test_numpy_only_program_does_not_import_torch():
    # the staging check once read the unused side of a Send/Recv/Bcast, whose
    # device field is 0 (the memory is zeroed), and loaded mcr.device and torch
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD",
                                                                    "PMIX_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NUMPY_ONLY)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["False"], proc.stdout


# -- the operations, as a table ------------------------------------------------------------
#
# Each builder returns an Op: the calls it makes (method, args, kwargs), with
# fill(it) writing iteration it's inputs into the send buffers *in place* and
# resetting the receive buffers, and results(it) giving (got, expected) pairs.
# Values are small integers: sums over 4 ranks are exact in every dtype.


class Op:
    def __init__(self, label, calls, fill, results, pair=False, blocking_only=False):
        self.label = label
        self.calls = calls            # [(method, args, kwargs)]
        self.fill = fill
        self.results = results
        self.pair = pair              # a receive and a send: the receive is posted first
        self.blocking_only = blocking_only


def value(rank, n, dtype, it, seed=0):
    return rank_data(rank, n, dtype, 100 * seed + it)


def rooted(comm, builder, **kw):
    return [builder(comm, root=root, **kw) for root in sorted({0, comm.size - 1})]


def op_send_recv(comm, dtype, buffer="tensor"):
    """Isend/Irecv on a ring; the receive at an offset inside a larger buffer."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    send = sentinel(N, dtype)
    recv = sentinel(N + 4, dtype)
    sendbuf = send.numpy() if buffer == "numpy" else send
    recvbuf = [recv.numpy() if buffer == "numpy" else recv, N, 2]     # [buf, count, displ]

    def fill(it):
        send.copy_(value(rank, N, dtype, it))
        recv.copy_(sentinel(N + 4, dtype))

    def results(it):
        want = sentinel(N + 4, dtype)
        want[2:2 + N] = value(left, N, dtype, it)
        return [(recv, want)]

    return Op(f"Send/Recv {dtype} ({buffer})",
              [("Recv", (recvbuf, left, 7), {}), ("Send", (sendbuf, right, 7), {})],
              fill, results, pair=True)


def op_bytearray_send_recv(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    send, recv = bytearray(5), bytearray(5)

    def fill(it):
        send[:] = bytes((rank * 10 + it + k) % 256 for k in range(5))
        recv[:] = bytes(5)

    def results(it):
        return [(torch.tensor(list(recv), dtype=torch.uint8),
                 torch.tensor([(left * 10 + it + k) % 256 for k in range(5)],
                              dtype=torch.uint8))]

    return Op("Send/Recv bytearray", [("Recv", (recv, left, 8), {}),
                                      ("Send", (send, right, 8), {})], fill, results, pair=True)


def op_sendrecv(comm, dtype, replace):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    send, recv = sentinel(N, dtype), sentinel(N, dtype)

    def fill(it):
        send.copy_(value(rank, N, dtype, it, 1))
        recv.copy_(sentinel(N, dtype))

    def results(it):
        return [((send if replace else recv), value(left, N, dtype, it, 1))]

    if replace:
        call = ("Sendrecv_replace", (send, right, 9, left, 9), {})
    else:
        call = ("Sendrecv", (send, right, 9, recv, left, 9), {})
    return Op(f"{call[0]} {dtype}", [call], fill, results, blocking_only=True)


def op_bcast(comm, dtype, root, buffer="tensor"):
    rank = comm.rank
    buf = sentinel(N, dtype)

    def fill(it):
        buf.copy_(value(root, N, dtype, it, 2) if rank == root else sentinel(N, dtype))

    return Op(f"Bcast {dtype} root {root} ({buffer})",
              [("Bcast", (buf.numpy() if buffer == "numpy" else buf,), {"root": root})],
              fill, lambda it: [(buf, value(root, N, dtype, it, 2))])


def op_gather(comm, dtype, root, in_place):
    size, rank = comm.size, comm.rank
    here = rank == root
    send = sentinel(N, dtype)
    out = sentinel(N * size, dtype)

    def fill(it):
        send.copy_(value(rank, N, dtype, it, 3))
        out.copy_(sentinel(N * size, dtype))
        if in_place and here:
            out[rank * N:(rank + 1) * N] = value(rank, N, dtype, it, 3)

    def results(it):
        return [(out, torch.cat([value(r, N, dtype, it, 3) for r in range(size)]))] \
            if here else []

    sendbuf = mcr.IN_PLACE if in_place and here else send
    return Op(f"Gather {dtype} root {root}{' in place' if in_place else ''}",
              [("Gather", (sendbuf, out if here else None), {"root": root})], fill, results)


def vector_counts(size):
    return [(i + 1) % 3 for i in range(size)]             # zeros too


def op_gatherv(comm, dtype, root, kind):
    size, rank = comm.size, comm.rank
    here = rank == root
    counts = vector_counts(size)
    displs, length = layout(counts, kind)
    send = sentinel(counts[rank], dtype)
    out = sentinel(length, dtype)

    def fill(it):
        send.copy_(value(rank, counts[rank], dtype, it, 4))
        out.copy_(sentinel(length, dtype))

    def results(it):
        blocks = [value(r, counts[r], dtype, it, 4) for r in range(size)]
        return [(out, place(sentinel(length, dtype), blocks, displs))] if here else []

    return Op(f"Gatherv {dtype} root {root} {kind}",
              [("Gatherv", (send, [out, counts, displs] if here else None), {"root": root})],
              fill, results)


def op_scatter(comm, dtype, root, in_place):
    size, rank = comm.size, comm.rank
    here = rank == root
    whole = sentinel(N * size, dtype)
    recv = sentinel(N, dtype)

    def fill(it):
        whole.copy_(value(root, N * size, dtype, it, 5))
        recv.copy_(sentinel(N, dtype))

    def results(it):
        if in_place and here:                        # the root's block stays in place
            return [(whole, value(root, N * size, dtype, it, 5))]
        return [(recv, value(root, N * size, dtype, it, 5)[rank * N:(rank + 1) * N])]

    recvbuf = mcr.IN_PLACE if in_place and here else recv
    return Op(f"Scatter {dtype} root {root}{' in place' if in_place else ''}",
              [("Scatter", (whole if here else None, recvbuf), {"root": root})], fill, results)


def op_scatterv(comm, dtype, root, kind):
    size, rank = comm.size, comm.rank
    here = rank == root
    counts = vector_counts(size)
    displs, length = layout(counts, kind)
    whole = sentinel(length, dtype)
    recv = sentinel(counts[rank], dtype)

    def blocks(it):
        return [value(root, counts[r], dtype, it, 10 + r) for r in range(size)]

    def fill(it):
        whole.copy_(place(sentinel(length, dtype), blocks(it), displs))
        recv.copy_(sentinel(counts[rank], dtype))

    return Op(f"Scatterv {dtype} root {root} {kind}",
              [("Scatterv", ([whole, counts, displs] if here else None, recv),
                {"root": root})], fill, lambda it: [(recv, blocks(it)[rank])])


def op_allgather(comm, dtype, in_place):
    size, rank = comm.size, comm.rank
    send = sentinel(N, dtype)
    out = sentinel(N * size, dtype)

    def fill(it):
        send.copy_(value(rank, N, dtype, it, 6))
        out.copy_(sentinel(N * size, dtype))
        if in_place:
            out[rank * N:(rank + 1) * N] = value(rank, N, dtype, it, 6)

    return Op(f"Allgather {dtype}{' in place' if in_place else ''}",
              [("Allgather", (mcr.IN_PLACE if in_place else send, out), {})], fill,
              lambda it: [(out, torch.cat([value(r, N, dtype, it, 6) for r in range(size)]))])


def op_allgatherv(comm, dtype, kind, buffer="tensor"):
    size, rank = comm.size, comm.rank
    counts = vector_counts(size)
    displs, length = layout(counts, kind)
    send = sentinel(counts[rank], dtype)
    out = sentinel(length, dtype)

    def fill(it):
        send.copy_(value(rank, counts[rank], dtype, it, 7))
        out.copy_(sentinel(length, dtype))

    def results(it):
        blocks = [value(r, counts[r], dtype, it, 7) for r in range(size)]
        return [(out, place(sentinel(length, dtype), blocks, displs))]

    if buffer == "numpy":
        sendbuf, recvbuf = send.numpy(), [out.numpy(), counts, displs]
    else:
        sendbuf, recvbuf = send, [out, counts, displs]
    return Op(f"Allgatherv {dtype} {kind} ({buffer})", [("Allgatherv", (sendbuf, recvbuf), {})],
              fill, results)


def op_alltoall(comm, dtype, in_place):
    size, rank = comm.size, comm.rank
    send = sentinel(N * size, dtype)
    out = sentinel(N * size, dtype)

    def fill(it):
        send.copy_(value(rank, N * size, dtype, it, 8))
        out.copy_(value(rank, N * size, dtype, it, 8) if in_place else sentinel(N * size, dtype))

    def results(it):
        return [(out, torch.cat([value(r, N * size, dtype, it, 8)[rank * N:(rank + 1) * N]
                                 for r in range(size)]))]

    return Op(f"Alltoall {dtype}{' in place' if in_place else ''}",
              [("Alltoall", (mcr.IN_PLACE if in_place else send, out), {})], fill, results)


def op_alltoallv(comm, dtype, kind):
    size, rank = comm.size, comm.rank

    def count(src, dst):
        return (src + 2 * dst) % 3

    def sdispls(src):
        return layout([count(src, d) for d in range(size)], kind)

    def block(src, dst, it):
        return value(src, count(src, dst), dtype, it, 20 + dst)

    scounts = [count(rank, d) for d in range(size)]
    rcounts = [count(s, rank) for s in range(size)]
    sd, slen = sdispls(rank)
    rd, rlen = layout(rcounts, kind)
    send, out = sentinel(slen, dtype), sentinel(rlen, dtype)

    def fill(it):
        send.copy_(place(sentinel(slen, dtype), [block(rank, d, it) for d in range(size)], sd))
        out.copy_(sentinel(rlen, dtype))

    def results(it):
        return [(out, place(sentinel(rlen, dtype), [block(s, rank, it) for s in range(size)],
                            rd))]

    return Op(f"Alltoallv {dtype} {kind}",
              [("Alltoallv", ([send, scounts, sd], [out, rcounts, rd]), {})], fill, results)


def reduction(dtype):
    """The op for dtype and the torch reference of that op."""
    if dtype == torch.bool:
        return mcr.LOR, lambda xs: torch.stack(xs).any(0)
    return mcr.SUM, lambda xs: torch.stack(xs).sum(0).to(dtype)


def op_reduce(comm, dtype, root, in_place):
    size, rank = comm.size, comm.rank
    here = rank == root
    op, ref = reduction(dtype)
    send, out = sentinel(N, dtype), sentinel(N, dtype)

    def fill(it):
        send.copy_(value(rank, N, dtype, it, 9))
        out.copy_(value(rank, N, dtype, it, 9) if in_place and here else sentinel(N, dtype))

    def results(it):
        return [(out, ref([value(r, N, dtype, it, 9) for r in range(size)]))] if here else []

    sendbuf = mcr.IN_PLACE if in_place and here else send
    return Op(f"Reduce {dtype} root {root}{' in place' if in_place else ''}",
              [("Reduce", (sendbuf, out if here else None), {"op": op, "root": root})],
              fill, results)


def op_allreduce_like(comm, dtype, method, in_place, buffer="tensor"):
    """Allreduce, Scan or Exscan."""
    size, rank = comm.size, comm.rank
    op, ref = reduction(dtype)
    send, out = sentinel(N, dtype), sentinel(N, dtype)

    def fill(it):
        send.copy_(value(rank, N, dtype, it, 11))
        out.copy_(value(rank, N, dtype, it, 11) if in_place else sentinel(N, dtype))

    def results(it):
        ranks = {"Allreduce": range(size), "Scan": range(rank + 1), "Exscan": range(rank)}
        if not ranks[method]:
            return []                                 # Exscan on rank 0: undefined
        return [(out, ref([value(r, N, dtype, it, 11) for r in ranks[method]]))]

    if buffer == "numpy":
        args = (mcr.IN_PLACE if in_place else send.numpy(), out.numpy())
    else:
        args = (mcr.IN_PLACE if in_place else send, out)
    return Op(f"{method} {dtype}{' in place' if in_place else ''} ({buffer})",
              [(method, args, {"op": op})], fill, results)


def op_reduce_scatter(comm, dtype, block, in_place):
    size, rank = comm.size, comm.rank
    op, ref = reduction(dtype)
    counts = [N] * size if block else vector_counts(size)
    total = sum(counts)
    start = sum(counts[:rank])
    send = sentinel(total, dtype)
    out = sentinel(total if in_place else counts[rank], dtype)

    def fill(it):
        send.copy_(value(rank, total, dtype, it, 12))
        out.copy_(value(rank, total, dtype, it, 12) if in_place
                  else sentinel(counts[rank], dtype))

    def results(it):
        whole = ref([value(r, total, dtype, it, 12) for r in range(size)])
        return [(out[:counts[rank]], whole[start:start + counts[rank]])]

    sendbuf = mcr.IN_PLACE if in_place else send
    if block:
        call = ("Reduce_scatter_block", (sendbuf, out), {"op": op})
    else:
        call = ("Reduce_scatter", (sendbuf, out, counts), {"op": op})
    return Op(f"{call[0]} {dtype}{' in place' if in_place else ''}", [call], fill, results)


def op_barrier(comm):
    return Op("Barrier", [("Barrier", (), {})], lambda it: None, lambda it: [])


def staged_ops(comm):
    """Every operation, over element types, roots, layouts and buffer kinds."""
    f32, f16, bf16, i64, u8, c64, b = (torch.float32, torch.float16, torch.bfloat16,
                                       torch.int64, torch.uint8, torch.complex64, torch.bool)
    ops = [op_barrier(comm), op_send_recv(comm, f32), op_send_recv(comm, torch.float64, "numpy"),
           op_send_recv(comm, b), op_bytearray_send_recv(comm),
           op_sendrecv(comm, c64, False), op_sendrecv(comm, bf16, True)]
    ops += rooted(comm, op_bcast, dtype=f16) + [op_bcast(comm, i64, 0, "numpy")]
    for in_place in (False, True):
        ops += rooted(comm, op_gather, dtype=i64, in_place=in_place)
        ops += rooted(comm, op_scatter, dtype=bf16, in_place=in_place)
        ops += rooted(comm, op_reduce, dtype=f32, in_place=in_place)
        ops += [op_allgather(comm, u8, in_place), op_alltoall(comm, c64, in_place),
                op_allreduce_like(comm, f16, "Allreduce", in_place),
                op_allreduce_like(comm, i64, "Scan", in_place),
                op_allreduce_like(comm, f32, "Exscan", in_place),
                op_reduce_scatter(comm, bf16, True, in_place),
                op_reduce_scatter(comm, i64, False, in_place)]
    for kind in ("packed", "gaps", "reversed"):
        ops += [op_gatherv(comm, f32, comm.size - 1, kind), op_scatterv(comm, u8, 0, kind),
                op_allgatherv(comm, f16, kind), op_alltoallv(comm, i64, kind)]
    ops += [op_allgatherv(comm, torch.int32, "gaps", "numpy"),
            op_allreduce_like(comm, torch.float64, "Allreduce", False, "numpy"),
            op_allreduce_like(comm, b, "Allreduce", False)]
    return ops


def nonblocking(method):
    return "I" + method[0].lower() + method[1:]


def complete(requests, how):
    """Complete every request of `requests` by `how` (one of COMPLETIONS)."""
    if how == "wait":
        for r in requests:
            r.Wait()
    elif how == "test":
        for r in requests:
            while not r.Test():
                pass
    elif how == "waitall":
        mcr.Request.Waitall(requests)
    elif how == "testall":
        while not mcr.Request.Testall(requests):
            pass
    elif how in ("waitany", "testany"):
        done = set()
        while True:
            if how == "waitany":
                index, flag = mcr.Request.Waitany(requests), True
            else:
                index, flag = mcr.Request.Testany(requests)
            if flag and index == mcr.UNDEFINED:
                break
            if flag:
                assert index not in done
                done.add(index)
    else:
        fn = mcr.Request.Waitsome if how == "waitsome" else mcr.Request.Testsome
        while fn(requests) is not None:
            pass


def check_results(failures, label, results):
    for got, want in results:
        if isinstance(got, np.ndarray):
            got = torch.from_numpy(got)
        if got.dtype != want.dtype or not torch.equal(got, want):
            failures.append(f"{label}: got {got}, expected {want}")


def run_blocking(comm, op):
    requests = []
    for k, (method, args, kwargs) in enumerate(op.calls):
        if op.pair and k == 0:
            requests.append(getattr(comm, nonblocking(method))(*args, **kwargs))
        else:
            getattr(comm, method)(*args, **kwargs)
    for r in requests:
        r.Wait()


def run_forms(comm, staged):
    """Every op in every form; return the wrong results."""
    failures = []
    mode = mode_name(staged)
    with host_staging(staged):
        for k, op in enumerate(staged_ops(comm)):
            op.fill(0)
            run_blocking(comm, op)
            check_results(failures, f"{op.label}, blocking, {mode}", op.results(0))
            if op.blocking_only:
                continue
            how = COMPLETIONS[k % len(COMPLETIONS)]
            op.fill(1)
            requests = [getattr(comm, nonblocking(m))(*a, **kw) for m, a, kw in op.calls]
            complete(requests, how)
            check_results(failures, f"{op.label}, non-blocking ({how}), {mode}", op.results(1))
            for emulated in (False, True):
                with persistent_emulation(emulated):
                    requests = [getattr(comm, m + "_init")(*a, **kw) for m, a, kw in op.calls]
                for it in range(3):
                    op.fill(10 + it)                       # new contents, in place
                    how = COMPLETIONS[(k + it + emulated) % len(COMPLETIONS)]
                    mcr.Prequest.Startall(requests)
                    complete(requests, how)
                    check_results(failures, f"{op.label}, persistent "
                                  f"({'emulated' if emulated else 'native'}) start {it} "
                                  f"({how}), {mode}", op.results(10 + it))
                for r in requests:
                    r.Free()
    return failures


@case.quick
def every_operation_in_every_form_without_staging(comm):
    # the control: the same table with host buffers given to MPI as they are
    failures = run_forms(comm, False)
    assert not failures, "\n".join(failures)


@case
def every_operation_in_every_form_staged(comm):
    failures = run_forms(comm, True)
    assert not failures, "\n".join(failures)
    assert_comm_works(comm)


# -- when staged results land --------------------------------------------------------------


def spin_until_complete(request):
    """Poll `request` without completing it (Get_status)."""
    while not request.Get_status():
        pass


@case
def staged_results_land_only_at_completion(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    with host_staging(True):
        for k, how in enumerate(COMPLETIONS):
            out = sentinel(N, torch.int64)
            rreq = comm.Irecv(out, left, 30 + k)
            sreq = comm.Isend(value(rank, N, torch.int64, k, 30), right, 30 + k)
            total = sentinel(N, torch.float32)
            creq = comm.Iallreduce(value(rank, N, torch.float32, k, 31), total)
            counts = vector_counts(size)
            displs, length = layout(counts, "gaps")
            gathered = sentinel(length, torch.float16)
            vreq = comm.Iallgatherv(value(rank, counts[rank], torch.float16, k, 32),
                                    [gathered, counts, displs])
            requests = [rreq, creq, vreq]
            for r in requests:
                spin_until_complete(r)
            # complete at MPI level, not yet for the caller: nothing copied back
            assert_equal(out, sentinel(N, torch.int64))
            assert_equal(total, sentinel(N, torch.float32))
            assert_equal(gathered, sentinel(length, torch.float16))
            complete(requests + [sreq], how)
            assert_equal(out, value(left, N, torch.int64, k, 30))
            assert_equal(total, torch.stack([value(r, N, torch.float32, k, 31)
                                             for r in range(size)]).sum(0))
            assert_equal(gathered, place(sentinel(length, torch.float16),
                                         [value(r, counts[r], torch.float16, k, 32)
                                          for r in range(size)], displs))


@case
def each_staged_request_lands_when_it_is_reported(comm):
    # Waitany/Testsome report requests one at a time: only those land
    size, rank = comm.size, comm.rank
    with host_staging(True):
        for how in ("waitany", "testany", "waitsome", "testsome"):
            outs = [sentinel(N, torch.int32) for _ in range(4)]
            requests = [comm.Iallreduce(value(rank, N, torch.int32, k, 40), outs[k])
                        for k in range(4)]
            for r in requests:
                spin_until_complete(r)
            reported = set()
            while len(reported) < 4:
                if how == "waitany":
                    new = [mcr.Request.Waitany(requests)]
                elif how == "testany":
                    index, flag = mcr.Request.Testany(requests)
                    new = [index] if flag else []
                else:
                    fn = mcr.Request.Waitsome if how == "waitsome" else mcr.Request.Testsome
                    new = fn(requests)
                reported.update(new)
                for k in range(4):
                    want = torch.stack([value(r, N, torch.int32, k, 40)
                                        for r in range(size)]).sum(0).to(torch.int32)
                    assert_equal(outs[k], want if k in reported else sentinel(N, torch.int32))


@case
def staged_persistent_requests_land_at_each_completion(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    with host_staging(True):
        for emulated in (False, True):
            with persistent_emulation(emulated):
                send, out = sentinel(N, torch.float64), sentinel(N, torch.float64)
                total = sentinel(N, torch.float64)
                requests = [comm.Recv_init(out, left, 50), comm.Send_init(send, right, 50),
                            comm.Allreduce_init(mcr.IN_PLACE, total)]
            for it in range(3):
                send.copy_(value(rank, N, torch.float64, it, 50))
                out.copy_(sentinel(N, torch.float64))
                total.copy_(value(rank, N, torch.float64, it, 51))
                mcr.Prequest.Startall(requests)
                for r in requests:
                    spin_until_complete(r)
                assert_equal(out, sentinel(N, torch.float64))
                assert_equal(total, value(rank, N, torch.float64, it, 51))
                mcr.Request.Waitall(requests)
                assert_equal(out, value(left, N, torch.float64, it, 50))
                assert_equal(total, torch.stack([value(r, N, torch.float64, it, 51)
                                                 for r in range(size)]).sum(0))
            for r in requests:
                r.Free()


# -- staging must not change what the caller observes ------------------------------------------


@case
def a_receive_changes_nothing_outside_its_message(comm):
    # MPI: a receive writes its message and nothing else; the rest of the
    # buffer's memory is the caller's, even while the receive is pending
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    failures = []
    for staged in MODES:
        mode = mode_name(staged)
        with host_staging(staged):
            # two receives into the two halves of one tensor, completed in reverse
            buf = torch.zeros(2 * N)
            first = comm.Irecv([buf, N, 0], left, 60)
            second = comm.Irecv([buf, N, N], left, 61)
            comm.Send(value(rank, N, torch.float32, 0, 60), right, 60)
            comm.Send(value(rank, N, torch.float32, 0, 61), right, 61)
            second.Wait()
            first.Wait()
            want = torch.cat([value(left, N, torch.float32, 0, 60),
                              value(left, N, torch.float32, 0, 61)])
            if not torch.equal(buf, want):
                failures.append(f"two halves, {mode}: got {buf}, expected {want}")
            # the caller writes past the message while the receive is pending
            buf = torch.zeros(2 * N)
            req = comm.Irecv([buf, N], left, 62)
            buf[N:] = 7.0
            comm.Send(value(rank, N, torch.float32, 0, 62), right, 62)
            req.Wait()
            want = torch.cat([value(left, N, torch.float32, 0, 62), torch.full((N,), 7.0)])
            if not torch.equal(buf, want):
                failures.append(f"write past a pending receive, {mode}: got {buf}, "
                                f"expected {want}")
            # a persistent receive into the first half, the second half written between starts
            buf = torch.zeros(2 * N)
            req = comm.Recv_init([buf, N], left, 63)
            for it in range(2):
                req.Start()
                buf[N:] = float(it + 1)
                comm.Send(value(rank, N, torch.float32, it, 63), right, 63)
                req.Wait()
                want = torch.cat([value(left, N, torch.float32, it, 63),
                                  torch.full((N,), float(it + 1))])
                if not torch.equal(buf, want):
                    failures.append(f"persistent receive, start {it}, {mode}: got {buf}, "
                                    f"expected {want}")
            req.Free()
    assert not failures, "\n".join(failures)


@case
def completing_an_inactive_persistent_request_changes_nothing(comm):
    # MPI: Wait/Test on an inactive persistent request return at once, and
    # leave the buffers to the caller
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    failures = []
    for staged in MODES:
        for emulated in (False, True):
            label = f"{mode_name(staged)}, {'emulated' if emulated else 'native'}"
            with host_staging(staged), persistent_emulation(emulated):
                out = torch.zeros(N)
                total = torch.zeros(N)
                requests = [comm.Recv_init(out, left, 70),
                            comm.Allreduce_init(torch.ones(N), total)]
                send = comm.Isend(value(rank, N, torch.float32, 0, 70), right, 70)
                mcr.Prequest.Startall(requests)
                mcr.Request.Waitall(requests)
                send.Wait()
                assert_equal(out, value(left, N, torch.float32, 0, 70))
                assert_equal(total, torch.full((N,), float(size)))
                for how in ("wait", "test", "waitall", "testall", "waitany", "waitsome"):
                    out.fill_(-1.0)
                    total.fill_(-2.0)
                    complete(requests, how)
                    if not (torch.equal(out, torch.full((N,), -1.0))
                            and torch.equal(total, torch.full((N,), -2.0))):
                        failures.append(f"{how} on inactive requests, {label}: buffers "
                                        f"became {out.tolist()} and {total.tolist()}")
                for r in requests:
                    r.Free()
    assert not failures, "\n".join(failures)


@case
def a_freed_receive_still_delivers(comm):
    # MPI: a freed request's operation goes on. A later message from the same
    # source and tag is matched after it (no overtaking), so once that one has
    # arrived the freed receive has its data too.
    if comm.size == 1:
        return
    failures = []
    for staged in MODES:
        with host_staging(staged):
            if comm.rank == 0:
                first, second = torch.zeros(N), torch.zeros(N)
                req = comm.Irecv(first, 1, 80)
                req.Free()
                comm.Recv(second, 1, 80)
                comm.Barrier()
                want = value(1, N, torch.float32, 0, 80)
                if not torch.equal(first, want):
                    failures.append(f"{mode_name(staged)}: freed receive gave {first}, "
                                    f"expected {want}")
            elif comm.rank == 1:
                comm.Send(value(1, N, torch.float32, 0, 80), 0, 80)
                comm.Send(value(1, N, torch.float32, 1, 80), 0, 80)
                comm.Barrier()
            else:
                comm.Barrier()
    assert not failures, "\n".join(failures)


@case
def other_backends_are_not_staged(comm):
    # staging is the MPI backend's: Gloo calls run as usual with it on
    want = torch.stack([value(r, N, torch.float32, 0, 90) for r in range(comm.size)]).sum(0)
    with host_staging(True):
        x = value(comm.rank, N, torch.float32, 0, 90)
        out, later = torch.zeros(N), torch.zeros(N)
        comm.Allreduce(x, out, backend="gloo")
        req = comm.Iallreduce(x, later, backend="gloo")
        req.Wait()
        assert_equal(out, want)
        assert_equal(later, want)
        assert_comm_works(comm)


test_mpi = mpi_cases(__name__, timeout=150)
