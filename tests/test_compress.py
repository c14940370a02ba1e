"""Compressed collectives (mcr.compress): the codecs alone, then the operations in every form
on MPI and Gloo. Expected values are computed with torch (and zfpy) on the whole data, through
Q(x), what a codec makes of x (a cast there and back; a user codec's own functions): moved data
arrives as Q(x), but what a root keeps (its block under IN_PLACE, Bcast's buffer); a reduction
gives Q(fold(Q(x_0), ..., Q(x_{n-1}))) in rank order in the buffer's type (Reduce_scatter(_block):
not rounded again); zfp results are within the bound the docs state."""

import collections
import importlib.util
import itertools
import sys

import pytest
import torch
from mpi4py import MPI

import mcr
from mcr import compress
from mpiharness import case, mpi_cases, run_script
from opmatrix import Findings, no_check, nonblocking, refill
from opref import OPS, cat, expect, layout, place, sentinel, vcounts
from util import assert_comm_works, logging_on, raises

BACKENDS = ("mpi", "gloo")
HAVE_ZFP = importlib.util.find_spec("zfpy") is not None
CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}
F32, F64 = torch.float32, torch.float64


def data(key, n, dtype=F32, seed=0):
    """Values of varied scale, not representable in fp16."""
    g = torch.Generator().manual_seed(7919 * seed + key)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)


def cast(x, name):
    return x.to(CASTS[name]).to(x.dtype)


def folded(values, q, op="SUM"):
    """fold(Q(x_0), ..., Q(x_{n-1})) in rank order, in the values' own type."""
    fold = {"SUM": torch.add, "MAX": torch.maximum, "MIN": torch.minimum}[op]
    acc = q(values[0])
    for v in values[1:]:
        acc = fold(acc, q(v))
    return acc


def reduced(values, q, op="SUM"):
    """Q(fold(Q(x_0), ..., Q(x_{n-1})))."""
    return q(folded(values, q, op))


def zfp_bound(rate):
    return 2.0 ** (7 - rate)


def _nonzeros(x):
    """A codec of a size of its own: fp16 of the values before the first zero."""
    k = int((x != 0).cumprod(0).sum()) if x.numel() else 0
    return x[:k].to(torch.float16)


def _fill(payload, like):
    out = torch.zeros_like(like)
    head = payload.view(torch.float16)
    out[:head.numel()] = head.to(like.dtype)
    return out


# codec: (compress= spec, Q)
CODECS = {"fp16": ("fp16", lambda x: cast(x, "fp16")), "bf16": ("bf16", lambda x: cast(x, "bf16")),
          "half": ((lambda x: x.to(torch.float16), lambda p, like: p.view(torch.float16)),
                   lambda x: cast(x, "fp16")),
          "nonzeros": ((_nonzeros, _fill), lambda x: _fill(_nonzeros(x).view(torch.uint8), x))}
q16 = CODECS["fp16"][1]


def run(comm, found, what, method, form, make, spec, backend):
    """`method` in `form` on `backend` with ``compress=spec``; `make(seed)` gives (args, check);
    a persistent request starts twice, new data written into its buffers. Returns the args."""
    label = f"{what} [{backend} {form}]"
    args, check = make(0)
    with found.check(label):
        if form == "persistent":
            req = getattr(comm, method + "_init")(*args, backend=backend, compress=spec)
            for seed in (1, 2):
                new_args, check = make(seed)
                refill(args, new_args)
                req.Start()
                req.Wait()
                with found.check(f"{label} start {seed}"):
                    check(args)
            req.Free()
        else:
            call = method if form == "blocking" else nonblocking(method)
            req = getattr(comm, call)(*args, backend=backend, compress=spec)
            assert (req is None) == (form == "blocking"), req
            if req is not None:
                req.Wait()
            check(args)
    return args


def fixed(args):
    return lambda seed: (args, no_check)


# -- codecs, without MPI ----------------------------------------------------------------
def test_codec_names():
    assert compress.codec("fp16").name == "fp16"
    assert compress.codec("bf16") is compress.codec("bf16")
    c = compress.codec("fp16")
    assert compress.codec(c) is c
    pair = (lambda x: x, lambda p, like: p.view(like.dtype))
    assert compress.codec(pair) is compress.codec(pair)


