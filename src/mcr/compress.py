"""Compressed collectives: Allreduce, Reduce, Reduce_scatter(_block),
Allgather(v), Gather(v), Scatter(v), Bcast and Alltoall(v) on
float32/float64 buffers, with each payload encoded by a lossy codec before
it goes on the wire and decoded after.

Codecs (``codec(spec)``): ``"fp16"`` and ``"bf16"`` (a cast, 2 bytes per
value), ``"zfp:rate=R"`` (zfp's fixed-rate mode through the ``zfpy`` package,
``R`` bits per value; ``pip install "mcr[zfp]"``), a pair ``(encode,
decode)`` of functions, or a ``Codec``.

The core parses and validates a call exactly as for an uncompressed one, asks
``applies(op, msg)`` whether compression serves it, and if so hands it to
``run``. Every operation here is a short pipeline of *stages*, each one
exchange of encoded bytes (an all-to-all, all-gather or broadcast through
mcr's own ``I...`` methods, on the chosen backend), with local work between
stages: encode, decode, reduce.

Stages and progress
-------------------
The stages run through ``mcr.stages``: stage ``k`` of every compressed
operation of a communicator on one backend runs on a private duplicate of it
(``private_comms(comm, backend).comms[k]``), posted in the same order on every
process, and every wait of the process drives them (see that module).

Algorithms and their precision
------------------------------
``decode(encode(x))`` is written ``Q(x)`` below (the codec's rounding).

- Allreduce (ops SUM, MAX, MIN): the vector of ``n`` elements is cut into
  ``size`` chunks, chunk ``i`` of ``n // size`` elements plus one for
  ``i < n % size``. Each rank encodes its chunk ``j`` and sends it to rank
  ``j`` (stage 0: all-to-all); rank ``j`` decodes the ``size`` chunks it got
  and reduces them in rank order (``((Q(x0) + Q(x1)) + Q(x2)) + ...``) in the
  buffer's own type (float32 stays float32, float64 float64), encodes the
  reduced chunk, and all ranks gather the encoded reduced chunks (stage 1)
  and decode them, the owner its own too. So every rank gets the same bits:
  ``Q(fold(Q(x_0[c]), ..., Q(x_{size-1}[c])))`` for each chunk ``c``: each
  input rounded once by the codec, the sum exact-order in full precision,
  the result rounded once more.
- Reduce (the same ops): as Allreduce, with the encoded reduced chunks
  gathered at the root only (stage 1: a gather), which decodes them: the
  root gets the bits Allreduce gives.
- Reduce_scatter(_block) (the same ops): each rank encodes the block of
  every rank and sends it to that rank (stage 0: all-to-all); each rank
  decodes the ``size`` blocks of its own and reduces them in rank order:
  ``fold(Q(x_0[j]), ..., Q(x_{size-1}[j]))`` for rank ``j``'s block, rounded
  once by the codec, not twice (the reduced block is not sent again).
- Allgather(v): each rank encodes its block, all gather the encoded blocks
  and decode every block into place, their own too: every rank holds
  ``Q(block)`` of every rank.
- Gather(v): each rank encodes its block and the root gathers and decodes
  them (its own too: ``Q(block)`` of every rank; in place, the root's block
  stays as it is).
- Scatter(v): the root encodes each block and scatters them, each rank
  decodes its own (the root too: ``Q(block)``; in place, the root's block
  stays as it is).
- Bcast: the root encodes, broadcasts, the others decode (``Q(buf)``); the
  root's buffer is not changed.
- Alltoall(v): each rank encodes each block it sends, exchanges them, and
  decodes each block it receives (its own block to itself too).

``fp16``/``bf16`` round to nearest even; a value beyond the float16 range
(abs above 65504) becomes inf, and bf16 keeps float32's range with 8 bits of
significand. zfp's fixed-rate mode bounds the size, not the error: the error
of a value depends on the values of its block of 4 (see the docs page for
the bound the tests check).

Wire size
---------
A payload's size comes from ``Codec.wire_nbytes(numel, dtype)`` when it
returns an int (fp16/bf16: ``2 * numel``; zfp fixed-rate: the zfp stream's
size); when it returns None (user codecs), the sizes are exchanged first, in
one more stage of int64 (an all-to-all, all-gather or broadcast). A codec's
``wire_nbytes`` must return None for every size or for none.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch
from mpi4py import MPI

from mcr import _core, stages
from mcr import backends as _backends
from mcr.backends import compose
from mcr.backends.message import Side
from mcr.stages import Pipeline as _Pipeline
from mcr.stages import Post as _Post
from mcr.stages import private_comms

__all__ = ["SUPPORTED_OPS", "FORMS", "Codec", "codec", "applies", "usable", "check", "run",
           "private_comms"]

SUPPORTED_OPS: tuple[str, ...] = ("Allreduce", "Reduce", "Reduce_scatter_block",
                                  "Reduce_scatter", "Allgather", "Allgatherv", "Gather",
                                  "Gatherv", "Scatter", "Scatterv", "Bcast", "Alltoall",
                                  "Alltoallv")
# the reductions among them, and where their op comes in their arguments
_OP_ARG = {"Allreduce": 2, "Reduce": 2, "Reduce_scatter_block": 2, "Reduce_scatter": 3}
FORMS: tuple[str, ...] = ("blocking", "nonblocking", "persistent")
REDUCTIONS: tuple[str, ...] = ("SUM", "MAX", "MIN")
_FLOATS = {"float32": torch.float32, "float64": torch.float64}
_BYTE = torch.uint8
_SIZE = torch.int64            # the element type of exchanged payload sizes


# -- Codecs ---------------------------------------------------------------------------


class Codec:
    """A lossy encoding of float32/float64 tensors for the wire.

    Subclass it and define ``encode`` and ``decode`` (and ``wire_nbytes``
    when the payload's size follows from the element count), or pass an
    ``(encode, decode)`` pair to ``codec``.
    """

    name = "codec"

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The payload of ``x`` (a 1-D contiguous float32/float64 tensor): a
        tensor of any type on ``x``'s device; its bytes travel."""
        raise NotImplementedError(f"compress: codec {self.name!r} does not define encode")

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        """Write the values ``payload`` (the bytes ``encode`` made, as a uint8
        tensor) encodes into ``out`` (1-D, the type and length encoded)."""
        raise NotImplementedError(f"compress: codec {self.name!r} does not define decode")

    def wire_nbytes(self, numel: int, dtype: torch.dtype) -> int | None:
        """The payload's size in bytes for ``numel`` elements of ``dtype``, or
        None when it depends on the values (the sizes are then exchanged)."""
        return None

    def __repr__(self) -> str:
        return f"<mcr.compress.Codec {self.name!r}>"


class _Cast(Codec):
    """fp16 or bf16: a cast, rounding to nearest even, on the tensor's device."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(payload.view(self.dtype))

    def wire_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        return 2 * numel


_ZFP_HEADER_BITS = 96          # zfpy's full header: magic 32, metadata 52, mode 12


class _Zfp(Codec):
    """zfp fixed-rate on host memory (zfpy); CUDA tensors go through host copies."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.name = f"zfp:rate={rate:g}"
        self.zfpy = _import_zfpy(self.name)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return torch.empty(0, dtype=_BYTE, device=x.device)
        stream = self.zfpy.compress_numpy(x.detach().cpu().numpy(), rate=self.rate)
        return torch.frombuffer(bytearray(stream), dtype=_BYTE).to(x.device)

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        if out.numel() == 0:
            return
        values = self.zfpy.decompress_numpy(payload.cpu().numpy().tobytes())
        if values.size != out.numel():
            raise ValueError(f"compress: {self.name} decoded {values.size} values, "
                             f"expected {out.numel()}")
        out.copy_(torch.from_numpy(values.reshape(-1)))

    def wire_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        # zfp codes 1-D arrays in blocks of 4 values, each of floor(4 R + 1/2)
        # bits, after the header; the stream is
        # flushed to 64-bit words
        if numel == 0:
            return 0
        block = math.floor(4 * self.rate + 0.5)
        bits = _ZFP_HEADER_BITS + -(-numel // 4) * block
        return -(-bits // 64) * 8


class _User(Codec):
    """A user's ``(encode, decode)`` pair: ``encode(x) -> tensor``,
    ``decode(payload, like) -> tensor`` with ``like.numel()`` elements."""

    def __init__(self, encode: Callable[[torch.Tensor], Any],
                 decode: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
        self.name = f"({getattr(encode, '__name__', 'encode')}, " \
                    f"{getattr(decode, '__name__', 'decode')})"
        self.encode_fn, self.decode_fn = encode, decode

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        payload = self.encode_fn(x)
        if not isinstance(payload, torch.Tensor):
            raise TypeError(f"compress: encode of codec {self.name} must return a torch "
                            f"tensor, returned {type(payload).__name__}")
        return payload

    def decode(self, payload: torch.Tensor, out: torch.Tensor) -> None:
        values = self.decode_fn(payload, out)
        if not isinstance(values, torch.Tensor) or values.numel() != out.numel():
            got = (f"a tensor of {values.numel()} elements" if isinstance(values, torch.Tensor)
                   else type(values).__name__)
            raise TypeError(f"compress: decode of codec {self.name} must return a tensor of "
                            f"{out.numel()} elements, returned {got}")
        out.copy_(values.reshape(-1))


def _import_zfpy(name: str) -> Any:
    try:
        zfpy = importlib.import_module("zfpy")      # an optional extra, without stubs
    except ImportError:
        raise ImportError(f"compress: codec {name!r} needs the zfpy package: "
                          'pip install "mcr[zfp]"') from None
    return zfpy


_SPEC_HELP = ("'fp16', 'bf16', 'zfp:rate=R', an (encode, decode) pair of callables or an "
              "mcr.compress.Codec")


def codec(spec: object) -> Codec:
    """The codec ``spec`` names (cached per spec where it is hashable).

    Parameters
    ----------
    spec : str, tuple or Codec
        ``"fp16"``, ``"bf16"``, ``"zfp:rate=R"`` (R bits per value, 3 <= R <= 64),
        a pair ``(encode, decode)`` of callables, or a ``Codec`` (returned as is).

    Raises
    ------
    TypeError
        For a spec of another kind.
    ValueError
        For an unknown codec name or a bad rate.
    ImportError
        For zfp when zfpy is not installed.
    """
    if isinstance(spec, Codec):
        return spec
    try:
        found = _CACHE.get(spec)
    except TypeError:               # a pair with an unhashable callable: not cached
        found = None
    if found is not None:
        return found
    if isinstance(spec, str):
        made = _named(spec)
    elif isinstance(spec, tuple) and len(spec) == 2 and all(callable(f) for f in spec):
        made = _User(*spec)
    else:
        raise TypeError(f"compress: expected {_SPEC_HELP}, got {spec!r}")
    if len(_CACHE) < 64:
        try:
            _CACHE[spec] = made
        except TypeError:
            pass
    return made


_CACHE: dict[object, Codec] = {}    # codecs by spec (names, hashable pairs)


def _named(spec: str) -> Codec:
    if spec == "fp16":
        return _Cast("fp16", torch.float16)
    if spec == "bf16":
        return _Cast("bf16", torch.bfloat16)
    if spec == "zfp" or spec.startswith("zfp:"):
        found = re.fullmatch(r"zfp:rate=([0-9.eE+-]+)", spec)
        rate = _number(found.group(1)) if found else None
        if rate is None or not 3 <= rate <= 64:
            # below 3 bits per value, a block of 4 values holds less than a
            # float64 exponent, and zfpy's stream is no longer of fixed size
            raise ValueError(f"compress: expected 'zfp:rate=R' with R bits per value, "
                             f"3 <= R <= 64, got {spec!r}")
        return _Zfp(rate)
    raise ValueError(f"compress: unknown codec {spec!r}; expected {_SPEC_HELP}")


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _encoded(c: Codec, x: torch.Tensor) -> torch.Tensor:
    """``c.encode(x)`` as contiguous bytes, checked against ``c.wire_nbytes``."""
    payload = c.encode(x)
    if payload.device != x.device:
        raise ValueError(f"compress: codec {c.name} encoded a tensor on {x.device} into one "
                         f"on {payload.device}; the payload must stay on the tensor's device")
    payload = payload.contiguous().reshape(-1)
    if payload.dtype != _BYTE:
        payload = payload.view(_BYTE)
    expected = c.wire_nbytes(x.numel(), x.dtype)
    if expected is not None and payload.numel() != expected:
        raise ValueError(f"compress: codec {c.name} encoded {x.numel()} elements into "
                         f"{payload.numel()} bytes, its wire_nbytes says {expected}")
    return payload


# -- What compression serves ----------------------------------------------------------


def _sides(op: str, msg: Any) -> tuple[Side, Side]:
    """(send side, receive side) of a parsed message: the one place that
    reads the caller's buffers (Bcast: both are ``buf``)."""
    r = Side(msg.side(1))
    return (r if op == "Bcast" else Side(msg.side(0))), r


def why_not(op: str, msg: Any) -> str | None:
    """Why compression does not serve ``op`` on ``msg``; None when it does."""
    if op not in SUPPORTED_OPS:
        return f"it applies to {', '.join(SUPPORTED_OPS)}, not {op}"
    s, r = _sides(op, msg)
    for side, arg in ((s, "sendbuf"), (r, "recvbuf")):
        if side.kind == "in_place" or side.kind == "null":   # (null: a rooted call's
            continue                                          # other side off the root)
        if side.tname not in _FLOATS:
            what = "a derived datatype" if side.tname is None else side.tname
            return (f"{'buf' if op == 'Bcast' else arg}: compression applies to float32 "
                    f"and float64 elements, got {what}")
    return None


def applies(op: str, msg: Any) -> bool:
    """Whether the compressed path serves ``op`` (a name of ``SUPPORTED_OPS``
    or any other method name) on the parsed message ``msg``: float32/float64
    elements on both sides (or ``IN_PLACE``)."""
    return why_not(op, msg) is None


def usable(op: str, msg: Any, args: Sequence[Any] = ()) -> bool:
    """Whether a communicator's default compression serves this call: it
    applies, and a reduction reduces with SUM, MAX or MIN (other calls run
    uncompressed)."""
    if not applies(op, msg):
        return False
    if op in _OP_ARG:
        try:
            _reduction(op, args)
        except ValueError:
            return False
    return True


def check(op: str, msg: Any, args: Sequence[Any] = ()) -> None:
    """Raise what ``run`` would raise for ``op`` on ``msg`` before it
    communicates: TypeError when compression does not apply, ValueError for
    a reduction's op other than SUM, MAX, MIN."""
    reason = why_not(op, msg)
    if reason is not None:
        raise TypeError(f"compress: {reason}")
    if op in _OP_ARG:
        _reduction(op, args)


def _reduction(what: str, args: Sequence[Any]) -> str:
    """The name of reduction `what`'s op, from its arguments (default SUM)."""
    at = _OP_ARG[what]
    op = args[at] if len(args) > at and args[at] is not None else MPI.SUM
    name = None
    if isinstance(op, MPI.Op):
        name = next((n for n in REDUCTIONS if getattr(MPI, n) == op), None)
    if name is None:
        raise ValueError(f"compress: {what} supports op {', '.join(REDUCTIONS)}, got "
                         f"{_op_text(op)}")
    return name


def _op_text(op: object) -> str:
    if isinstance(op, MPI.Op):
        for n in ("PROD", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC"):
            if op == getattr(MPI, n):
                return n
        return "a user-defined op"
    return repr(op)


# -- Launching an operation ------------------------------------------------------------


def _launch(comm: Any, backend: str, plan: Callable[[list[int]], tuple[int, _Pipeline]],
            on_wire: Callable[[int], object] | None, cuda: bool) -> Any:
    """Post stage 0 of a new operation (mcr.stages) and queue its later
    stages; its Request."""
    sent = [0]
    count, pipeline = plan(sent)
    done = None if on_wire is None else (lambda: on_wire(sent[0]))
    return _core._work_request(backend, [stages.launch(comm, backend, count, pipeline, cuda,
                                                       done)])


# -- Persistent requests --------------------------------------------------------------


def _prequest(comm: Any, op: str, msg: Any, args: Sequence[Any], backend: str,
              start: Callable[[Callable[[int], object] | None], Any]) -> Any:
    """A Prequest whose each Start calls ``start(on_wire)``, which posts and
    returns a Request (the logger records each start, with its bytes on the
    wire)."""
    preq = _core._prequest(comm, lambda: start(preq._note_wire), op, msg, args, backend)
    return preq


# -- The operations --------------------------------------------------------------------


def run(comm: Any, op: str, form: str, msg: Any, args: Sequence[Any], codec_spec: Any,
        backend: str, on_wire: Callable[[int], object] | None = None) -> Any:
    """Run ``op`` compressed.

    Parameters
    ----------
    comm : mcr.Comm
        The communicator.
    op : str
        One of ``SUPPORTED_OPS``.
    form : str
        ``"blocking"`` (returns None once done), ``"nonblocking"`` (returns
        an ``mcr.Request``) or ``"persistent"`` (returns an ``mcr.Prequest``
        whose each Start encodes what the buffers hold then).
    msg : parsed message
        The core's parsed message of ``args`` (``msg.side(0)``, ``msg.side(1)``).
    args : sequence
        The method's arguments in its blocking signature's order (Allreduce:
        sendbuf, recvbuf, op; Bcast: buf, root; the others: sendbuf, recvbuf).
    codec_spec : str, tuple or Codec
        What ``codec`` accepts.
    backend : str
        The backend the exchanges run on: ``"mpi"``, ``"gloo"`` or ``"nccl"``.
    on_wire : callable, optional
        Called with the bytes this rank sends to other ranks for the call,
        once the operation completes (persistent requests: the logger's
        record of each Start is told instead).

    Raises
    ------
    ValueError
        For an unknown op, form or backend, a bad codec, or an Allreduce op
        other than SUM, MAX, MIN.
    TypeError
        When compression does not apply to the message (elements not
        float32/float64) or the codec spec is of a wrong kind.
    """
    if op not in SUPPORTED_OPS:
        raise ValueError(f"compress: op: expected one of {', '.join(SUPPORTED_OPS)}, "
                         f"got {op!r}")
    if form not in FORMS:
        raise ValueError(f"compress: form: expected one of {', '.join(FORMS)}, got {form!r}")
    if backend not in _backends.names():        # the built-in ones and the plug-ins
        raise ValueError(f"compress: backend: expected one of {', '.join(_backends.names())}, "
                         f"got {backend!r}")
    c = codec(codec_spec)
    check(op, msg, args)
    s, r = _sides(op, msg)
    size, rank = comm.Get_size(), comm.Get_rank()

    def plan(sent: list[int]) -> tuple[int, _Pipeline]:
        return _PLANS[op](c, backend, size, rank, s, r, args, sent)

    cuda = "cuda" in (s.torch_device().type, r.torch_device().type)
    if form == "persistent":
        return _prequest(comm, op, msg, args, backend,
                         lambda note: _launch(comm, backend, plan, note, cuda))
    req = _launch(comm, backend, plan, on_wire, cuda)
    if form == "blocking":
        req.Wait()
        return None
    return req


def _fixed(c: Codec, counts: Sequence[int], dtype: torch.dtype) -> list[int] | None:
    """The payload sizes of blocks of ``counts`` elements, or None when the
    codec's sizes depend on the values."""
    sizes = [c.wire_nbytes(n, dtype) for n in counts]
    if any(n is None for n in sizes):
        return None
    return [int(n) for n in sizes if n is not None]


def _offsets(sizes: Sequence[int]) -> list[int]:
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += n
    return out


def _joined(payloads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not payloads:
        return torch.empty(0, dtype=_BYTE, device=device)
    return torch.cat(list(payloads)) if len(payloads) > 1 else payloads[0]


def _decode_all(c: Codec, packed: torch.Tensor, sizes: Sequence[int],
                outs: Sequence[torch.Tensor]) -> None:
    for payload, out in zip(torch.split(packed, list(sizes)), outs):
        if out.numel():
            c.decode(payload, out)


def _alltoallv(backend: str, inp: torch.Tensor, in_sizes: Sequence[int], out: torch.Tensor,
               out_sizes: Sequence[int]) -> _Post:
    def post(private: Any) -> Any:
        return private.Ialltoallv([inp, list(in_sizes), _offsets(in_sizes)],
                                  [out, list(out_sizes), _offsets(out_sizes)], backend=backend)
    return post


def _allgatherv(backend: str, mine: torch.Tensor, out: torch.Tensor,
                sizes: Sequence[int]) -> _Post:
    def post(private: Any) -> Any:
        return private.Iallgatherv(mine, [out, list(sizes), _offsets(sizes)], backend=backend)
    return post


def _sizes_alltoall(backend: str, mine: Sequence[int], device: torch.device
                    ) -> tuple[torch.Tensor, _Post]:
    """(the sizes to receive, the post of an all-to-all of one int64 per rank)."""
    inp = torch.tensor(list(mine), dtype=_SIZE, device=device)
    out = torch.empty(len(mine), dtype=_SIZE, device=device)
    return out, lambda private: private.Ialltoall(inp, out, backend=backend)


def _sizes_allgather(backend: str, mine: int, size: int, device: torch.device
                     ) -> tuple[torch.Tensor, _Post]:
    inp = torch.tensor([mine], dtype=_SIZE, device=device)
    out = torch.empty(size, dtype=_SIZE, device=device)
    return out, lambda private: private.Iallgather(inp, out, backend=backend)


def _blocks(x: Side, counts: Sequence[int], displs: Sequence[int]) -> list[torch.Tensor]:
    return [x.typed(n, d) for n, d in zip(counts, displs)]


def _others(sizes: Sequence[int], rank: int) -> int:
    return sum(n for i, n in enumerate(sizes) if i != rank)


# Each plan: (stages, pipeline). A pipeline encodes before its first yield
# (so encoding errors come before any communication), yields one post per
# stage and decodes after the last; ``sent[0]`` collects the bytes this rank
# sends to other ranks.

_Plan = Callable[[Codec, str, int, int, Side, Side, Sequence[Any], list[int]],
                 tuple[int, _Pipeline]]


def _scattered(c: Codec, backend: str, size: int, rank: int, x: Side, counts: list[int],
               fixed: list[int] | None, reduction: str, sent: list[int]
               ) -> Generator[_Post, None, torch.Tensor | None]:
    """Stages that reduce ``x`` (``counts[i]`` elements for rank ``i``, in
    rank order) onto the ranks: each block encoded and sent to its rank
    (their sizes first, unless ``fixed``); this rank's block reduced from the
    decoded operands in rank order (None when it has no elements)."""
    dtype = _FLOATS[x.tname]
    device = x.torch_device()
    chunks = [_encoded(c, t) for t in _blocks(x, counts, _offsets(counts))]
    out_sizes: list[int]
    if fixed is None:
        got, post = _sizes_alltoall(backend, [p.numel() for p in chunks], device)
        sent[0] += 8 * (size - 1)
        yield post
        out_sizes = [int(v) for v in got.tolist()]
    else:
        out_sizes = [fixed[rank]] * size
    in_sizes = [p.numel() for p in chunks]
    inbox = torch.empty(sum(out_sizes), dtype=_BYTE, device=device)
    sent[0] += _others(in_sizes, rank)
    yield _alltoallv(backend, _joined(chunks, device), in_sizes, inbox, out_sizes)
    if not counts[rank]:
        return None
    operands = [torch.empty(counts[rank], dtype=dtype, device=device) for _ in range(size)]
    _decode_all(c, inbox, out_sizes, operands)
    return compose.fold(reduction, operands)


def _root(args: Sequence[Any], at: int) -> int:
    """A rooted call's root, argument ``at`` (default 0)."""
    return int(args[at]) if len(args) > at and args[at] is not None else 0


def _chunks(n: int, size: int) -> list[int]:
    """``n`` elements cut into ``size`` chunks, the first ``n % size`` one longer."""
    return [n // size + (1 if i < n % size else 0) for i in range(size)]


def _plan_allreduce(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                    args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    reduction = _reduction("Allreduce", args)
    counts = _chunks(r.count, size)
    x = r if s.kind == "in_place" else s
    fixed = _fixed(c, counts, _FLOATS[r.tname])
    device = r.torch_device()

    def pipeline() -> _Pipeline:
        mine = yield from _scattered(c, backend, size, rank, x, counts, fixed, reduction, sent)
        reduced = _encoded(c, mine) if mine is not None else \
            torch.empty(0 if fixed is None else fixed[rank], dtype=_BYTE, device=device)
        gathered, sizes = yield from _gathered(backend, reduced, size, device, fixed, sent)
        _decode_all(c, gathered, sizes, _blocks(r, counts, _offsets(counts)))

    return (2 if fixed is not None else 4), pipeline()


def _plan_reduce(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                 args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    reduction = _reduction("Reduce", args)
    root = _root(args, 3)
    x = r if s.kind == "in_place" else s
    counts = _chunks(x.count, size)
    fixed = _fixed(c, counts, _FLOATS[x.tname])
    device = x.torch_device()

    def pipeline() -> _Pipeline:
        mine = yield from _scattered(c, backend, size, rank, x, counts, fixed, reduction, sent)
        reduced = _encoded(c, mine) if mine is not None else \
            torch.empty(0 if fixed is None else fixed[rank], dtype=_BYTE, device=device)
        out, sizes = yield from _gathered_at(backend, reduced, root, rank == root, size,
                                             device, fixed, sent)
        if rank == root:
            _decode_all(c, out, sizes, _blocks(r, counts, _offsets(counts)))

    return (2 if fixed is not None else 4), pipeline()


def _plan_reduce_scatter(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                         args: Sequence[Any], sent: list[int], block: bool = False
                         ) -> tuple[int, _Pipeline]:
    what = "Reduce_scatter_block" if block else "Reduce_scatter"
    reduction = _reduction(what, args)
    counts = [r.count] * size if block else list(r.counts or ())
    x = r if s.kind == "in_place" else s
    fixed = _fixed(c, counts, _FLOATS[x.tname])

    def pipeline() -> _Pipeline:
        mine = yield from _scattered(c, backend, size, rank, x, counts, fixed, reduction, sent)
        if mine is not None:
            r.typed(counts[rank]).copy_(mine)

    return (1 if fixed is not None else 2), pipeline()


def _plan_reduce_scatter_block(c: Codec, backend: str, size: int, rank: int, s: Side,
                               r: Side, args: Sequence[Any], sent: list[int]
                               ) -> tuple[int, _Pipeline]:
    return _plan_reduce_scatter(c, backend, size, rank, s, r, args, sent, True)


def _gathered(backend: str, mine: torch.Tensor, size: int, device: torch.device,
              fixed: list[int] | None, sent: list[int]
              ) -> Generator[_Post, None, tuple[torch.Tensor, list[int]]]:
    """Stages that all-gather every rank's encoded payload ``mine`` (their
    sizes first, unless ``fixed``); (the payloads one after another, their
    sizes)."""
    if fixed is None:
        got, post = _sizes_allgather(backend, mine.numel(), size, device)
        sent[0] += 8 * (size - 1)
        yield post
        sizes = [int(v) for v in got.tolist()]
    else:
        sizes = fixed
    out = torch.empty(sum(sizes), dtype=_BYTE, device=device)
    sent[0] += mine.numel() * (size - 1)
    yield _allgatherv(backend, mine, out, sizes)
    return out, sizes


def _gathered_at(backend: str, mine: torch.Tensor, root: int, here: bool, size: int,
                 device: torch.device, fixed: list[int] | None, sent: list[int]
                 ) -> Generator[_Post, None, tuple[torch.Tensor, list[int]]]:
    """Stages that gather every rank's encoded payload ``mine`` at ``root``
    (``here``: this rank; their sizes first, unless ``fixed``): at the root
    (the payloads one after another, their sizes), elsewhere (nothing, [])."""
    if not here:
        sent[0] += mine.numel()
    if fixed is None:
        inp = torch.tensor([mine.numel()], dtype=_SIZE, device=device)
        got = torch.empty(size if here else 0, dtype=_SIZE, device=device)
        if not here:
            sent[0] += 8
        yield lambda private: private.Igather(inp, got if here else None, root,
                                              backend=backend)
        sizes = [int(v) for v in got.tolist()]
    else:
        sizes = list(fixed) if here else []
    out = torch.empty(sum(sizes), dtype=_BYTE, device=device)
    yield lambda private: private.Igatherv(
        mine, [out, list(sizes), _offsets(sizes)] if here else None, root, backend=backend)
    return out, sizes


def _plan_allgather(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                    args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    counts, displs = r.blocks(size)
    dtype = _FLOATS[r.tname]
    device = r.torch_device()
    fixed = _fixed(c, counts, dtype)

    def pipeline() -> _Pipeline:
        own = r.typed(counts[rank], displs[rank]) if s.kind == "in_place" \
            else s.typed(s.count)
        out, sizes = yield from _gathered(backend, _encoded(c, own), size, device, fixed, sent)
        _decode_all(c, out, sizes, _blocks(r, counts, displs))

    return (1 if fixed is not None else 2), pipeline()


def _plan_gather(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                 args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    root = _root(args, 2)
    here, in_place = rank == root, s.kind == "in_place"
    x = r if in_place else s
    dtype = _FLOATS[x.tname]
    device = x.torch_device()
    counts, displs = r.blocks(size) if here else ([s.count], [0])
    fixed = _fixed(c, counts, dtype)
    if fixed is not None and in_place:
        fixed[root] = 0                 # the root's block stays where it is

    def pipeline() -> _Pipeline:
        payload = torch.empty(0, dtype=_BYTE, device=device) if in_place else \
            _encoded(c, s.typed(s.count))
        out, sizes = yield from _gathered_at(backend, payload, root, here, size, device, fixed,
                                             sent)
        if here:
            outs = _blocks(r, counts, displs)
            if in_place:
                outs[root] = outs[root][:0]
            _decode_all(c, out, sizes, outs)

    return (1 if fixed is not None else 2), pipeline()


def _plan_scatter(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                  args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    root = _root(args, 2)
    here, in_place = rank == root, r.kind == "in_place"
    x = s if here else r
    dtype = _FLOATS[x.tname]
    device = x.torch_device()
    counts, displs = s.blocks(size) if here else ([r.count], [0])
    fixed = _fixed(c, counts, dtype)
    if fixed is not None and in_place:
        fixed[root] = 0                 # the root's block stays where it is

    def pipeline() -> _Pipeline:
        payloads = []
        if here:
            payloads = [_encoded(c, t) for t in _blocks(s, counts, displs)]
            if in_place:
                payloads[root] = payloads[root][:0]
            sent[0] += _others([p.numel() for p in payloads], rank)
        nbytes: int
        if fixed is None:
            inp = torch.tensor([p.numel() for p in payloads], dtype=_SIZE, device=device)
            got = torch.empty(1, dtype=_SIZE, device=device)
            if here:
                sent[0] += 8 * (size - 1)
            yield lambda private: private.Iscatter(inp if here else None, got, root,
                                                   backend=backend)
            nbytes = int(got.item())
        else:
            nbytes = fixed[rank] if here else fixed[0]
        sizes = [p.numel() for p in payloads]
        inbox = torch.empty(nbytes, dtype=_BYTE, device=device)
        packed = _joined(payloads, device)
        yield lambda private: private.Iscatterv(
            [packed, sizes, _offsets(sizes)] if here else None, inbox, root, backend=backend)
        if not (here and in_place) and r.count:
            c.decode(inbox, r.typed(r.count))

    return (1 if fixed is not None else 2), pipeline()


def _plan_bcast(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    root = _root(args, 1)
    dtype = _FLOATS[r.tname]
    device = r.torch_device()
    fixed = _fixed(c, [r.count], dtype)

    def pipeline() -> _Pipeline:
        payload = _encoded(c, r.typed(r.count)) if rank == root else None
        if fixed is None:
            nbytes = torch.tensor([payload.numel() if payload is not None else 0],
                                  dtype=_SIZE, device=device)
            if rank == root:
                sent[0] += 8 * (size - 1)
            yield lambda private: private.Ibcast(nbytes, root, backend=backend)
            total = int(nbytes.item())
        else:
            total = fixed[0]
        buf = payload if payload is not None else \
            torch.empty(total, dtype=_BYTE, device=device)
        if rank == root:
            sent[0] += buf.numel() * (size - 1)
        yield lambda private: private.Ibcast(buf, root, backend=backend)
        if rank != root and r.count:
            c.decode(buf, r.typed(r.count))

    return (1 if fixed is not None else 2), pipeline()


def _plan_alltoall(c: Codec, backend: str, size: int, rank: int, s: Side, r: Side,
                   args: Sequence[Any], sent: list[int]) -> tuple[int, _Pipeline]:
    rcounts, rdispls = r.blocks(size)
    src = r if s.kind == "in_place" else s
    scounts, sdispls = src.blocks(size)
    dtype = _FLOATS[r.tname]
    device = r.torch_device()
    # every rank decides alike whether sizes are exchanged (None for all or none)
    fixed_in = _fixed(c, scounts, dtype)
    fixed_out = _fixed(c, rcounts, dtype)
    fixed = fixed_in is not None and fixed_out is not None

    def pipeline() -> _Pipeline:
        blocks = [_encoded(c, t) for t in _blocks(src, scounts, sdispls)]
        in_sizes = [p.numel() for p in blocks]
        if fixed_out is None:
            got, post = _sizes_alltoall(backend, in_sizes, device)
            sent[0] += 8 * (size - 1)
            yield post
            out_sizes = [int(v) for v in got.tolist()]
        else:
            out_sizes = fixed_out
        out = torch.empty(sum(out_sizes), dtype=_BYTE, device=device)
        sent[0] += _others(in_sizes, rank)
        yield _alltoallv(backend, _joined(blocks, device), in_sizes, out, out_sizes)
        _decode_all(c, out, out_sizes, _blocks(r, rcounts, rdispls))

    return (1 if fixed else 2), pipeline()


_PLANS: dict[str, _Plan] = {
    "Allreduce": _plan_allreduce,
    "Reduce": _plan_reduce,
    "Reduce_scatter_block": _plan_reduce_scatter_block,
    "Reduce_scatter": _plan_reduce_scatter,
    "Allgather": _plan_allgather,
    "Allgatherv": _plan_allgather,
    "Gather": _plan_gather,
    "Gatherv": _plan_gather,
    "Scatter": _plan_scatter,
    "Scatterv": _plan_scatter,
    "Bcast": _plan_bcast,
    "Alltoall": _plan_alltoall,
    "Alltoallv": _plan_alltoall,
}
