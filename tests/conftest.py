import os
import signal
import sys
import threading

import pytest

from mcr import launch  # (imports no MPI)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# one-process programs the tests start without mpiexec start as jobs do (mcr.launch): without
# Open MPI's ofi BTL, which sleeps a second in MPI_Init (the user's setting wins)
os.environ.setdefault("OMPI_MCA_btl", launch.OPEN_MPI_ENV["OMPI_MCA_btl"])


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    import mpiharness

    # a SIGTERM (a `timeout` command, kill) ends the session as Ctrl-C does: on the way out
    # the running MPI job is stopped (launch.Job), not left spinning without its parent
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)

    def progress_line(text):
        # a job of many modules runs for minutes: say which one it is at (output capture
        # suspended while it writes, as for live logs)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None and config.option.verbose >= 0:
            with capture.global_and_fixture_disabled():
                reporter.write(f" {text} ", flush=True)
    mpiharness.progress_line = progress_line
    config.addinivalue_line("markers", "quick: the quick tier (python -m pytest -m quick): "
                            "one case of each operation on each backend at 2 processes")


@pytest.hookimpl(trylast=True)     # after -k and -m have deselected
def pytest_collection_modifyitems(session, config, items):
    import mpiharness
    mpiharness.select(items)
    if config.option.collectonly:
        return
    # what only computes (mypy, sphinx) or waits on the network (the download of mpi4py's
    # suite) starts now, at the lowest priority, on what the MPI jobs leave idle of the cores;
    # the tests take the results (mpiharness.Background, sdist.prefetch)
    for module in dict.fromkeys(getattr(item, "module", None) for item in items):
        if hasattr(module, "start_early"):
            module.start_early()


def pytest_terminal_summary(terminalreporter, config):
    """``--durations=N``: the N slowest MPI cases as their job timed them (pytest charges a
    whole job to its first case). ``MCR_TEST_COVERAGE=FOLDER``: how many combinations the
    MPI cases called, as the workers recorded them (what a reorganized suite must not lower)."""
    import collections
    import json

    import mpiharness
    most = config.option.durations
    if most is not None and mpiharness.case_seconds():
        timed = sorted(mpiharness.case_seconds().items(), key=lambda kv: -kv[1])
        terminalreporter.write_sep("=", f"slowest {most or len(timed)} MPI cases "
                                   f"({sum(timed_s for _, timed_s in timed):.0f} s in all)")
        for (path, name, nprocs), seconds in timed[:most or None]:
            terminalreporter.write_line(
                f"{seconds:8.2f}s {os.path.relpath(path)}::{name} at {nprocs}")
    folder = os.environ.get("MCR_TEST_COVERAGE")
    if not folder or not os.path.isdir(folder):
        return
    seen = set()
    for name in os.listdir(folder):
        if name.startswith("calls-"):
            with open(os.path.join(folder, name)) as f:
                seen |= {tuple(json.loads(line)) for line in f if line.strip()}
    ops, per_backend = {c[0] for c in seen}, collections.Counter(c[2] for c in seen)
    terminalreporter.write_line(
        f"MPI cases: {len(seen)} (operation, form, backend, element type, world size) "
        f"combinations called, {len(ops)} operations; by backend: "
        + ", ".join(f"{b} {n}" for b, n in sorted(per_backend.items())))
