"""backend="auto": tuning tables decide which backend runs each collective.

MPI cases: every rank reads, through ``MCR_TUNING``, a table sending some sizes of some
operations to Gloo; calls run under auto in every form, and counting wrappers on the Gloo
sub-communicator's typed methods show which ran there. Tables that differ across ranks, or
that one rank cannot use, raise on every rank. Plain tests: the table format.
"""

import contextlib
import json
import os
import shutil
import tempfile
from unittest import mock

import pytest
import torch

import mcr
import mcr.hooks
from mcr import backends, tuning
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises

# (op, bytes, MPI's latency, Gloo's) of the table the cases route by: Allreduce
# MPI up to 64 bytes, Gloo above; Bcast Gloo everywhere; Allgather MPI to 16
# bytes, Gloo above; Alltoallv (one backend) Gloo; Reduce_scatter_block MPI;
# Barrier Gloo
ROUTES = [("Allreduce", 16, 1.0, 9.0), ("Allreduce", 64, 2.0, 9.0),
          ("Allreduce", 256, 20.0, 9.0), ("Bcast", 4, 20.0, 9.0), ("Allgather", 16, 1.0, 9.0),
          ("Allgather", 1024, 20.0, 9.0), ("Alltoallv", 16, 20.0, 9.0),
          ("Alltoallv", 4096, 30.0, 19.0), ("Reduce_scatter_block", 64, 1.0, 9.0),
          ("Barrier", 0, 20.0, 9.0)]


def routing_table():
    t = tuning.Table(machine={"host": "test", "world_size": 0})
    for op, nbytes, mpi, gloo in ROUTES:
        t.add(op, "cpu", nbytes, {"mpi": mpi, "gloo": gloo})
    return t


# -- helpers of the MPI cases ----------------------------------------------------------
@contextlib.contextmanager
def shared_dir(comm):
    """A temporary folder, the same on every rank (rank 0 makes and removes it)."""
    path = comm.bcast(tempfile.mkdtemp(prefix="mcr-auto-") if comm.rank == 0 else None)
    try:
        yield path
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(path, ignore_errors=True)


def save_table(comm, path, table=None):
    """Rank 0 saves `table` (the routing table) at `path`, which every rank then sees."""
    if comm.rank == 0:
        (table or routing_table()).save(path)
    comm.Barrier()
    return path


@contextlib.contextmanager
def environ(**values):
    """`values` set in os.environ (None: unset) within the block."""
    with mock.patch.dict(os.environ, {k: v for k, v in values.items() if v is not None}):
        for k in (k for k, v in values.items() if v is None):
            os.environ.pop(k, None)
        yield


@contextlib.contextmanager
def dup(comm):
    """A Dup of `comm` (which reads the tuning table), freed at the end."""
    c = comm.Dup()
    try:
        yield c
    finally:
        c.Free()


@contextlib.contextmanager
def gloo_counter(comm):
    """`take()`: {method: calls} of the Gloo sub-communicator's typed methods since the last
    take (spies: the methods still run), how a case sees that auto chose Gloo."""
    sub = backends.subcomm(comm, "gloo")
    with contextlib.ExitStack() as stack:
        spies = {name: stack.enter_context(mock.patch.object(sub, name, wraps=getattr(sub, name)))
                 for name in ("allreduce", "bcast", "allgather", "alltoallv",
                              "reduce_scatter_block", "barrier", "send", "recv")}

        def take():
            seen = {name: spy.call_count for name, spy in spies.items() if spy.call_count}
            for spy in spies.values():
                spy.reset_mock()
            return seen
        yield take


