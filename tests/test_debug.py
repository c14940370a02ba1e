"""python -m mcr.debug, merging the flight-recorder files of a job's ranks: each case plants
the files of a made-up job (the format is the contract with the core's recorder) and checks the
report against the expected one, written out by hand. Real jobs under mpiexec (at the sizes of
mpiharness.LAYER_SIZES) check the vector collectives, whose records differ between ranks
(test_check_jobs reads real files of hangs)."""

import json
import os
import subprocess
import sys

import pytest

from mcr import debug, launch
from mpiharness import LAYER_SIZES, mpi_env, world_sizes

SUM4 = "Allreduce float32[4] SUM"
IALL = "Iallreduce float32[4] SUM"
SRC = os.path.dirname(os.path.dirname(os.path.abspath(debug.__file__)))


def call(seq, desc=SUM4, state="done", age=1.0, *, op=None, comm="world", form="blocking",
         backend="mpi", root=-1, peer=-1, tag=-1, nbytes=16, duration=None):
    """One call record as the recorder writes it (op: desc's first word)."""
    if duration is None and state == "done":
        duration = 0.001
    return {"comm": comm, "seq": seq, "op": op or desc.split()[0], "form": form,
            "backend": backend, "desc": desc, "peer": peer, "root": root, "tag": tag,
            "bytes": nbytes, "state": state, "age": age, "duration": duration}


def done(first, last, desc=SUM4, **kw):
    """Completed calls #first..#last."""
    return [call(s, desc, **kw) for s in range(first, last + 1)]


def pending(seq, age, desc=SUM4, **kw):
    return call(seq, desc, "pending", age, **kw)


def world(size, next_seq, first_seq=1):
    return {"world": {"members": list(range(size)), "next_seq": next_seq, "first_seq": first_seq}}


def plant(directory, rank, size, calls, comms=None, reason="exit", message="", **extra):
    """Write rank's file; comms default: world with next_seq after its last call."""
    if comms is None:
        seqs = [c["seq"] for c in calls if c["seq"] is not None]
        comms = world(size, max(seqs, default=0) + 1, min(seqs, default=None))
    record = {"version": 1, "rank": rank, "size": size, "host": f"node{rank // 8}",
              "pid": 1000 + rank, "time": 1764620000.5, "reason": reason, "message": message,
              "comms": comms, "calls": calls, **extra}
    path = directory / f"mcr-flight-{rank}.json"
    path.write_text(json.dumps(record))
    return path


