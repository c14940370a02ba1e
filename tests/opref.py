"""Reference data and expected results for every test of an operation.

Each rank's data is a deterministic function of (key, length, element type, reduction, seed), so any
rank computes what any other sends or receives, and every expected value is computed here with
torch/numpy on the whole data, never with mcr. Element types are torch dtypes or numpy dtypes (then
the buffers are numpy arrays).

Values are small integers, so every reduction order is exact in every type: PROD operands are 1..3,
logical operands -2..2 (a lone operand, as at rank 0 of a Scan, comes back as it is, not as 0 or
1; bool: False and True), order, sum and bitwise operands of
signed types include negatives, and uint32/uint64 values reach above 2**31/2**63 (wrong if reduced
or compared as signed).
"""

import functools

import numpy as np
import torch

import mcr

# -- element types -------------------------------------------------------------------
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIGNED = [torch.int32, torch.int64, torch.int8, torch.int16]
UNSIGNED = [torch.uint8, torch.uint16, torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128]
NUMPY = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8,
         np.complex64, np.complex128, np.bool_]
# the element types the collective tests of tests/test_*.py run on
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.uint8, torch.int8, torch.complex64]
# data movement works on every element type
MOVE = FLOATS + SIGNED + UNSIGNED + COMPLEX + [torch.bool]

# -- reductions --------------------------------------------------------------------------

