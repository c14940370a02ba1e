"""backend="auto": tuning tables decide which backend runs each collective.

The MPI cases write a table (on rank 0, into a folder every rank sees) that
sends some sizes of some operations to Gloo, point every rank at it with
``MCR_TUNING``, and run real calls under auto in every form. Which backend
ran is seen at the Gloo sub-communicator: its typed methods are wrapped to
count their calls (the Gloo operation itself still runs). The results are
checked against torch on the whole data. Tables that differ across ranks, or
that cannot be used on one rank, must raise on every rank, never hang.

The plain tests check the table format itself: round trip, ranges, merge, the
choice for operations that take one backend, and errors naming the file and
the field.
"""

import contextlib
import json
import os
import shutil
import tempfile

import pytest
import torch

import mcr
import mcr.hooks
from mcr import backends, tuning
from mpiharness import case, mpi_cases
from util import assert_comm_works, raises


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


@contextlib.contextmanager
def environ(**values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def routing_table():
    """Allreduce: MPI up to 64 bytes, Gloo above; Bcast: Gloo everywhere;
    Allgather: MPI to 16 bytes, Gloo above; Alltoallv (one backend): Gloo;
    Reduce_scatter_block: MPI; Barrier: Gloo."""
    t = tuning.Table(machine={"host": "test", "world_size": 0})
    t.add("Allreduce", "cpu", 16, {"mpi": 1.0, "gloo": 9.0})
    t.add("Allreduce", "cpu", 64, {"mpi": 2.0, "gloo": 9.0})
    t.add("Allreduce", "cpu", 256, {"mpi": 20.0, "gloo": 9.0})
    t.add("Bcast", "cpu", 4, {"mpi": 20.0, "gloo": 9.0})
    t.add("Allgather", "cpu", 16, {"mpi": 1.0, "gloo": 9.0})
    t.add("Allgather", "cpu", 1024, {"mpi": 20.0, "gloo": 9.0})
    t.add("Alltoallv", "cpu", 16, {"mpi": 20.0, "gloo": 9.0})
    t.add("Alltoallv", "cpu", 4096, {"mpi": 30.0, "gloo": 19.0})
    t.add("Reduce_scatter_block", "cpu", 64, {"mpi": 1.0, "gloo": 9.0})
    t.add("Barrier", "cpu", 0, {"mpi": 20.0, "gloo": 9.0})
    return t


class GlooCounter:
    """Counts the calls of the Gloo sub-communicator's typed methods (which
    still run): how the cases see that auto ran an operation on Gloo."""

    METHODS = ("allreduce", "bcast", "allgather", "alltoallv", "reduce_scatter_block",
               "barrier", "send", "recv")

    def __init__(self, comm):
        self.sub = backends.subcomm(comm, "gloo")
        self.counts = dict.fromkeys(self.METHODS, 0)
        for name in self.METHODS:
            original = getattr(self.sub, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                self.counts[_name] += 1
                return _original(*args, **kwargs)
            setattr(self.sub, name, counted)

    def close(self):
        for name in self.METHODS:
            delattr(self.sub, name)

    def take(self):
        """The methods called since the last take, with their counts."""
        seen = {k: v for k, v in self.counts.items() if v}
        self.counts = dict.fromkeys(self.METHODS, 0)
        return seen


def run_forms(call, check):
    """Run a collective blocking, non-blocking and persistent, checking each."""
    for form in ("blocking", "nonblocking", "persistent"):
        result = call(form)
        if form == "nonblocking":
            result.Wait()
        elif form == "persistent":
            result.Start()
            result.Wait()
            result.Free()
        check(form)


# -- MPI cases -----------------------------------------------------------------------

@case
def table_sends_chosen_sizes_to_gloo(comm):
    size, rank = comm.size, comm.rank
    with shared_dir(comm) as folder:
        path = os.path.join(folder, "table.json")
        if rank == 0:
            routing_table().save(path)
        comm.Barrier()
        with environ(MCR_TUNING=path):
            c = comm.Dup()
            c.backend = "auto"
            gloo = GlooCounter(c)
            try:
                # Allreduce: 4 and 16 floats are 16 and 64 bytes (MPI), 17 and 100 floats Gloo
                for n, expected_backend in ((4, "mpi"), (16, "mpi"), (17, "gloo"),
                                            (100, "gloo")):
                    assert c.choose("Allreduce", 4 * n).backend == expected_backend
                    x = torch.arange(n, dtype=torch.float32) + rank
                    want = sum(torch.arange(n, dtype=torch.float32) + r for r in range(size))
                    y = torch.zeros(n)

                    def allreduce(form):
                        y.zero_()
                        method = {"blocking": c.Allreduce, "nonblocking": c.Iallreduce,
                                  "persistent": c.Allreduce_init}[form]
                        return method(x, y)

                    def check(form):
                        assert torch.equal(y, want), (n, form, y, want)
                    run_forms(allreduce, check)
                    seen = gloo.take()
                    # the persistent form on Gloo posts the non-blocking one at Start
                    assert seen == ({"allreduce": 3} if expected_backend == "gloo" else {}), \
                        (n, seen)

                # Bcast: Gloo at every size
                b = torch.arange(5.0) if rank == 0 else torch.zeros(5)
                c.Bcast(b, 0)
                assert torch.equal(b, torch.arange(5.0)) and gloo.take() == {"bcast": 1}

                # Allgather by block size: 4 floats (16 B) on MPI, 8 floats on Gloo
                for n, on_gloo in ((4, False), (8, True)):
                    out = torch.zeros(size * n)
                    c.Allgather(torch.full((n,), float(rank)), out)
                    want = torch.arange(size, dtype=torch.float32).repeat_interleave(n)
                    assert torch.equal(out, want), (n, out)
                    assert gloo.take() == ({"allgather": 1} if on_gloo else {})

                # Alltoallv: one backend whatever the size (Gloo here); counts differ per rank
                counts = [r + rank + 1 for r in range(size)]
                send = torch.cat([torch.full((k,), float(100 * rank + r))
                                  for r, k in enumerate(counts)])
                rcounts = [rank + r + 1 for r in range(size)]
                recv = torch.zeros(sum(rcounts))
                c.Alltoallv([send, counts], [recv, rcounts])
                want = torch.cat([torch.full((k,), float(100 * r + rank))
                                  for r, k in enumerate(rcounts)])
                assert torch.equal(recv, want) and gloo.take() == {"alltoallv": 1}
                assert c.choose("Alltoallv", 1 << 30).backend == "gloo"

                # Reduce_scatter_block: MPI; Barrier: Gloo
                v = torch.ones(size * 2)
                r = torch.zeros(2)
                c.Reduce_scatter_block(v, r)
                assert torch.equal(r, torch.full((2,), float(size))) and gloo.take() == {}
                c.Barrier()
                assert gloo.take() == {"barrier": 1}

                # point-to-point under auto is MPI, whatever the table
                if size > 1:
                    got = torch.zeros(3)
                    c.Sendrecv(torch.full((3,), float(rank)), (rank + 1) % size, 5, got,
                               (rank - 1) % size, 5)
                    assert torch.equal(got, torch.full((3,), float((rank - 1) % size)))
                    assert gloo.take() == {}
                assert c.choose("Send", 10**6).backend == "mpi"
                # an explicit backend still wins over the default auto
                y = torch.zeros(100)
                c.Allreduce(torch.ones(100), y, backend="mpi")
                assert torch.equal(y, torch.full((100,), float(size))) and gloo.take() == {}

                # the hooks see the backend auto chose
                seen = []
                with mcr.hooks.installed(lambda call: seen.append((call.op, call.backend))):
                    c.Allreduce(torch.ones(4), torch.zeros(4))
                    c.Allreduce(torch.ones(64), torch.zeros(64))
                assert seen == [("Allreduce", "mpi"), ("Allreduce", "gloo")], seen
                assert gloo.take() == {"allreduce": 1}
            finally:
                gloo.close()
                c.Free()


@case
def choose_explains_and_validates(comm):
    with shared_dir(comm) as folder:
        path = os.path.join(folder, "table.json")
        if comm.rank == 0:
            routing_table().save(path)
        comm.Barrier()
        with environ(MCR_TUNING=path):
            c = comm.Dup()
            try:
                got = c.choose("Iallreduce", 100)
                assert (got.op, got.device, got.nbytes, got.backend, got.source) == \
                    ("Allreduce", "cpu", 100, "gloo", path)
                assert got.entry.bytes == 256 and got.entry.min_bytes == 65, got.entry
                assert "256 bytes" in got.reason and "gloo 9 us" in got.reason, got.reason
                assert c.choose("Allreduce_init", 0).entry.bytes == 16
                # no entry for an operation or a device: the defaults
                assert c.choose("Scan", 8).backend == "mpi"
                assert c.choose("Scan", 8).entry is None
                assert c.choose("Allreduce", 8, "cuda").backend == tuning.default_backend("cuda")
                with raises(ValueError, "op", "'Allreduse'"):
                    c.choose("Allreduse", 8)
                with raises(TypeError, "op", "int"):
                    c.choose(3, 8)
                with raises(ValueError, "device", "'gpu'"):
                    c.choose("Allreduce", 8, "gpu")
                with raises(ValueError, "nbytes", "-1"):
                    c.choose("Allreduce", -1)
            finally:
                c.Free()
        # no table anywhere: the defaults (MPI for host memory)
        with environ(MCR_TUNING=None, XDG_CACHE_HOME=os.path.join(folder, "empty")):
            c = comm.Dup()
            try:
                got = c.choose("Allreduce", 4)
                assert got.backend == "mpi" and got.source == "defaults", got
                y = torch.zeros(2)
                c.Allreduce(torch.ones(2), y, backend="auto")
                assert torch.equal(y, torch.full((2,), float(comm.size)))
            finally:
                c.Free()
        # the table mcr.tune saved for this host and size, in the cache
        cache = os.path.join(folder, "cache")
        with environ(MCR_TUNING=None, XDG_CACHE_HOME=cache):
            if comm.rank == 0:
                routing_table().save(tuning.cache_path(comm.size))
            comm.Barrier()
            c = comm.Dup()
            try:
                got = c.choose("Bcast", 4)
                assert got.backend == "gloo" and got.source == tuning.cache_path(comm.size)
            finally:
                c.Free()


@case
def ranks_with_different_tables_are_refused(comm):
    if comm.size == 1:
        return
    with shared_dir(comm) as folder:
        paths = [os.path.join(folder, name) for name in ("a.json", "b.json")]
        if comm.rank == 0:
            routing_table().save(paths[0])
            other = routing_table()
            other.add("Allreduce", "cpu", 16, {"mpi": 99.0})      # MPI loses at 16 bytes
            other.save(paths[1])
        comm.Barrier()
        mine = paths[0] if comm.rank == 0 else paths[1]
        with environ(MCR_TUNING=mine):
            c = comm.Dup()
            try:
                # every rank raises, at the first collective under auto; none hangs
                with raises(tuning.TuningError, "different tuning tables", "rank 0: " + paths[0],
                            paths[1]):
                    c.Allreduce(torch.ones(4), torch.zeros(4), backend="auto")
                with raises(tuning.TuningError, "different tuning tables"):
                    c.Ibcast(torch.ones(4), 0, backend="auto")
                assert_comm_works(c)           # MPI, explicitly, still works
            finally:
                c.Free()


@case
def unusable_table_on_one_rank_raises_everywhere(comm):
    with shared_dir(comm) as folder:
        good, bad = os.path.join(folder, "good.json"), os.path.join(folder, "bad.json")
        if comm.rank == 0:
            routing_table().save(good)
            data = routing_table().to_json()
            data["entries"][2]["bytes"] = "sixty-four"
            with open(bad, "w") as f:
                json.dump(data, f)
        comm.Barrier()
        # the last rank alone has the broken table: the others must not wait for it
        mine = bad if comm.rank == comm.size - 1 else good
        with environ(MCR_TUNING=mine):
            c = comm.Dup()
            try:
                with raises(tuning.TuningError, f"rank {comm.size - 1}: {bad}",
                            "entries[2].bytes", "expected int, got str"):
                    c.Allreduce(torch.ones(4), torch.zeros(4), backend="auto")
                if comm.rank == comm.size - 1:        # locally, choose says why
                    with raises(tuning.TuningError, bad, "entries[2].bytes"):
                        c.choose("Allreduce", 4)
                assert_comm_works(c)
            finally:
                c.Free()


test_mpi = mpi_cases(__name__, timeout=240)


# -- the table format (no MPI) ------------------------------------------------------------

def test_round_trip_and_ranges(tmp_path):
    t = routing_table()
    path = str(tmp_path / "t.json")
    t.save(path)
    back = tuning.Table.load(path)
    assert back.to_json() == t.to_json()
    assert back.digest() == t.digest()
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


def test_ties_go_to_mpi():
    t = tuning.Table()
    assert t.add("Bcast", "cpu", 8, {"gloo": 5.0, "mpi": 5.0}).backend == "mpi"


@pytest.mark.parametrize("edit, fragments", [
    (lambda d: d.update(version=2), ("version", "version 2")),
    (lambda d: d.update(format="other"), ("format", "'mcr-tuning'")),
    (lambda d: d.pop("entries"), ("entries", "expected a list")),
    (lambda d: d["entries"][0].pop("op"), ("entries[0].op", "missing")),
    (lambda d: d["entries"][0].update(op="Allreduse"), ("entries[0].op", "'Allreduse'")),
    (lambda d: d["entries"][1].update(device="gpu"), ("entries[1].device", "'gpu'")),
    (lambda d: d["entries"][1].update(bytes=-1), ("entries[1].bytes", "-1")),
    (lambda d: d["entries"][1].update(bytes=True), ("entries[1].bytes", "bool")),
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
    with pytest.raises(tuning.TuningError) as info:
        tuning.Table.load(str(path))
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_unreadable_tables(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(tuning.TuningError, match="not JSON"):
        tuning.Table.load(str(path))
    with pytest.raises(tuning.TuningError, match="cannot read"):
        tuning.Table.load(str(tmp_path / "missing.json"))


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