@pytest.mark.parametrize("spec, exc, fragment", [
    ("fp8", ValueError, "unknown codec 'fp8'"), ("zfp", ValueError, "zfp:rate=R"),
    ("zfp:rate=2", ValueError, "3 <= R <= 64"), ("zfp:rate=abc", ValueError, "'zfp:rate=abc'"),
    ("zfp:rate=nan", ValueError, "3 <= R <= 64"), (3, TypeError, "compress: expected"),
    ((len,), TypeError, "(encode, decode)")])
def test_bad_codecs(spec, exc, fragment):
    with raises(exc, "compress", fragment):
        compress.codec(spec)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_cast_round_trip(name, dtype):
    c, x, out = compress.codec(name), data(0, 101, dtype), torch.empty(101, dtype=dtype)
    payload = compress._encoded(c, x)
    assert payload.dtype == torch.uint8 and payload.numel() == 2 * 101
    c.decode(payload, out)
    assert torch.equal(out, cast(x, name))


def test_fp16_overflow_is_inf():
    c, out = compress.codec("fp16"), torch.empty(2)
    c.decode(compress._encoded(c, torch.tensor([1e5, -7e4])), out)
    assert out.isinf().all()


@pytest.mark.skipif(not HAVE_ZFP, reason="zfpy is not installed")
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("rate", [3, 4.5, 8, 12.3, 16, 32, 64])
def test_zfp_wire_size_and_bound(dtype, rate):
    c = compress.codec(f"zfp:rate={rate}")
    for n in (0, 1, 3, 4, 5, 100, 1001, 4099):
        x, out = data(n, n, dtype), torch.empty(n, dtype=dtype)
        payload = compress._encoded(c, x)        # checks the size against wire_nbytes
        assert payload.numel() == c.wire_nbytes(n, dtype)
        c.decode(payload, out)
        if n and 8 <= rate <= 32:
            assert (out - x).abs().max() <= zfp_bound(rate) * x.abs().max()


def test_zfpy_missing_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "zfpy", None)       # import zfpy fails
    compress._CACHE.clear()
    try:
        with raises(ImportError, "zfpy", 'pip install "mcr[zfp]"'):
            compress.codec("zfp:rate=7")
    finally:
        compress._CACHE.clear()


def test_user_codec_checks_its_results():
    bad = compress.codec((lambda x: x.numpy(), lambda p, like: like))
    with raises(TypeError, "compress", "must return a torch tensor"):
        compress._encoded(bad, torch.zeros(3))
    short = compress.codec((lambda x: x, lambda p, like: p[:1]))
    with raises(TypeError, "compress", "must return a tensor of 3 elements"):
        short.decode(torch.zeros(12, dtype=torch.uint8), torch.zeros(3))


# -- every operation, exact results ---------------------------------------------------
# A maker(comm, variant, gen, q, root) gives (args, check) of its operation; gen(key, n) is the
# data of a rank (or a pair of ranks), q is Q.
def reduction(comm, v, gen, q, root):
    """Allreduce, Reduce, Reduce_scatter(_block) (uneven counts, rank 0's empty); input kept."""
    rank, size, op = comm.rank, comm.size, OPS[v.op]
    counts = {"Reduce_scatter_block": [v.n] * size, "Reduce_scatter":
              [0 if i == 0 and size > 1 else 1 + i % 3 for i in range(size)]}.get(v.method)
    xs = [gen(r, sum(counts) if counts else v.n) for r in range(size)]
    if counts:
        start = sum(counts[:rank])
        want = folded(xs, q, v.op)[start:start + counts[rank]]
    else:
        want = reduced(xs, q, v.op)
    tail = {"Reduce": (op, root), "Reduce_scatter": (counts, op)}.get(v.method, (op,))
    if v.method == "Reduce" and rank != root:
        return (xs[rank], None) + tail, no_check
    if v.in_place:      # the input is the whole receive buffer, the result at its start
        return (mcr.IN_PLACE, xs[rank]) + tail, lambda a: expect(a[1][:len(want)], want)
    return ((xs[rank].clone(), sentinel(len(want), v.dtype)) + tail,
            lambda a: (expect(a[1], want), expect(a[0], xs[rank])))


