"""Progress of a tuning run: a tqdm bar with the time left, or plain lines
where tqdm is not installed (or the output is not a terminal).

Open MPI passes a rank's output on line by line, so a bar drawn by a rank
(redrawn with carriage returns) would only show at the end. When the
launching process started the job, rank 0 therefore appends one JSON line
per measurement to a file (:class:`Reporter`), and the launching process
draws the bar from it (:class:`Follower`); run directly under mpiexec, rank 0
draws it itself, as plain lines unless its stderr is a terminal.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Progress", "Reporter", "Follower"]


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Shows how many of ``total`` measurements are done.

    Parameters
    ----------
    total : int
        The measurements of the run (one per point, backend and round).
    stream : file, optional
        Where to write (default ``sys.stderr``).
    bar : bool, optional
        Draw a tqdm bar (default: when ``stream`` is a terminal and tqdm is
        installed); otherwise a line at the start of each operation and at
        the end.
    """

    def __init__(self, total: int, stream: TextIO | None = None,
                 bar: bool | None = None) -> None:
        self.total, self.done, self.section = total, 0, ""
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.bar: Any = None
        if bar is None:
            bar = self.stream.isatty()
        if bar:
            try:
                tqdm = importlib.import_module("tqdm").tqdm
                self.bar = tqdm(total=total, unit="meas", desc="mcr.tune", file=self.stream,
                                mininterval=0.5, dynamic_ncols=True)
            except ImportError:
                pass
        if self.bar is None:
            print(f"mcr.tune: {total} measurements", file=self.stream, flush=True)

    def update(self, done: int, what: str, section: str, left: float | None = None) -> None:
        """``done`` measurements are done, the last of ``what`` (as ``Allreduce
        cpu 64 B``) in ``section`` (as ``round 1/3, Allreduce cpu``); ``left``:
        seconds left of the time budget, if there is one."""
        now = time.perf_counter()
        step, self.done = done - self.done, done
        if self.bar is not None:
            postfix = what + (f", budget left {_clock(left)}" if left is not None else "")
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(step)
        elif section != self.section or done >= self.total:
            elapsed = now - self.start
            if left is None:
                left = elapsed / max(done, 1) * (self.total - done)
            print(f"mcr.tune: {done}/{self.total} measurements ({section}), "
                  f"{_clock(elapsed)} elapsed, about {_clock(left)} left",
                  file=self.stream, flush=True)
        self.section = section

    def close(self) -> None:
        """End the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Reporter:
    """Rank 0's side: counts the measurements and shows them, or appends them
    to ``channel`` for the launching process to show.

    Parameters
    ----------
    total : int
        The measurements of the run.
    enabled : bool
        False on every rank but 0: nothing is shown or written.
    deadline : float, optional
        ``time.perf_counter()`` at which the time budget ends.
    channel : str, optional
        The file the launching process follows (:class:`Follower`).
    """

    def __init__(self, total: int, enabled: bool, deadline: float | None = None,
                 channel: str | None = None) -> None:
        self.total, self.done, self.deadline = total, 0, deadline
        self.enabled = enabled
        self.file: TextIO | None = None
        self.shown: Progress | None = None
        if not enabled:
            return
        if channel:
            try:
                self.file = open(channel, "a")
            except OSError:         # rank 0 on another node than the launching process
                pass
        if self.file is not None:
            self._write({"total": total})
        else:
            self.shown = Progress(total)

    def _write(self, record: dict[str, Any]) -> None:
        assert self.file is not None
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def step(self, what: str, section: str, measurements: int = 1) -> None:
        """``measurements`` more are done, the last of ``what`` in ``section``."""
        if not self.enabled:
            return
        self.done += measurements
        left = self.deadline - time.perf_counter() if self.deadline is not None else None
        if self.file is not None:
            self._write({"done": self.done, "what": what, "section": section, "left": left})
        elif self.shown is not None:
            self.shown.update(self.done, what, section, left)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.shown is not None:
            self.shown.close()
            self.shown = None


class Follower:
    """The launching process's side: a thread that reads what rank 0 appends
    to ``channel`` and shows it (:class:`Progress`) until :meth:`stop`."""

    POLL = 0.2          # seconds between reads

    def __init__(self, channel: str, stream: TextIO | None = None) -> None:
        self.channel, self.stream = channel, stream
        self.shown: Progress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="mcr.tune progress",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Show what is left to read, end the bar and the thread."""
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        offset, pending = 0, ""
        while True:
            last = self._stop.is_set()      # read once more after the job ended
            try:
                with open(self.channel) as f:
                    f.seek(offset)
                    pending += f.read()
                    offset = f.tell()
            except OSError:                 # not made yet
                pass
            *lines, pending = pending.split("\n")
            for line in lines:
                self._show(json.loads(line))
            if last:
                break
            self._stop.wait(self.POLL)
        if self.shown is not None:
            self.shown.close()

    def _show(self, record: dict[str, Any]) -> None:
        if "total" in record:
            self.shown = Progress(record["total"], self.stream)
        elif self.shown is not None:
            self.shown.update(record["done"], record["what"], record["section"],
                              record["left"])