def run_cli(*args):
    """``python -m mcr.debug args``: (status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "mcr.debug", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


TIMEOUT30 = {"reason": "timeout", "message": "Allreduce on world did not complete in 30 s"}
TP = {"members": [0, 1, 2], "next_seq": 2, "first_seq": 1}


def several_communicators():
    # world agrees; 'tp' labels two groups of one split, {0,1} (diverges at #2) and {2,3}
    for rank in range(4):
        second = (pending(2, 4.0, f"Allgather float32[{2 + rank}]", comm="tp") if rank < 2
                  else call(2, "Allgather float32[2]", comm="tp"))
        yield rank, 4, done(1, 2) + [call(1, "Allgather float32[2]", comm="tp"), second], {
            "comms": {"world": world(4, 3)["world"],
                      "tp": dict(TP, members=[0, 1] if rank < 2 else [2, 3], next_seq=3)}}


def check_fewer_calls(report):
    at = {a.rank: a for a in report.comms[0].divergence.ranks}
    return (at[1].kind, at[1].last_seq, at[0].kind) == ("none", 5, "call")


# name: (files planted: (rank, size, calls[, plant's keywords]), the report's lines (after its
# first unless given), a check of the report or None)
EVEN, ODD = (",".join(map(str, range(first, 64, 2))) for first in (0, 1))
REPORTS = {
    "the_issue_example": (
        [(0, 2, done(1, 16) + [pending(17, 31.2), pending(None, 40.0, "Irecv", peer=1, tag=5)],
          TIMEOUT30), (1, 2, done(1, 16) + [pending(17, 30.9, "Bcast float32[4]", root=0)])],
        ["mcr.debug: 2 files, ranks 0-1 of 2 (reasons: rank 0 timeout, rank 1 exit)",
         "  rank 0 timeout: Allreduce on world did not complete in 30 s",
         "communicator world (ranks 0-1): ranks diverge at call #17",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 31.2 s",
         "  rank 1: Bcast float32[4] root=0   [mpi, blocking] pending for 30.9 s",
         "  (calls #1-#16 agree)",
         "pending point-to-point:",
         "  rank 0: Irecv from 1 tag 5, 16 bytes, pending for 40.0 s"],
        lambda r: (r.comms[0].divergence.seq, r.comms[0].incomplete, r.comms[0].compared_from,
                   r.comms[0].agreed_to) == (17, None, 1, 16)),
    "root": (
        [(rank, 3, done(1, 2) + [pending(3, age, "Bcast float32[4]", root=root)])
         for rank, root, age in ((0, 0, 5.0), (1, 1, 7.5), (2, 0, 6.0))],
        ["communicator world (ranks 0-2): ranks diverge at call #3",
         "  ranks 0,2: Bcast float32[4] root=0  [mpi, blocking] pending for 5.0-6.0 s",
         "  rank 1:    Bcast float32[4] root=1  [mpi, blocking] pending for 7.5 s",
         "  (calls #1-#2 agree)"], None),
    **{kind: (
        [(0, 2, done(1, 4) + [pending(5, 3.0)]), (1, 2, done(1, 4) + [pending(5, 3.0, other)])],
        ["communicator world (ranks 0-1): ranks diverge at call #5",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 3.0 s",
         f"  rank 1: {other}  [mpi, blocking] pending for 3.0 s",
         "  (calls #1-#4 agree)"], None)
       for kind, other in (("count", "Allreduce float32[8] SUM"),
                           ("element_type", "Allreduce float64[4] SUM"),
                           ("reduction_op", "Allreduce float32[4] MAX"))},
    "backend": (
        [(0, 2, [pending(1, 2.0)]), (1, 2, [pending(1, 2.0, backend="gloo")])],
        ["communicator world (ranks 0-1): ranks diverge at call #1",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 2.0 s",
         "  rank 1: Allreduce float32[4] SUM  [gloo, blocking] pending for 2.0 s"], None),
    "rank_with_fewer_calls": (      # rank 1 skipped the Bcast #6 the others made
        [(rank, 3, done(1, 5) + [pending(6, 9.0, "Bcast float32[2]", root=0)],
          {"reason": "timeout", "message": "Bcast on world did not complete in 8 s"})
         for rank in (0, 2)] + [(1, 3, done(1, 5))],
        ["mcr.debug: 3 files, ranks 0-2 of 3 (reasons: ranks 0,2 timeout, rank 1 exit)",
         "  ranks 0,2 timeout: Bcast on world did not complete in 8 s",
         "communicator world (ranks 0-2): ranks diverge at call #6",
         "  ranks 0,2: Bcast float32[2] root=0  [mpi, blocking] pending for 9.0 s",
         "  rank 1:    no call #6 (its last on this communicator: #5 Allreduce float32[4] SUM "
         "[mpi, blocking], done)",
         "  (calls #1-#5 agree)"], check_fewer_calls),
    "rank_without_collectives": (
        [(0, 2, [pending(1, 1.5)]), (1, 2, [], {"comms": world(2, next_seq=1, first_seq=None)})],
        ["communicator world (ranks 0-1): ranks diverge at call #1",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 1.5 s",
         "  rank 1: no call #1 (no collective on this communicator)"], None),
    "rank_whose_file_lacks_the_communicator": (  # rank 1's 'tp' has other members
        [(rank, 3, [pending(1, 3.0, "Barrier", comm="tp")], {"comms": {"tp": TP}})
         for rank in (0, 2)]
        + [(1, 3, [call(1, "Barrier", comm="tp")], {"comms": {"tp": dict(TP, members=[1])}})],
        ["communicator tp (ranks 0-2): ranks diverge at call #1",
         "  ranks 0,2: Barrier  [mpi, blocking] pending for 3.0 s",
         "  rank 1:    its file has no communicator of this label and these members",
         "communicator tp (rank 1): call #1 agrees, all completed"],
        lambda r: [(c.label, c.members, c.ok) for c in r.comms] == [
            ("tp", [0, 1, 2], False), ("tp", [1], True)]),
    "missing_rank_file": (
        [(rank, 4, done(1, 2) + [pending(3, 20.0)], {"reason": "timeout"}) for rank in range(3)],
        ["mcr.debug: 3 files, ranks 0-2 of 4, no file for rank 3 (reasons: ranks 0-2 timeout)",
         "communicator world (ranks 0-3): call #3 did not complete (pending on ranks 0-2)",
         "  ranks 0-2: Allreduce float32[4] SUM  [mpi, blocking] pending for 20.0 s",
         "  rank 3:    no file",
         "  (calls #1-#2 agree)"], lambda r: r.missing == [3]),
    "missing_rank_file_with_all_agreeing": (
        [(rank, 4, done(1, 2)) for rank in (0, 1, 3)],
        ["communicator world (ranks 0-3): no file for rank 2; calls #1-#2 agree on ranks "
         "0-1,3, all completed"], None),
    "pending_on_one_rank_done_on_the_others": (
        [(0, 4, done(1, 2) + [pending(3, 12.0)], {"reason": "timeout"})]
        + [(rank, 4, done(1, 3)) for rank in (1, 2, 3)],
        ["communicator world (ranks 0-3): call #3 did not complete (pending on rank 0)",
         "  rank 0:    Allreduce float32[4] SUM  [mpi, blocking] pending for 12.0 s",
         "  ranks 1-3: Allreduce float32[4] SUM  [mpi, blocking] done",
         "  (calls #1-#2 agree)"],
        lambda r: (r.comms[0].incomplete.seq, r.comms[0].divergence) == (3, None)),
    "incomplete_before_a_divergence": (  # an Iallreduce never waited for on rank 1
        [(0, 2, done(1, 1) + [call(2, IALL, form="nonblocking"), pending(3, 4.0)]),
         (1, 2, done(1, 1) + [pending(2, 6.0, IALL, form="nonblocking"),
                              call(3, "Barrier", "failed", 5.0)])],
        ["communicator world (ranks 0-1): call #2 did not complete (pending on rank 1)",
         "  rank 0: Iallreduce float32[4] SUM  [mpi, nonblocking] done",
         "  rank 1: Iallreduce float32[4] SUM  [mpi, nonblocking] pending for 6.0 s",
         "communicator world (ranks 0-1): ranks diverge at call #3",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 4.0 s",
         "  rank 1: Barrier                   [mpi, blocking] failed after 5.0 s",
         "  (call #1 agrees)"], None),
    # Dup, Split, ... and Free are numbered among the collectives; a failed call
    # shows how long it ran until it failed (its duration), not its age at the dump
    "constructor_against_a_collective": (
        [(rank, 3, [call(1, "Dup", nbytes=0),
                    call(2, "Split", "failed", 40.0, nbytes=0, duration=5.0)])
         for rank in (0, 1)] + [(2, 3, [call(1, "Dup", nbytes=0), pending(2, 39.5)])],
        ["communicator world (ranks 0-2): ranks diverge at call #2",
         "  ranks 0-1: Split                     [mpi, blocking] failed after 5.0 s",
         "  rank 2:    Allreduce float32[4] SUM  [mpi, blocking] pending for 39.5 s",
         "  (call #1 agrees)"], None),
    # Create_group is made by the group's processes only: not numbered, listed as the
    # point-to-point calls are (rank 2 never came to it; ranks 1-2 wait in an Allreduce)
    "create_group_pending": (
        [(0, 3, done(1, 1) + [pending(None, 8.0, "Create_group", nbytes=0)])]
        + [(rank, 3, done(1, 1) + [pending(2, 7.0)]) for rank in (1, 2)],
        ["communicator world (ranks 0-2): ranks diverge at call #2",
         "  rank 0:    no call #2 (its last on this communicator: #1 Allreduce float32[4] SUM "
         "[mpi, blocking], done)",
         "  ranks 1-2: Allreduce float32[4] SUM  [mpi, blocking] pending for 7.0 s",
         "  (call #1 agrees)",
         "pending point-to-point and Create_group:",
         "  rank 0: Create_group (by the group's processes only), pending for 8.0 s"], None),
    "all_agree": (
        [(rank, 2, done(1, 3)) for rank in range(2)],
        ["mcr.debug: 2 files, ranks 0-1 of 2 (reasons: ranks 0-1 exit)",
         "communicator world (ranks 0-1): calls #1-#3 agree, all completed"],
        lambda r: r.ok),
    "pending_point_to_point_only": (
        [(0, 2, done(1, 2) + [pending(None, 3.0, "Isend", peer=1, tag=0, nbytes=64)]),
         (1, 2, done(1, 2) + [pending(None, 9.0, "Irecv"),
                              pending(None, 2.0, "Recv", peer=0, tag=7)])],
        ["communicator world (ranks 0-1): calls #1-#2 agree, all completed",
         "pending point-to-point:",
         "  rank 0: Isend to 1 tag 0, 64 bytes, pending for 3.0 s",
         "  rank 1: Irecv from any, 16 bytes, pending for 9.0 s (and 1 more)"],
        lambda r: [len(r.pending[rank]) for rank in (0, 1)] == [1, 2]),
    "ring_truncation": (
        [(0, 2, done(10, 19) + [pending(20, 2.0)], {"comms": world(2, 21, 10)}),
         (1, 2, done(15, 19) + [pending(20, 2.0, "Barrier")], {"comms": world(2, 21, 15)})],
        ["communicator world (ranks 0-1): ranks diverge at call #20",
         "  rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 2.0 s",
         "  rank 1: Barrier                   [mpi, blocking] pending for 2.0 s",
         "  (calls #10-#19 agree; calls before #15 are not in every file)"],
        lambda r: (r.comms[0].compared_from, r.comms[0].complete_from,
                   r.comms[0].divergence.seq) == (10, 15, 20)),
    "ring_keeps_an_old_pending_call": (  # rank 0's ring: Iallreduce #3, #18-#20
        [(0, 2, [pending(3, 50.0, IALL, form="nonblocking")] + done(18, 20),
          {"comms": world(2, 21, 3)}), (1, 2, done(18, 20), {"comms": world(2, 21, 18)})],
        ["communicator world (ranks 0-1): call #3 did not complete (pending on rank 0)",
         "  rank 0: Iallreduce float32[4] SUM  [mpi, nonblocking] pending for 50.0 s",
         "  rank 1: call #3 completed, no longer in its file",
         "  (calls before #18 are not in every file)"], None),
    "rank_stopped_before_the_others_rings_begin": (
        [(0, 2, done(10, 20), {"comms": world(2, 21, 10)}), (1, 2, done(1, 3))],
        ["communicator world (ranks 0-1): ranks diverge at call #4",
         "  rank 0: call #4 completed, no longer in its file",
         "  rank 1: no call #4 (its last on this communicator: #3 Allreduce float32[4] SUM "
         "[mpi, blocking], done)",
         "  (calls #1-#3 agree; calls before #10 are not in every file)"], None),
    "every_ring_past_the_first_calls": (
        [(rank, 2, done(41, 50), {"comms": world(2, 51, 41)}) for rank in range(2)],
        ["communicator world (ranks 0-1): calls #41-#50 agree, all completed "
         "(calls before #41 are no longer in any file)"], None),
    "several_communicators": (
        list(several_communicators()),
        ["communicator tp (ranks 0-1): ranks diverge at call #2",
         "  rank 0: Allgather float32[2]  [mpi, blocking] pending for 4.0 s",
         "  rank 1: Allgather float32[3]  [mpi, blocking] pending for 4.0 s",
         "  (call #1 agrees)",
         "communicator world (ranks 0-3): calls #1-#2 agree, all completed",
         "communicator tp (ranks 2-3): calls #1-#2 agree, all completed"],
        lambda r: [(c.label, c.members, c.ok) for c in r.comms] == [
            ("tp", [0, 1], False), ("world", [0, 1, 2, 3], True), ("tp", [2, 3], True)]),
    # each rank's own counts of a vector collective differ (a zero is left out of the
    # description); what must agree does, and the elements sent add up to those received
    "vector_collectives_agree": (
        [(rank, 3, [call(1, f"Gatherv float32{send} recv 6 root=0" if rank == 0 else
                          f"Gatherv float32{send} root=0", root=0),
                    call(2, "Scatterv float32 send 6 recv 1 root=0" if rank == 0 else
                         f"Scatterv float32 recv {rank + 1} root=0", root=0),
                    call(3, f"Alltoallv float32 send {3 * (rank + 1)} recv 6"),
                    call(4, "Allgatherv float32[6]"),
                    call(5, "Reduce_scatter float32[6] SUM")])
         for rank, send in ((0, " send 1"), (1, ""), (2, " send 5"))],
        ["communicator world (ranks 0-2): calls #1-#5 agree, all completed"], lambda r: r.ok),
    # a datatype mcr does not name (a column type, "24-byte") matches by the bytes of data:
    # the same bytes agree, in the totals of a vector collective too; other bytes diverge
    "datatypes_match_by_bytes": (
        [(rank, 2, [call(1, ("Scatter 24-byte[1] root=0", "Scatter float64[3] root=0")[rank],
                         root=0),
                    call(2, ("Gatherv float64 send 2 recv 4 root=0",
                             "Gatherv 16-byte send 1 root=0")[rank], root=0),
                    pending(3, 2.0, ("Bcast 16-byte[1] root=0", "Bcast float64[3] root=0")[rank],
                            root=0)]) for rank in (0, 1)],
        ["communicator world (ranks 0-1): ranks diverge at call #3",
         "  rank 0: Bcast 16-byte[1] root=0  [mpi, blocking] pending for 2.0 s",
         "  rank 1: Bcast float64[3] root=0  [mpi, blocking] pending for 2.0 s",
         "  (calls #1-#2 agree)"], lambda r: r.comms[0].divergence.seq == 3),
    "vector_bytes_do_not_add_up": (
        [(rank, 2, [pending(1, 2.0, ("Gatherv float64 send 2 recv 4 root=0",
                                     "Gatherv 24-byte send 1 root=0")[rank], root=0)])
         for rank in (0, 1)],
        ["communicator world (ranks 0-1): ranks diverge at call #1 (counts that do not add "
         "up: the ranks send 40 bytes of data in all and receive 32)",
         "  rank 0: Gatherv float64 send 2 recv 4 root=0  [mpi, blocking] pending for 2.0 s",
         "  rank 1: Gatherv 24-byte send 1 root=0         [mpi, blocking] pending for 2.0 s"],
        None),
    "vector_counts_do_not_add_up": (    # rank 2 sends one element more than the root takes
        [(rank, 3, done(1, 1) + [pending(2, 5.0, desc, root=0)])
         for rank, desc in ((0, "Gatherv float32 send 1 recv 6 root=0"),
                            (1, "Gatherv float32 send 2 root=0"),
                            (2, "Gatherv float32 send 4 root=0"))],
        ["communicator world (ranks 0-2): ranks diverge at call #2 (counts that do not add "
         "up: the ranks send 7 elements in all and receive 6)",
         "  rank 0: Gatherv float32 send 1 recv 6 root=0  [mpi, blocking] pending for 5.0 s",
         "  rank 1: Gatherv float32 send 2 root=0         [mpi, blocking] pending for 5.0 s",
         "  rank 2: Gatherv float32 send 4 root=0         [mpi, blocking] pending for 5.0 s",
         "  (call #1 agrees)"],
        lambda r: r.comms[0].divergence.why.startswith("counts that do not add up")),
    **{kind: (
        [(0, 2, [pending(1, 2.0, "Gatherv float32 send 1 recv 3 root=0", root=0)]),
         (1, 2, [pending(1, 2.0, other, root=root)])],
        ["communicator world (ranks 0-1): ranks diverge at call #1",
         "  rank 0: Gatherv float32 send 1 recv 3 root=0  [mpi, blocking] pending for 2.0 s",
         f"  rank 1: {other:<36}  [mpi, blocking] pending for 2.0 s"],
        lambda r: r.comms[0].divergence.why == "")
       for kind, other, root in (
           ("vector_root", "Gatherv float32 send 2 root=1", 1),
           ("vector_operation", "Scatterv float32 recv 2 root=0", 0),
           ("vector_element_type", "Gatherv float64 send 2 root=0", 0))},
    "64_ranks_grouped": (
        [(rank, 64, done(1, 7) + [pending(8, 30.0, "Barrier") if rank == 37
                                  else pending(8, 30.0 + rank / 100)],
          {} if rank % 2 else TIMEOUT30) for rank in range(64)],
        [f"mcr.debug: 64 files, ranks 0-63 of 64 (reasons: ranks {EVEN} timeout, ranks {ODD} exit)",
         f"  ranks {EVEN} timeout: Allreduce on world did not complete in 30 s",
         "communicator world (ranks 0-63): ranks diverge at call #8",
         "  ranks 0-36,38-63: Allreduce float32[4] SUM  [mpi, blocking] pending for 30.0-30.6 s",
         "  rank 37:          Barrier                   [mpi, blocking] pending for 30.0 s",
         "  (calls #1-#7 agree)"], None),
}


@pytest.mark.parametrize("name", REPORTS)
def test_report(tmp_path, name):
    files, want, check = REPORTS[name]
    for rank, size, calls, *kw in files:
        plant(tmp_path, rank, size, calls, **(kw[0] if kw else {}))
    report = debug.merge([tmp_path])
    agree = ("all_agree", "every_ring_past_the_first_calls", "vector_collectives_agree")
    assert report.status == (0 if name in agree else 1)
    assert report.text().endswith("\n")
    assert report.text().splitlines()[0 if want[0].startswith("mcr.debug:") else 1:] == want
    assert check is None or check(report), report


def test_point_to_point_on_objects_and_all(tmp_path):
    # mpi4py's recv and probe on pickled objects: a receive that timed out failed (its size
    # unknown), shown with how long it waited, not its age at the dump; a probe is "from"
    plant(tmp_path, 0, 2, [call(None, "recv from 1 tag 2", "failed", 4.0, duration=3.0,
                                peer=1, tag=2, nbytes=-1)])
    plant(tmp_path, 1, 2, [pending(None, 4.5, "probe from 0 tag 2", peer=0, tag=2, nbytes=-1)])
    status, out, err = run_cli("--all", tmp_path)
    assert (status, err) == (1, "")
    assert out.splitlines()[1:] == [
        "communicator world (ranks 0-1): no collective call recorded",
        "pending point-to-point:",
        "  rank 0: recv from 1 tag 2, failed after 3.0 s",
        "  rank 1: probe from 0 tag 2, pending for 4.5 s",
        "every call that did not complete, per rank:",
        "  rank 0 (node0 pid 1000): 1 call",
        "    recv from 1 tag 2, failed after 3.0 s",
        "  rank 1 (node0 pid 1001): 1 call",
        "    probe from 0 tag 2, pending for 4.5 s"]
    # --all with the files named, in any order
    plant(tmp_path, 0, 2, done(1, 1) + [pending(2, 8.0),
                                        pending(None, 9.5, "Irecv", peer=1, tag=3)])
    plant(tmp_path, 1, 2, done(1, 1) + [pending(2, 7.0)])
    status, out, err = run_cli("--all", *(tmp_path / f"mcr-flight-{r}.json" for r in (1, 0)))
    assert (status, err) == (1, "")
    assert out.splitlines()[-6:] == [
        "every call that did not complete, per rank:",
        "  rank 0 (node0 pid 1000): 2 calls",
        "    world #2: Allreduce float32[4] SUM  [mpi, blocking] pending for 8.0 s",
        "    Irecv from 1 tag 3, 16 bytes, pending for 9.5 s",
        "  rank 1 (node0 pid 1001): 1 call",
        "    world #2: Allreduce float32[4] SUM  [mpi, blocking] pending for 7.0 s"]


def test_json(tmp_path):
    plant(tmp_path, 0, 2, done(1, 4) + [pending(5, 3.0)], reason="timeout")
    plant(tmp_path, 1, 2, done(1, 4) + [pending(5, 3.0, "Barrier")])
    status, out, err = run_cli("--json", tmp_path)
    assert (status, err) == (1, "")
    data = json.loads(out)
    assert (data["status"], data["size"], data["ranks"], data["missing"]) == (1, 2, [0, 1], [])
    assert data["reasons"] == {"0": "timeout", "1": "exit"}
    comm, = data["comms"]
    assert (comm["label"], comm["members"], comm["agreed_to"], comm["incomplete"]) == (
        "world", [0, 1], 4, None)
    div = comm["divergence"]
    assert (div["seq"], div["kind"]) == (5, "diverge")
    assert [(a["rank"], a["kind"], a["call"]["desc"]) for a in div["ranks"]] == [
        (0, "call", SUM4), (1, "call", "Barrier")]
    assert [c["seq"] for c in data["pending"]["0"]] == [5]


def test_cli_files_and_directory(tmp_path):
    for rank in range(3):
        plant(tmp_path, rank, 3, done(1, 2))
    (tmp_path / "notes.txt").write_text("not a flight file")
    assert run_cli(tmp_path) == (
        0, "mcr.debug: 3 files, ranks 0-2 of 3 (reasons: ranks 0-2 exit)\n"
           "communicator world (ranks 0-2): calls #1-#2 agree, all completed\n", "")
    status, out, _ = run_cli(tmp_path / "mcr-flight-2.json", tmp_path / "mcr-flight-0.json")
    assert status == 1
    assert out.splitlines()[0] == ("mcr.debug: 2 files, ranks 0,2 of 3, no file for rank 1 "
                             "(reasons: ranks 0,2 exit)")


# -- Unusable files: exit status 2, the file named ----------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1 "
                  "column 2)"),
    ("[1, 2]", "must hold a JSON object, holds a list"),
    ('{"version": 2}', "format version 2, this mcr.debug reads version 1"),
    ('{"version": 1, "size": 2}', "missing key 'rank'"),
    ('{"version": 1, "size": 2, "rank": 2}', "'rank' must be in 0-1 (size 2), got 2"),
    ('{"version": 1, "size": "2"}', "'size' must be an integer, got str '2'"),
])
def test_bad_file(tmp_path, text, fragment):
    path = tmp_path / "mcr-flight-1.json"
    path.write_text(text)
    other = plant(tmp_path, 0, 2, done(1, 1))
    with pytest.raises(debug.FlightFileError) as info:
        debug.merge([other, path])
    assert str(info.value) == f"{path}: {fragment}"
    assert run_cli(other, path) == (2, "", f"mcr.debug: {path}: {fragment}\n")


@pytest.mark.parametrize("change, fragment", [
    (lambda r: r["calls"][0].update(seq="1"),
     "calls[0]: 'seq' must be an integer or null, got str '1'"),
    (lambda r: r["calls"][0].update(state="running"),
     "calls[0]: 'state' must be one of pending, done, failed, got 'running'"),
    (lambda r: r["calls"][0].update(age=True), "calls[0]: 'age' must be a number, got bool True"),
    (lambda r: r["calls"][0].pop("desc"), "calls[0]: missing key 'desc'"),
    (lambda r: r["calls"][0].update(comm="tp"),
     "calls[0]: communicator 'tp' is not in 'comms' ('world')"),
    (lambda r: r["calls"].append(dict(r["calls"][0])),
     "calls[1]: a second call #1 on communicator 'world'"),
    (lambda r: r["comms"]["world"].update(members=[1]),
     "comms['world']: 'members' [1] does not include the file's rank 0"),
    (lambda r: r["comms"]["world"].update(members=[0, 5]),
     "comms['world']: 'members' must be world ranks 0-1, got [0, 5]"),
    (lambda r: r.update(job=5), "'job' must be a string or null, got int 5"),
])
def test_bad_field(tmp_path, change, fragment):
    path = plant(tmp_path, 0, 2, done(1, 1))
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    with pytest.raises(debug.FlightFileError) as info:
        debug.merge([path])
    assert str(info.value) == f"{path}: {fragment}"


def test_files_of_different_jobs(tmp_path):
    a = plant(tmp_path, 0, 2, done(1, 1))
    b = plant(tmp_path, 1, 4, done(1, 1), comms=world(4, 2))
    assert run_cli(tmp_path) == (2, "", f"mcr.debug: files from different jobs (sizes "
                                        f"[2, 4]): {a}: size 2; {b}: size 4\n")
    # a rank of the second run died without writing: its file is the first run's
    a = plant(tmp_path, 0, 2, done(1, 2), job="prterun-node0-4242@1")
    b = plant(tmp_path, 1, 2, done(1, 1), job="prterun-node0-977@1")
    assert run_cli(tmp_path) == (2, "", "mcr.debug: files from different jobs (prterun-node0-"
                                        f"4242@1, prterun-node0-977@1): {a}: job prterun-node0-"
                                        f"4242@1; {b}: job prterun-node0-977@1\n")
    (tmp_path / "old").mkdir()
    c = plant(tmp_path / "old", 0, 2, done(1, 2))
    with pytest.raises(debug.FlightFileError) as info:
        debug.merge([a, c])
    assert str(info.value) == f"{a} and {c}: both are rank 0 (files of two jobs?)"


@pytest.mark.parametrize("other", [None, "absent"])
def test_files_of_one_named_job_or_of_no_known_job(tmp_path, other):
    # a file without a name (an unnamed job, or an older recorder's) is not refused
    plant(tmp_path, 0, 2, done(1, 2), job="slurm 77.0")
    plant(tmp_path, 1, 2, done(1, 2), **({} if other == "absent" else {"job": other}))
    report = debug.merge([tmp_path])
    assert report.ranks == [0, 1] and all(c.ok for c in report.comms)


def test_no_paths_an_empty_directory_and_a_missing_file(tmp_path):
    status, out, err = run_cli()
    assert (status, out) == (2, "")
    assert "usage: python -m mcr.debug" in err and "Traceback" not in err
    assert run_cli(tmp_path) == (
        2, "", f"mcr.debug: {tmp_path}: a directory without mcr-flight-*.json files\n")
    with pytest.raises(debug.FlightFileError, match="^paths: no flight-recorder file given$"):
        debug.merge([])
    missing = tmp_path / "mcr-flight-9.json"
    assert run_cli(missing)[::2] == (2, f"mcr.debug: {missing}: cannot read it (No such "
                                        "file or directory)\n")


# -- Real jobs: vector collectives, each rank with its own counts ---------------------------

# counts[k]: what rank k contributes, uneven and 0 for rank 2; Alltoallv: rank r sends
# moved(r, k) elements to rank k, each 10 * r + k
VECTOR_HEAD = """
import sys, torch, mcr
comm = mcr.COMM_WORLD
r, n = comm.rank, comm.size
counts = [(k + 1) % 3 for k in range(n)]
total = sum(counts)
def moved(src, dst):
    return (src + 2 * dst) % 3
