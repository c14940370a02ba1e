"""Staging of device buffers on the MPI backend, tested on host memory.

A CUDA buffer given to an MPI library that is not CUDA-aware is copied to host memory before
the call and back at completion; ``opmatrix.staging`` stages host buffers through the same code
(``mcr.device.HostInterface``), as the matrix's backend "staged" does for every collective.
Here: ``mcr.device`` unit tests; point-to-point in every form, staged and not; when staged
results land; what a receive may change; inactive and freed requests, staged and not."""

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mcr
from mcr import _core, device
from mpiharness import case, mpi_cases
from opmatrix import COMPLETIONS, Findings, complete, emulation, staging
from opref import expect, layout, place, rank_data, sentinel, vcounts
from util import assert_comm_works, assert_equal

N = 3
MODES = (False, True)                 # host staging off (control), on


# -- mcr.device (in-process) ---------------------------------------------------------------
def as_bytes(x):
    """The bytes of a tensor or array, as a uint8 tensor (a copy)."""
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).view(torch.uint8).clone()
    return torch.from_numpy(np.frombuffer(bytes(memoryview(x).cast("B")), np.uint8).copy())


def address(x):
    return x.data_ptr() if isinstance(x, torch.Tensor) else np.frombuffer(x, np.uint8).ctypes.data


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


@pytest.mark.parametrize("label, make", OWNERS, ids=[o[0] for o in OWNERS])
def test_a_backends_typed_side_views_the_callers_elements(label, make):
    """Side.typed (what backends reduce on): the caller's elements at any offset, as a view;
    also read as bytes of another type (the owner is not of the message's type)."""
    from mcr.backends.message import Side
    owner = make()
    whole = as_bytes(owner)
    own = owner.dtype if isinstance(owner, torch.Tensor) else torch.float64
    for dtype in {own, torch.uint8}:            # the owner's type, and bytes of another
        if whole.numel() % dtype.itemsize:
            continue
        elems = whole.view(dtype)
        total, name = elems.numel(), str(dtype).removeprefix("torch.")
        for first, count, displ in [(0, total, 0), (1, total - 1, 0), (1, total - 3, 2),
                                    (0, 1, total - 1), (total, 0, 0)]:
            if count < 0:                       # (a 1-element owner)
                continue
            side = Side(("buf", address(owner) + first * dtype.itemsize, count, None, None,
                         total - first, name, dtype.itemsize, -1, owner))
            got = side.typed(count, displ)
            want = elems[first + displ:first + displ + count]
            assert got.dtype == dtype and torch.equal(got, want), (dtype, first, count, displ)
            if got.numel():                     # a view: it reads the owner's memory
                assert got.data_ptr() == address(owner) + (first + displ) * dtype.itemsize


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


@pytest.mark.parametrize("value", ["flase", "2", "aware"])
def test_mcr_cuda_aware_refuses_what_it_does_not_know(monkeypatch, value):
    """A typo must not hand device pointers to an MPI library that cannot read them."""
    monkeypatch.setenv("MCR_CUDA_AWARE", value)
    with pytest.raises(ValueError, match=f"MCR_CUDA_AWARE: expected 1 .on. or 0 .off., got "
                                         f"'{value}'"):
        device.mpi_cuda_aware()