def gathering(comm, v, gen, q, root):
    """Gather(v), Allgather(v) (v: gaps between blocks): Q of every block, but Gather IN_PLACE's."""
    rank, size, rooted = comm.rank, comm.size, not v.method.startswith("All")
    vector = v.method.endswith("v")
    counts = vcounts(size) if vector else [v.n] * size
    displs, length = layout(counts, "gaps" if vector else "packed")
    blocks = [gen(r, c) for r, c in enumerate(counts)]
    if rooted and rank != root:
        return (blocks[rank], None, root), no_check
    recv = sentinel(length, v.dtype)
    keep = rooted and v.in_place
    want = place(recv, [b if keep and r == rank else q(b) for r, b in enumerate(blocks)], displs)
    if v.in_place:
        recv = place(recv, [blocks[rank]], [displs[rank]])
    send = mcr.IN_PLACE if v.in_place else blocks[rank]
    args = (send, [recv, counts, displs] if vector else recv) + ((root,) if rooted else ())
    return args, lambda a: expect(a[1][0] if vector else a[1], want)


def scattering(comm, v, gen, q, root):
    """Scatter(v): each rank gets Q(its block), the root too, but for IN_PLACE (it stays)."""
    rank, size, vector = comm.rank, comm.size, v.method.endswith("v")
    counts = vcounts(size) if vector else [v.n] * size
    displs, length = layout(counts, "gaps" if vector else "packed")
    blocks = [gen(r, c) for r, c in enumerate(counts)]
    whole = place(sentinel(length, v.dtype), blocks, displs)
    recv, want = sentinel(counts[rank], v.dtype), q(blocks[rank])
    if rank != root:
        return (None, recv, root), lambda a: expect(a[1], want)
    if v.in_place:
        return (whole.clone(), mcr.IN_PLACE, root), lambda a: expect(a[0], whole)
    return ([whole, counts, displs] if vector else whole, recv, root), \
        lambda a: expect(a[1], want)


def bcast(comm, v, gen, q, root):
    """The root's buffer stays as it is, the others get Q of it."""
    x = gen(root, v.n)
    if comm.rank == root:
        return (x.clone(), root), lambda a: expect(a[0], x)
    return (sentinel(v.n, v.dtype), root), lambda a: expect(a[0], q(x))


def alltoall(comm, v, gen, q, root):
    """Alltoall(v); Alltoallv as the MoE exchange: a count per pair, some empty, gaps between."""
    rank, size, vector = comm.rank, comm.size, v.method.endswith("v")

    def count(src, dst):
        return (src + 2 * dst) % 4 if vector else v.n
    outgoing = [gen(100 * rank + d, count(rank, d)) for d in range(size)]
    incoming = [gen(100 * s + rank, count(s, rank)) for s in range(size)]
    scounts, rcounts = [len(b) for b in outgoing], [len(b) for b in incoming]
    rdispls, rlength = layout(rcounts, "gaps" if vector else "packed")
    want = place(sentinel(rlength, v.dtype), [q(b) for b in incoming], rdispls)
    if not vector:
        send = mcr.IN_PLACE if v.in_place else cat(outgoing)
        recv = cat(outgoing) if v.in_place else sentinel(rlength, v.dtype)
        return (send, recv), lambda a: expect(a[1], want)
    return (([cat(outgoing), scounts, layout(scounts, "packed")[0]],
             [sentinel(rlength, v.dtype), rcounts, rdispls]), lambda a: expect(a[1][0], want))


MAKERS = {"Allreduce": reduction, "Reduce": reduction, "Reduce_scatter_block": reduction,
          "Reduce_scatter": reduction, "Gather": gathering, "Gatherv": gathering,
          "Allgather": gathering, "Allgatherv": gathering, "Scatter": scattering,
          "Scatterv": scattering, "Bcast": bcast, "Alltoall": alltoall, "Alltoallv": alltoall}
