"""Find where the ranks of a hung or failed job went apart, from the files of
mcr's flight recorder.

With ``MCR_FLIGHT_RECORDER=DIR`` set, each rank writes ``DIR/mcr-flight-<world
rank>.json`` when it raises :class:`mcr.TimeoutError` or
:class:`mcr.MismatchError`, and at exit: its most recent calls, each with its
communicator, the communicator's collective number (``seq``), a description
(the same on every member rank but for the elements each sends and receives
in a vector collective), and whether it completed. This module reads those
files and says, per communicator, on which collective call the ranks stopped
agreeing::

    python -m mcr.debug DIR                      # every mcr-flight-*.json in DIR
    python -m mcr.debug FILE [FILE ...]          # these files, in any order
    python -m mcr.debug --all DIR                # also every pending call, per rank
    python -m mcr.debug --json DIR               # the analysis as JSON

or, from Python, ``mcr.debug.merge(paths)``, which returns a :class:`Report`
(``report.text()`` is what the command prints). Importing this module
initializes no MPI and loads neither mcr's core nor torch: it runs anywhere the
files are.

**What it finds.** For each communicator (a label with its member ranks: two
groups made by one split may share a label) it walks the collective numbers
upward, from the oldest call any member's file holds, and names

- the first call on which the ranks **diverge**: a rank made another call
  (another operation, element type, count, reduction op, backend or root), the
  elements the ranks send in a vector collective (``Gatherv``, ``Scatterv``,
  ``Alltoallv``) do not add up to those they receive, or a rank made no
  call with that number (it stopped earlier: its last collective on that
  communicator is named, with whether it completed), or a member rank has no
  file;
- the first call that **did not complete** on some rank (pending, or failed
  with an error), when it comes before the divergence: a collective that
  never finished.

A call that one file still holds and another no longer does was compared on
the ranks that have it; the one that dropped it completed it (the recorder
keeps every pending call), so a pending call kept from long ago is found too.
Calls recorded without a number are point-to-point (and ``Create_group``,
which only the group's processes make); the oldest one still pending on
each rank is listed (``--all`` lists every pending call of every
rank, collectives included).

**The report** is plain text; ranks whose lines are the same are written once
(``ranks 1-3:``, their times as a range), so a 64-rank report stays short::

    mcr.debug: 2 files, ranks 0-1 of 2 (reasons: rank 0 timeout, rank 1 exit)
      rank 0 timeout: Allreduce on world did not complete in 30 s
    communicator world (ranks 0-1): ranks diverge at call #17
      rank 0: Allreduce float32[4] SUM  [mpi, blocking] pending for 31.2 s
      rank 1: Bcast float32[4] root=0   [mpi, blocking] pending for 30.9 s
      (calls #1-#16 agree)
    pending point-to-point:
      rank 0: Recv from 1 tag 5, 16 bytes, pending for 40.0 s

**Exit status**: 0 when every communicator's calls agree on every rank, every
call completed and every rank of the job has a file; 1 when a divergence, a
call that did not complete or a missing rank file was found (the report says
which); 2 when the files cannot be used (unreadable, not JSON, another format
version, a field missing or of the wrong type, files of jobs of different
sizes or of two jobs their launchers named, two files for one rank): the
message, on stderr, names the file and what is wrong, and nothing is
analysed.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import glob
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VERSION", "FILE_PATTERN", "FlightFileError", "Call", "CommInfo", "FlightFile",
           "RankAt", "Finding", "CommReport", "Report", "read", "flight_paths", "merge", "main"]

VERSION = 1                          # the format version this module reads
FILE_PATTERN = "mcr-flight-*.json"   # what a directory argument stands for
STATES = ("pending", "done", "failed")


class FlightFileError(ValueError):
    """A flight-recorder file cannot be used; the message names the file."""


# ---------------------------------------------------------------------------
# The files

@dataclass(frozen=True)
class Call:
    """One recorded call, as the file has it.

    ``seq`` is the communicator's collective number, None for point-to-point
    and ``Create_group`` (made by some of its processes only);
    ``peer``, ``root`` and ``tag`` are -1 where they do not apply, ``bytes``
    where it is not known (a pickled object not yet received); ``age`` is
    the seconds since the call was posted, at the dump; ``duration`` the
    seconds a completed call took, or a failed call until it failed (None
    while pending).
    """

    comm: str
    seq: int | None
    op: str
    form: str
    backend: str
    desc: str
    peer: int
    root: int
    tag: int
    bytes: int
    state: str
    age: float
    duration: float | None


@dataclass(frozen=True)
class CommInfo:
    """A communicator as one rank's file has it: its member world ranks, the
    number its next collective would get and the oldest number still in the file
    (None when the file has none)."""

    members: tuple[int, ...]
    next_seq: int
    first_seq: int | None


@dataclass(frozen=True)
class FlightFile:
    """One rank's flight-recorder file, read and checked."""

    path: str
    rank: int
    size: int
    job: str | None     # the launcher's name of the job, where it gives one
    host: str
    pid: int
    time: float
    reason: str
    message: str
    comms: dict[str, CommInfo]
    calls: tuple[Call, ...]


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):        # (int, float): any JSON number
        return "a number"
    return {int: "an integer", str: "a string", list: "a list", dict: "an object"}[kind]


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
         nullable: bool = False) -> Any:
    """``obj[key]``, checked to be of ``kind`` (a bool is not a number)."""
    if key not in obj:
        raise FlightFileError(f"{where}: missing key {key!r}")
    value = obj[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = _kind_name(kind) + (" or null" if nullable else "")
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise FlightFileError(f"{where}: {key!r} must be {expected}, got "
                              f"{type(value).__name__} {shown}")
    return value


def _read_call(obj: Any, where: str) -> Call:
    if not isinstance(obj, dict):
        raise FlightFileError(f"{where}: must be an object, got {type(obj).__name__}")
    seq = _get(obj, "seq", int, where, nullable=True)
    if seq is not None and seq < 1:
        raise FlightFileError(f"{where}: 'seq' must be 1 or more (or null), got {seq}")
    state = _get(obj, "state", str, where)
    if state not in STATES:
        raise FlightFileError(f"{where}: 'state' must be one of {', '.join(STATES)}, "
                              f"got {state!r}")
    duration = _get(obj, "duration", (int, float), where, nullable=True)
    return Call(comm=_get(obj, "comm", str, where), seq=seq, op=_get(obj, "op", str, where),
                form=_get(obj, "form", str, where), backend=_get(obj, "backend", str, where),
                desc=_get(obj, "desc", str, where), peer=_get(obj, "peer", int, where),
                root=_get(obj, "root", int, where), tag=_get(obj, "tag", int, where),
                bytes=_get(obj, "bytes", int, where), state=state,
                age=float(_get(obj, "age", (int, float), where)),
                duration=None if duration is None else float(duration))


def _read_comm(label: str, obj: Any, rank: int, size: int, where: str) -> CommInfo:
    where = f"{where}: comms[{label!r}]"
    if not isinstance(obj, dict):
        raise FlightFileError(f"{where}: must be an object, got {type(obj).__name__}")
    members = _get(obj, "members", list, where)
    if not all(isinstance(m, int) and not isinstance(m, bool) and 0 <= m < size
               for m in members):
        raise FlightFileError(f"{where}: 'members' must be world ranks 0-{size - 1}, "
                              f"got {members!r}")
    if len(set(members)) != len(members):
        raise FlightFileError(f"{where}: 'members' lists a rank twice: {members!r}")
    if rank not in members:
        raise FlightFileError(f"{where}: 'members' {members!r} does not include the "
                              f"file's rank {rank}")
    next_seq = _get(obj, "next_seq", int, where)
    first_seq = _get(obj, "first_seq", int, where, nullable=True)
    if next_seq < 1:
        raise FlightFileError(f"{where}: 'next_seq' must be 1 or more, got {next_seq}")
    return CommInfo(tuple(members), next_seq, first_seq)


def read(path: str | os.PathLike[str]) -> FlightFile:
    """Read one rank's flight-recorder file and check its fields.

    Parameters
    ----------
    path : str or path-like
        The file (``mcr-flight-<rank>.json``).

    Returns
    -------
    FlightFile

    Raises
    ------
    FlightFileError
        The file cannot be read, is not JSON, has another format version, or
        a field is missing or of the wrong type; the message names the file and
        the field.
    """
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            obj = json.load(f)
    except OSError as exc:
        raise FlightFileError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise FlightFileError(f"{where}: not JSON (not UTF-8 text: {exc.reason} at byte "
                              f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise FlightFileError(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column "
                              f"{exc.colno})") from None
    if not isinstance(obj, dict):
        raise FlightFileError(f"{where}: must hold a JSON object, holds a "
                              f"{type(obj).__name__}")
    version = _get(obj, "version", int, where)
    if version != VERSION:
        raise FlightFileError(f"{where}: format version {version}, this mcr.debug reads "
                              f"version {VERSION}")
    size = _get(obj, "size", int, where)
    if size < 1:
        raise FlightFileError(f"{where}: 'size' must be 1 or more, got {size}")
    rank = _get(obj, "rank", int, where)
    if not 0 <= rank < size:
        raise FlightFileError(f"{where}: 'rank' must be in 0-{size - 1} (size {size}), "
                              f"got {rank}")
    comms_obj = _get(obj, "comms", dict, where)
    comms = {label: _read_comm(label, info, rank, size, where)
             for label, info in comms_obj.items()}
    calls = tuple(_read_call(c, f"{where}: calls[{i}]")
                  for i, c in enumerate(_get(obj, "calls", list, where)))
    seen: set[tuple[str, int]] = set()
    for i, call in enumerate(calls):
        if call.comm not in comms:
            raise FlightFileError(f"{where}: calls[{i}]: communicator {call.comm!r} is not "
                                  f"in 'comms' ({', '.join(map(repr, comms)) or 'none'})")
        if call.seq is not None:
            if (call.comm, call.seq) in seen:
                raise FlightFileError(f"{where}: calls[{i}]: a second call #{call.seq} on "
                                      f"communicator {call.comm!r}")
            seen.add((call.comm, call.seq))
    # "job" came after version 1's first files: a file without it is of no known job
    job = _get(obj, "job", str, where, nullable=True) if "job" in obj else None
    return FlightFile(path=where, rank=rank, size=size, job=job,
                      host=_get(obj, "host", str, where),
                      pid=_get(obj, "pid", int, where),
                      time=float(_get(obj, "time", (int, float), where)),
                      reason=_get(obj, "reason", str, where),
                      message=_get(obj, "message", str, where), comms=comms, calls=calls)


def flight_paths(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files that ``paths`` name: a directory stands for every
    ``mcr-flight-*.json`` in it.

    Raises
    ------
    FlightFileError
        A directory holds no such file.
    """
    out: list[str] = []
    for path in (os.fspath(p) for p in paths):
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(glob.escape(path), FILE_PATTERN)))
            if not found:
                raise FlightFileError(f"{path}: a directory without {FILE_PATTERN} files")
            out += found
        else:
            out.append(path)
    return out


# ---------------------------------------------------------------------------
# The analysis

@dataclass(frozen=True)
class RankAt:
    """What one member rank has at a communicator's collective number.

    ``kind`` is

    - ``"call"``: the call is in its file (``call``);
    - ``"none"``: it made no call with that number; ``last_seq`` is its last
      collective on the communicator (0: none), ``last`` that call when the file
      still has it;
    - ``"dropped"``: it made the call and the call completed, but its file no
      longer has it (the recorder keeps only the most recent completed calls,
      and every pending one);
    - ``"no comm"``: its file has no communicator of this label and members;
    - ``"no file"``: the rank has no file.
    """

    rank: int
    kind: str
    call: Call | None = None
    last_seq: int = 0
    last: Call | None = None


@dataclass(frozen=True)
class Finding:
    """A collective number where something is wrong, and what each member rank
    has there. ``kind``: ``"diverge"`` or ``"incomplete"``; ``why``, where the
    calls look alike but do not match (a vector collective whose counts do not
    add up), says how."""

    seq: int
    kind: str
    ranks: list[RankAt]
    why: str = ""


@dataclass(frozen=True)
class CommReport:
    """One communicator's result.

    ``compared_from`` is the collective number the comparison started at (the
    oldest one in any member's file), ``agreed_to`` the last number before the
    first finding (or the last number compared): the calls between them agree
    on the ranks whose files have them. From ``complete_from`` (the oldest
    number in every member's file) on, every file has them. ``incomplete`` is
    set only when it comes before ``divergence``.
    """

    label: str
    members: list[int]
    missing: list[int]
    compared_from: int
    complete_from: int
    agreed_to: int
    incomplete: Finding | None
    divergence: Finding | None

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong on this communicator."""
        return not (self.missing or self.incomplete or self.divergence)


@dataclass
class _Track:
    """One rank's collective calls on one communicator."""

    calls: dict[int, Call]
    first: int
    next: int
    in_file: bool

    def at(self, rank: int, seq: int) -> RankAt:
        if not self.in_file:
            return RankAt(rank, "no comm")
        if seq in self.calls:
            return RankAt(rank, "call", self.calls[seq])
        if seq < self.next:
            return RankAt(rank, "dropped")
        return RankAt(rank, "none", last_seq=self.next - 1, last=self.calls.get(self.next - 1))


def _track(f: FlightFile, label: str, members: tuple[int, ...]) -> _Track:
    info = f.comms.get(label)
    if info is None or info.members != members:
        return _Track({}, 1, 1, in_file=False)
    calls = {c.seq: c for c in f.calls if c.comm == label and c.seq is not None}
    # the declared bounds widened to the calls present, so that a recorder off
    # by one still has every call it wrote compared
    first = min([info.next_seq if info.first_seq is None else info.first_seq, *calls])
    return _Track(calls, first, max([info.next_seq, *(s + 1 for s in calls)]), in_file=True)


# The elements a rank sends and receives in a vector collective (Gatherv, Scatterv,
# Alltoallv), as the recorder's description gives them: "Gatherv float32 send 2 recv 5
# root=0". Each rank's own, so they may differ between ranks; a zero is left out.
_MOVES = re.compile(r" (send|recv) (\d+)(?= |$)")


# the element types a description names, and their bytes; a datatype mcr does
# not name is described by its bytes ("Scatter 24-byte[1] root=0")
_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4,
             "int32": 4, "uint64": 8, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4,
             "float64": 8, "complex64": 8, "complex128": 16,
             "longdouble": ctypes.sizeof(ctypes.c_longdouble),
             "clongdouble": 2 * ctypes.sizeof(ctypes.c_longdouble)}
_TYPED = re.compile(r"^(\S+) ((\d+)-byte|[a-z]+\d*)(?:\[(\d+)\])?(?= |$)")


def _unit(m: re.Match[str] | None) -> int | None:
    """The bytes of one element of a description's type (`m`: its _TYPED
    match), or None (no type)."""
    if m is None:
        return None
    return int(m[3]) if m[3] else _ITEMSIZE.get(m[2])


def _in_bytes(c: Call) -> bool:
    """Whether the call moves a datatype mcr does not name: MPI matches it with
    the others' by the bytes of data, not by element type and count."""
    m = _TYPED.match(c.desc)
    return m is not None and m[3] is not None


def _same_call(c: Call, in_bytes: bool = False) -> tuple[str, str, str, int]:
    """What must be equal on every member rank for a collective to match: the
    operation, backend, root and description, less the elements this rank sends
    and receives (its own counts of a vector collective; :func:`_moves_add_up`
    compares their totals). `in_bytes`: the element type and count as bytes
    (where some rank moves a datatype mcr does not name)."""
    desc = _MOVES.sub("", c.desc)
    m = _TYPED.match(desc)
    unit = _unit(m)
    if in_bytes and m is not None and unit is not None:
        size = f"{int(m[4]) * unit} bytes" if m[4] else "bytes"
        desc = f"{m[1]} {size}{desc[m.end():]}"
    return (c.op, desc, c.backend, c.root)


def _moves_add_up(at: Sequence[RankAt]) -> str:
    """Why the elements the member ranks send and receive in a vector collective
    do not add up, or "" when they do or cannot be counted (a rank's file no
    longer has the call, or the call moves no counted elements). In bytes where
    the ranks' elements differ in size."""
    calls = [a.call for a in at if a.call is not None]
    if len(calls) < len(at):
        return ""
    units = {_unit(_TYPED.match(c.desc)) for c in calls if _MOVES.search(c.desc)}
    in_bytes = len(units) > 1 and None not in units
    sent = received = 0
    counted = False
    for c in calls:
        unit = (_unit(_TYPED.match(c.desc)) or 1) if in_bytes else 1
        for way, count in _MOVES.findall(c.desc):
            counted = True
            n = int(count) * unit
            if way == "send":
                sent += n
            else:
                received += n
    if not counted or sent == received:
        return ""
    return f"counts that do not add up: the ranks send {sent} " \
           f"{'bytes of data' if in_bytes else 'elements'} in all and receive {received}"


def _compare(label: str, members: tuple[int, ...], files: Mapping[int, FlightFile]) -> CommReport:
    tracks = {r: _track(files[r], label, members) for r in members if r in files}
    missing = [r for r in members if r not in files]
    # from the oldest call of any file: a call that another file no longer has
    # completed there (pending calls are always kept), so an old pending call
    # kept by one rank is compared too
    start = min(t.first for t in tracks.values())
    complete_from = max(t.first for t in tracks.values())
    end = max(t.next for t in tracks.values()) - 1
    # between these numbers every rank is "dropped" or "none", and the first
    # number where one is "none" is another rank's next
    candidates = sorted({s for t in tracks.values() for s in t.calls if start <= s <= end}
                        | {t.next for t in tracks.values() if start <= t.next <= end}
                        | ({start} if start <= end else set()))
    incomplete: Finding | None = None
    divergence: Finding | None = None
    for seq in candidates:
        at = [tracks[r].at(r, seq) if r in tracks else RankAt(r, "no file") for r in members]
        calls = [a.call for a in at if a.call is not None]
        made = any(a.kind in ("call", "dropped") for a in at)
        stopped = any(a.kind in ("none", "no comm") for a in at)
        in_bytes = any(_in_bytes(c) for c in calls)
        if (made and stopped) or len({_same_call(c, in_bytes) for c in calls}) > 1:
            divergence = Finding(seq, "diverge", at)
            break
        why = _moves_add_up(at)
        if why:
            divergence = Finding(seq, "diverge", at, why)
            break
        if incomplete is None and any(c.state != "done" for c in calls):
            incomplete = Finding(seq, "incomplete", at)
    first_found = incomplete or divergence
    agreed_to = first_found.seq - 1 if first_found else end
    return CommReport(label, list(members), missing, start, complete_from, agreed_to,
                      incomplete, divergence)


@dataclass
class Report:
    """What :func:`merge` found in a job's flight-recorder files.

    Attributes
    ----------
    files : list of str
        The files read, by rank.
    size : int
        The job's number of ranks.
    ranks : list of int
        The world ranks that have a file.
    missing : list of int
        The world ranks that have none.
    reasons : dict of int to str
        Why each rank wrote its file (``"timeout"``, ``"mismatch"``, ``"exit"``).
    messages : dict of int to str
        The error message of each rank that wrote its file on an error.
    hosts : dict of int to str
        Each rank's host and process id (``"node1 pid 1234"``).
    comms : list of CommReport
        Per communicator, those with something wrong first.
    pending : dict of int to list of Call
        Every call that did not complete (pending or failed), per rank, oldest
        first.
    """

    files: list[str]
    size: int
    ranks: list[int]
    missing: list[int]
    reasons: dict[int, str]
    messages: dict[int, str]
    hosts: dict[int, str]
    comms: list[CommReport]
    pending: dict[int, list[Call]]

    @property
    def ok(self) -> bool:
        """Whether every rank has a file, every communicator agrees and every
        call completed."""
        return not self.missing and all(c.ok for c in self.comms) and not any(
            self.pending.values())

    @property
    def status(self) -> int:
        """The exit status of ``python -m mcr.debug``: 0 when :attr:`ok`, else 1."""
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` prints): the fields,
        nested dataclasses as objects, and ``status``; ``json.dumps`` writes the
        rank keys of ``reasons``, ``messages``, ``hosts`` and ``pending`` as
        strings."""
        return {"status": self.status, **dataclasses.asdict(self)}

    def text(self, all_pending: bool = False) -> str:
        """The report as ``python -m mcr.debug`` prints it.

        Parameters
        ----------
        all_pending : bool
            Also list every call that did not complete, per rank (``--all``).
        """
        lines = self._header()
        for comm in self.comms:
            lines += _comm_lines(comm)
        lines += self._p2p_lines()
        if all_pending:
            lines += self._all_pending_lines()
        return "\n".join(lines) + "\n"

    def _header(self) -> list[str]:
        n = len(self.files)
        head = f"mcr.debug: {n} file{'s' * (n != 1)}, {_ranks(self.ranks)} of {self.size}"
        if self.missing:
            head += f", no file for {_ranks(self.missing)}"
        reasons = _by_value(self.reasons)
        head += " (reasons: " + ", ".join(f"{_ranks(r)} {why}" for why, r in reasons) + ")"
        lines = [head]
        said = {r: f"{self.reasons[r]}: {m}" for r, m in self.messages.items() if m}
        for text, ranks in _by_value(said):
            first, *rest = text.splitlines() or [""]
            lines += [f"  {_ranks(ranks)} {first}"] + [f"    {line}" for line in rest]
        return lines

    def _p2p_lines(self) -> list[str]:
        items = []
        for rank, calls in sorted(self.pending.items()):
            p2p = [c for c in calls if c.seq is None]
            if p2p:
                oldest = max(p2p, key=lambda c: c.age)
                more = f" (and {len(p2p) - 1} more)" if len(p2p) > 1 else ""
                items.append(_Item(rank, _p2p_text(oldest), oldest.state, _took(oldest), more))
        if not items:
            return []
        groups = " and Create_group" * any(i.text.startswith("Create_group") for i in items)
        return [f"pending point-to-point{groups}:"] + _lines(_grouped(items), "  ")

    def _all_pending_lines(self) -> list[str]:
        lines = ["every call that did not complete, per rank:"]
        for rank in self.ranks:
            calls = self.pending.get(rank, [])
            count = f"{len(calls)} call{'s' * (len(calls) != 1)}" if calls else "none"
            lines.append(f"  rank {rank} ({self.hosts[rank]}): {count}")
            for c in calls:
                what = _p2p_text(c) if c.seq is None else (
                    f"{c.comm} #{c.seq}: {_coll_text(c)}  [{c.backend}, {c.form}]")
                lines.append(f"    {what} {_state_text(c.state, [_took(c)])}")
        return lines


def merge(paths: Iterable[str | os.PathLike[str]]) -> Report:
    """Read the flight-recorder files of one job and compare the ranks' calls.

    Parameters
    ----------
    paths : iterable of str or path-like
        The files, in any order; a directory stands for every
        ``mcr-flight-*.json`` in it.

    Returns
    -------
    Report

    Raises
    ------
    FlightFileError
        No file given, a file cannot be used (see :func:`read`), the files
        come from jobs of different sizes or from jobs of different names
        (:func:`mcr.launch.job_name`, where the launcher gives one), or two
        files are of the same rank.
    """
    files = sorted((read(p) for p in flight_paths(paths)), key=lambda f: f.rank)
    if not files:
        raise FlightFileError("paths: no flight-recorder file given")
    sizes = {f.size for f in files}
    if len(sizes) > 1:
        named = "; ".join(f"{f.path}: size {f.size}" for f in files)
        raise FlightFileError(f"files from different jobs (sizes {sorted(sizes)}): {named}")
    jobs = {f.job for f in files if f.job is not None}
    if len(jobs) > 1:
        named = "; ".join(f"{f.path}: job {f.job}" for f in files if f.job is not None)
        raise FlightFileError(f"files from different jobs ({', '.join(sorted(jobs))}): "
                              f"{named}")
    by_rank: dict[int, FlightFile] = {}
    for f in files:
        if f.rank in by_rank:
            raise FlightFileError(f"{by_rank[f.rank].path} and {f.path}: both are rank {f.rank} "
                                  f"(files of two jobs?)")
        by_rank[f.rank] = f
    size = files[0].size
    # a communicator is its label and its members: two groups made by one split
    # may carry one label
    comms = dict.fromkeys((label, info.members) for f in files for label, info in f.comms.items())
    results = [_compare(label, members, by_rank) for label, members in comms]
    results.sort(key=lambda c: c.ok)
    return Report(
        files=[f.path for f in files], size=size, ranks=list(by_rank),
        missing=[r for r in range(size) if r not in by_rank],
        reasons={f.rank: f.reason for f in files},
        messages={f.rank: f.message for f in files if f.message},
        hosts={f.rank: f"{f.host} pid {f.pid}" for f in files}, comms=results,
        pending={f.rank: [c for c in f.calls if c.state != "done"] for f in files
                 if any(c.state != "done" for c in f.calls)})


# ---------------------------------------------------------------------------
# The text

def _ranks(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-3``, ``ranks 0,2,4-6``."""
    values = sorted(ranks)
    runs: list[list[int]] = []
    for r in values:
        if runs and runs[-1][-1] == r - 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    spans = ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
    return f"rank{'s' * (len(values) != 1)} {spans}"


def _by_value(mapping: Mapping[int, str]) -> list[tuple[str, list[int]]]:
    """The ranks of each value, in the order of each value's first rank."""
    out: dict[str, list[int]] = {}
    for rank in sorted(mapping):
        out.setdefault(mapping[rank], []).append(rank)
    return list(out.items())


def _coll_text(c: Call) -> str:
    root = f" root={c.root}" if c.root >= 0 and f"root={c.root}" not in c.desc else ""
    return c.desc + root


def _p2p_text(c: Call) -> str:
    where = "" if c.comm == "world" else f" on {c.comm}"
    if c.op == "Create_group":
        return f"Create_group{where} (by the group's processes only),"
    op = c.op.lower()
    way = "to" if "send" in op else "from" if "recv" in op or "probe" in op else "peer"
    peer = "any" if c.peer < 0 else str(c.peer)
    tag = f" tag {c.tag}" if c.tag >= 0 else ""
    size = f" {c.bytes} bytes," if c.bytes >= 0 else ""     # (-1: not known)
    return f"{c.op} {way} {peer}{tag}{where},{size}"


def _took(c: Call) -> float:
    """How long `c` has waited: a failed call until it failed, where the file
    says; else its age at the dump."""
    return c.duration if c.state == "failed" and c.duration is not None else c.age


def _state_text(state: str, ages: Sequence[float]) -> str:
    if state == "done":
        return "done"
    lo, hi = f"{min(ages):.1f}", f"{max(ages):.1f}"
    span = lo if lo == hi else f"{lo}-{hi}"
    return f"pending for {span} s" if state == "pending" else f"failed after {span} s"


@dataclass(frozen=True)
class _Item:
    """One rank's line before grouping: ranks with the same text, state and
    suffix share a line, their ages as a range."""

    rank: int
    text: str
    state: str = ""
    age: float = 0.0
    suffix: str = ""
    column: str = ""          # a second column, aligned across the lines


@dataclass
class _Group:
    """The ranks that share a line, and their ages."""

    item: _Item
    ranks: list[int] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)


def _grouped(items: Iterable[_Item]) -> list[_Group]:
    groups: dict[tuple[str, str, str, str], _Group] = {}
    for item in items:
        group = groups.setdefault((item.text, item.column, item.state, item.suffix),
                                  _Group(item))
        group.ranks.append(item.rank)
        group.ages.append(item.age)
    return sorted(groups.values(), key=lambda g: min(g.ranks))


def _lines(groups: list[_Group], indent: str) -> list[str]:
    """One line per group: its ranks, then its text, the second columns aligned."""
    labels = [f"{_ranks(g.ranks)}:" for g in groups]
    width = max(map(len, labels), default=0)
    text_width = max((len(g.item.text) for g in groups if g.item.column), default=0)
    out = []
    for label, g in zip(labels, groups):
        item = g.item
        state = f" {_state_text(item.state, g.ages)}" if item.state else ""
        text = f"{item.text:<{text_width}}  {item.column}" if item.column else item.text
        out.append(f"{indent}{label:<{width}} {text}{state}{item.suffix}")
    return out


def _rank_item(at: RankAt, seq: int) -> _Item:
    if at.kind == "call" and at.call is not None:
        c = at.call
        return _Item(at.rank, _coll_text(c), c.state, _took(c),
                     column=f"[{c.backend}, {c.form}]")
    if at.kind == "none":
        if at.last_seq == 0:
            why = "no collective on this communicator"
        elif at.last is None:
            why = f"its last on this communicator: #{at.last_seq}, no longer in its file"
        else:
            c = at.last
            why = (f"its last on this communicator: #{at.last_seq} {_coll_text(c)} "
                   f"[{c.backend}, {c.form}], {c.state}")
        return _Item(at.rank, f"no call #{seq} ({why})")
    texts = {"dropped": f"call #{seq} completed, no longer in its file",
             "no comm": "its file has no communicator of this label and these members",
             "no file": "no file"}
    return _Item(at.rank, texts[at.kind])


def _finding_lines(comm: CommReport, found: Finding) -> list[str]:
    head = f"communicator {comm.label} ({_ranks(comm.members)}): "
    if found.kind == "diverge":
        head += f"ranks diverge at call #{found.seq}"
        if found.why:
            head += f" ({found.why})"
    else:
        states = {a.rank: a.call.state for a in found.ranks
                  if a.call is not None and a.call.state != "done"}
        head += f"call #{found.seq} did not complete (" + ", ".join(
            f"{state} on {_ranks(ranks)}" for state, ranks in _by_value(states)) + ")"
    return [head] + _lines(_grouped(_rank_item(a, found.seq) for a in found.ranks), "  ")


def _comm_lines(comm: CommReport) -> list[str]:
    first, last = comm.compared_from, comm.agreed_to
    agreed = (f"calls #{first}-#{last} agree" if last > first else
              f"call #{first} agrees" if last == first else "")
    complete = comm.complete_from
    older = (f"calls before #{complete} are not in every file" if complete > first else
             f"calls before #{first} are no longer in any file" if first > 1 else "")
    if comm.ok or (comm.missing and not (comm.incomplete or comm.divergence)):
        others = [r for r in comm.members if r not in comm.missing]
        head = f"communicator {comm.label} ({_ranks(comm.members)}): "
        if comm.missing:
            head += f"no file for {_ranks(comm.missing)}; "
        if not agreed:
            return [head + (older or "no collective call recorded")]
        on = f" on {_ranks(others)}" if comm.missing else ""
        tail = f" ({older})" if older else ""
        return [f"{head}{agreed}{on}, all completed{tail}"]
    lines = []
    for found in (comm.incomplete, comm.divergence):
        if found is not None:
            lines += _finding_lines(comm, found)
    note = "; ".join(filter(None, [agreed, older]))
    return lines + ([f"  ({note})"] if note else [])


# ---------------------------------------------------------------------------
# The command

def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mcr.debug``: print the report; return the exit status
    (0: all agree, 1: something found, 2: the files cannot be used)."""
    parser = argparse.ArgumentParser(
        prog="python -m mcr.debug",
        description="Find where the ranks of a hung or failed job went apart, from the "
                    "flight-recorder files (MCR_FLIGHT_RECORDER=DIR).",
        epilog="Exit status: 0 all ranks agree and every call completed; 1 a divergence, a "
               "call that did not complete or a missing rank file; 2 unusable files.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help=f"a rank's file, or a directory (every {FILE_PATTERN} in it)")
    parser.add_argument("--all", action="store_true", dest="all_pending",
                        help="also list every call that did not complete, per rank")
    parser.add_argument("--json", action="store_true",
                        help="print the analysis as JSON instead of text")
    args = parser.parse_args(argv)
    try:
        report = merge(args.paths)
    except FlightFileError as exc:
        print(f"mcr.debug: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        sys.stdout.write(report.text(all_pending=args.all_pending))
    return report.status


if __name__ == "__main__":
    sys.exit(main())