def python(code, **env):
    """The output of `code` run by a fresh Python, outside the MPI job."""
    env.update({k: v for k, v in os.environ.items()
                if k not in env and not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


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
    out = python(SHOW_INTERFACE, MCR_CUDA_AWARE=value)
    assert out.split() == ["CudaInterface", "0", str(aware), "1"], out


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
    # one process on a periodic ring: its own left and right neighbour, which Open MPI
    # gets wrong and mcr composes of Alltoallv rounds: block 1 goes right, comes from the left
    cart = comm.Create_cart([1], [True])
    s, r = np.array([1.0, 2.0]), np.zeros(2)
    cart.Neighbor_alltoall(s, r)
    assert list(r) == [2.0, 1.0], r
    r[:] = 0
    cart.Ineighbor_alltoall(s, r).Wait()
    assert list(r) == [2.0, 1.0], r
    r[:] = 0
    persistent = cart.Neighbor_alltoall_init(s, r)
    persistent.Start()
    persistent.Wait()
    assert list(r) == [2.0, 1.0], r
    print("torch" in sys.modules)
"""


def test_numpy_only_program_does_not_import_torch():
    # the staging check once read the unused side of a Send/Recv/Bcast, whose
    # device field is 0 (the memory is zeroed), and loaded mcr.device and torch; the
    # neighbourhood calls composed on MPI once moved torch tensors over the arrays
    out = python(NUMPY_ONLY)
    assert out.split() == ["False"], out


# -- point-to-point, staged and not (the matrix has collectives only) ------------------------
P2P_KINDS = (torch.float32, np.float64, torch.bool, bytearray)


def message(kind, rank, seed):
    """What `rank` sends: N elements of `kind` (a bytearray: N bytes)."""
    if kind is bytearray:
        return bytearray(rank_data(rank, N, torch.uint8, seed).numpy().tobytes())
    return rank_data(rank, N, kind, seed)


def receive_buffer(kind):
    """(buffer, spec): the message at offset 2 of N + 4 elements; a bytearray whole."""
    buf = bytearray(N) if kind is bytearray else sentinel(N + 4, kind)
    return buf, (buf if kind is bytearray else [buf, N, 2])


def expect_received(kind, got, sent):
    if kind is bytearray:
        assert got == sent, (got, sent)
    else:
        expect(got, place(sentinel(N + 4, kind), [sent], [2]))


@case.matrix(staged=MODES)
def point_to_point_in_every_form(comm, staged):
    """Tensors, arrays and bytearrays: Send to a posted Irecv, non-blocking and persistent
    (started twice, new contents written in place), completed every way; Sendrecv(_replace)."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    found, turns = Findings(), itertools.cycle(COMPLETIONS)
    with staging(staged):
        assert _core._set_host_staging(staged) == staged       # returns the previous
        for kind in P2P_KINDS:
            send = message(kind, rank, 0)
            recv, spec = receive_buffer(kind)
            persistent = [comm.Recv_init(spec, left, 8), comm.Send_init(send, right, 8)]
            for seed, form in enumerate(("blocking", "nonblocking", "persistent", "persistent"), 1):
                send[:] = message(kind, rank, seed)
                recv[:] = receive_buffer(kind)[0]
                how = next(turns)
                if form == "blocking":
                    req = comm.Irecv(spec, left, 7)
                    comm.Send(send, right, 7)
                    req.Wait()
                elif form == "nonblocking":
                    complete([comm.Irecv(spec, left, 7), comm.Isend(send, right, 7)], how)
                else:
                    mcr.Prequest.Startall(persistent)
                    complete(persistent, how)
                with found.check(f"{kind} {form} {how}"):
                    expect_received(kind, recv, message(kind, left, seed))
            for req in persistent:
                req.Free()
        recv, both = sentinel(N, torch.complex64), message(torch.bfloat16, rank, 6)
        comm.Sendrecv(message(torch.complex64, rank, 5), right, 9, recv, left, 9)
        comm.Sendrecv_replace(both, right, 9, left, 9)
        with found.check("Sendrecv, Sendrecv_replace"):
            expect(recv, message(torch.complex64, left, 5))
            expect(both, message(torch.bfloat16, left, 6))
    found.report()


# -- when staged results land --------------------------------------------------------------
def spin_until_complete(request):
    """Poll `request` without completing it (Get_status)."""
    while not request.Get_status():
        pass


def total(n, dtype, seed, ranks):
    return torch.stack([rank_data(r, n, dtype, seed) for r in ranks]).sum(0).to(dtype)


@case.matrix(how=COMPLETIONS)
def staged_results_land_only_at_completion(comm, how):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    counts = vcounts(size)
    displs, length = layout(counts, "gaps")
    seed = 30 + 3 * COMPLETIONS.index(how)
    with staging(True):
        out, summed = sentinel(N, torch.int64), sentinel(N, torch.float32)
        gathered = sentinel(length, torch.float16)
        requests = [comm.Irecv(out, left, seed),
                    comm.Iallreduce(rank_data(rank, N, torch.float32, seed + 1), summed),
                    comm.Iallgatherv(rank_data(rank, counts[rank], torch.float16, seed + 2),
                                     [gathered, counts, displs])]
        sreq = comm.Isend(rank_data(rank, N, torch.int64, seed), right, seed)
        for r in requests:
            spin_until_complete(r)
        # complete at MPI level, not yet for the caller: nothing copied back
        for buf in (out, summed, gathered):
            assert_equal(buf, sentinel(len(buf), buf.dtype))
        complete(requests + [sreq], how)
        assert_equal(out, rank_data(left, N, torch.int64, seed))
        assert_equal(summed, total(N, torch.float32, seed + 1, range(size)))
        assert_equal(gathered, place(sentinel(length, torch.float16), [
            rank_data(r, counts[r], torch.float16, seed + 2) for r in range(size)], displs))


@case.matrix(how=("waitany", "testany", "waitsome", "testsome"))
def each_staged_request_lands_when_it_is_reported(comm, how):
    # Waitany/Testsome report requests one at a time: only those land
    rank, ranks = comm.rank, range(comm.size)
    with staging(True):
        outs = [sentinel(N, torch.int32) for _ in range(4)]
        requests = [comm.Iallreduce(rank_data(rank, N, torch.int32, 40 + k), outs[k])
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
                new = getattr(mcr.Request, how.capitalize())(requests)
            reported.update(new)
            for k in range(4):
                assert_equal(outs[k], total(N, torch.int32, 40 + k, ranks)
                             if k in reported else sentinel(N, torch.int32))


@case
def staged_persistent_requests_land_at_each_completion(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    f64 = torch.float64
    with staging(True):
        for emulated in (False, True):
            with emulation(emulated):
                send, out, summed = sentinel(N, f64), sentinel(N, f64), sentinel(N, f64)
                requests = [comm.Recv_init(out, left, 50), comm.Send_init(send, right, 50),
                            comm.Allreduce_init(mcr.IN_PLACE, summed)]
            for it in range(3):
                send.copy_(rank_data(rank, N, f64, 50 + it))
                out.copy_(sentinel(N, f64))
                summed.copy_(rank_data(rank, N, f64, 60 + it))
                mcr.Prequest.Startall(requests)
                for r in requests:
                    spin_until_complete(r)
                assert_equal(out, sentinel(N, f64))
                assert_equal(summed, rank_data(rank, N, f64, 60 + it))
                mcr.Request.Waitall(requests)
                assert_equal(out, rank_data(left, N, f64, 50 + it))
                assert_equal(summed, total(N, f64, 60 + it, range(size)))
            for r in requests:
                r.Free()


@case
def a_refused_start_leaves_the_running_operations_staged_data(comm):
    """Start on a staged native request still running is refused before its buffers are
    copied in again: the running Allreduce (in place, 2 MiB: read late, at the peer's match)
    sums the data of its own start, not the caller's newer data."""
    n, rank, f64 = 1 << 18, comm.rank, torch.float64
    peer = comm.Dup()
    with staging(True), emulation(False):
        summed = rank_data(rank, n, f64, 70)
        req = comm.Allreduce_init(mcr.IN_PLACE, summed)
        if rank == 0:
            req.Start()
            summed.copy_(rank_data(rank, n, f64, 71))
            with pytest.raises(ValueError, match="request: still active"):
                req.Start()
            if comm.size > 1:
                peer.Send(torch.ones(1), 1, 9)      # the others start only now
        else:
            if rank == 1:
                peer.Recv(torch.zeros(1), 0, 9)
            req.Start()
        req.Wait()
        assert_equal(summed, total(n, f64, 70, range(comm.size)))
        req.Free()
    peer.Free()


# -- staging must not change what the caller observes ------------------------------------------
@case.matrix(staged=MODES)
def a_receive_changes_nothing_outside_its_message(comm, staged):
    # MPI: a receive writes its message and nothing else; the rest of the
    # buffer's memory is the caller's, even while the receive is pending
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    found = Findings()

    def msg(r, seed):
        return rank_data(r, N, torch.float32, seed)
    with staging(staged):
        # two receives into the two halves of one tensor, completed in reverse
        buf = torch.zeros(2 * N)
        first = comm.Irecv([buf, N, 0], left, 60)
        second = comm.Irecv([buf, N, N], left, 61)
        comm.Send(msg(rank, 60), right, 60)
        comm.Send(msg(rank, 61), right, 61)
        second.Wait()
        first.Wait()
        with found.check("two halves"):
            expect(buf, torch.cat([msg(left, 60), msg(left, 61)]))
        # the caller writes past the message while the receive is pending
        req = comm.Irecv([buf := torch.zeros(2 * N), N], left, 62)
        buf[N:] = 7.0
        comm.Send(msg(rank, 62), right, 62)
        req.Wait()
        with found.check("write past a pending receive"):
            expect(buf, torch.cat([msg(left, 62), torch.full((N,), 7.0)]))
        # a persistent receive into the first half, the second written between starts
        req = comm.Recv_init([buf := torch.zeros(2 * N), N], left, 63)
        for it in range(2):
            req.Start()
            buf[N:] = float(it + 1)
            comm.Send(msg(rank, 63 + it), right, 63)
            req.Wait()
            with found.check(f"persistent receive, start {it}"):
                expect(buf, torch.cat([msg(left, 63 + it), torch.full((N,), it + 1.0)]))
        req.Free()
    found.report()


@case
def a_collectives_receive_buffer_is_only_copied_out(comm):
    # a collective writes all of its receive message, so its host copy is not filled from the
    # buffer first (on a GPU: one blocking copy less); in place, and for a receive, it is
    rank, ranks, f32 = comm.rank, range(comm.size), torch.float32
    right, left = (rank + 1) % comm.size, (rank - 1) % comm.size
    x = rank_data(rank, N, f32, 70)
    read = []                                   # the address each staging copy read from
    real = device.HostInterface.copy

    def observed(self, dst, src):
        read.append(src.data_ptr())
        real(self, dst, src)

    def in_place(out):
        out.copy_(x)
        comm.Allreduce(mcr.IN_PLACE, out)
    cases = [  # (name, call, its receive buffer's length, what it receives, copied in)
        ("Allreduce", lambda out: comm.Allreduce(x, out), N, total(N, f32, 70, ranks), False),
        ("Allreduce in place", in_place, N, total(N, f32, 70, ranks), True),
        ("Allgather", lambda out: comm.Allgather(x, out), N * comm.size,
         torch.cat([rank_data(r, N, f32, 70) for r in ranks]), False),
        ("Scan", lambda out: comm.Scan(x, out), N, total(N, f32, 70, range(rank + 1)), False),
        ("Sendrecv", lambda out: comm.Sendrecv(x, right, 71, out, left, 71), N,
         rank_data(left, N, f32, 70), True)]
    found = Findings()
    device.HostInterface.copy = observed
    try:
        with staging(True):
            for name, call, n, want, copied_in in cases:
                out = sentinel(n, f32)
                read.clear()
                call(out)
                start, end = out.data_ptr(), out.data_ptr() + out.nbytes
                with found.check(name):
                    expect(out, want)
                    assert any(start <= p < end for p in read) == copied_in, read
    finally:
        device.HostInterface.copy = real
    found.report()


@case.matrix(staged=MODES, emulated=(False, True))
def completing_an_inactive_persistent_request_changes_nothing(comm, staged, emulated):
    # MPI: Wait/Test on an inactive persistent request return at once, and
    # leave the buffers to the caller
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    found = Findings()
    with staging(staged), emulation(emulated):
        out, summed = torch.zeros(N), torch.zeros(N)
        requests = [comm.Recv_init(out, left, 70), comm.Allreduce_init(torch.ones(N), summed)]
        send = comm.Isend(rank_data(rank, N, torch.float32, 70), right, 70)
        mcr.Prequest.Startall(requests)
        mcr.Request.Waitall(requests)
        send.Wait()
        assert_equal(out, rank_data(left, N, torch.float32, 70))
        assert_equal(summed, torch.full((N,), float(size)))
        for how in ("wait", "test", "waitall", "testall", "waitany", "waitsome"):
            out.fill_(-1.0)
            summed.fill_(-2.0)
            with found.check(f"{how} on inactive"):
                if how == "waitany":        # nothing active: UNDEFINED at once
                    assert mcr.Request.Waitany(requests) == mcr.UNDEFINED
                elif how == "waitsome":     # and None
                    assert mcr.Request.Waitsome(requests) is None
                else:
                    complete(requests, how)
                expect(out, torch.full((N,), -1.0))
                expect(summed, torch.full((N,), -2.0))
        for r in requests:
            r.Free()
    found.report()


@case.matrix(staged=MODES)
def a_freed_receive_still_delivers(comm, staged):
    # MPI: a freed request's operation goes on. A later message from the same
    # source and tag is matched after it (no overtaking), so once that one has
    # arrived the freed receive has its data too.
    if comm.size == 1:
        return
    with staging(staged):
        if comm.rank == 0:
            req = comm.Irecv(first := torch.zeros(N), 1, 80)
            req.Free()
            comm.Recv(torch.zeros(N), 1, 80)
        elif comm.rank == 1:
            comm.Send(rank_data(1, N, torch.float32, 80), 0, 80)
            comm.Send(rank_data(1, N, torch.float32, 81), 0, 80)
        comm.Barrier()
        if comm.rank == 0:
            expect(first, rank_data(1, N, torch.float32, 80))


@case
def other_backends_are_not_staged(comm):
    # staging is the MPI backend's: Gloo calls run as usual with it on
    want = total(N, torch.float32, 90, range(comm.size))
    with staging(True):
        x = rank_data(comm.rank, N, torch.float32, 90)
        out, later = torch.zeros(N), torch.zeros(N)
        comm.Allreduce(x, out, backend="gloo")
        req = comm.Iallreduce(x, later, backend="gloo")
        req.Wait()
        assert_equal(out, want)
        assert_equal(later, want)
        assert_comm_works(comm)


test_mpi = mpi_cases(__name__)