# n: elements per block (the vector operations have their own counts); root
# -1: the last rank
V = collections.namedtuple("V", "method codec dtype n op root in_place",
                           defaults=(None, None, -1, False))
VARIANTS = [
    V("Allreduce", "fp16", F32, 37, "SUM"), V("Allreduce", "bf16", F64, 5, "SUM"),
    V("Allreduce", "fp16", F64, 1000, "MAX"), V("Allreduce", "bf16", F32, 2, "MIN"),
    V("Allreduce", "fp16", F32, 9, "SUM", in_place=True),
    V("Reduce", "fp16", F32, 37, "SUM"), V("Reduce", "bf16", F64, 37, "MAX"),
    V("Reduce", "bf16", F32, 11, "SUM", in_place=True),
    V("Reduce_scatter_block", "fp16", F32, 4, "SUM"),
    V("Reduce_scatter_block", "bf16", F64, 4, "MAX"),
    V("Reduce_scatter_block", "fp16", F32, 3, "SUM", in_place=True),
    V("Reduce_scatter", "fp16", F32, op="SUM"), V("Reduce_scatter", "bf16", F64, op="MAX"),
    V("Gather", "fp16", F32, 6), V("Gather", "bf16", F64, 6),
    V("Gather", "fp16", F32, 4, in_place=True),
    V("Gatherv", "fp16", F32), V("Gatherv", "bf16", F64),
    V("Scatter", "fp16", F32, 5), V("Scatter", "bf16", F64, 5),
    V("Scatter", "fp16", F32, 4, in_place=True),
    V("Scatterv", "fp16", F32), V("Scatterv", "bf16", F64),
    V("Allgather", "bf16", F64, 4), V("Allgather", "fp16", F32, 3, in_place=True),
    V("Allgatherv", "fp16", F32), V("Bcast", "fp16", F32, 50),
    V("Alltoall", "fp16", F32, 3), V("Alltoall", "bf16", F32, 2, in_place=True),
    V("Alltoallv", "bf16", F64),
    # user codecs (a zero in each rank's data: "nonzeros" sends a size of its own)
    V("Allgather", "nonzeros", F32, 8), V("Bcast", "nonzeros", F32, 8, root=0),
    V("Gather", "nonzeros", F32, 8, root=0), V("Scatter", "nonzeros", F32, 8, root=0),
    V("Allreduce", "half", F32, 8, "SUM"), V("Reduce", "half", F32, 8, "SUM", 0),
    V("Reduce_scatter_block", "half", F32, 8, "SUM"),
]


def variant_maker(comm, v):
    """make(seed) of variant `v`."""
    def make(seed):
        def gen(key, n):
            x = data(key, n, v.dtype, seed)
            if v.codec not in CASTS and n > 2:
                x[2 + key % (n - 2)] = 0
            return x
        return MAKERS[v.method](comm, v, gen, CODECS[v.codec][1], v.root % comm.size)
    return make


@case.matrix(backend=BACKENDS + ("tiny",), form=compress.FORMS)
def every_operation_exact(comm, backend, form):
    # compression takes any registered backend: the entry-point plug-in "tiny" runs a few
    found = Findings()
    for v in VARIANTS:
        if backend == "tiny" and (v.codec, v.method) not in (
                ("fp16", "Allreduce"), ("fp16", "Allgather"), ("fp16", "Bcast")):
            continue
        what = (f"{v.method} {v.codec} on {v.dtype} n={v.n} op={v.op} root={v.root}"
                f"{' IN_PLACE' * v.in_place}")
        run(comm, found, what, v.method, form, variant_maker(comm, v), CODECS[v.codec][0],
            backend)
    found.report()


