"""Data and reference results for the collective tests (tests/test_cco_*.py).

Element types per kind of operation, operands suited to each reduction,
buffer layouts for vector collectives, and the expected results computed with
torch/numpy on the whole data (never with mcr). Every function is
deterministic, so any rank computes what any other rank sends or receives.
"""

import functools

import numpy as np
import torch

import mcr
from util import DTYPES, rank_data

# -- element types -------------------------------------------------------------

# data movement works on every element type
MOVE_DTYPES = DTYPES + [torch.complex128, torch.int16, torch.bool]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int32, torch.int64, torch.uint8, torch.int8, torch.int16]
COMPLEX_DTYPES = [torch.complex64, torch.complex128]
NUMPY_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8,
                np.int8, np.complex64, np.complex128, np.bool_]

# -- reductions ------------------------------------------------------------------

OP_NAMES = {"SUM": mcr.SUM, "PROD": mcr.PROD, "MAX": mcr.MAX, "MIN": mcr.MIN,
            "LAND": mcr.LAND, "LOR": mcr.LOR, "LXOR": mcr.LXOR,
            "BAND": mcr.BAND, "BOR": mcr.BOR, "BXOR": mcr.BXOR}
ARITH = ("SUM", "PROD")
ORDER = ("MAX", "MIN")
LOGICAL = ("LAND", "LOR", "LXOR")
BITWISE = ("BAND", "BOR", "BXOR")


def reduction_cases(dtypes=None):
    """(dtype, op name) for every op on the element types it applies to."""
    pairs = [(dt, op) for dt in FLOAT_DTYPES for op in ARITH + ORDER]
    pairs += [(dt, op) for dt in INT_DTYPES for op in ARITH + ORDER + LOGICAL + BITWISE]
    pairs += [(torch.bool, op) for op in LOGICAL]
    pairs += [(dt, op) for dt in COMPLEX_DTYPES for op in ARITH]
    if dtypes is not None:
        pairs = [(dt, op) for dt, op in pairs if dt in dtypes]
    return pairs


def operand(rank, n, dtype, op, seed=0):
    """Rank `rank`'s operand for `op`: small integers whose reduction over four
    ranks is exact in every type (PROD: 1..3; logical ops: with zeros; order
    and sum ops on signed types: negative values too)."""
    if op in LOGICAL:
        return rank_data(rank, n, torch.bool, seed).to(dtype)
    if op == "PROD":
        v = rank_data(rank, n, torch.int64, seed) % 3 + 1
        if dtype.is_complex:
            w = rank_data(rank, n, torch.int64, seed + 7) % 3
            return torch.complex(v.double(), w.double()).to(dtype)
        return v.to(dtype)
    x = rank_data(rank, n, dtype, seed)
    if op in ("SUM",) + ORDER and dtype.is_signed and not dtype.is_complex:
        x = x - 4
    return x


def operands(size, n, dtype, op, seed=0):
    return [operand(r, n, dtype, op, seed) for r in range(size)]


def reduce_ref(tensors, op):
    """The element-wise reduction of `tensors` by `op` (a name), in their dtype."""
    if not tensors:
        raise ValueError("nothing to reduce")
    x = torch.stack(tensors)
    dtype = x.dtype
    if op == "SUM":
        r = x.sum(0)
    elif op == "PROD":
        r = x.prod(0)
    elif op == "MAX":
        r = x.amax(0)
    elif op == "MIN":
        r = x.amin(0)
    elif op == "LAND":
        r = (x != 0).all(0)
    elif op == "LOR":
        r = (x != 0).any(0)
    elif op == "LXOR":
        r = (x != 0).sum(0) % 2 == 1
    else:
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
              "BXOR": torch.bitwise_xor}[op]
        r = functools.reduce(fn, tensors)
    return r.to(dtype)


def np_reduce_ref(arrays, op):
    """`reduce_ref` for numpy arrays."""
    x = np.stack(arrays)
    ufunc = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
             "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
             "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    if op in LOGICAL:
        x = x != 0
    return ufunc.reduce(x, axis=0).astype(arrays[0].dtype)


def np_operand(rank, n, dtype, op, seed=0):
    """`operand` as a numpy array of `dtype`."""
    tdtype = torch.from_numpy(np.zeros(0, dtype)).dtype
    return operand(rank, n, tdtype, op, seed).numpy()


def np_data(rank, n, dtype, seed=0):
    """`rank_data` as a numpy array of `dtype`."""
    if dtype == np.bool_:
        return rank_data(rank, n, torch.bool, seed).numpy()
    t = rank_data(rank, n, torch.complex128 if np.issubdtype(dtype, np.complexfloating)
                  else torch.int64, seed)
    return t.numpy().astype(dtype)


# -- buffers and layouts --------------------------------------------------------------


def sentinel(n, dtype):
    """A buffer of `n` elements holding a value the test data never has."""
    if dtype == torch.bool:
        return torch.zeros(n, dtype=dtype)
    if dtype.is_signed or dtype.is_floating_point or dtype.is_complex:
        return torch.full((n,), -9, dtype=dtype)
    return torch.full((n,), 99, dtype=dtype)


def np_sentinel(n, dtype):
    if dtype == np.bool_:
        return np.zeros(n, dtype)
    return np.full(n, 99, dtype)


LAYOUTS = ("packed", "gaps", "reversed")


def layout(counts, kind):
    """Displacements for blocks of `counts` elements, and the buffer length.

    packed: rank order, no gaps (the default MPI layout); gaps: rank order with
    holes before, between and after the blocks; reversed: the last rank's block
    first, with a hole between blocks.
    """
    counts = list(counts)
    displs, pos = [0] * len(counts), 0
    if kind == "packed":
        order, gap, lead = range(len(counts)), 0, 0
    elif kind == "gaps":
        order, gap, lead = range(len(counts)), 2, 1
    elif kind == "reversed":
        order, gap, lead = reversed(range(len(counts))), 1, 0
    else:
        raise ValueError(kind)
    pos = lead
    for i in order:
        displs[i] = pos
        pos += counts[i] + gap
    length = pos if kind == "packed" else pos + 1
    return displs, length


def place(buffer, blocks, displs):
    """A copy of `buffer` with block i written at displs[i]."""
    out = buffer.copy() if isinstance(buffer, np.ndarray) else buffer.clone()
    for block, d in zip(blocks, displs):
        out[d:d + len(block)] = block
    return out


def int_forms(values):
    """The same counts or displacements as every kind of integer sequence."""
    return [list(values), tuple(values), torch.tensor(values, dtype=torch.int32),
            torch.tensor(values, dtype=torch.int64), np.array(values, dtype=np.int32),
            np.array(values, dtype=np.int64)]


def roots(size):
    """The roots to try: the first and the last rank."""
    return sorted({0, size - 1})