def blocks(sizes, values):
    return torch.cat([torch.full((c,), float(v)) for c, v in zip(sizes, values)])
"""

VECTOR_AGREE = VECTOR_HEAD + """
def check(what, got, want):
    assert torch.equal(got, want), (what, r, got, want)
mine = torch.full((counts[r],), float(r))
out = torch.empty(total) if r == n - 1 else None
comm.Gatherv(mine, [out, counts] if r == n - 1 else None, root=n - 1)             # 1
if r == n - 1:
    check("Gatherv", out, blocks(counts, range(n)))
whole = torch.arange(float(total))
got = torch.empty(counts[r])
comm.Scatterv([whole, counts] if r == 0 else None, got, root=0)                   # 2
check("Scatterv", got, whole[sum(counts[:r]):sum(counts[:r + 1])])
out = torch.empty(total)
comm.Allgatherv(mine, [out, counts])                                              # 3
check("Allgatherv", out, blocks(counts, range(n)))
send = [moved(r, k) for k in range(n)]
recv = [moved(k, r) for k in range(n)]
for post in (comm.Alltoallv, lambda s, d: comm.Ialltoallv(s, d).Wait()):          # 4, 5
    out = torch.empty(sum(recv))
    post([blocks(send, [10 * r + k for k in range(n)]), send], [out, recv])
    check("Alltoallv", out, blocks(recv, [10 * k + r for k in range(n)]))
