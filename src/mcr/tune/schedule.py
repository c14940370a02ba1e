"""What a tuning run measures and how many calls each timed loop makes.

A run is a list of :class:`Point` (operation, device, size), each measured on
every backend that serves the device, in ``--rounds`` rounds: every round
visits every point, so that a burst of interference on a shared machine
spoils one round of a point, not all of them. Without a time budget the
loops make OSU's counts (:func:`osu_counts`); with one, :class:`Budget`
shares the time left among the loops left, after the overhead the visits so
far have taken besides their timed loops (setting up buffers, checking,
probing), so that the run ends near its deadline whatever the machine. Rank 0
decides the counts; the worker broadcasts them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Point", "points", "osu_counts", "Budget", "LARGE", "MIN_ITERS", "WARMUP_SHARE",
           "LOOP_CAP"]

# OSU's counts: sizes above LARGE bytes get fewer calls
LARGE = 8192
ITERS, ITERS_LARGE = 1000, 100
WARMUP, WARMUP_LARGE = 200, 10
MIN_ITERS = 3           # timed calls per loop, however short the budget
WARMUP_SHARE = 0.2      # warm-up calls per timed call under a budget
LOOP_CAP = 0.25         # seconds: without a budget, a loop of slow calls is cut to this


@dataclass(frozen=True)
class Point:
    """One measured point: an operation (benchmark name) on a device at a size."""

    op: str
    device: str
    nbytes: int


def points(ops: Sequence[str], devices: Sequence[str],
           sizes: Sequence[int]) -> list[Point]:
    """Every point of a run, operation by operation (barrier: size 0 only)."""
    return [Point(op, device, n) for op in ops for device in devices
            for n in ([0] if op == "barrier" else sizes)]


def osu_counts(nbytes: int) -> tuple[int, int]:
    """OSU's (timed calls, warm-up calls) for a message of ``nbytes``."""
    return (ITERS_LARGE, WARMUP_LARGE) if nbytes > LARGE else (ITERS, WARMUP)


@dataclass
class Budget:
    """Iteration counts for the loops of a run, within ``seconds`` if given.

    Parameters
    ----------
    seconds : float or None
        The time the measurements may take (None: OSU's counts, each loop cut
        to :data:`LOOP_CAP` seconds).
    loops : int
        The timed loops of the whole run (points x backends x rounds).
    visits_left : int
        The visits of the run (points x rounds).
    start : float
        When the run began (``time.perf_counter()``).
    """

    seconds: float | None
    loops: int
    visits_left: int
    start: float
    overheads: list[float] = field(default_factory=list)

    def per_loop(self, now: float) -> float:
        """Seconds one loop (warm-up and timed calls) may take from ``now``."""
        if self.seconds is None:
            return LOOP_CAP
        left = self.start + self.seconds - now
        # the mean: the first round's visits (checks, probes, connecting the
        # backends) cost more than the later ones
        overhead = statistics.fmean(self.overheads) if self.overheads else 0.0
        return max(0.0, left - overhead * self.visits_left) / max(1, self.loops)

    def counts(self, nbytes: int, per_call: float, now: float) -> tuple[int, int]:
        """(timed calls, warm-up calls) of one loop of calls taking ``per_call``
        seconds each at ``nbytes``: OSU's counts at most, :data:`MIN_ITERS`
        timed calls at least."""
        iters, warmup = osu_counts(nbytes)
        fits = self.per_loop(now) / max(per_call, 1e-9)
        if self.seconds is None:
            return max(MIN_ITERS, min(iters, int(fits))), min(warmup, max(1, int(fits) // 5))
        timed = max(MIN_ITERS, min(iters, int(fits / (1 + WARMUP_SHARE))))
        return timed, max(1, min(warmup, int(timed * WARMUP_SHARE)))

    def done(self, loops: int, seconds: float, looping: float) -> None:
        """Account for a visit of a point: its ``loops`` timed loops, the
        ``seconds`` it took in all, ``looping`` of them in its loops."""
        self.loops -= loops
        self.visits_left = max(0, self.visits_left - 1)
        self.overheads.append(max(0.0, seconds - looping))