@case
def zfp_within_bound(comm):
    if not HAVE_ZFP:
        return
    import zfpy
    size, rank, rate, n, found = comm.size, comm.rank, 12, 1003, Findings()
    spec, bound = f"zfp:rate={rate}", zfp_bound(rate)
    for backend, form in itertools.product(BACKENDS, ("blocking", "persistent")):
        for dtype in (F32, F64):
            inputs = [data(r, n, dtype) for r in range(size)]
            exact = sum(v.double() for v in inputs)
            scale = sum(v.abs().max().item() for v in inputs) + exact.abs().max().item()
            _, y, _ = run(comm, found, f"zfp Allreduce on {dtype}", "Allreduce", form,
                          fixed((inputs[rank], torch.zeros(n, dtype=dtype), mcr.SUM)), spec,
                          backend)
            err = (y.double() - exact).abs().max().item()
            assert err <= 1.01 * bound * scale, (backend, form, dtype, err, bound * scale)
            everyone = torch.zeros(n * size, dtype=dtype)          # the same bits everywhere
            comm.Allgather(y, everyone)
            assert all(torch.equal(everyone[i * n:(i + 1) * n], y) for i in range(size))
        # Allgather: each block is zfp's own rounding of it
        args = (data(rank, 77, F64), torch.zeros(77 * size, dtype=F64))
        run(comm, found, "zfp Allgather", "Allgather", form, fixed(args), spec, backend)
        expected = torch.cat([torch.from_numpy(zfpy.decompress_numpy(zfpy.compress_numpy(
            data(r, 77, F64).numpy(), rate=rate))) for r in range(size)])
        assert torch.equal(args[1], expected), (backend, form)
    found.report()


@case.matrix(backend=BACKENDS)
def stages_posted_in_order(comm, backend):
    """Multi-stage operations in flight, completed in another order on each rank: the private
    communicators see their stages in posting order everywhere."""
    size, rank = comm.size, comm.rank
    ys, reqs = [], []
    for i in range(4):
        spec = "fp16" if i % 2 else CODECS["half"][0]       # 2 and 4 stages
        ys.append(torch.zeros(10 + i))
        reqs.append(comm.Iallreduce(data(rank, 10 + i, seed=i), ys[i], mcr.SUM, backend=backend,
                                    compress=spec))
    for i in range(4) if rank % 2 else reversed(range(4)):
        reqs[i].Wait()
    for i, y in enumerate(ys):
        assert torch.equal(y, reduced([data(r, 10 + i, seed=i) for r in range(size)], q16)), i
    # Test too
    req = comm.Iallreduce(data(rank, 6), y := torch.zeros(6), mcr.MAX, backend=backend,
                          compress="bf16")
    while not req.Test():
        pass
    assert torch.equal(y, reduced([data(r, 6) for r in range(size)], CODECS["bf16"][1], "MAX"))


@case.matrix(backend=BACKENDS)
def bytes_on_the_wire(comm, backend):
    # the logger records them, one record per call (per start), the private
    # communicators' own traffic not
    size, rank, found = comm.size, comm.rank, Findings()
    with logging_on() as log:
        run(comm, found, "", "Allgather", "blocking",
            fixed((data(rank, 10), torch.zeros(10 * size))), "fp16", backend)
        run(comm, found, "", "Allreduce", "persistent",
            fixed((data(rank, 8 * size), torch.zeros(8 * size), mcr.SUM)), "bf16", backend)
        run(comm, found, "", "Bcast", "nonblocking", fixed((torch.zeros(5), 0)), "fp16", backend)
    records = log.records
    assert [(r["op"], r["form"], r["backend"]) for r in records] == \
        [("Allgather", "blocking", backend)] + [("Allreduce", "persistent", backend)] * 2 \
        + [("Bcast", "nonblocking", backend)], records
    allgather, start1, start2, bcast = records
    assert allgather["bytes"] == 40 * size and allgather["wire_bytes"] == 20 * (size - 1)
    # each start: 7 of 8 chunks of 8 values out, then the reduced chunk to 7 ranks
    for start in (start1, start2):
        assert (start["bytes"], start["wire_bytes"]) == (32 * size, 2 * 2 * 8 * (size - 1)), start
    assert (bcast["bytes"], bcast["wire_bytes"]) == (20, 10 * (size - 1) if rank == 0 else 0)
    found.report()