got = torch.empty(counts[r])
comm.Reduce_scatter(torch.full((total,), float(r + 1)), got, counts)              # 6
check("Reduce_scatter", got, torch.full((counts[r],), n * (n + 1) / 2))
print(f"rank {r}: all correct", flush=True)
"""

# with MCR_CHECK=1: each mismatch on a communicator of its own, made in this order (so
# labelled #1-#4), where every rank raises before any communicates
VECTOR_DIVERGE = VECTOR_HEAD + """
last = n - 1
def mismatched(call):
    try:
        call()
    except mcr.MismatchError as exc:
        print(f"rank {r}: MismatchError: {exc}", flush=True)
sums, roots, ops, types = (comm.Dup() for _ in range(4))                          # 1-4
# the last rank sends one element more than the root takes from it
mismatched(lambda: sums.Gatherv(torch.ones(counts[r] + (r == last)),
                                [torch.empty(total), counts] if r == 0 else None, root=0))
# the last rank names itself the root
root = last if r == last else 0
mismatched(lambda: roots.Scatterv([torch.ones(total), counts] if r == root else None,
                                  torch.empty(counts[r]), root=root))
# the last rank calls Scatterv, the others Gatherv
mismatched(lambda: ops.Scatterv(None, torch.empty(counts[r]), root=0) if r == last else
           ops.Gatherv(torch.ones(counts[r]), [torch.empty(total), counts] if r == 0
                       else None, root=0))
