"""Compressed collectives (mcr.compress): codecs on their own, then every
operation in every form on real MPI processes, on MPI and Gloo.

Expected values are computed here with torch (and zfpy) on the whole data:
fp16/bf16 results are exact (each input cast, reduced in rank order in the
buffer's type, cast again), zfp results within the bound the docs state.
The messages are parsed by the core (``run`` with ``msg=None`` parses its
arguments on a private communicator through the core's own parser).
"""

import importlib.util
import sys

import pytest
import torch
from mpi4py import MPI

import mcr
from mcr import compress
from mpiharness import case, mpi_cases, run_script
from util import assert_comm_works, raises

BACKENDS = ("mpi", "gloo")
FORMS = compress.FORMS
HAVE_ZFP = importlib.util.find_spec("zfpy") is not None
CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}


def data(rank, n, dtype=torch.float32, seed=0):
    """Rank `rank`'s values: normal, of varied scale, not representable in fp16."""
    g = torch.Generator().manual_seed(7919 * seed + rank)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)


def cast(x, name):
    """Q(x) of a cast codec, computed independently."""
    return x.to(CASTS[name]).to(x.dtype)


def folded(values, name, op="SUM"):
    """fold(Q(x_0), ..., Q(x_{n-1})) in rank order, in the values' own type."""
    acc = cast(values[0], name)
    for v in values[1:]:
        q = cast(v, name)
        acc = acc + q if op == "SUM" else torch.maximum(acc, q) if op == "MAX" \
            else torch.minimum(acc, q)
    return acc


def reduced(values, name, op="SUM"):
    """Q(fold(Q(x_0), ..., Q(x_{n-1}))) in rank order, as documented."""
    return cast(folded(values, name, op), name)


def zfp_bound(rate):
    return 2.0 ** (7 - rate)


def start_wait(req, form, before=None):
    """Complete what `run` returned for `form` (a persistent request twice,
    calling `before()` before each start)."""
    if form == "blocking":
        assert req is None
    elif form == "nonblocking":
        req.Wait()
    else:
        for _ in range(2):
            if before is not None:
                before()
            req.Start()
            req.Wait()
        req.Free()


def method(op, form):
    if form == "nonblocking":
        return "I" + op[0].lower() + op[1:]
    return op + "_init" if form == "persistent" else op


def run(comm, op, form, args, spec, backend, before=None):
    """`op` in `form` through the communicator's method with ``compress=spec``."""
    req = getattr(comm, method(op, form))(*args, backend=backend, compress=spec)
    start_wait(req, form, before)


# -- codecs, without MPI ----------------------------------------------------------------


def test_codec_names():
    assert compress.codec("fp16").name == "fp16"
    assert compress.codec("bf16") is compress.codec("bf16")
    c = compress.codec("fp16")
    assert compress.codec(c) is c
    pair = (lambda x: x, lambda p, like: p.view(like.dtype))
    assert compress.codec(pair) is compress.codec(pair)


@pytest.mark.parametrize("spec, exc, fragment", [
    ("fp8", ValueError, "unknown codec 'fp8'"),
    ("zfp", ValueError, "zfp:rate=R"),
    ("zfp:rate=2", ValueError, "3 <= R <= 64"),
    ("zfp:rate=abc", ValueError, "'zfp:rate=abc'"),
    ("zfp:rate=nan", ValueError, "3 <= R <= 64"),
    (3, TypeError, "compress: expected"),
    ((len,), TypeError, "(encode, decode)"),
])
def test_bad_codecs(spec, exc, fragment):
    with raises(exc, "compress", fragment):
        compress.codec(spec)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cast_round_trip(name, dtype):
    c = compress.codec(name)
    x = data(0, 101, dtype)
    payload = compress._encoded(c, x)
    assert payload.dtype == torch.uint8 and payload.numel() == 2 * 101
    out = torch.empty_like(x)
    c.decode(payload, out)
    assert torch.equal(out, cast(x, name))


def test_fp16_overflow_is_inf():
    c = compress.codec("fp16")
    out = torch.empty(2)
    c.decode(compress._encoded(c, torch.tensor([1e5, -7e4])), out)
    assert out.isinf().all()