# -- MPI cases -----------------------------------------------------------------------
@case
def table_sends_chosen_sizes_to_gloo(comm):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    with shared_dir(comm) as folder:
        path = save_table(comm, os.path.join(folder, "table.json"))
        with environ(MCR_TUNING=path), dup(comm) as c, gloo_counter(c) as taken:
            c.backend = "auto"
            # Allreduce: 4 and 16 floats are 16 and 64 bytes (MPI), 17 and 100 floats Gloo
            for n, backend in ((4, "mpi"), (16, "mpi"), (17, "gloo"), (100, "gloo")):
                assert c.choose("Allreduce", 4 * n).backend == backend
                x = torch.arange(n, dtype=torch.float32) + rank
                ys = [torch.zeros(n) for _ in range(3)]
                c.Allreduce(x, ys[0])
                c.Iallreduce(x, ys[1]).Wait()
                persistent = c.Allreduce_init(x, ys[2])
                persistent.Start()
                persistent.Wait()
                persistent.Free()
                want = sum(torch.arange(n, dtype=torch.float32) + r for r in range(size))
                assert all(torch.equal(y, want) for y in ys), (n, ys, want)
                # the persistent form on Gloo posts the non-blocking one at Start
                assert taken() == ({"allreduce": 3} if backend == "gloo" else {}), n
            b = torch.arange(5.0) if rank == 0 else torch.zeros(5)
            c.Bcast(b, 0)                   # Gloo at every size
            assert torch.equal(b, torch.arange(5.0)) and taken() == {"bcast": 1}
            # Allgather by block size: 4 floats (16 B) on MPI, 8 floats on Gloo
            for n, seen in ((4, {}), (8, {"allgather": 1})):
                out = torch.zeros(size * n)
                c.Allgather(torch.full((n,), float(rank)), out)
                assert torch.equal(out, torch.arange(float(size)).repeat_interleave(n))
                assert taken() == seen, n
            # Alltoallv: one backend whatever the size (Gloo here); as many elements
            # go to rank r as come from it, a different count for every pair
            counts = [r + rank + 1 for r in range(size)]
            send = torch.cat([torch.full((k,), 100.0 * rank + r) for r, k in enumerate(counts)])
            recv = torch.zeros(sum(counts))
            c.Alltoallv([send, counts], [recv, counts])
            assert torch.equal(recv, torch.cat([torch.full((k,), 100.0 * r + rank)
                                                for r, k in enumerate(counts)]))
            assert taken() == {"alltoallv": 1}
            assert c.choose("Alltoallv", 1 << 30).backend == "gloo"
            # Reduce_scatter_block: MPI; Barrier: Gloo
            r = torch.zeros(2)
            c.Reduce_scatter_block(torch.ones(size * 2), r)
            assert torch.equal(r, torch.full((2,), float(size))) and taken() == {}
            c.Barrier()
            assert taken() == {"barrier": 1}
            # point-to-point under auto is MPI, whatever the table
            if size > 1:
                got = torch.zeros(3)
                c.Sendrecv(torch.full((3,), float(rank)), right, 5, got, left, 5)
                assert torch.equal(got, torch.full((3,), float(left))) and taken() == {}
            assert c.choose("Send", 10**6).backend == "mpi"
            # an explicit backend still wins over the default auto
            y = torch.zeros(100)
            c.Allreduce(torch.ones(100), y, backend="mpi")
            assert torch.equal(y, torch.full((100,), float(size))) and taken() == {}
            # the hooks see the backend auto chose
            seen = []
            with mcr.hooks.installed(lambda call: seen.append((call.op, call.backend))):
                c.Allreduce(torch.ones(4), torch.zeros(4))
                c.Allreduce(torch.ones(64), torch.zeros(64))
            assert seen == [("Allreduce", "mpi"), ("Allreduce", "gloo")], seen
            assert taken() == {"allreduce": 1}


@case
def choose_explains_and_validates(comm):
    with shared_dir(comm) as folder:
        path = save_table(comm, os.path.join(folder, "table.json"))
        with environ(MCR_TUNING=path), dup(comm) as c:
            got = c.choose("Iallreduce", 100)
            assert (got.op, got.device, got.nbytes, got.backend, got.source) == \
                ("Allreduce", "cpu", 100, "gloo", path)
            assert got.entry.bytes == 256 and got.entry.min_bytes == 65, got.entry
            assert "256 bytes" in got.reason and "gloo 9 us" in got.reason, got.reason
            assert c.choose("Allreduce_init", 0).entry.bytes == 16
            # no entry for an operation or a device: the defaults
            assert c.choose("Scan", 8).backend == "mpi" and c.choose("Scan", 8).entry is None
            assert c.choose("Allreduce", 8, "cuda").backend == tuning.default_backend("cuda")
            for exc, fragments, args in ((ValueError, ("op", "'Allreduse'"), ("Allreduse", 8)),
                                         (TypeError, ("op", "int"), (3, 8)),
                                         (ValueError, ("device", "'gpu'"), ("Allreduce", 8, "gpu")),
                                         (ValueError, ("nbytes", "-1"), ("Allreduce", -1))):
                with raises(exc, *fragments):
                    c.choose(*args)
        # no table anywhere: the defaults (MPI for host memory)
        with environ(MCR_TUNING=None, XDG_CACHE_HOME=os.path.join(folder, "empty")), \
                dup(comm) as c:
            got = c.choose("Allreduce", 4)
            assert got.backend == "mpi" and got.source == "defaults", got
            y = torch.zeros(2)
            c.Allreduce(torch.ones(2), y, backend="auto")
            assert torch.equal(y, torch.full((2,), float(comm.size)))
        # the table mcr.tune saved for this host and size, in the cache
        with environ(MCR_TUNING=None, XDG_CACHE_HOME=os.path.join(folder, "cache")):
            cached = save_table(comm, tuning.cache_path(comm.size))
            with dup(comm) as c:
                got = c.choose("Bcast", 4)
                assert got.backend == "gloo" and got.source == cached, got