# the last rank gathers float64
kind = torch.float64 if r == last else torch.float32
mismatched(lambda: types.Allgatherv(torch.ones(counts[r], dtype=kind),
                                    [torch.empty(total, dtype=kind), counts]))
"""


def _recorded_job(tmp_path, nprocs, code, **env):
    """`code` run on `nprocs` ranks with the flight recorder on: its output (it must end with
    status 0) and the recorder's directory."""
    script, flight = tmp_path / "job.py", tmp_path / "flight"
    script.write_text(code)
    job_env = dict(mpi_env(), MCR_FLIGHT_RECORDER=str(flight), **env)
    job_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, job_env.get("PYTHONPATH")]))
    for key in ("MCR_CHECK", "MCR_TIMEOUT"):
        if key not in env:
            job_env.pop(key, None)
    result = launch.run(nprocs, [sys.executable, str(script)], timeout=120, env=job_env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout
    return result.stdout, flight


@pytest.mark.parametrize("nprocs", world_sizes(LAYER_SIZES))
def test_a_correct_job_with_vector_collectives_agrees(tmp_path, nprocs):
    out, flight = _recorded_job(tmp_path, nprocs, VECTOR_AGREE)
    assert out.count(": all correct") == nprocs, out
    ranks = "rank 0" if nprocs == 1 else f"ranks 0-{nprocs - 1}"
    assert run_cli(flight) == (
        0, f"mcr.debug: {nprocs} file{'s' * (nprocs > 1)}, {ranks} of {nprocs} (reasons: "
           f"{ranks} exit)\n"
           f"communicator world ({ranks}): calls #1-#6 agree, all completed\n", "")


@pytest.mark.parametrize("nprocs", world_sizes([2, 3]))
def test_a_job_whose_vector_collectives_diverge_is_reported(tmp_path, nprocs):
    out, flight = _recorded_job(tmp_path, nprocs, VECTOR_DIVERGE, MCR_CHECK="1")
    assert out.count("MismatchError") == 4 * nprocs, out
    members = f"0-{nprocs - 1}"
    counts = [(k + 1) % 3 for k in range(nprocs)]
    report = debug.merge([flight])
    assert report.status == 1
    found = {c.label: c for c in report.comms}
    assert found["world"].ok and found["world"].agreed_to == 4, report.text()
    sums, roots, ops, types = (found[f"{members}#{i}"] for i in range(1, 5))
    for comm in (sums, roots, ops, types):
        assert comm.divergence is not None and comm.divergence.seq == 1, report.text()
        assert all(a.kind == "call" for a in comm.divergence.ranks), report.text()
    assert sums.divergence.why == (f"counts that do not add up: the ranks send "
                                   f"{sum(counts) + 1} elements in all and receive "
                                   f"{sum(counts)}")
    calls = {name: [a.call for a in comm.divergence.ranks]
             for name, comm in (("roots", roots), ("ops", ops), ("types", types))}
    assert [c.root for c in calls["roots"]] == [0] * (nprocs - 1) + [nprocs - 1]
    assert [c.op for c in calls["ops"]] == ["Gatherv"] * (nprocs - 1) + ["Scatterv"]
    assert [c.desc for c in calls["types"]] == [f"Allgatherv float32[{sum(counts)}]"] * (
        nprocs - 1) + [f"Allgatherv float64[{sum(counts)}]"]
    assert all(comm.divergence.why == "" for comm in (roots, ops, types))
    text = " ".join(report.text().split())
    assert (f"communicator {members}#1 (ranks {members}): ranks diverge at call #1 "
            f"(counts that do not add up") in text, text
