"""mcr as a ``torch.distributed`` backend: the process group named ``"mcr"``.

``import mcr`` registers the backend with torch (without initializing MPI);
under ``mpiexec``, ``torch.distributed.init_process_group("mcr")`` then needs
nothing else: rank and size come from MPI, the store is bootstrapped over MPI
(see :mod:`mcr._torchreg`). Each process group holds one mcr communicator
(``group.comm``, a duplicate of ``COMM_WORLD`` or of a subset of it), and every
torch.distributed operation on the group runs on it, on its default backend
(MPI, Gloo, NCCL or ``auto``)::

    import mcr, torch.distributed as dist
    dist.init_process_group("mcr")                        # mpiexec -n 4 python train.py
    dist.all_reduce(tensor)                               # MPI_Allreduce on the tensor
    moe = dist.new_group(backend="mcr", pg_options=mcr.distributed.Options(backend="auto"))

A Python subclass of torch's ``ProcessGroup`` is what PyTorch's own tests use
for out-of-tree backends: torch's functions call its methods directly, and
torch's C++ (DDP's reducer) reaches ``allreduce``, ``broadcast`` and
``allgather`` through pybind11's trampoline. Every collective posts mcr's
non-blocking form, and a call that torch waits for at once
(``async_op=False``) waits for it there: ranks may differ in ``async_op``.
Either returns a :class:`Work` holding the requests and what to do when they
complete (unpack a staged result, divide for ``AVG``).

There is no progress thread: operations progress when the program waits or
tests (``Work.wait``, ``is_completed``, or any mcr wait). ``get_future``
therefore completes the operation before it returns the future, so DDP's
gradient allreduce runs when its bucket is ready, not overlapped with the rest
of the backward pass.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Options", "ProcessGroupMCR", "Work", "create"]


@dataclass
class Options:
    """Options of an ``"mcr"`` process group (``pg_options=`` of
    ``init_process_group`` or ``new_group``).

    Parameters
    ----------
    backend : str, optional
        The mcr backend the group's operations run on: ``"mpi"``, ``"gloo"``,
        ``"nccl"`` or ``"auto"``. Default: the communicator's own default
        (``$MCR_BACKEND``, else ``"mpi"``). Settable later as
        ``group.comm.backend``.
    same_async_op : bool
        A promise that every rank passes the same ``async_op`` to each
        collective of the group. Then a call with ``async_op=False`` runs
        the blocking form, which Open MPI runs faster (a 1 MiB ``all_reduce``
        in about half the time at 2 ranks). Default ``False``: every call
        posts the non-blocking form, as torch lets ranks differ (its ``Join``
        does: it waits at once on the ranks that have joined, not on the
        others); MPI never matches a blocking collective with a non-blocking
        one, so a broken promise hangs.
    """

    backend: str | None = None
    same_async_op: bool = False

    def __post_init__(self) -> None:
        if self.backend is not None:
            from .backends import check_name
            check_name(self.backend)


# torch's reduction -> the MPI op mcr runs (AVG is SUM, then a division)
_OPS = {"SUM": "SUM", "AVG": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX",
        "BAND": "BAND", "BOR": "BOR", "BXOR": "BXOR"}
# ... on bool tensors, where MPI's arithmetic and bitwise ops do not apply:
# the logical op with torch's result (True + True is True, as on Gloo)
_BOOL_OPS = {"SUM": "LOR", "MAX": "LOR", "BOR": "LOR", "PRODUCT": "LAND", "MIN": "LAND",
             "BAND": "LAND", "BXOR": "LXOR"}
# torch's RedOpType by its integer value (reading an enum's name through
# pybind11 costs 2 us a call; its int, 0.6 us)
_KINDS = {int(value): name   # type: ignore[call-overload]
          for name, value in dist.ReduceOp.RedOpType.__members__.items()}

# mpi4py's MPI module and mcr's Request class, bound by create() (importing
# them initializes MPI, which registering the backend must not do)
MPI: Any = None
Request: Any = None

class Work(dist.Work):
    """The outcome of one operation on an ``"mcr"`` group: its mcr requests,
    and what runs once they complete.

    It behaves as torch's own works: ``wait()`` blocks until the operation has
    completed (and raises what it raised), ``is_completed()`` tests without
    blocking, ``get_future()`` gives a completed ``torch.futures.Future``
    holding :meth:`result`.
    """

    def __init__(self, op: str, requests: list[Any], result: list[torch.Tensor],
                 finish: Callable[[], None] | None = None, status: Any = None,
                 timeout: float = 0.0) -> None:
        super().__init__()
        self._op = op
        self._timeout = timeout     # seconds a wait() without its own timeout allows
        self._requests = requests
        self._result = result
        self._finish = finish
        self._status = status
        self._statuses = None if status is None else [status]
        self._error: BaseException | None = None
        self._done = False
        if not requests:
            self._complete()

    def _complete(self) -> None:
        if self._done:          # (a coalesced work completes its parts, some done at once)
            return
        self._done = True
        if self._finish is not None:
            self._finish()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._done = True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the operation has completed.

        Parameters
        ----------
        timeout : datetime.timedelta, optional
            Give up after this long with ``RuntimeError`` (the operation stays
            pending). None or zero: the operation's own timeout (a barrier's:
            see :meth:`ProcessGroupMCR.barrier`), else as long as it takes.

        Returns
        -------
        True
        """
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        seconds = timeout.total_seconds() if timeout else self._timeout
        try:
            if seconds > 0:
                if _test_until(self._requests, time.monotonic() + seconds, self._statuses):
                    self._complete()
            else:
                Request.Waitall(self._requests, self._statuses)
                self._complete()
        except BaseException as exc:
            self._fail(exc)
            raise
        if not self._done:
            raise RuntimeError(f"{self._op}: not completed within {seconds:g} s: Timed out "
                               f"waiting {seconds * 1000:.0f}ms (the operation is still "
                               f"pending)")
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed (tests it: drives progress)."""
        if self._done:
            return True
        try:
            if not Request.Testall(self._requests, self._statuses):
                return False
        except BaseException as exc:
            self._fail(exc)
            return True
        self._complete()
        return True

    def is_success(self) -> bool:
        """Whether the operation has completed without an error."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """What the operation raised, if it failed."""
        return self._error

    def result(self) -> list[torch.Tensor]:
        """The operation's output tensors (valid once it has completed)."""
        return self._result

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future holding :meth:`result`. The operation completes first (mcr
        has no progress thread: see the module's docstring)."""
        self.wait()
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result(self._result)
        return future

    def synchronize(self) -> None:
        """Wait (the stream-ordered wait of torch's NCCL works is a full one here)."""
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        """The sender of a ``recv`` from any source (after it has completed)."""
        if self._status is None:
            raise ValueError(f"{self._op}: source_rank is known only for a receive "
                             f"from any source")
        self.wait()
        return int(self._status.Get_source())

    _source_rank = source_rank


def _tensor(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The one tensor of a torch tensor list (dense, of any strides)."""
    if len(tensors) != 1:
        raise ValueError(f"{op}: the 'mcr' backend takes one tensor per call "
                         f"(got {len(tensors)}); use the *_coalesced calls for several")
    return _strided(tensors[0], op)


def _strided(tensor: torch.Tensor, op: str) -> torch.Tensor:
    if tensor.layout != torch.strided:
        raise TypeError(f"{op}: a tensor of layout {tensor.layout} is not supported; the 'mcr' "
                        "backend, as Gloo, takes sparse tensors in all_reduce only")
    return tensor


# MPI reads and writes contiguous memory: a tensor of other strides (a transpose,
# a chunk along dim 1) moves through a contiguous copy
def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """An input as MPI reads it: ``tensor``, or a contiguous copy of it."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _out(tensor: torch.Tensor, op: str) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """An output as MPI writes it: ``tensor`` and None, or a contiguous copy and what
    copies it back into ``tensor`` once the operation completes."""
    if tensor.is_contiguous():
        return tensor, None
    if any(stride == 0 and n > 1 for stride, n in zip(tensor.stride(), tensor.shape)):
        raise ValueError(f"{op}: the output tensor of shape {tuple(tensor.shape)} and strides "
                         f"{tensor.stride()} repeats its elements (an expanded tensor); pass "
                         "one with memory of its own (tensor.clone())")
    copy = tensor.contiguous()

    def back() -> None:
        tensor.copy_(copy)
    return copy, back


def _then(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """The steps that are not None, one after the other (None when there are none)."""
    todo = [step for step in steps if step is not None]
    if len(todo) < 2:
        return todo[0] if todo else None

    def run() -> None:
        for step in todo:
            step()
    return run


def _flat(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """One contiguous tensor holding ``tensors`` one after the other."""
    if not tensors:
        raise ValueError(f"{op}: empty tensor list")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(f"{op}: the tensors have different dtypes {sorted(map(str, dtypes))}")
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
    """What copies ``flat`` back into ``tensors`` (when the operation completes)."""
    def finish() -> None:
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n
    return finish


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share memory."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _apart(input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``input``, or a copy of it where it shares memory with ``output``: torch
    lets a collective's input and output alias, MPI does not."""
    return input.clone() if _overlap(input, output) else input


def _rows(tensor: torch.Tensor) -> tuple[int, int]:
    """Dim-0 rows, and elements per row (how all_to_all_single's splits count)."""
    if tensor.dim() == 0:
        return 1, 1
    return tensor.shape[0], math.prod(tensor.shape[1:])


# torch's stubs type ProcessGroup's methods with the convenience overloads of
# its C++ binding; torch's functions (and this class) use the options form only
_ProcessGroup: Any = dist.ProcessGroup


class ProcessGroupMCR(_ProcessGroup):  # type: ignore[misc]
    """A torch.distributed process group whose operations run on one mcr
    communicator, ``self.comm``.

    Ranks (``root``, ``dst``, ``src``) are ranks in the group, as torch passes
    them; the communicator numbers its processes the same way. The methods
    take torch's options form, ``(tensors, opts)``, as torch.distributed's
    functions call them; call those functions, not the methods.
    ``timeout`` and ``same_async_op`` are the group's (``init_process_group``'s
    or ``new_group``'s timeout; :class:`Options`).
    """

    def __init__(self, comm: Any, rank: int, size: int,
                 timeout: datetime.timedelta | None = None, same_async_op: bool = False) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self._name = ""
        self._desc = ""
        # the group's timeout (init_process_group's, new_group's): barriers
        # and monitored barriers give up after it, as on Gloo
        self._timeout = timeout.total_seconds() if timeout and timeout.total_seconds() > 0 \
            else 0.0
        # monitored_barrier's messages, apart from the group's own traffic, on
        # MPI whatever the group's backend (they are cancelled on a timeout)
        self._control = comm.Dup()
        self._control.backend = "mpi"
        self._timed_out: list[Work] = []    # timed-out barriers: their requests stay alive
        self._same_async_op = same_async_op     # Options.same_async_op

    # torch keeps a group's name and description on the backends registered
    # with it; this group registers none (it is its own backend), so it keeps
    # them itself. torch looks groups up by this name (destroy_process_group,
    # DeviceMesh, functional collectives).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set (an 'mcr' group not made by "
                               "torch.distributed)")
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    # torch asks a group for its backend per device (init_process_group with a
    # device_id, new_group looking for a communicator to split): this group is
    # its own backend on every device, and neither splits nor coalesces
    supports_splitting = False
    supports_coalescing = False

    def _get_backend(self, device: Any) -> ProcessGroupMCR:
        return self

    # the devices torch asks a group for (a C++ group lists those of the backends
    # registered with it; this one registers none): checkpointing's async_save and
    # broadcast_from_rank0, object collectives' device, look here
    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cpu"), torch.device("cuda")]

    def getBackendName(self) -> str:
        return "mcr"

    def __repr__(self) -> str:
        backend = "(destroyed)" if self.comm is None else repr(self.comm.backend)
        return f"ProcessGroupMCR(rank={self.rank()}, size={self.size()}, backend={backend})"

    # -- helpers -------------------------------------------------------------

    def _op(self, opts: Any, name: str, tensor: torch.Tensor) -> tuple[Any, bool]:
        """The MPI op for torch's ``opts.reduceOp``, and whether it is AVG."""
        kind = _KINDS.get(int(opts.reduceOp.op), "?")
        if kind not in _OPS:
            raise ValueError(f"{name}: reduction {kind} is not supported by the 'mcr' "
                             f"backend (supported: {', '.join(_OPS)})")
        avg = kind == "AVG"
        if avg and not (tensor.is_floating_point() or tensor.is_complex()):
            raise TypeError(f"{name}: ReduceOp.AVG needs a floating-point or complex "
                            f"tensor, got {tensor.dtype}")
        if tensor.dtype == torch.bool:
            return getattr(MPI, _BOOL_OPS[kind]), False
        return getattr(MPI, _OPS[kind]), avg

    def _avg(self, tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
        size = self.size()

        def finish() -> None:
            for t in tensors:
                t.div_(size)
        return finish

    def _run(self, opts: Any, name: str, call: str, args: tuple[Any, ...],
             kwargs: dict[str, Any], result: list[torch.Tensor],
             finish: Callable[[], None] | None = None) -> Work:
        """Post the communicator's ``call`` in its non-blocking form (``I`` +
        the name), and wait for it at once when torch does (``opts.asyncOp``
        false: ``async_op=False``); or run its blocking form then, on a group
        whose ranks agree on ``async_op`` (``Options.same_async_op``).

        torch lets each rank choose ``async_op`` for itself, and MPI never
        matches a blocking collective with a non-blocking one."""
        waits = opts is not None and not opts.asyncOp
        if waits and self._same_async_op:
            getattr(self.comm, call)(*args, **kwargs)
            return Work(name, [], result, finish)
        request = getattr(self.comm, "I" + call.lower())(*args, **kwargs)
        if waits:
            request.Wait()
            return Work(name, [], result, finish)
        return Work(name, [request], result, finish)

    # -- collectives ---------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.AllreduceOptions()
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._sparse_allreduce(tensors[0], opts)
        tensor = _tensor(tensors, "all_reduce")
        mpi_op, avg = self._op(opts, "all_reduce", tensor)
        work, back = _out(tensor, "all_reduce")
        return self._run(opts, "all_reduce", "Allreduce", (MPI.IN_PLACE, work), {"op": mpi_op},
                         [tensor], _then(self._avg([work]) if avg else None, back))

    def _sparse_allreduce(self, tensor: torch.Tensor, opts: Any) -> Work:
        """The sum of a sparse COO tensor over the group, as Gloo makes it: every
        rank gathers the others' indices and values and adds them up. It runs
        at the call; the result replaces ``tensor``'s contents."""
        name = "all_reduce"
        kind = _KINDS.get(int(opts.reduceOp.op), "?")
        if kind != "SUM":
            raise ValueError(f"{name}: a sparse tensor is reduced with ReduceOp.SUM only, "
                             f"got {kind}")
        if tensor.layout != torch.sparse_coo:
            raise TypeError(f"{name}: sparse layout {tensor.layout} is not supported; "
                            f"only torch.sparse_coo (tensor.to_sparse_coo())")
        indices = tensor._indices().contiguous()
        values = tensor._values().contiguous()
        per_value = math.prod(values.shape[1:])
        counts = torch.tensor([indices.shape[1]], dtype=torch.int64)
        every = torch.empty(self.size(), dtype=torch.int64)
        self.comm.Allgather(counts, every)
        nnz = [int(n) for n in every]
        all_indices = torch.empty(indices.shape[0] * sum(nnz), dtype=indices.dtype)
        self.comm.Allgatherv(indices.t().contiguous(),
                             [all_indices, [n * indices.shape[0] for n in nnz]])
        all_values = torch.empty((sum(nnz),) + tuple(values.shape[1:]), dtype=values.dtype)
        self.comm.Allgatherv(values, [all_values, [n * per_value for n in nnz]])
        total = torch.sparse_coo_tensor(all_indices.view(sum(nnz), -1).t(), all_values,
                                        tensor.shape).coalesce()
        tensor.copy_(total)
        return Work(name, [], [tensor])

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.AllreduceCoalescedOptions()
        requests, works, backs = [], [], []
        for tensor in tensors:
            mpi_op, avg = self._op(opts, "all_reduce_coalesced", tensor)
            work, back = _out(_strided(tensor, "all_reduce_coalesced"), "all_reduce_coalesced")
            requests.append(self.comm.Iallreduce(MPI.IN_PLACE, work, op=mpi_op))
            works.append(work)
            backs.append(back)
        return Work("all_reduce_coalesced", requests, list(tensors),
                    _then(self._avg(works) if tensors and avg else None, *backs))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.BroadcastOptions()
        tensor = _tensor(tensors, "broadcast")
        work, back = (_dense(tensor), None) if self.rank() == opts.rootRank \
            else _out(tensor, "broadcast")
        return self._run(opts, "broadcast", "Bcast", (work,), {"root": opts.rootRank}, [tensor],
                         back)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.ReduceOptions()
        tensor = _tensor(tensors, "reduce")
        mpi_op, avg = self._op(opts, "reduce", tensor)
        root = opts.rootRank
        kwargs = {"op": mpi_op, "root": root}
        if self.rank() == root:
            work, back = _out(tensor, "reduce")
            return self._run(opts, "reduce", "Reduce", (MPI.IN_PLACE, work), kwargs, [tensor],
                             _then(self._avg([work]) if avg else None, back))
        return self._run(opts, "reduce", "Reduce", (_dense(tensor), None), kwargs, [tensor])

    def allgather(self, output_tensors: list[list[torch.Tensor]],
                  input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        tensor = _dense(_tensor(input_tensors, "all_gather"))
        outputs = self._one_list(output_tensors, "all_gather")
        staged = torch.empty(sum(t.numel() for t in outputs), dtype=tensor.dtype,
                             device=tensor.device)
        counts = [t.numel() for t in outputs]
        return self._run(opts, "all_gather", "Allgatherv", (tensor, [staged, counts]), {},
                         outputs, _unflatten(staged, outputs))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """``all_gather_coalesced``: ``output_lists[rank][i]`` receives input
        ``i`` of ``rank``, as torch lays them out."""
        name = "all_gather_coalesced"
        if len(output_lists) != self.size():
            raise ValueError(f"{name}: output_tensor_lists has {len(output_lists)} lists for "
                             f"{self.size()} ranks")
        for rank, outputs in enumerate(output_lists):
            if len(outputs) != len(input_tensors):
                raise ValueError(f"{name}: output_tensor_lists[{rank}] has {len(outputs)} "
                                 f"tensors for {len(input_tensors)} inputs")
        works = [self.allgather([[outputs[i] for outputs in output_lists]], [tensor])
                 for i, tensor in enumerate(input_tensors)]
        return self._merged(name, works)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Work:
        name = "all_gather_into_tensor"
        user_output = _strided(output, name)
        if output.numel() != _strided(input, name).numel() * self.size():
            raise ValueError(f"{name}: output has {output.numel()} elements, "
                             f"expected input's {input.numel()} x {self.size()} ranks")
        output, back = _out(user_output, name)
        input = _dense(input)
        send: Any = input
        if _overlap(input, output):     # FSDP's form: the input is this rank's block
            own = output.data_ptr() + self.rank() * input.numel() * input.element_size()
            own_block = input.dtype == output.dtype and input.data_ptr() == own
            send = MPI.IN_PLACE if own_block else input.clone()
        return self._run(opts, name, "Allgather", (send, output), {}, [user_output], back)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return self._merged("all_gather_into_tensor_coalesced",
                            [self.all_gather_single(o, i) for o, i in zip(outputs, inputs)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Work:
        opts = opts or dist.ReduceScatterOptions()
        output = _tensor(output_tensors, "reduce_scatter")
        inputs = self._one_list(input_tensors, "reduce_scatter")
        mpi_op, avg = self._op(opts, "reduce_scatter", output)
        counts = [t.numel() for t in inputs]
        if counts[self.rank()] != output.numel():
            raise ValueError(f"reduce_scatter: output has {output.numel()} elements, but this "
                             f"rank's input block has {counts[self.rank()]}")
        work, back = _out(output, "reduce_scatter")
        return self._run(opts, "reduce_scatter", "Reduce_scatter",
                         (_flat(inputs, "reduce_scatter"), work),
                         {"recvcounts": counts, "op": mpi_op}, [output],
                         _then(self._avg([work]) if avg else None, back))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Work:
        opts = opts or dist.ReduceScatterOptions()
        name = "reduce_scatter_tensor"
        output, input = _strided(output, name), _strided(input, name)
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"{name}: input has {input.numel()} elements, expected "
                             f"output's {output.numel()} x {self.size()} ranks")
        mpi_op, avg = self._op(opts, name, output)
        work, back = _out(output, name)
        return self._run(opts, name, "Reduce_scatter_block", (_apart(_dense(input), work), work),
                         {"op": mpi_op}, [output], _then(self._avg([work]) if avg else None,
                                                         back))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return self._merged("reduce_scatter_tensor_coalesced",
                            [self.reduce_scatter_single(o, i, opts)
                             for o, i in zip(outputs, inputs)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Work:
        name = "all_to_all"
        if len(output_tensors) != self.size() or len(input_tensors) != self.size():
            raise ValueError(f"{name}: expected {self.size()} input and output tensors, got "
                             f"{len(input_tensors)} and {len(output_tensors)}")
        send = _flat(input_tensors, name)
        recv = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype,
                           device=send.device)
        return self._run(opts, name, "Alltoallv", ([send, [t.numel() for t in input_tensors]],
                                                   [recv, [t.numel() for t in output_tensors]]),
                         {}, list(output_tensors), _unflatten(recv, output_tensors))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Work:
        name = "all_to_all_single"
        output, input = _strided(output, name), _strided(input, name)
        # Alltoallv even without splits: a rank that gives even splits, or
        # none, must match the others whichever they do (MPI does not match
        # Alltoall with Alltoallv)
        send = self._splits(input, input_split_sizes, "input_split_sizes")
        recv = self._splits(output, output_split_sizes, "output_split_sizes")
        work, back = _out(output, name)
        return self._run(opts, name, "Alltoallv", ([_apart(_dense(input), work), send],
                                                   [work, recv]), {}, [output], back)

    alltoall_base = all_to_all_single       # the name torch 2.11's all_to_all_single calls

    def _splits(self, tensor: torch.Tensor, splits: list[int], what: str) -> list[int]:
        """Element counts per rank from dim-0 splits (even when none are given)."""
        size, (rows, per) = self.size(), _rows(tensor)
        if not splits:
            if rows % size:
                raise ValueError(f"all_to_all_single: {rows} rows do not split evenly over "
                                 f"{size} ranks; give {what}")
            return [rows // size * per] * size
        if len(splits) != size:
            raise ValueError(f"all_to_all_single: {what} has {len(splits)} entries for "
                             f"{size} ranks")
        if min(splits) < 0:
            raise ValueError(f"all_to_all_single: {what} holds a negative size, "
                             f"{min(splits)} (for rank {list(splits).index(min(splits))})")
        if sum(splits) != rows:
            raise ValueError(f"all_to_all_single: {what} sum to {sum(splits)}, but the "
                             f"tensor has {rows} rows")
        return [n * per for n in splits]

    def gather(self, output_tensors: list[list[torch.Tensor]],
               input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts or dist.GatherOptions()
        tensor = _dense(_tensor(input_tensors, "gather"))
        root = opts.rootRank
        if self.rank() != root:
            return self._run(opts, "gather", "Gatherv", (tensor, None), {"root": root}, [])
        outputs = self._one_list(output_tensors, "gather")
        staged = torch.empty(sum(t.numel() for t in outputs), dtype=tensor.dtype,
                             device=tensor.device)
        return self._run(opts, "gather", "Gatherv",
                         (tensor, [staged, [t.numel() for t in outputs]]), {"root": root},
                         outputs, _unflatten(staged, outputs))

    def scatter(self, output_tensors: list[torch.Tensor],
                input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Work:
        opts = opts or dist.ScatterOptions()
        tensor = _tensor(output_tensors, "scatter")
        root = opts.rootRank
        work, back = _out(tensor, "scatter")
        if self.rank() != root:
            return self._run(opts, "scatter", "Scatterv", (None, work), {"root": root},
                             [tensor], back)
        inputs = self._one_list(input_tensors, "scatter")
        send = [_flat(inputs, "scatter"), [t.numel() for t in inputs]]
        return self._run(opts, "scatter", "Scatterv", (send, work), {"root": root}, [tensor],
                         back)

    def barrier(self, opts: Any = None) -> Work:
        """A barrier that gives up after ``opts.timeout`` (``dist.barrier``'s
        ``timeout``), else the group's timeout, with ``RuntimeError``. A
        timed-out barrier stays posted: the group's collectives are then out of
        step, as after any collective that failed on some ranks; make a new group."""
        seconds = self._timeout
        if opts is not None and opts.timeout.total_seconds() > 0:
            seconds = opts.timeout.total_seconds()
        work = Work("barrier", [self.comm.Ibarrier()], [], timeout=seconds)
        if opts is not None and not opts.asyncOp:
            try:
                work.wait()
            except RuntimeError:
                self._timed_out.append(work)
                raise
        return work

    def monitored_barrier(self, timeout: datetime.timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it (torch's
        ``dist.monitored_barrier``, as on Gloo).

        Rank 0 waits for a message from every other rank, then answers each.
        Run by every rank of the group; ``dist.monitored_barrier(group)``
        calls it (``import mcr`` extends torch's function to "mcr" groups).

        Parameters
        ----------
        timeout : datetime.timedelta, optional
            How long rank 0 waits for the others, and they for its answer.
            Default: the group's timeout.
        wait_all_ranks : bool
            Rank 0 names every rank that did not arrive, not only the first.

        Raises
        ------
        RuntimeError
            On rank 0, naming the ranks that did not arrive in time
            (``"Rank 1 failed to pass monitoredBarrier in 2000 ms"``); on the
            others, when rank 0's answer does not come in time.
        """
        seconds = timeout.total_seconds() if timeout is not None else self._timeout or math.inf
        ms = f"{seconds * 1000:.0f} ms"
        rank, size, control = self.rank(), self.size(), self._control
        if size == 1:
            return
        deadline = time.monotonic() + seconds
        if rank != 0:
            sent = control.Isend(bytearray(1), 0, 0)
            answer = control.Irecv(bytearray(1), 0, 1)
            if not _test_until([sent, answer], deadline):
                _cancel([answer, sent])
                raise RuntimeError(
                    f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                    f"while waiting for send/recv from rank 0 (no answer in {ms}; rank 0 "
                    f"names the ranks that did not arrive)")
            return
        arrivals = [control.Irecv(bytearray(1), source, 0) for source in range(1, size)]
        missing: list[int] = []
        for source, request in zip(range(1, size), arrivals):
            if time.monotonic() >= deadline and not request.Test():
                # as Gloo: the time ran out before this rank's turn came
                missing.extend(range(source, size))
                if not wait_all_ranks or source == 1:
                    _cancel(arrivals[source - 1:])
                    raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms}")
                break
            if (missing and not wait_all_ranks) or not _test_until([request], deadline):
                missing.append(source)
        if missing:
            _cancel([arrivals[source - 1] for source in missing])
            who = ("Ranks " + ", ".join(map(str, missing)) if wait_all_ranks
                   else f"Rank {missing[0]}")
            raise RuntimeError(f"{who} failed to pass monitoredBarrier in {ms}")
        Request.Waitall([control.Isend(bytearray(1), dest, 1) for dest in range(1, size)])

    def _one_list(self, lists: list[list[torch.Tensor]], op: str) -> list[torch.Tensor]:
        if len(lists) != 1:
            raise ValueError(f"{op}: the 'mcr' backend takes one tensor list per call "
                             f"(got {len(lists)})")
        tensors = lists[0]
        if len(tensors) != self.size():
            raise ValueError(f"{op}: the list has {len(tensors)} tensors for "
                             f"{self.size()} ranks")
        return [_strided(t, op) for t in tensors]

    def _merged(self, op: str, works: list[Work]) -> Work:
        """One work over several (the *_coalesced calls)."""
        requests = [r for w in works for r in w._requests]
        result = [t for w in works for t in w._result]

        def finish() -> None:
            for w in works:
                w._complete()
        return Work(op, requests, result, finish)

    # -- point-to-point ------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        tensor = _tensor(tensors, "send")
        return Work("send", [self.comm.Isend(_dense(tensor), dst, tag)], [tensor])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        tensor = _tensor(tensors, "recv")
        work, back = _out(tensor, "recv")
        return Work("recv", [self.comm.Irecv(work, src, tag)], [tensor], back)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        tensor = _tensor(tensors, "recv")
        work, back = _out(tensor, "recv")
        status = MPI.Status()
        request = self.comm.Irecv(work, MPI.ANY_SOURCE, tag)
        return Work("recv", [request], [tensor], back, status=status)

    # -- lifetime ------------------------------------------------------------

    def shutdown(self) -> None:
        """Free the communicator (``destroy_process_group``), also on a rank
        whose barrier timed out: Free is collective on a Gloo or NCCL group,
        and the barrier left posted does not stop it (MPI frees the
        communicator once the barrier completes, if ever; the Gloo or NCCL
        group goes with it)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            self._control.Free()
            comm.Free()

    abort = shutdown


def _test_until(requests: list[Any], deadline: float, statuses: Any = None) -> bool:
    """Test ``requests`` (filling ``statuses``) until all complete (True) or
    ``time.monotonic()`` reaches ``deadline`` (False), sleeping 10 us to 1 ms
    between tests."""
    pause = 1e-5
    while not Request.Testall(requests, statuses):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return True


def _cancel(requests: list[Any]) -> None:
    """Cancel the point-to-point requests that have not completed, and complete them."""
    for request in requests:
        if not request.Test():
            request.Cancel()
            request.Wait()


# -- the backend's creator -----------------------------------------------------

def create(opts: Any, pg_options: Any) -> ProcessGroupMCR:
    """Make the ``"mcr"`` process group that torch asks for (registered with
    ``extended_api=True``: ``opts`` is torch's ``_DistributedBackendOptions``).

    The default group gets a duplicate of ``COMM_WORLD``; a subgroup gets a
    communicator over its ranks of ``COMM_WORLD``, made by its members only
    (``MPI_Comm_create_group``), as torch calls the creator on members only.

    Raises
    ------
    RuntimeError
        If torch's ranks are not MPI's (the processes were not started by
        ``mpiexec`` as one job).
    TypeError
        If ``pg_options`` is not an :class:`Options`.
    """
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: the 'mcr' backend takes mcr.distributed.Options, "
                        f"got {type(pg_options).__name__}")
    import zlib

    from mcr import MPI as mcr_MPI
    from mcr._core import COMM_WORLD as world
    from mcr._core import Request as mcr_Request
    global MPI, Request
    MPI, Request = mcr_MPI, mcr_Request
    ranks = list(opts.global_ranks_in_group)
    rank, size = opts.group_rank, opts.group_size
    if not ranks:
        if (rank, size) != (world.Get_rank(), world.Get_size()):
            raise RuntimeError(
                f"init_process_group('mcr'): torch says rank {rank} of {size}, MPI says "
                f"rank {world.Get_rank()} of {world.Get_size()}: each process is an MPI job "
                f"of its own (started by torchrun or another launcher that is not MPI's); "
                f"start the processes with mpiexec as one job, e.g. 'mpiexec -n {size} "
                f"python ...' (the 'mcr' backend takes its ranks from MPI)")
        comm = world.Dup()
    else:
        if max(ranks) >= world.Get_size() or ranks[rank] != world.Get_rank():
            raise RuntimeError(
                f"new_group(backend='mcr', ranks={ranks}): this process is rank "
                f"{world.Get_rank()} of {world.Get_size()} in MPI's COMM_WORLD, which "
                f"does not match torch's ranks; start the processes with mpiexec")
        group = world.Get_group().Incl(ranks)
        try:
            # the same tag on every member: the group's name, which torch agreed
            comm = world.Create_group(group, zlib.crc32(str(opts.group_id).encode()) % 32768)
        finally:
            group.Free()
    if pg_options is not None and pg_options.backend is not None:
        comm.backend = pg_options.backend
    # set up now, as torch's Gloo does: a first call would set the backend up
    # (under auto: agree on the tuning table first), and a barrier's timeout
    # could not bound a set-up that waits for the others
    if comm.backend == "auto":
        comm.Barrier()
    elif comm.backend != "mpi":
        from . import backends
        backends.subcomm(comm, comm.backend).start()
    return ProcessGroupMCR(comm, rank, size, opts.timeout,
                           pg_options is not None and pg_options.same_async_op)
