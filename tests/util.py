"""Helpers shared by the test cases (the data and expected values of operations are in opref.py)."""

import contextlib

import numpy as np
import torch

import mcr

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


def ring(comm):
    """(right, left): this rank's neighbours on the ring."""
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def status_of(status):
    """(source, tag, count) of an mcr.Status."""
    return status.Get_source(), status.Get_tag(), status.Get_count()


def assert_comm_works(comm):
    """An Allreduce that must give the right answer: the comm is still usable."""
    x = torch.full((3,), float(comm.rank + 1))
    y = torch.zeros(3)
    comm.Allreduce(x, y, op=mcr.SUM)
    expected = float(sum(range(1, comm.size + 1)))
    assert torch.equal(y, torch.full((3,), expected)), (y, expected)


def assert_truncated(call, arg, capacity, source, tag, nbytes, error_class=None):
    """`call()` raises `error_class` (default MPI_ERR_TRUNCATE) as an mcr.Exception that mpi4py's
    catches, noted by mcr: argument `arg` of `capacity` bytes, the message of `nbytes` (where
    known), source and tag. Returns the exception."""
    error_class = mcr.MPI.ERR_TRUNCATE if error_class is None else error_class
    try:
        call()
    except mcr.MPI.Exception as exc:       # as a ported mpi4py program catches it
        assert isinstance(exc, mcr.Exception), type(exc)
        assert exc.Get_error_class() == error_class, (exc.Get_error_class(), str(exc))
        tail = (f" from rank {source} (tag {tag}) does not fit the receive buffer of "
                f"{capacity} bytes")
        notes = getattr(exc, "__notes__", [])
        assert f"{arg}: message of {nbytes} bytes{tail}" in notes or \
            f"{arg}: a message{tail}" in notes, (notes, arg, tail)
        return exc
    raise AssertionError(f"MPI error class {error_class} not raised (tag {tag})")


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


class logging_on:
    """Log (keeping records) within a ``with`` block, from a clean slate."""

    def __enter__(self):
        import mcr.log
        mcr.log.reset()
        mcr.log.start(records=True)
        return self

    def __exit__(self, *exc):
        self.records, self.rows = mcr.log.records(), mcr.log.summary()["rows"]
        mcr.log.stop()
        mcr.log.reset()