@pytest.mark.skipif(not HAVE_ZFP, reason="zfpy is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rate", [3, 4.5, 8, 12.3, 16, 32, 64])
def test_zfp_wire_size_and_bound(dtype, rate):
    c = compress.codec(f"zfp:rate={rate}")
    for n in (0, 1, 3, 4, 5, 100, 1001, 4099):
        x = data(n, n, dtype)
        payload = compress._encoded(c, x)        # checks the size against wire_nbytes
        assert payload.numel() == c.wire_nbytes(n, dtype)
        out = torch.empty_like(x)
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


# -- operations on MPI and Gloo -------------------------------------------------------


@case
def allreduce_cast_exact(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        for form in FORMS:
            for name, dtype, n, op in (("fp16", torch.float32, 37, "SUM"),
                                       ("bf16", torch.float64, 5, "SUM"),
                                       ("fp16", torch.float64, 1000, "MAX"),
                                       ("bf16", torch.float32, 2, "MIN")):
                x = data(rank, n, dtype)
                y = torch.full((n,), -1.0, dtype=dtype)
                run(comm, "Allreduce", form, (x, y, getattr(mcr, op)), name, backend)
                expected = reduced([data(r, n, dtype) for r in range(size)], name, op)
                assert torch.equal(y, expected), (backend, form, name, op, y, expected)
                assert torch.equal(x, data(rank, n, dtype))            # sendbuf untouched
            # in place
            z = data(rank, 9)
            run(comm, "Allreduce", form, (mcr.IN_PLACE, z, mcr.SUM), "fp16", backend,
                before=lambda: z.copy_(data(rank, 9)))
            assert torch.equal(z, reduced([data(r, 9) for r in range(size)], "fp16"))


@case
def reduce_and_reduce_scatter_cast_exact(comm):
    # Reduce: the root gets Allreduce's bits; Reduce_scatter(_block): each
    # rank's block is fold(Q(x_0), ..., Q(x_{n-1})), rounded once
    size, rank = comm.size, comm.rank
    root = size - 1
    counts = [(0 if i == 0 and size > 1 else 1 + i % 3) for i in range(size)]
    start = sum(counts[:rank])
    for backend in BACKENDS:
        for form in FORMS:
            for name, dtype, op in (("fp16", torch.float32, "SUM"),
                                    ("bf16", torch.float64, "MAX")):
                where = (backend, form, name, op)
                xs = [data(r, 37, dtype) for r in range(size)]
                y = torch.full((37,), -1.0, dtype=dtype) if rank == root else None
                run(comm, "Reduce", form, (xs[rank], y, getattr(mcr, op), root), name, backend)
                if rank == root:
                    assert torch.equal(y, reduced(xs, name, op)), where
                xs = [data(r, 4 * size, dtype, seed=1) for r in range(size)]
                y = torch.full((4,), -1.0, dtype=dtype)
                run(comm, "Reduce_scatter_block", form, (xs[rank], y, getattr(mcr, op)), name,
                    backend)
                assert torch.equal(y, folded(xs, name, op)[4 * rank:4 * rank + 4]), where
                assert torch.equal(xs[rank], data(rank, 4 * size, dtype, seed=1))
                xs = [data(r, sum(counts), dtype, seed=2) for r in range(size)]
                y = torch.full((counts[rank],), -1.0, dtype=dtype)
                run(comm, "Reduce_scatter", form, (xs[rank], y, counts, getattr(mcr, op)),
                    name, backend)
                assert torch.equal(y, folded(xs, name, op)[start:start + counts[rank]]), where
            # in place: the input is the whole receive buffer, the result its first block
            z = data(rank, 3 * size)
            run(comm, "Reduce_scatter_block", form, (mcr.IN_PLACE, z, mcr.SUM), "fp16",
                backend, before=lambda: z.copy_(data(rank, 3 * size)))
            want = folded([data(r, 3 * size) for r in range(size)], "fp16")
            assert torch.equal(z[:3], want[3 * rank:3 * rank + 3]), (backend, form)
            w = data(rank, 11)
            run(comm, "Reduce", form, (mcr.IN_PLACE if rank == root else w,
                                       w if rank == root else None, mcr.SUM, root),
                "bf16", backend, before=lambda: w.copy_(data(rank, 11)))
            if rank == root:
                assert torch.equal(w, reduced([data(r, 11) for r in range(size)], "bf16"))


@case
def gather_and_scatter_cast_exact(comm):
    # Gather(v): the root gets Q(block) of every rank, its own too;
    # Scatter(v): each rank gets Q(its block), the root too; in place, the
    # root's own block stays as it is
    size, rank = comm.size, comm.rank
    root = size - 1
    here = rank == root
    counts = [1 + (2 * i) % 5 for i in range(size)]
    displs = [sum(counts[:i]) + i for i in range(size)]        # a gap after each block
    total = displs[-1] + counts[-1] + 1
    for backend in BACKENDS:
        for form in FORMS:
            for name, dtype in (("fp16", torch.float32), ("bf16", torch.float64)):
                where = (backend, form, name)
                xs = [data(r, 6, dtype) for r in range(size)]
                out = torch.full((6 * size,), -1.0, dtype=dtype) if here else None
                run(comm, "Gather", form, (xs[rank], out, root), name, backend)
                if here:
                    assert torch.equal(out, torch.cat([cast(v, name) for v in xs])), where
                vs = [data(r, counts[r], dtype, seed=3) for r in range(size)]
                out = torch.full((total,), -1.0, dtype=dtype) if here else None
                run(comm, "Gatherv", form, (vs[rank], [out, counts, displs] if here else None,
                                            root), name, backend)
                if here:
                    want = torch.full((total,), -1.0, dtype=dtype)
                    for r in range(size):
                        want[displs[r]:displs[r] + counts[r]] = cast(vs[r], name)
                    assert torch.equal(out, want), where
                whole = data(root, 5 * size, dtype, seed=4)
                y = torch.full((5,), -1.0, dtype=dtype)
                run(comm, "Scatter", form, (whole if here else None, y, root), name, backend)
                assert torch.equal(y, cast(whole[5 * rank:5 * rank + 5], name)), where
                whole = data(root, total, dtype, seed=5)
                y = torch.full((counts[rank],), -1.0, dtype=dtype)
                run(comm, "Scatterv", form, ([whole, counts, displs] if here else None, y, root),
                    name, backend)
                mine = whole[displs[rank]:displs[rank] + counts[rank]]
                assert torch.equal(y, cast(mine, name)), where
            buf = torch.full((4 * size,), -1.0)
            buf[4 * root:4 * root + 4] = data(root, 4)
            run(comm, "Gather", form, (mcr.IN_PLACE if here else data(rank, 4),
                                       buf if here else None, root), "fp16", backend)
            if here:
                want = torch.cat([data(r, 4) if r == root else cast(data(r, 4), "fp16")
                                  for r in range(size)])
                assert torch.equal(buf, want), (backend, form)
            whole = data(root, 4 * size, seed=6)
            mine = whole[4 * rank:4 * rank + 4].clone() if here else torch.zeros(4)
            run(comm, "Scatter", form, (whole if here else None, mcr.IN_PLACE if here else mine,
                                        root), "fp16", backend)
            want = whole[4 * rank:4 * rank + 4] if here else cast(whole[4 * rank:4 * rank + 4],
                                                                   "fp16")
            assert torch.equal(mine, want), (backend, form)


@case
def allgather_cast_exact(comm):
    size, rank = comm.size, comm.rank
    counts = [r % 3 + 1 for r in range(size)]
    displs = [sum(counts[:r]) + r for r in range(size)]            # gaps between blocks
    for backend in BACKENDS:
        for form in FORMS:
            x = data(rank, 4, torch.float64)
            out = torch.zeros(4 * size, dtype=torch.float64)
            run(comm, "Allgather", form, (x, out), "bf16", backend)
            expected = torch.cat([cast(data(r, 4, torch.float64), "bf16") for r in range(size)])
            assert torch.equal(out, expected), (backend, form)

            mine = data(rank, counts[rank])
            out = torch.full((displs[-1] + counts[-1] + 1,), 5.0)
            run(comm, "Allgatherv", form, (mine, [out, counts, displs]), "fp16", backend)
            expected = torch.full_like(out, 5.0)
            for r in range(size):
                expected[displs[r]:displs[r] + counts[r]] = cast(data(r, counts[r]), "fp16")
            assert torch.equal(out, expected), (backend, form, out, expected)

            out = torch.zeros(3 * size)
            out[3 * rank:3 * rank + 3] = data(rank, 3)
            run(comm, "Allgather", form, (mcr.IN_PLACE, out), "fp16", backend,
                before=lambda: out[3 * rank:3 * rank + 3].copy_(data(rank, 3)))
            assert torch.equal(out, torch.cat([cast(data(r, 3), "fp16") for r in range(size)]))


@case
def bcast_cast_exact(comm):
    size, rank = comm.size, comm.rank
    root = size - 1
    for backend in BACKENDS:
        for form in FORMS:
            buf = data(root, 50) if rank == root else torch.zeros(50)
            run(comm, "Bcast", form, (buf, root), "fp16", backend, before=buf.zero_
                if rank != root else None)
            expected = data(root, 50) if rank == root else cast(data(root, 50), "fp16")
            assert torch.equal(buf, expected), (backend, form)


def a2a_block(src, dst, n, dtype=torch.float32):
    return data(100 * src + dst, n, dtype)


@case
def alltoall_cast_exact(comm):
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        for form in FORMS:
            x = torch.cat([a2a_block(rank, d, 3) for d in range(size)])
            out = torch.zeros(3 * size)
            run(comm, "Alltoall", form, (x, out), "fp16", backend)
            expected = torch.cat([cast(a2a_block(s, rank, 3), "fp16") for s in range(size)])
            assert torch.equal(out, expected), (backend, form)

            # the MoE exchange: a different count for each pair, some empty
            def count(s, d):
                return (s + 2 * d) % 4
            scounts = [count(rank, d) for d in range(size)]
            rcounts = [count(s, rank) for s in range(size)]
            sdispls = [sum(scounts[:d]) for d in range(size)]
            rdispls = [sum(rcounts[:s]) + 1 for s in range(size)]
            x = torch.cat([a2a_block(rank, d, scounts[d], torch.float64) for d in range(size)])
            out = torch.zeros(sum(rcounts) + 1, dtype=torch.float64)
            run(comm, "Alltoallv", form, ([x, scounts, sdispls], [out, rcounts, rdispls]),
                "bf16", backend)
            expected = torch.zeros_like(out)
            for s in range(size):
                expected[rdispls[s]:rdispls[s] + rcounts[s]] = \
                    cast(a2a_block(s, rank, rcounts[s], torch.float64), "bf16")
            assert torch.equal(out, expected), (backend, form, out, expected)

            def fill(out):
                return out.copy_(torch.cat([a2a_block(rank, d, 2) for d in range(size)]))
            out = fill(torch.zeros(2 * size))
            run(comm, "Alltoall", form, (mcr.IN_PLACE, out), "bf16", backend,
                before=lambda: fill(out))
            assert torch.equal(out, torch.cat([cast(a2a_block(s, rank, 2), "bf16")
                                               for s in range(size)]))


@case
def zfp_within_bound(comm):
    if not HAVE_ZFP:
        return
    import zfpy
    size, rank = comm.size, comm.rank
    rate = 12
    bound = zfp_bound(rate)
    for backend in BACKENDS:
        for form in ("blocking", "persistent"):
            for dtype in (torch.float32, torch.float64):
                n = 1003
                x = data(rank, n, dtype)
                y = torch.zeros(n, dtype=dtype)
                run(comm, "Allreduce", form, (x, y, mcr.SUM), f"zfp:rate={rate}", backend)
                inputs = [data(r, n, dtype) for r in range(size)]
                exact = sum(v.double() for v in inputs)
                scale = sum(v.abs().max().item() for v in inputs) + exact.abs().max().item()
                err = (y.double() - exact).abs().max().item()
                assert err <= 1.01 * bound * scale, (backend, form, dtype, err, bound * scale)
                # every rank holds the same bits
                everyone = torch.zeros(n * size, dtype=dtype)
                comm.Allgather(y, everyone)
                assert all(torch.equal(everyone[i * n:(i + 1) * n], y) for i in range(size))

            # Allgather: each block is zfp's own rounding of it
            x = data(rank, 77, torch.float64)
            out = torch.zeros(77 * size, dtype=torch.float64)
            run(comm, "Allgather", form, (x, out), f"zfp:rate={rate}", backend)
            expected = torch.cat([torch.from_numpy(zfpy.decompress_numpy(zfpy.compress_numpy(
                data(r, 77, torch.float64).numpy(), rate=rate))) for r in range(size)])
            assert torch.equal(out, expected), (backend, form)


def _half(x):
    return x.to(torch.float16)


def _unhalf(payload, like):
    return payload.view(torch.float16)


def _nonzeros(x):
    """A codec whose size depends on the values: fp16 of the first k values,
    k being the count of leading nonzeros."""
    k = int((x != 0).cumprod(0).sum()) if x.numel() else 0
    return x[:k].to(torch.float16)


def _fill(payload, like):
    out = torch.zeros_like(like)
    head = payload.view(torch.float16)
    out[:head.numel()] = head.to(like.dtype)
    return out


@case
def user_codec_sizes_exchanged(comm):
    size, rank = comm.size, comm.rank
    pair = (_nonzeros, _fill)

    def truncated(x):
        return _fill(_nonzeros(x).view(torch.uint8), x)

    for backend in BACKENDS:
        for form in FORMS:
            x = data(rank, 8)
            x[rank + 2:rank + 3] = 0               # a different payload size on each rank
            out = torch.zeros(8 * size)
            run(comm, "Allgather", form, (x, out), pair, backend)
            xs = [data(r, 8) for r in range(size)]
            for r, v in enumerate(xs):
                v[r + 2:r + 3] = 0
            assert torch.equal(out, torch.cat([truncated(v) for v in xs])), (backend, form)

            y = torch.zeros(8)
            run(comm, "Allreduce", form, (x, y, mcr.SUM), (_half, _unhalf), backend)
            assert torch.equal(y, reduced(xs, "fp16"))

            buf = x.clone()
            run(comm, "Bcast", form, (buf, 0), pair, backend)
            assert torch.equal(buf, x if rank == 0 else truncated(xs[0]))

            out = torch.zeros(8 * size) if rank == 0 else None
            run(comm, "Gather", form, (x, out, 0), pair, backend)
            if rank == 0:
                assert torch.equal(out, torch.cat([truncated(v) for v in xs]))
            y = torch.zeros(8)
            run(comm, "Scatter", form, (torch.cat(xs) if rank == 0 else None, y, 0), pair,
                backend)
            assert torch.equal(y, truncated(xs[rank]))

            y = torch.zeros(8) if rank == 0 else None
            run(comm, "Reduce", form, (x, y, mcr.SUM, 0), (_half, _unhalf), backend)
            if rank == 0:
                assert torch.equal(y, reduced(xs, "fp16"))
            xs8 = [torch.cat([v] * size) for v in xs]
            y = torch.zeros(8)
            run(comm, "Reduce_scatter_block", form, (xs8[rank], y, mcr.SUM), (_half, _unhalf),
                backend)
            assert torch.equal(y, folded(xs8, "fp16")[8 * rank:8 * rank + 8])


@case
def stages_posted_in_order(comm):
    """Several multi-stage operations in flight, completed in another order
    on each rank: the private communicators see their stages in posting
    order everywhere."""
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        xs, ys, reqs = [], [], []
        for i in range(4):
            spec = "fp16" if i % 2 else (_half, _unhalf)       # 2 and 4 stages
            x = data(rank, 10 + i, seed=i)
            y = torch.zeros(10 + i)
            reqs.append(comm.Iallreduce(x, y, mcr.SUM, backend=backend, compress=spec))
            xs.append(x)
            ys.append(y)
        order = list(range(4)) if rank % 2 else list(reversed(range(4)))
        for i in order:
            reqs[i].Wait()
        for i in range(4):
            assert torch.equal(ys[i], reduced([data(r, 10 + i, seed=i) for r in range(size)],
                                              "fp16")), (backend, i)
        # Waitall and Test across them
        y = torch.zeros(6)
        r1 = comm.Iallreduce(data(rank, 6), y, mcr.MAX, backend=backend, compress="bf16")
        while not r1.Test():
            pass
        assert torch.equal(y, reduced([data(r, 6) for r in range(size)], "bf16", "MAX"))


@case
def bytes_on_the_wire(comm):
    # the logger records them, one record per call (per start), the private
    # communicators' own traffic not
    size, rank = comm.size, comm.rank
    for backend in BACKENDS:
        mcr.log.reset()
        mcr.log.start(records=True)
        run(comm, "Allgather", "blocking", (data(rank, 10), torch.zeros(10 * size)), "fp16",
            backend)
        run(comm, "Allreduce", "persistent", (data(rank, 8 * size), torch.zeros(8 * size),
                                              mcr.SUM), "bf16", backend)
        buf = torch.zeros(5)
        run(comm, "Bcast", "nonblocking", (buf, 0), "fp16", backend)
        records = mcr.log.records()
        mcr.log.stop()
        mcr.log.reset()
        assert [(r["op"], r["form"], r["backend"]) for r in records] == \
            [("Allgather", "blocking", backend)] + [("Allreduce", "persistent", backend)] * 2 \
            + [("Bcast", "nonblocking", backend)], records
        allgather, start1, start2, bcast = records
        assert allgather["bytes"] == 40 * size and allgather["wire_bytes"] == 20 * (size - 1)
        # each start: 7 of 8 chunks of 8 values out, then the reduced chunk to 7 ranks
        for start in (start1, start2):
            assert start["bytes"] == 32 * size
            assert start["wire_bytes"] == 2 * 2 * 8 * (size - 1), start
        assert bcast["bytes"] == 20 and bcast["wire_bytes"] == (10 * (size - 1) if rank == 0
                                                                 else 0)


@case
def bad_input_before_communicating(comm):
    x, y = torch.ones(4), torch.zeros(4)
    for backend in BACKENDS:
        with raises(ValueError, "compress", "supports op SUM, MAX, MIN", "PROD"):
            comm.Allreduce(x, y, mcr.PROD, backend=backend, compress="fp16")
        with raises(TypeError, "compress", "float32 and float64", "int32"):
            comm.Allreduce(x.int(), y.int(), backend=backend, compress="fp16")
        with raises(TypeError, "compress", "buf", "float16"):
            comm.Bcast(x.half(), 0, backend=backend, compress="fp16")
        with raises(ValueError, "compress", "unknown codec"):
            comm.Allgather(x, torch.zeros(4 * comm.size), backend=backend, compress="fp12")
        with raises(ValueError, "compress", "Reduce_scatter_block supports op", "PROD"):
            comm.Reduce_scatter_block(torch.ones(4 * comm.size), y, mcr.PROD, backend=backend,
                                      compress="fp16")
        with raises(TypeError, "compress"):       # (no compress argument)
            comm.Scan(x, y, mcr.SUM, backend=backend, compress="fp16")
        # the core's own validation, as for an uncompressed call
        with raises(ValueError, "counts must match"):
            comm.Allreduce(x, torch.zeros(3), backend=backend, compress="fp16")
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
    xs = [data(r, 7) / 3 for r in range(size)]
    y = torch.zeros(7)
    dup.Allreduce(xs[rank], y)
    assert torch.equal(y, reduced(xs, "fp16"))
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
    dup = comm.Dup()
    for backend in BACKENDS:
        y = torch.zeros(3)
        run(dup, "Allreduce", "nonblocking", (torch.ones(3), y, mcr.SUM), "fp16", backend)
        assert torch.equal(y, torch.full((3,), float(comm.size)))
    privates = [c for g in (compress.private_comms(dup, b) for b in BACKENDS)
                for c in g.comms]
    assert len(privates) == 4
    dup.Free()
    assert all(c == MPI.COMM_NULL for c in privates)
    assert_comm_works(comm)


test_mpi = mpi_cases(__name__)


def test_benchmark_tiny():
    """``python -m mcr.bench.compression`` on a tiny range: one row per
    operation, size and codec, the uncompressed row exact."""
    from mcr.bench import compression
    code, out = run_script(2, ["-m", "mcr.bench.compression", "--sizes", "4K,16K",
                               "--codecs", "fp16,bf16", "--ops", "Allreduce,Alltoall",
                               "--rounds", "1", "--iters", "2"], timeout=120)
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith(("Allreduce",
                                                                          "Alltoall"))]
    assert len(rows) == 2 * 2 * 3, out
    for op, size, spec, wire, t, speed, err in rows:
        assert float(t) > 0
        if spec == "none":
            assert float(err) == 0
        else:
            assert 0 < float(err) < 1, (op, size, spec, err)
    assert compression._sizes("64K..1M") == [65536, 262144, 1048576]
