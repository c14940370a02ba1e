"""Helpers shared by the test cases: per-rank data and expected values
computed with torch/numpy on the whole data (never with mcr)."""

import contextlib

import numpy as np
import torch

import mcr

# dtypes the collective tests run on; values are small integers, so that every
# reduction order gives the exact result even in float16/bfloat16
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.uint8, torch.int8, torch.complex64]


def rank_data(rank, n, dtype=torch.float32, seed=0):
    """Deterministic data of rank `rank`: any rank can compute any rank's data."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    hi = 4 if dtype in (torch.uint8, torch.int8) else 8
    values = torch.randint(1, hi, (n,), generator=g)
    if dtype.is_complex:
        imag = torch.randint(1, hi, (n,), generator=g)
        return torch.complex(values.double(), imag.double()).to(dtype)
    return values.to(dtype)


def all_data(size, n, dtype=torch.float32, seed=0):
    return [rank_data(r, n, dtype, seed) for r in range(size)]


@contextlib.contextmanager
def raises(exc_type, *fragments):
    """Assert that the block raises `exc_type` whose message has all `fragments`."""
    try:
        yield
    except exc_type as exc:
        message = str(exc)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in error message {message!r}"
    else:
        raise AssertionError(f"{exc_type.__name__} not raised")


def assert_comm_works(comm):
    """An Allreduce that must give the right answer: the comm is still usable."""
    x = torch.full((3,), float(comm.rank + 1))
    y = torch.zeros(3)
    comm.Allreduce(x, y, op=mcr.SUM)
    expected = float(sum(range(1, comm.size + 1)))
    assert torch.equal(y, torch.full((3,), expected)), (y, expected)


def assert_equal(actual, expected):
    if isinstance(actual, np.ndarray):
        np.testing.assert_array_equal(actual, expected)
        return
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert torch.equal(actual, expected), f"\nactual:   {actual}\nexpected: {expected}"


class Failures:
    """Wrong results and errors, recorded (not raised) so that every rank keeps
    making the same calls; the case fails at its end with all of them."""

    def __init__(self, comm):
        self.rank = comm.rank
        self.found = []

    def check(self, label, got, want):
        if got.dtype != want.dtype or not torch.equal(got, want):
            self.found.append(f"{label}: got {got}, expected {want}")

    def error(self, label, exc):
        self.found.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")

    def done(self):
        assert not self.found, f"rank {self.rank}:\n" + "\n".join(self.found)