OPS = {name: getattr(mcr, name) for name in
       ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")}
ARITH, ORDER = ("SUM", "PROD"), ("MAX", "MIN")
LOGICAL, BITWISE = ("LAND", "LOR", "LXOR"), ("BAND", "BOR", "BXOR")
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum,
          "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
# values above 2**31 / 2**63: wrong if reduced or compared as signed
HIGH = {torch.uint32: 1 << 31, torch.uint64: 1 << 63}


def reductions(dtypes=None):
    """(element type, op name) for every op on every element type it applies to, numpy types
    included; `dtypes` restricts the element types."""
    pairs = [(dt, op) for dt in FLOATS for op in ARITH + ORDER]
    pairs += [(dt, op) for dt in SIGNED + UNSIGNED for op in OPS]
    pairs += [(torch.bool, op) for op in LOGICAL]
    pairs += [(dt, op) for dt in COMPLEX for op in ARITH]
    pairs += [(np.float32, "SUM"), (np.float64, "MAX"), (np.int32, "PROD"),
              (np.int64, "MIN"), (np.uint8, "BOR"), (np.int8, "BXOR"), (np.bool_, "LAND"),
              (np.bool_, "LXOR"), (np.int16, "LOR"), (np.complex128, "SUM"),
              (np.complex64, "PROD"), (np.float16, "SUM")]
    return [p for p in pairs if dtypes is None or p[0] in dtypes]


def is_numpy(dtype):
    return not isinstance(dtype, torch.dtype)


@functools.cache
def torch_dtype(dtype):
    """The torch dtype of `dtype` (a torch dtype, or a numpy one)."""
    return torch.from_numpy(np.zeros(0, dtype)).dtype if is_numpy(dtype) else dtype


# -- data ------------------------------------------------------------------------------

def data(key, n, dtype=torch.float32, op=None, seed=0):
    """`n` elements of `dtype` for `key` (a rank, or any int) and reduction `op` (None: data to
    move, 1..7); a numpy array for a numpy `dtype`. A new copy at each call (the tests write
    into what they get) of what is made once per process: the matrix asks for the same data on
    every backend, and making it was a third of its time at 4 ranks."""
    return copy(_made(key, n, dtype, op, seed))


@functools.lru_cache(maxsize=1 << 16)
def _made(key, n, dtype, op, seed):
    if is_numpy(dtype):
        return _made(key, n, torch_dtype(dtype), op, seed).numpy()
    g = torch.Generator().manual_seed(10007 * seed + key)

    def ints(lo, hi):
        return torch.randint(lo, hi, (n,), generator=g)
    if dtype == torch.bool:
        return ints(0, 2).to(dtype)
    if op in LOGICAL:
        return ints(-2 if dtype.is_signed else 0, 3).to(dtype)
    if dtype.is_complex:
        if op == "PROD":
            return torch.complex(ints(1, 4).double(), ints(0, 2).double()).to(dtype)
        return torch.complex(ints(1, 8).double(), ints(-3, 4).double()).to(dtype)
    if op == "PROD":
        return ints(1, 4).to(dtype)
    if op in BITWISE:
        return ints(-64 if dtype.is_signed else 0, 64).to(dtype)
    if dtype in HIGH:
        small = ints(0, 8).numpy().astype(np.uint64)
        high = ints(0, 2).numpy().astype(np.uint64) * np.uint64(HIGH[dtype])
        return torch.from_numpy(small + high).to(dtype)
    if dtype.is_signed and op in ("SUM", "MAX", "MIN"):
        return (ints(1, 8) - 4).to(dtype)
    return ints(1, 4 if dtype in (torch.uint8, torch.int8) else 8).to(dtype)


def operands(size, n, dtype=torch.float32, op=None, seed=0):
    """Every rank's `data`, in rank order."""
    return [data(r, n, dtype, op, seed) for r in range(size)]


def rank_data(rank, n, dtype=torch.float32, seed=0):
    """Rank `rank`'s data to move (`data` with no reduction)."""
    return data(rank, n, dtype, None, seed)


def all_data(size, n, dtype=torch.float32, seed=0):
    return operands(size, n, dtype, None, seed)


def pair_block(src, dst, n, dtype, seed=0):
    """What rank `src` sends rank `dst` in an all-to-all."""
    return data(100 + 8 * src + dst, n, dtype, None, seed)


def reduce_ref(xs, op):
    """`op` (a name) over `xs` in rank order with numpy, in their element type (bfloat16
    through float32: exact on these small integers); one operand as it is (MPI applies no
    operation to it)."""
    if not len(xs):
        raise ValueError("nothing to reduce")
    if len(xs) == 1:
        return copy(xs[0])
    if is_numpy(xs[0].dtype) or isinstance(xs[0], np.ndarray):
        arrays = [x != 0 for x in xs] if op in LOGICAL else list(xs)
        return np.asarray(functools.reduce(UFUNCS[op], arrays)).astype(xs[0].dtype)
    dtype = xs[0].dtype
    arrays = [(t.float() if dtype == torch.bfloat16 else t).numpy() for t in xs]
    if op in LOGICAL:
        arrays = [a != 0 for a in arrays]
    return torch.from_numpy(np.asarray(functools.reduce(UFUNCS[op], arrays))).to(dtype)


# -- buffers and layouts --------------------------------------------------------------

def sentinel(n, dtype):
    """A receive buffer of `n` elements holding a value no result has (bool: all False)."""
    if is_numpy(dtype):
        return sentinel(n, torch_dtype(dtype)).numpy()
    return torch.zeros(n, dtype=dtype) if dtype == torch.bool else torch.full((n,), 77, dtype=dtype)


def cat(blocks):
    return np.concatenate(blocks) if isinstance(blocks[0], np.ndarray) else torch.cat(blocks)


def copy(x):
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


def vcounts(size):
    """Uneven block sizes with zeros: 1 3 0 2 4 1 ..."""
    return [(2 * r + 1) % 5 for r in range(size)]


LAYOUTS = ("packed", "gaps", "reversed")


def layout(counts, kind):
    """Displacements for blocks of `counts` elements, and the buffer length. packed: rank order,
    no gaps (MPI's default); gaps: rank order with holes before, between and after the blocks;
    reversed: the last rank's block first, with a hole between blocks."""
    counts = list(counts)
    order, gap, lead = {"packed": (range(len(counts)), 0, 0),
                        "gaps": (range(len(counts)), 2, 1),
                        "reversed": (reversed(range(len(counts))), 1, 0)}[kind]
    displs, pos = [0] * len(counts), lead
    for i in order:
        displs[i] = pos
        pos += counts[i] + gap
    return displs, pos if kind == "packed" else pos + 1


def place(buffer, blocks, displs):
    """A copy of `buffer` with block i written at displs[i]."""
    out = copy(buffer)
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


def expect(actual, expected, what=""):
    """Assert `actual` equals `expected` in element type and every value."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray) and actual.dtype == expected.dtype and \
            np.array_equal(actual, expected), \
            f"{what}\n  actual:   {actual}\n  expected: {expected}"
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, not {expected.dtype}"
    assert torch.equal(actual, expected), (
        f"{what}\n  actual:   {actual.tolist()}\n  expected: {expected.tolist()}")