@case.matrix(backend=BACKENDS)
def bad_input_before_communicating(comm, backend):
    x, y, kw = torch.ones(4), torch.zeros(4), {"backend": backend, "compress": "fp16"}
    with raises(ValueError, "compress", "supports op SUM, MAX, MIN", "PROD"):
        comm.Allreduce(x, y, mcr.PROD, **kw)
    with raises(TypeError, "compress", "float32 and float64", "int32"):
        comm.Allreduce(x.int(), y.int(), **kw)
    with raises(TypeError, "compress", "buf", "float16"):
        comm.Bcast(x.half(), 0, **kw)
    with raises(ValueError, "compress", "unknown codec"):
        comm.Allgather(x, torch.zeros(4 * comm.size), backend=backend, compress="fp12")
    with raises(ValueError, "compress", "Reduce_scatter_block supports op", "PROD"):
        comm.Reduce_scatter_block(torch.ones(4 * comm.size), y, mcr.PROD, **kw)
    with raises(TypeError, "compress"):       # (no compress argument)
        comm.Scan(x, y, mcr.SUM, **kw)
    # the core's own validation, as for an uncompressed call
    with raises(ValueError, "counts must match"):
        comm.Allreduce(x, torch.zeros(3), **kw)
    assert_comm_works(comm)


@case
def communicator_default(comm):
    # comm.compress: what it serves is compressed, the rest runs as it is;
    # compress=False turns it off for one call; Dup inherits it
    size, rank = comm.size, comm.rank
    dup = comm.Dup()
    with raises(ValueError, "compress", "unknown codec"):
        dup.compress = "fp12"
    assert dup.compress is None
    dup.compress = "fp16"
    assert dup.compress == "fp16"
    xs, y = [data(r, 7) / 3 for r in range(size)], torch.zeros(7)
    dup.Allreduce(xs[rank], y)
    assert torch.equal(y, reduced(xs, q16))
    ints = [(torch.arange(7) % 3 + r + 1).float() for r in range(size)]   # exact sums
    dup.Allreduce(ints[rank], y, compress=False)
    assert torch.equal(y, sum(ints))
    z = torch.zeros(7, dtype=torch.int64)
    dup.Allreduce(torch.arange(7) * (rank + 1), z)             # int64: not compressed
    assert torch.equal(z, torch.arange(7) * sum(range(1, size + 1)))
    p = torch.zeros(7)
    dup.Allreduce(ints[rank], p, mcr.PROD)                     # PROD: not compressed
    assert torch.equal(p, torch.stack(ints).prod(0))
    child = dup.Dup()
    assert child.compress == "fp16"
    child.Free()
    dup.compress = None
    dup.Allreduce(ints[rank] + 1024.25, y)                      # not float16 values
    assert torch.equal(y, sum(ints) + 1024.25 * size)
    dup.Free()


@case
def private_comms_freed_with_comm(comm):
    dup, found = comm.Dup(), Findings()
    for backend in BACKENDS:
        _, y, _ = run(dup, found, "", "Allreduce", "nonblocking",
                      fixed((torch.ones(3), torch.zeros(3), mcr.SUM)), "fp16", backend)
        assert torch.equal(y, torch.full((3,), float(comm.size)))
    privates = [c for b in BACKENDS for c in compress.private_comms(dup, b).comms]
    assert len(privates) == 4
    dup.Free()
    assert all(c == MPI.COMM_NULL for c in privates)
    found.report()
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)


def test_benchmark_tiny():
    """``python -m mcr.bench.compression``, tiny: a row per operation, size, codec; none exact."""
    from mcr.bench import compression
    code, out = run_script(2, ["-m", "mcr.bench.compression", "--sizes", "4K,16K",
                               "--codecs", "fp16,bf16", "--ops", "Allreduce,Alltoall",
                               "--rounds", "1", "--iters", "2"], timeout=120)
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()
            if line.startswith(("Allreduce", "Alltoall"))]
    assert len(rows) == 2 * 2 * 3, out
    for op, size, spec, wire, t, speed, err in rows:
        assert float(t) > 0
        if spec == "none":
            assert float(err) == 0
        else:
            assert 0 < float(err) < 1, (op, size, spec, err)
    assert compression._sizes("64K..1M") == [65536, 262144, 1048576]