@case
def ranks_with_different_tables_are_refused(comm):
    if comm.size == 1:
        return
    other = routing_table()
    other.add("Allreduce", "cpu", 16, {"mpi": 99.0})      # MPI loses at 16 bytes
    with shared_dir(comm) as folder:
        a = save_table(comm, os.path.join(folder, "a.json"))
        b = save_table(comm, os.path.join(folder, "b.json"), other)
        with environ(MCR_TUNING=a if comm.rank == 0 else b), dup(comm) as c:
            # every rank raises, at the first collective under auto; none hangs
            with raises(tuning.TuningError, "different tuning tables", "rank 0: " + a, b):
                c.Allreduce(torch.ones(4), torch.zeros(4), backend="auto")
            with raises(tuning.TuningError, "different tuning tables"):
                c.Ibcast(torch.ones(4), 0, backend="auto")
            assert_comm_works(c)           # MPI, explicitly, still works


def broken_tables():
    """{name: (the file's bytes, what the error says)}: a field of the wrong kind, a file that
    is no text, a size beyond the core's bounds, a backend for memory it does not serve."""
    def edited(entry, **fields):
        data = routing_table().to_json()
        data["entries"][entry].update(fields)
        return json.dumps(data).encode()
    return {"field": (edited(2, bytes="sixty-four"), ("entries[2].bytes", "expected int, got str")),
            "binary": (b"\xff\xfe{" * 8, ("not UTF-8 text",)),
            "huge": (edited(2, bytes=2**70), ("entries[2].bytes", "2**62")),
            "device": (edited(0, backend="nccl", latency_us={"nccl": 1.0}),
                       ("Barrier on cpu: backend 'nccl' serves cuda buffers only",))}


@case
def unusable_table_on_one_rank_raises_everywhere(comm):
    last = comm.size - 1
    with shared_dir(comm) as folder:
        good = os.path.join(folder, "good.json")
        save_table(comm, good)
        for name, (content, fragments) in broken_tables().items():
            bad = os.path.join(folder, name + ".json")
            if comm.rank == 0:
                with open(bad, "wb") as f:
                    f.write(content)
            comm.Barrier()
            # the last rank alone has the broken table: the others must not wait for it
            with environ(MCR_TUNING=bad if comm.rank == last else good), dup(comm) as c:
                with raises(tuning.TuningError, f"rank {last}: {bad}", *fragments):
                    c.Allreduce(torch.ones(4), torch.zeros(4), backend="auto")
                if comm.rank == last:        # locally, choose says why
                    with raises(tuning.TuningError, bad, *fragments):
                        c.choose("Allreduce", 4)
                assert_comm_works(c)


test_mpi = mpi_cases(__name__, timeout=240)


# -- the table format (no MPI) ------------------------------------------------------------
def test_round_trip_and_ranges(tmp_path):
    t = routing_table()
    path = str(tmp_path / "t.json")
    t.save(path)
    back = tuning.Table.load(path)
    assert back.to_json() == t.to_json() and back.digest() == t.digest()
    allreduce = [e for e in back.entries if e.op == "Allreduce"]
    assert [(e.min_bytes, e.max_bytes) for e in allreduce] == [(0, 16), (17, 64), (65, None)]
    assert [e.backend for e in allreduce] == ["mpi", "mpi", "gloo"]
    # the plan merges neighbouring ranges with the same backend
    plan = tuning.plan(back)
    assert plan["Allreduce", "cpu"] == [(64, "mpi"), (None, "gloo")]
    assert plan["Scan", "cpu"] == [(None, "mpi")]
    assert plan["Alltoallv", "cpu"] == [(None, "gloo")]


def test_merge_replaces_only_what_was_measured_again():
    t = routing_table()
    other = tuning.Table(machine={"host": "again"})
    other.add("Allreduce", "cpu", 16, {"gloo": 0.5})            # Gloo measured again only
    other.add("Scan", "cpu", 8, {"mpi": 3.0, "gloo": 40.0})
    t.merge(other)
    e16 = next(e for e in t.entries if (e.op, e.bytes) == ("Allreduce", 16))
    assert e16.latency_us == {"mpi": 1.0, "gloo": 0.5} and e16.backend == "gloo"
    assert any(e.op == "Scan" for e in t.entries)
    assert t.machine == {"host": "again"}


def test_one_backend_for_ops_whose_sizes_differ_across_ranks():
    t = tuning.Table()
    # Gloo wins the small size by a little, MPI the large one by a lot
    t.add("Gatherv", "cpu", 4, {"mpi": 10.0, "gloo": 8.0})
    t.add("Gatherv", "cpu", 4096, {"mpi": 20.0, "gloo": 200.0})
    assert [e.backend for e in t.entries] == ["mpi", "mpi"]
    assert tuning.plan(t)["Gatherv", "cpu"] == [(None, "mpi")]
    # and ties go to MPI
    assert tuning.Table().add("Bcast", "cpu", 8, {"gloo": 5.0, "mpi": 5.0}).backend == "mpi"


@pytest.mark.parametrize("edit, fragments", [
    (lambda d: d.update(version=2), ("version", "version 2")),
    (lambda d: d.update(format="other"), ("format", "'mcr-tuning'")),
    (lambda d: d.pop("entries"), ("entries", "expected a list")),
    (lambda d: d["entries"][0].pop("op"), ("entries[0].op", "missing")),
    (lambda d: d["entries"][0].update(op="Allreduse"), ("entries[0].op", "'Allreduse'")),
    (lambda d: d["entries"][1].update(device="gpu"), ("entries[1].device", "'gpu'")),
    (lambda d: d["entries"][1].update(bytes=-1), ("entries[1].bytes", "-1")),
    (lambda d: d["entries"][1].update(bytes=True), ("entries[1].bytes", "bool")),
    (lambda d: d["entries"][1].update(bytes=2**62), ("entries[1].bytes", "2**62 - 1")),
    (lambda d: d.update(version=True), ("version", "version True")),
    (lambda d: d.update(version=1.0), ("version", "version 1.0")),
    (lambda d: d["entries"][0]["latency_us"].update(gloo="fast"),
     ("entries[0].latency_us.gloo", "'fast'")),
    (lambda d: d["entries"][0].update(backend="nccl"), ("entries[0].backend", "'nccl'")),
    (lambda d: d["entries"].append(dict(d["entries"][0])), ("entries[", "a second entry")),
])
def test_malformed_tables_name_file_and_field(tmp_path, edit, fragments):
    data = routing_table().to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with raises(tuning.TuningError, str(path), *fragments):
        tuning.Table.load(str(path))


def test_unreadable_tables(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with raises(tuning.TuningError, "not JSON"):
        tuning.Table.load(str(path))
    with raises(tuning.TuningError, "cannot read"):
        tuning.Table.load(str(tmp_path / "missing.json"))
    path.write_bytes(b"\x89PNG\r\n")
    with raises(tuning.TuningError, str(path), "not UTF-8 text (byte 0x89 at offset 0)"):
        tuning.Table.load(str(path))
    path.write_text("[" * 100_000)
    with raises(tuning.TuningError, str(path), "nested too deeply"):
        tuning.Table.load(str(path))


def test_resolve_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MCR_TUNING", raising=False)
    assert tuning.resolve(2) == (None, "defaults")
    cached = tuning.cache_path(2)
    assert cached.startswith(str(tmp_path / "cache" / "mcr" / "tuning"))
    routing_table().save(cached)
    table, source = tuning.resolve(2)
    assert source == cached and table.digest() == routing_table().digest()
    assert tuning.resolve(3) == (None, "defaults")          # another size: not this table
    named = tmp_path / "named.json"
    tuning.Table().save(str(named))
    monkeypatch.setenv("MCR_TUNING", str(named))
    assert tuning.resolve(2)[1] == str(named)
    monkeypatch.setenv("MCR_TUNING", str(tmp_path / "nope.json"))
    with pytest.raises(tuning.TuningError, match="MCR_TUNING.*no such file"):
        tuning.resolve(2)
    monkeypatch.setenv("MCR_TUNING", str(tmp_path))
    with pytest.raises(tuning.TuningError, match="MCR_TUNING.*a folder, not a table file"):
        tuning.resolve(2)
